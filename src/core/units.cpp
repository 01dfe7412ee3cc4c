#include "core/units.h"

#include <cstdio>

namespace shardlm {

std::string with_commas(int64_t value) {
  bool negative = value < 0;
  uint64_t v = negative ? static_cast<uint64_t>(-(value + 1)) + 1 : static_cast<uint64_t>(value);
  std::string digits = std::to_string(v);
  std::string out;
  int count = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    if (count > 0 && count % 3 == 0) out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++count;
  }
  return negative ? "-" + out : out;
}

static std::string format_unit(double value, int decimals, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, value, unit);
  return buf;
}

std::string format_gib(double bytes, int decimals) { return format_unit(bytes / kGiB, decimals, "GiB"); }
std::string format_gb(double bytes, int decimals) { return format_unit(bytes / kGB, decimals, "GB"); }

}  // namespace shardlm

#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace shardlm {

int64_t parse_bytes(const std::string& text, const std::string& what) {
  const char* s = text.c_str();
  char* end = nullptr;
  double value = std::strtod(s, &end);
  if (end == s || !(value >= 0) || std::isinf(value))
    fail(ErrorCode::kInvalidArgument, what, " '", text, "' is not a size; write e.g. 4GiB, 512MiB, 8GB or a byte count");
  std::string unit(end);
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KiB" || unit == "K") scale = 1024.0;
  else if (unit == "MiB" || unit == "M") scale = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") scale = kGiB;
  else if (unit == "TiB" || unit == "T") scale = kGiB * 1024;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  else fail(ErrorCode::kInvalidArgument, what, " '", text, "': unknown unit '", unit, "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  double bytes = value * scale;
  if (bytes > 9.2e18) fail(ErrorCode::kInvalidArgument, what, " '", text, "' is too large");
  return static_cast<int64_t>(bytes);
}

}  // namespace shardlm
