// shardlm make-model: write a synthetic Hugging Face checkpoint with the
// shapes of a catalog model and seeded random weights (see
// loader/synthetic_checkpoint.h for the weight distributions and RNG).
#include <chrono>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "core/dtype.h"
#include "core/error.h"
#include "loader/model_catalog.h"
#include "loader/synthetic_checkpoint.h"

namespace shardlm::cli {
namespace {

struct MakeModelOptions {
  SyntheticModelOptions synth;
  std::string out;
  std::string dtype;  // "": bf16, or f16 for awq/gptq (as AutoAWQ/AutoGPTQ checkpoints)
  bool asym = false;
  bool tie = false;
  bool no_tie = false;
  bool no_norm_topk_prob = false;
  std::vector<int64_t> mlp_only_layers;
  CLI::Option* mlp_only_option = nullptr;  // given at all (an empty list is allowed)
};

int run_make_model(MakeModelOptions& o) {
  if (o.dtype.empty()) o.dtype = o.synth.quantize == "awq" || o.synth.quantize.rfind("gptq", 0) == 0 ? "f16" : "bf16";
  o.synth.sym = !o.asym;
  if (!parse_dtype(o.dtype, &o.synth.dtype))
    fail(ErrorCode::kInvalidArgument, "--dtype \"", o.dtype, "\" is not supported; use bf16, f16 or f32");
  if (o.tie && o.no_tie) fail(ErrorCode::kInvalidArgument, "--tie and --no-tie contradict each other; give one");
  if (o.mlp_only_option && o.mlp_only_option->count() > 0) o.synth.mlp_only_layers = o.mlp_only_layers;
  if (o.no_norm_topk_prob) o.synth.norm_topk_prob = false;
  if (o.tie) o.synth.tie_word_embeddings = true;
  if (o.no_tie) o.synth.tie_word_embeddings = false;
  const auto start = std::chrono::steady_clock::now();
  const SyntheticModelResult r = write_synthetic_model(o.out, o.synth);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const ModelSpec& s = r.spec;
  std::printf("wrote %s: %s-shaped %s, %lld layers, hidden %lld, intermediate %lld, heads %lld/%lld kv, head_dim %lld, vocab %lld%s\n",
              o.out.c_str(), o.synth.like.c_str(), s.architecture.c_str(), static_cast<long long>(s.n_layers),
              static_cast<long long>(s.hidden_size), static_cast<long long>(s.intermediate_size),
              static_cast<long long>(s.n_heads), static_cast<long long>(s.n_kv_heads), static_cast<long long>(s.head_dim),
              static_cast<long long>(s.vocab_size), s.tie_word_embeddings ? ", tied embeddings" : "");
  if (s.is_moe())
    std::printf("  experts: %lld per MoE layer (%lld of %lld layers), top-%lld, %lld columns each%s\n",
                static_cast<long long>(s.n_experts), static_cast<long long>(s.n_moe_layers()),
                static_cast<long long>(s.n_layers), static_cast<long long>(s.n_experts_per_token),
                static_cast<long long>(s.moe_intermediate_size), s.norm_topk_prob ? ", renormalised" : "");
  if (s.quant.enabled()) std::printf("  quantized: %s (round to nearest of the seeded weights)\n", s.quant.describe().c_str());
  std::printf("  weights: %s, %llu bytes in %zu file(s), seed %llu\n", dtype_torch_name(s.dtype),
              static_cast<unsigned long long>(r.total_size), r.weight_files.size(),
              static_cast<unsigned long long>(o.synth.seed));
  std::printf("  tokenizer: %lld ids (256 bytes + %lld merges + 3 special); eos <|im_end|> = %lld; %.2f s\n",
              static_cast<long long>(r.tokenizer_vocab), static_cast<long long>(r.n_merges),
              static_cast<long long>(s.eos_token_ids.empty() ? -1 : s.eos_token_ids[0]), seconds);
  return 0;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("make-model", "Write a synthetic checkpoint (real shapes, seeded random weights)");
  auto o = std::make_shared<MakeModelOptions>();
  sub->add_option("--like", o->synth.like, "Catalog model whose shapes to use (" + catalog_names() + ")")->required();
  sub->add_option("--out", o->out, "Output directory (created if missing)")->required();
  sub->add_option("--layers", o->synth.n_layers, "Decoder layers (0: the model's)")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "Weight dtype: bf16, f16 or f32 (default bf16; f16 with --quantize awq/gptq)");
  sub->add_option("--quantize", o->synth.quantize,
                  "Write a quantized checkpoint in the published layout: awq, gptq (4-bit), gptq-int8, fp8 (E4M3, blocks 128x128)");
  sub->add_option("--group-size", o->synth.group_size, "AWQ/GPTQ group size (AWQ: 64 or 128; GPTQ: -1, 32, 64, 128)")
      ->capture_default_str();
  sub->add_flag("--desc-act", o->synth.desc_act, "GPTQ act-order: rows grouped by decreasing importance, g_idx records it");
  sub->add_flag("--asym", o->asym, "GPTQ asymmetric (per-group zero points; default symmetric)");
  sub->add_flag("--lm-head", o->synth.quantize_lm_head,
                "GPTQ: quantize lm_head too (\"lm_head\": true, GPTQModel's layout); a tied model is written untied");
  sub->add_option("--seed", o->synth.seed, "Seed of the weight generator")->capture_default_str();
  sub->add_option("--vocab", o->synth.vocab_size, "Vocabulary size (0: the model's; at least 259)");
  sub->add_option("--shards", o->synth.n_shards, "Number of safetensors files (>1 writes an index)")->capture_default_str();
  sub->add_option("--hidden", o->synth.hidden_size, "Override hidden_size");
  sub->add_option("--intermediate", o->synth.intermediate_size, "Override intermediate_size");
  sub->add_option("--heads", o->synth.n_heads, "Override num_attention_heads");
  sub->add_option("--kv-heads", o->synth.n_kv_heads, "Override num_key_value_heads");
  sub->add_option("--head-dim", o->synth.head_dim, "Override head_dim (default hidden/heads when either changes)");
  sub->add_option("--sliding-window", o->synth.sliding_window,
                  "Positions a windowed layer attends to: Gemma 3's local layers; every layer of Mistral, Mixtral, Phi-3 (0: the model's)");
  sub->add_option("--final-logit-softcapping", o->synth.final_logit_softcapping,
                  "Gemma 3: final_logit_softcapping c (logits = c * tanh(logits / c)); default null, as released");
  sub->add_option("--original-max-position", o->synth.original_max_position,
                  "LongRoPE models: original_max_position_embeddings, where the long rope factors take over "
                  "(max_position_embeddings keeps its ratio to it)");
  sub->add_option("--experts", o->synth.n_experts, "MoE: experts per layer (0: the model's)");
  sub->add_option("--experts-per-token", o->synth.n_experts_per_token, "MoE: experts routed per token (0: the model's)");
  sub->add_option("--moe-intermediate", o->synth.moe_intermediate_size, "MoE: each expert's intermediate size (0: the model's)");
  sub->add_option("--decoder-sparse-step", o->synth.decoder_sparse_step, "Qwen3-MoE: experts on every Nth layer (0: the model's)");
  o->mlp_only_option = sub->add_option("--mlp-only-layers", o->mlp_only_layers, "Qwen3-MoE: layers with a dense MLP instead of experts")
                  ->delimiter(',');
  sub->add_flag("--no-norm-topk-prob", o->no_norm_topk_prob,
                "Qwen3-MoE: norm_topk_prob false (routing weights stay softmax probabilities)");
  sub->add_flag("--tie", o->tie, "Tie lm_head to the embedding");
  sub->add_flag("--no-tie", o->no_tie, "Write a separate lm_head");
  set_command_action(sub, [o] { return run_make_model(*o); });
}

}  // namespace

SHARDLM_REGISTER_COMMAND(setup);

}  // namespace shardlm::cli
