// shardlm quantize SRC --quantize awq|gptq|gptq-int8|fp8 --out DST: an
// unquantized checkpoint written in a published quantized layout by
// round-to-nearest (loader/quantize_checkpoint.h), to measure what a format
// costs on a trained model (`shardlm perplexity`, --dump-top1).
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "loader/quantize_checkpoint.h"

namespace shardlm::cli {
namespace {

struct QuantizeOptions {
  std::string src, out, format;
  int64_t group_size = 128;
  bool desc_act = false;
  bool asym = false;
  bool lm_head = false;
};

int run_quantize(const QuantizeOptions& o) {
  QuantConfig q = published_quant_config(o.format, o.group_size, o.desc_act, !o.asym, "--quantize");
  if (o.lm_head) enable_quantized_lm_head(q, "--lm-head");
  const QuantizeCheckpointResult r = quantize_checkpoint(o.src, o.out, q);
  std::printf("wrote %s: %s, %lld Linear modules quantized (round to nearest), %llu bytes of tensors\n", o.out.c_str(),
              r.spec.quant.describe().c_str(), static_cast<long long>(r.n_quantized),
              static_cast<unsigned long long>(r.total_size));
  return 0;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("quantize", "Write an unquantized checkpoint as AWQ, GPTQ or FP8 (round to nearest)");
  auto o = std::make_shared<QuantizeOptions>();
  sub->add_option("src", o->src, "Unquantized model directory")->required();
  sub->add_option("--quantize", o->format, "awq, gptq (4-bit), gptq-int8, fp8 (E4M3, blocks 128x128)")->required();
  sub->add_option("--out", o->out, "Output directory (created if missing)")->required();
  sub->add_option("--group-size", o->group_size, "AWQ/GPTQ group size (AWQ: 64 or 128; GPTQ: -1, 32, 64, 128)")
      ->capture_default_str();
  sub->add_flag("--desc-act", o->desc_act, "GPTQ act-order (rows grouped by decreasing column energy)");
  sub->add_flag("--asym", o->asym, "GPTQ asymmetric (default symmetric)");
  sub->add_flag("--lm-head", o->lm_head,
                "GPTQ: quantize lm_head too (\"lm_head\": true, as GPTQModel writes it; a tied model is written untied)");
  set_command_action(sub, [o] { return run_quantize(*o); });
}

SHARDLM_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace shardlm::cli
