// TensorBoard's record checksum: CRC-32C (Castagnoli), not zlib's CRC-32.
#include "runtime/tensorboard.h"

#include <string>

#include <gtest/gtest.h>

namespace lockstep {
namespace {

TEST(TensorBoardChecksum, IsCrc32cWithItsCheckValue) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);  // the published check value
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_NE(crc32c(check.data(), check.size()), 0xCBF43926u) << "zlib's CRC-32 of the same bytes";
}

}  // namespace
}  // namespace lockstep
