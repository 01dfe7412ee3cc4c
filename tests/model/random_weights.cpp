#include "random_weights.h"

#include <cmath>
#include <random>

namespace shardlm::testing {

std::shared_ptr<MemoryWeightSource> random_weights(const ModelSpec& spec, uint32_t seed) {
  auto src = std::make_shared<MemoryWeightSource>();
  std::mt19937 rng(seed);
  for (const TensorSpec& t : expected_tensors(spec)) {
    if (t.optional) continue;
    const int64_t n = shape_numel(t.shape);
    const bool is_norm = t.shape.size() == 1 && t.name.find("norm") != std::string::npos;
    const bool is_bias = t.name.find(".bias") != std::string::npos;
    // Linear weights scaled by 1/sqrt(fan_in) so activations stay O(1);
    // embeddings O(1); norms around 1.
    const float scale = is_norm ? 0.1f : is_bias ? 0.5f
                        : t.name.find("embed_tokens") != std::string::npos ? 1.0f
                        : 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(spec.dtype));
    for (int64_t i = 0; i < n; ++i)
      store_from_f32(bytes.data(), spec.dtype, static_cast<size_t>(i), (is_norm ? 1.0f : 0.0f) + dist(rng));
    src->add(t.name, spec.dtype, t.shape, std::move(bytes));
  }
  return src;
}

ModelSpec qwen25_7b_like(int64_t hidden, int64_t n_layers, int64_t intermediate, int64_t vocab) {
  ModelSpec s;
  s.architecture = "Qwen2ForCausalLM";
  s.model_type = "qwen2";
  s.family = Family::kQwen2;
  s.vocab_size = vocab;
  s.hidden_size = hidden;
  s.intermediate_size = intermediate;
  s.n_layers = n_layers;
  s.n_heads = 28;
  s.n_kv_heads = 4;
  s.head_dim = 128;
  s.rms_norm_eps = 1e-6;
  s.rope_theta = 1000000.0;
  s.max_position_embeddings = 32768;
  s.tie_word_embeddings = false;
  s.qkv_bias = true;
  s.dtype = DType::kBF16;
  s.eos_token_ids = {};
  return s;
}

}  // namespace shardlm::testing
