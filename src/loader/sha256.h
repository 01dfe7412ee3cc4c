// SHA-256 of files (OpenSSL EVP), streamed in 1 MiB reads so a 5 GB shard is
// never held in memory; and the `sha256sum` manifest format.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

// Lowercase hex digest of the file's bytes. Throws kNotFound / kIo.
std::string sha256_file(const std::filesystem::path& path);
// Lowercase hex digest of a buffer.
std::string sha256_bytes(std::string_view bytes);

struct ManifestEntry {
  std::string name;    // as written, without a leading "*" (binary mode) or "./"
  std::string sha256;  // lowercase hex
};

// Parses `sha256sum` output: one "HEX  NAME" (or "HEX *NAME") per line; blank
// lines and lines starting with '#' are skipped. Lines that do not fit are
// returned in *bad_lines as "line N: TEXT" (the text cut to 80 characters).
std::vector<ManifestEntry> parse_sha256_manifest(std::string_view text, std::vector<std::string>* bad_lines);

}  // namespace shardlm
