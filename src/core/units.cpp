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
