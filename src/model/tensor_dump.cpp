#include "model/tensor_dump.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

const std::vector<std::string>& TensorDump::known_names() {
  static const std::vector<std::string> names = {
      "embd",     "attn_norm", "q",       "k",        "v",           "q_norm",         "k_norm",
      "q_rope",   "k_rope",    "kqv",     "attn_out", "ffn_inp",     "ffn_norm",       "ffn_gate",
      "ffn_up",   "ffn_act",   "ffn_moe_logits",      "ffn_moe_topk", "ffn_moe_weights", "ffn_out",
      "l_out",    "result_norm"};
  return names;
}

TensorDump::TensorDump(std::vector<std::string> names) : names_(std::move(names)) {
  const auto& known = known_names();
  for (const std::string& n : names_) {
    if (n == "all") {
      all_ = true;
      continue;
    }
    if (std::find(known.begin(), known.end(), n) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      fail(ErrorCode::kInvalidArgument, "--dump-tensors: no intermediate is named \"", n, "\"; known: all, ", list);
    }
  }
}

bool TensorDump::wants(std::string_view name) const {
  return all_ || std::find(names_.begin(), names_.end(), name) != names_.end();
}

void TensorDump::record(backend::Backend& b, std::string_view name, int64_t layer, const Tensor& t) {
  if (!wants(name)) return;
  DumpedTensor d;
  d.name = std::string(name);
  d.layer = layer;
  for (int i = 0; i < t.rank(); ++i) d.shape.push_back(t.dim(i));
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<uint8_t> raw(t.nbytes());
  b.download(t, raw.data());
  d.values.resize(n);
  for (size_t i = 0; i < n; ++i) d.values[i] = load_as_f32(raw.data(), t.dtype(), i);
  tensors_.push_back(std::move(d));
}

}  // namespace shardlm
