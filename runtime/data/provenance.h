#pragma once
// Which data a run used: each file's path, size, modification time and a
// digest of its contents (xxh3, 64 bit). A digest is computed once per
// (path, size, modification time) and kept in the cache folder
// (cache_folder()/data-digests.json), so a large file is not read again at
// every start; a cache that cannot be read or written only costs the hash.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lockstep {

// One object per file: path, bytes, modified (UTC), xxh3, digest_cached.
nlohmann::json data_provenance(const std::vector<std::string>& files);

// One object for a folder of many files (an image folder): path, files,
// bytes, modified (the newest), xxh3 over each file's relative path and
// digest, digest_cached. Cached by the listing's names, sizes and times.
nlohmann::json folder_provenance(const std::string& folder, const std::vector<std::string>& files);

}  // namespace lockstep
