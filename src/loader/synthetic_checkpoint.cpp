#include "loader/synthetic_checkpoint.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/model_catalog.h"
#include "loader/quant_pack.h"
#include "loader/safetensors_writer.h"
#include "loader/synthetic_tokenizer.h"

namespace shardlm {

using nlohmann::json;

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// (center, std) of a tensor's elements; see the header.
std::pair<float, float> weight_distribution(const std::string& name, int64_t hidden_size,
                                            const std::vector<int64_t>& shape, bool tied) {
  if (ends_with(name, "norm.weight")) return {1.0f, 0.05f};  // input/post_attention/q/k/final norms
  if (ends_with(name, ".bias")) return {0.0f, 0.1f};
  const float head_std = 2.0f / std::sqrt(static_cast<float>(hidden_size));
  // (A multimodal checkpoint's language model has them under language_model.)
  if (ends_with(name, "lm_head.weight")) return {0.0f, head_std};
  if (ends_with(name, "model.embed_tokens.weight")) return {0.0f, tied ? head_std : 1.0f};
  const int64_t in = shape.size() == 2 ? shape[1] : 1;
  return {0.0f, 1.0f / std::sqrt(static_cast<float>(in))};
}

void write_json(const std::filesystem::path& path, const json& value) {
  std::ofstream out(path);
  if (!out) fail(ErrorCode::kIo, path.string(), ": cannot open for writing");
  out << value.dump(2) << "\n";
  if (!out) fail(ErrorCode::kIo, path.string(), ": write failed");
}

void check_positive(int64_t value, const char* option) {
  if (value < 0) fail(ErrorCode::kInvalidArgument, option, " must be positive, found ", value);
}

}  // namespace

float synthetic_weight_value(uint64_t seed, const std::string& tensor_name, int64_t hidden_size,
                             const std::vector<int64_t>& shape, bool tied, int64_t i) {
  const auto [center, std] = weight_distribution(tensor_name, hidden_size, shape, tied);
  const uint64_t key = splitmix64(seed ^ fnv1a64(tensor_name));
  // Top 24 bits -> u in [-1, 1), exact in f32.
  const float u = static_cast<float>(splitmix64(key + static_cast<uint64_t>(i)) >> 40) * (1.0f / 8388608.0f) - 1.0f;
  return center + std * 1.7320508f * u;
}

ModelSpec synthetic_model_spec(const SyntheticModelOptions& o) {
  ModelSpec spec = catalog_model_spec(o.like);
  const bool moe_option = o.n_experts > 0 || o.n_experts_per_token > 0 || o.moe_intermediate_size > 0 ||
                          o.decoder_sparse_step > 0 || o.mlp_only_layers.has_value() ||
                          o.norm_topk_prob.has_value();
  if (moe_option && !spec.is_moe())
    fail(ErrorCode::kInvalidArgument, "make-model: --experts, --experts-per-token, --moe-intermediate, --decoder-sparse-step and "
         "--mlp-only-layers apply to mixture-of-experts models; ", o.like, " is dense");
  if ((o.decoder_sparse_step > 0 || o.mlp_only_layers || o.norm_topk_prob) && spec.family != Family::kQwen3Moe)
    fail(ErrorCode::kInvalidArgument, "make-model: --decoder-sparse-step, --mlp-only-layers and --no-norm-topk-prob are "
         "Qwen3-MoE fields; ", o.like, " puts experts on every layer and always renormalises");
  check_positive(o.n_experts, "--experts");
  check_positive(o.n_experts_per_token, "--experts-per-token");
  check_positive(o.moe_intermediate_size, "--moe-intermediate");
  check_positive(o.decoder_sparse_step, "--decoder-sparse-step");
  check_positive(o.n_layers, "--layers");
  check_positive(o.vocab_size, "--vocab");
  check_positive(o.hidden_size, "--hidden");
  check_positive(o.intermediate_size, "--intermediate");
  check_positive(o.n_heads, "--heads");
  check_positive(o.n_kv_heads, "--kv-heads");
  check_positive(o.head_dim, "--head-dim");
  if (o.n_layers > 0) spec.n_layers = o.n_layers;
  if (o.vocab_size > 0) spec.vocab_size = o.vocab_size;
  if (o.intermediate_size > 0) spec.intermediate_size = o.intermediate_size;
  const bool reshaped = o.hidden_size > 0 || o.n_heads > 0;
  if (o.hidden_size > 0) spec.hidden_size = o.hidden_size;
  if (o.n_heads > 0) spec.n_heads = o.n_heads;
  if (o.n_kv_heads > 0) spec.n_kv_heads = o.n_kv_heads;
  else if (o.n_heads > 0 && spec.n_heads % spec.n_kv_heads != 0) spec.n_kv_heads = spec.n_heads;
  if (o.head_dim > 0) {
    spec.head_dim = o.head_dim;
  } else if (reshaped) {
    if (spec.hidden_size % spec.n_heads != 0)
      fail(ErrorCode::kInvalidArgument, "--hidden (", spec.hidden_size, ") is not a multiple of --heads (", spec.n_heads,
           "); give --head-dim explicitly");
    spec.head_dim = spec.hidden_size / spec.n_heads;
  }
  if (spec.n_heads % spec.n_kv_heads != 0)
    fail(ErrorCode::kInvalidArgument, "--heads (", spec.n_heads, ") must be a multiple of --kv-heads (", spec.n_kv_heads, ")");
  if (spec.rope_scaling.type == "longrope") {
    // One LongRoPE factor per rotary frequency: the catalog's, sampled evenly
    // when --head-dim (or --hidden / --heads) changes how many there are.
    const size_t half = static_cast<size_t>(spec.rotary_dim() / 2);
    for (std::vector<double>* f : {&spec.rope_scaling.short_factor, &spec.rope_scaling.long_factor}) {
      std::vector<double> resized(half);
      for (size_t i = 0; i < half && !f->empty(); ++i) resized[i] = (*f)[i * f->size() / half];
      *f = std::move(resized);
    }
  }
  if (spec.head_dim % 2 != 0)
    fail(ErrorCode::kInvalidArgument, "--head-dim must be even (rotary embeddings rotate pairs), found ", spec.head_dim);
  if (o.tie_word_embeddings) spec.tie_word_embeddings = *o.tie_word_embeddings;
  if (o.quantize_lm_head) {
    if (o.tie_word_embeddings.value_or(false))
      fail(ErrorCode::kInvalidArgument, "make-model: --lm-head writes a quantized lm_head of its own, which a tied ",
           "model does not have (GPTQModel quantizes untied lm_heads only); drop --tie");
    spec.tie_word_embeddings = false;
  }
  check_positive(o.sliding_window, "--sliding-window");
  check_positive(o.original_max_position, "--original-max-position");
  if (o.original_max_position > 0) {
    RopeScaling& r = spec.rope_scaling;
    if (r.type != "longrope")
      fail(ErrorCode::kInvalidArgument, "make-model: --original-max-position applies to LongRoPE models ",
           "(phi-3-mini-128k, phi-4-mini); ", o.like, " has no LongRoPE scaling");
    // The same factor (and so the same attention factor) on a shorter context.
    r.original_max_position_embeddings = o.original_max_position;
    spec.max_position_embeddings = static_cast<int64_t>(std::llround(r.factor * static_cast<double>(o.original_max_position)));
  }
  if (o.final_logit_softcapping < 0.0 || !std::isfinite(o.final_logit_softcapping))
    fail(ErrorCode::kInvalidArgument, "--final-logit-softcapping must be a positive number, found ",
         o.final_logit_softcapping);
  if (o.final_logit_softcapping > 0.0) {
    if (spec.family != Family::kGemma3)
      fail(ErrorCode::kInvalidArgument, "make-model: --final-logit-softcapping applies to Gemma 3 (gemma-3-*); ", o.like,
           " has no final_logit_softcapping field");
    spec.final_logit_softcapping = o.final_logit_softcapping;
  }
  if (o.sliding_window > 0) {
    // Mistral, Mixtral and Phi-3 window every layer (transformers' reading
    // of their sliding_window); Gemma 3 its local layers.
    const bool every_layer =
        spec.family == Family::kMistral || spec.family == Family::kMixtral || spec.family == Family::kPhi3;
    if (spec.sliding_layers.empty() && !every_layer)
      fail(ErrorCode::kInvalidArgument, "make-model: --sliding-window applies to models with a sliding window ",
           "(gemma-3-*, mistral-7b, mixtral-8x7b, phi-4); ", o.like, " has none");
    if (spec.sliding_layers.empty()) spec.sliding_layers.assign(static_cast<size_t>(spec.n_layers), true);
    spec.sliding_window = o.sliding_window;
  }
  if (spec.is_moe()) {
    if (o.n_experts > 0) spec.n_experts = o.n_experts;
    if (o.n_experts_per_token > 0) spec.n_experts_per_token = o.n_experts_per_token;
    if (spec.n_experts_per_token > spec.n_experts)
      fail(ErrorCode::kInvalidArgument, "--experts-per-token (", spec.n_experts_per_token, ") exceeds --experts (",
           spec.n_experts, ")");
    if (spec.family == Family::kMixtral) {
      if (o.moe_intermediate_size > 0 && o.intermediate_size > 0 && o.moe_intermediate_size != o.intermediate_size)
        fail(ErrorCode::kInvalidArgument, "--moe-intermediate and --intermediate differ, but Mixtral's experts are "
             "intermediate_size wide; give one");
      if (o.moe_intermediate_size > 0) spec.intermediate_size = o.moe_intermediate_size;
      spec.moe_intermediate_size = spec.intermediate_size;
    } else {
      if (o.moe_intermediate_size > 0) spec.moe_intermediate_size = o.moe_intermediate_size;
      if (o.decoder_sparse_step > 0) spec.decoder_sparse_step = o.decoder_sparse_step;
      if (o.norm_topk_prob) spec.norm_topk_prob = *o.norm_topk_prob;
      if (o.mlp_only_layers) {
        for (int64_t l : *o.mlp_only_layers)
          if (l < 0 || l >= spec.n_layers)
            fail(ErrorCode::kInvalidArgument, "--mlp-only-layers: layer ", l, " is outside [0, ", spec.n_layers, ")");
        spec.mlp_only_layers = *o.mlp_only_layers;
      }
    }
  }
  spec.dtype = o.dtype;
  spec.quant = synthetic_quant_config(o);
  if (o.n_shards < 1) fail(ErrorCode::kInvalidArgument, "--shards must be at least 1, found ", o.n_shards);

  const SyntheticTokenizer tok = build_synthetic_tokenizer(spec.vocab_size);  // throws if --vocab < 259
  spec.bos_token_id = tok.endoftext_id;
  spec.eos_token_ids = {tok.im_end_id};
  // Round trip through the strict parser: whatever we write must load.
  ModelSpec parsed = parse_model_config(model_config_json(spec), "make-model config.json");
  parsed.quant.scales_dtype = spec.quant.scales_dtype;
  return parsed;
}

QuantConfig synthetic_quant_config(const SyntheticModelOptions& o) {
  if (o.quantize.empty()) {
    if (o.desc_act || !o.sym || o.quantize_lm_head)
      fail(ErrorCode::kInvalidArgument, "--desc-act, --asym and --lm-head need --quantize gptq or gptq-int8");
    return QuantConfig{};
  }
  QuantConfig q = published_quant_config(o.quantize, o.group_size, o.desc_act, o.sym, "--quantize");
  if (o.quantize_lm_head) enable_quantized_lm_head(q, "--lm-head");
  return q;
}

std::vector<TensorSpec> synthetic_tensor_list(const ModelSpec& spec) {
  std::vector<TensorSpec> out;
  for (auto& t : expected_tensors(spec))
    if (!t.optional) out.push_back(std::move(t));
  return out;
}

SyntheticModelResult write_synthetic_model(const std::filesystem::path& dir, const SyntheticModelOptions& options) {
  SyntheticModelResult result;
  result.spec = synthetic_model_spec(options);
  const ModelSpec& spec = result.spec;
  const SyntheticTokenizer tok = build_synthetic_tokenizer(spec.vocab_size);
  result.tokenizer_vocab = tok.n_vocab();
  result.n_merges = static_cast<int64_t>(tok.merges.size());

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail(ErrorCode::kIo, dir.string(), ": cannot create directory: ", ec.message());
  // Stale files of another shard count would confuse readers.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (ends_with(name, ".safetensors") || name == "model.safetensors.index.json") std::filesystem::remove(entry.path());
  }

  json config = model_config_json(spec);
  config["transformers_version"] = "4.43.1";
  config["use_cache"] = true;
  write_json(dir / "config.json", config);
  write_json(dir / "generation_config.json", {{"bos_token_id", tok.endoftext_id},
                                              {"eos_token_id", json::array({tok.im_end_id, tok.endoftext_id})},
                                              {"pad_token_id", tok.endoftext_id},
                                              {"do_sample", false},
                                              {"transformers_version", "4.43.1"}});
  write_json(dir / "tokenizer.json", synthetic_tokenizer_json(tok));
  write_json(dir / "tokenizer_config.json", synthetic_tokenizer_config_json(tok, spec.max_position_embeddings));

  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::vector<TensorSpec>> modules;  // quantized Linear -> its parts
  std::map<std::string, const TensorSpec*> part_of;         // part name -> its spec in `modules`
  for (const auto& t : synthetic_tensor_list(spec)) {
    tensors.push_back({t.name, t.dtypes.empty() ? spec.dtype : t.dtypes.front(), t.shape});
    if (t.part != QuantPart::kNone) modules[t.module].push_back(t);
  }
  for (const auto& [module, parts] : modules)
    for (const TensorSpec& t : parts) part_of[t.name] = &t;
  const uint64_t seed = options.seed;
  const bool tied = spec.tie_word_embeddings;
  const int64_t hidden = spec.hidden_size;
  // First element of the output-projection rows of ids the tokenizer lacks.
  const int64_t unused_from = result.tokenizer_vocab * hidden;
  // Quantized parts: the whole module is quantized when its first part is
  // written; each part's bytes are kept until that part is done (parts of a
  // module are not adjacent: the writer orders tensors by dtype size).
  std::map<std::string, std::vector<uint8_t>> pending;
  auto fill_quantized = [&](const TensorToWrite& t, int64_t begin, int64_t count, void* out) {
    const TensorSpec& ts = *part_of.at(t.name);
    auto it = pending.find(t.name);
    if (it == pending.end()) {
      const std::string weight_name = ts.module + ".weight";
      const std::vector<int64_t> shape = {ts.out_features, ts.in_features};
      std::vector<float> w(static_cast<size_t>(ts.out_features * ts.in_features));
      for (size_t i = 0; i < w.size(); ++i)
        w[i] = synthetic_weight_value(seed, weight_name, hidden, shape, tied, static_cast<int64_t>(i));
      // A quantized lm_head's rows of ids the tokenizer lacks are zero too
      // (stored exactly: a zero group quantizes to its zero point).
      if (ts.slot == TensorSlot::kLmHead)
        std::fill(w.begin() + std::min<int64_t>(unused_from, static_cast<int64_t>(w.size())), w.end(), 0.0f);
      auto bytes = quantize_linear(spec.quant, w.data(), ts.out_features, ts.in_features, modules.at(ts.module));
      for (const TensorSpec& p : modules.at(ts.module)) pending[p.name] = std::move(bytes.at(p.part));
      it = pending.find(t.name);
    }
    const size_t esize = dtype_size(t.dtype);
    std::memcpy(out, it->second.data() + begin * esize, static_cast<size_t>(count) * esize);
    if (begin + count == t.n_elements()) pending.erase(it);
  };
  auto fill = [seed, tied, hidden, unused_from, &part_of, &fill_quantized](const TensorToWrite& t, int64_t begin,
                                                                           int64_t count, void* out) {
    if (part_of.count(t.name)) return fill_quantized(t, begin, count, out);
    auto [center, std] = weight_distribution(t.name, hidden, t.shape, tied);
    const bool output_rows = t.name == "lm_head.weight" || (tied && t.name == "model.embed_tokens.weight");
    const int64_t zero_from = output_rows ? unused_from : INT64_MAX;
    const uint64_t key = splitmix64(seed ^ fnv1a64(t.name));
    const float scale = std * 1.7320508f;
    const DType dtype = t.dtype;
    auto run = [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        const float u = static_cast<float>(splitmix64(key + static_cast<uint64_t>(begin + j)) >> 40) * (1.0f / 8388608.0f) - 1.0f;
        store_from_f32(out, dtype, static_cast<size_t>(j), begin + j >= zero_from ? 0.0f : center + scale * u);
      }
    };
    // Chunks are up to 16 MiB: split big ones over the cores.
    const int64_t n_threads = count < (1 << 16) ? 1 : std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> threads;
    for (int64_t t = 1; t < n_threads; ++t) threads.emplace_back(run, count * t / n_threads, count * (t + 1) / n_threads);
    run(0, count / n_threads);
    for (auto& th : threads) th.join();
  };
  ShardedWriteResult written = write_sharded_safetensors(dir, tensors, options.n_shards, fill);
  result.weight_files = written.files;
  result.total_size = written.total_size;
  return result;
}

}  // namespace shardlm
