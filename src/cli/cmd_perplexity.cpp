// shardlm perplexity [MODEL] FILE: the model's perplexity on a text file
// (UTF-8, encoded with the model's tokenizer), on ranks as threads. For the
// quality cost of quantization, a bf16/fp8 KV cache or a layout: run it twice
// and compare. --json prints one object:
//   {"model", "file", "tokens", "scored", "windows", "context", "layout",
//    "kv_cache_dtype", "mean_nll", "perplexity", "seconds"}
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "plan/tensor_split.h"
#include "cli/command.h"
#include "cli/default_model.h"
#include "core/error.h"
#include "loader/model_spec.h"
#include "model/perplexity.h"
#include "tokenizer/tokenizer.h"

#include "cli/device_flag.h"

namespace shardlm::cli {
namespace {

struct PerplexityCliOptions {
  std::vector<std::string> args;  // [MODEL] FILE
  int64_t context = 0;
  int64_t max_tokens = 0;
  int tp = 1;
  int pp = 1;
  std::string tensor_split;                // --tensor-split W0,W1,...
  std::vector<int64_t> pp_layer_partition; // --pp-layer-partition
  std::string kv_dtype;  // "": f32 on cpu, bf16 on cuda
  std::string device = "cpu";
  int64_t block_size = 16;
  bool json = false;
  std::string dump_top1;
  std::string quant_activations;  // --quant-activations int8|f32 ("" = the environment's, else int8)
  std::string dense_activations;  // --dense-activations f32|bf16 ("" = the environment's, else f32)
};

int run_perplexity(const PerplexityCliOptions& o) {
  apply_quant_activations(o.quant_activations);
  apply_dense_activations(o.dense_activations, o.device);
  const std::string model = resolve_model_dir(o.args.size() == 2 ? o.args[0] : "", "perplexity");
  const std::string file = o.args.back();
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(ErrorCode::kNotFound, "perplexity: cannot read FILE '", file, "'; give a UTF-8 text file");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::filesystem::path dir(model);
  const ModelSpec spec = load_model_config(dir / "config.json");
  const Tokenizer tokenizer = Tokenizer::load(dir);
  const std::vector<int32_t> ids = tokenizer.encode(text, false);

  PerplexityOptions p;
  p.layout.tp = o.tp;
  p.layout.pp = o.pp;
  if (!o.tensor_split.empty()) p.layout.tensor_split = parse_tensor_split(o.tensor_split);
  p.layout.pp_layer_partition = o.pp_layer_partition;
  validate_layout(spec, p.layout);
  p.context = o.context;
  p.max_scored = o.max_tokens;
  p.block_size = o.block_size;
  p.device = device_for_thread_ranks(o.device, o.tp * o.pp);
  const std::string kv_name = o.kv_dtype.empty() ? (p.device.is_cpu() ? "f32" : "bf16") : o.kv_dtype;
  if (o.kv_dtype.empty()) {
    p.kv_dtype = default_kv_dtype(p.device);
  } else if (o.kv_dtype == "auto") {
    p.kv_dtype = spec.dtype;
  } else if (o.kv_dtype == "fp8" || o.kv_dtype == "fp8_e4m3") {
    p.kv_dtype = DType::kF8E4M3;  // written with scale 1, widened in registers by attention
  } else if (!parse_dtype(o.kv_dtype, &p.kv_dtype)) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-dtype \"", o.kv_dtype, "\": use auto, bf16, f16, f32 or fp8 (E4M3)");
  }
  const PerplexityResult r = perplexity_local(spec, open_checkpoint(dir), ids, p);
  const int64_t context = o.context > 0 ? o.context : spec.max_position_embeddings;
  if (!o.dump_top1.empty()) {
    // Int32 LE, one per scored position: compare two runs' files for the top-1 agreement.
    std::ofstream out(o.dump_top1, std::ios::binary);
    out.write(reinterpret_cast<const char*>(r.top1.data()), static_cast<std::streamsize>(r.top1.size() * sizeof(int32_t)));
    if (!out) fail(ErrorCode::kIo, "perplexity: cannot write --dump-top1 '", o.dump_top1, "'");
  }
  if (o.json) {
    nlohmann::json j = {{"model", model},           {"file", file},
                        {"tokens", ids.size()},     {"scored", r.n_scored},
                        {"windows", r.n_windows},   {"context", context},
                        {"layout", p.layout.to_string()}, {"kv_cache_dtype", kv_name},
                        {"device", p.device.to_string()},
                        {"mean_nll", r.mean_nll()}, {"perplexity", r.perplexity()},
                        {"seconds", r.seconds}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("perplexity: %.4f\nmean_nll: %.6f nats/token\nscored: %lld of %zu tokens in %lld windows of %lld\n",
                r.perplexity(), r.mean_nll(), static_cast<long long>(r.n_scored), ids.size(),
                static_cast<long long>(r.n_windows), static_cast<long long>(context));
    std::fprintf(stderr, "%s, kv %s: %.1f s (%.0f tokens/s)\n", p.layout.to_string().c_str(), kv_name.c_str(),
                 r.seconds, r.n_scored / std::max(r.seconds, 1e-9));
  }
  return 0;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("perplexity", "Perplexity of a model on a text file (ranks as threads)");
  auto o = std::make_shared<PerplexityCliOptions>();
  sub->add_option("paths", o->args, "[MODEL] FILE: model directory (default: the demo model) and a UTF-8 text file")
      ->required()
      ->expected(1, 2);
  sub->add_option("--context", o->context, "Tokens per window (default: the model's max_position_embeddings)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--max-tokens", o->max_tokens, "Score at most this many tokens (default: all)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub->add_option("--tp,--tensor-parallel-size", o->tp, "Tensor-parallel ranks (threads)")->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_option("--pp,--pipeline-parallel-size", o->pp, "Pipeline stages (threads)")->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_option("--tensor-split", o->tensor_split, "Relative shares of the TP ranks (mixed devices): one weight per TP rank, or TP × PP stage-major, e.g. 3,1 (default: even)");
  sub->add_option("--pp-layer-partition", o->pp_layer_partition, "Layers per stage, e.g. 10,18 (default: balanced by bytes)")
      ->delimiter(',');
  sub->add_option("--dump-top1", o->dump_top1,
                  "Write the argmax token of every scored position here (int32 LE): top-1 agreement between models");
  sub->add_option("--kv-cache-dtype", o->kv_dtype,
                  "f32, bf16, f16, fp8 (E4M3), or auto (the weights' dtype); default f32 on cpu, bf16 on cuda");
  add_device_option(sub, &o->device);
  add_quant_activations_option(sub, &o->quant_activations);
  add_dense_activations_option(sub, &o->dense_activations);
  sub->add_option("--block-size", o->block_size, "Tokens per KV block")->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_flag("--json", o->json, "Print one JSON object");
  set_command_action(sub, [o] { return run_perplexity(*o); });
}

SHARDLM_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace shardlm::cli
