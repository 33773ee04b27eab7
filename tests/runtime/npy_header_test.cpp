// The .npy header reader against what numpy writes and against hostile
// headers: long strings that crashed a recursive regex matcher, shapes whose
// product wraps, dimensions past 64 bits, negative dimensions.
#include "runtime/data/npy_header.h"

#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "runtime/base/errors.h"

namespace lockstep {
namespace {

std::string npy(const std::string& dict, int version = 1) {
  std::string out = "\x93NUMPY";
  out += char(version);
  out += char(0);
  const size_t length = dict.size();
  out += char(length & 0xff);
  out += char((length >> 8) & 0xff);
  if (version > 1) {
    out += char((length >> 16) & 0xff);
    out += char((length >> 24) & 0xff);
  }
  return out + dict;
}

NpyHeader parse(const std::string& file) {
  return parse_npy_header(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "x.npy");
}

std::string error_of(const std::string& file) {
  try {
    parse(file);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(NpyHeader, ReadsWhatNumpyWrites) {
  const NpyHeader h = parse(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (256, 1, 28, 28), }          \n"));
  EXPECT_EQ(h.descr, "<f4");
  EXPECT_FALSE(h.fortran_order);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{256, 1, 28, 28}));
  EXPECT_EQ(h.data_offset, 10 + 80u);
  EXPECT_EQ(parse(npy("{'descr': '|u1', 'fortran_order': True, 'shape': (7,), }\n", 2)).shape,
            (std::vector<int64_t>{7}));
  EXPECT_EQ(parse(npy("{\"descr\":\"<i8\",\"shape\":(3L, 2L),\"fortran_order\":False}", 3)).shape,
            (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(parse(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }")).shape,
            (std::vector<int64_t>{0, 4}));
}

TEST(NpyHeader, LongHeadersAreRefusedBeforeTheyAreRead) {
  // 2 MB and 60 KB: a recursive matcher overflowed the stack on both.
  for (size_t n : {size_t(2000000), size_t(60000)}) {
    const std::string descr = npy("{'descr': '<" + std::string(n, 'a') + "', 'fortran_order': False, 'shape': (1,), }", 2);
    const std::string message = error_of(descr);
    EXPECT_NE(message.find("x.npy: the .npy header is"), std::string::npos) << message;
    EXPECT_NE(message.find("at most 10000"), std::string::npos) << message;
    EXPECT_LT(message.size(), 300u);
  }
  const std::string spaces = npy("{'descr':" + std::string(9000, ' ') + "'<f4', 'fortran_order': False, 'shape': (1,), }", 2);
  EXPECT_EQ(parse(spaces).descr, "<f4");
  std::string commas = "{'descr': '<f4', 'fortran_order': False, 'shape': (1";
  for (int i = 0; i < 3000; ++i) commas += ", 1";
  EXPECT_NE(error_of(npy(commas + "), }", 2)).find("more than 64 dimensions"), std::string::npos);
}

TEST(NpyHeader, ShapesThatWrapOrDoNotFitAreRefused) {
  const NpyHeader wrap = parse(npy("{'descr': '|u1', 'fortran_order': False, 'shape': (64, 288230376151711744), }"));
  try {
    npy_data_bytes(wrap.shape, 1, "x.npy");
    FAIL() << "2^64 bytes accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("more bytes than fit in 64 bits"), std::string::npos) << e.what();
  }
  EXPECT_EQ(npy_data_bytes({256, 1, 28, 28}, 4, "x.npy"), 256 * 28 * 28 * 4);
  EXPECT_NE(error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999, 1), }"))
                .find("does not fit in 64 bits"),
            std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-256, 1, 28, 28), }"))
                .find("negative dimension"),
            std::string::npos);
}

TEST(NpyHeader, WhatIsNotADictLiteralIsNamed) {
  EXPECT_NE(error_of(npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }"))
                .find("structured or object"),
            std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '<f4', 'shape': (1,), }")).find("no 'fortran_order'"), std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,)}")).find("neither True"),
            std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }")).find("0-dimensional"),
            std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '<f4")).find("unterminated"), std::string::npos);
  EXPECT_NE(error_of(npy("{'descr': '\x01\x1b[2J', 'fortran_order': False, 'shape': (1,), 'x': 1}")).find("\\x1b"),
            std::string::npos);
  std::string cut = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }");
  cut.resize(cut.size() - 5);
  EXPECT_NE(error_of(cut).find("truncated"), std::string::npos);
  EXPECT_NE(error_of(std::string("\x93NUMPY\x09\x00\x00\x00\x00\x00", 12)).find("version 9"), std::string::npos);
  EXPECT_NE(error_of("PK\x03\x04 and more").find("no \\x93NUMPY magic"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
