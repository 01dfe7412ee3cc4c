// Byte and count formatting. GiB = 2^30 bytes, GB = 10^9 bytes: always say which.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kGB = 1e9;

// 4976698672 -> "4,976,698,672"
std::string with_commas(int64_t value);
// 15231233024 -> "14.19 GiB"
std::string format_gib(double bytes, int decimals = 2);
// 15231233024 -> "15.23 GB"
std::string format_gb(double bytes, int decimals = 2);

}  // namespace shardlm

namespace shardlm {
// "4GiB", "512MiB", "2GB", "1.5G" (= GiB), "1048576" -> bytes. Throws
// Error(kInvalidArgument) naming `what` (e.g. "--kv-cache-memory") otherwise.
int64_t parse_bytes(const std::string& text, const std::string& what);
}  // namespace shardlm
