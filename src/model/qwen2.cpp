// Qwen2 / Qwen2.5 (Qwen2ForCausalLM): the Llama graph plus biases on q, k and
// v (always present; config.json has no field for them). Qwen2.5 configs
// carry sliding-window fields with use_sliding_window false; we attend fully.
#include "core/error.h"
#include "model/family.h"

namespace shardlm {

FamilyGraph qwen2_graph(const ModelSpec& spec) {
  FamilyGraph g;
  g.name = "qwen2";
  g.qkv_bias = true;
  if (!spec.qkv_bias)
    fail(ErrorCode::kInvalidArgument, "Qwen2 model spec without q/k/v biases: Qwen2ForCausalLM always has them");
  g.rope = rope_config(spec);
  return g;
}

}  // namespace shardlm
