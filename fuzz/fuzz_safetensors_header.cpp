// libFuzzer entry: any bytes as a whole safetensors file. The parser must
// return problems, never crash, hang or read outside the buffer.
#include <cstddef>
#include <cstdint>
#include <span>

#include "loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardlm::SafetensorsHeader header = shardlm::parse_safetensors_header(std::span(data, size), "fuzz.safetensors");
  // Touch what callers use: every usable entry must lie inside the buffer.
  for (const shardlm::SafetensorsEntry& e : header.tensors) {
    if (!e.usable) continue;
    if (header.data_start + e.end > size) __builtin_trap();
    if (e.end > e.begin) {
      volatile uint8_t last = data[header.data_start + e.end - 1];
      (void)last;
    }
  }
  for (const shardlm::Problem& p : header.problems) (void)p.text();
  return 0;
}
