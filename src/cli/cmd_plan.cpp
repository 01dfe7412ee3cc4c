// `shardlm plan MODEL --gpus 6xA100-40GB`: every layout the devices allow,
// budgeted per rank, checked against vLLM, one recommended. Exit 0 when a
// layout fits, 1 when none does (or the model cannot be read), 2 on usage errors.
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/speculative_config_flag.h"
#include "core/error.h"
#include "core/units.h"
#include "loader/model_catalog.h"
#include "model/draft_model.h"
#include "plan/checkpoint_headers.h"
#include "plan/explain.h"
#include "plan/planner.h"
#include "plan/plan_plot.h"
#include "plan/tensor_split.h"

namespace shardlm::cli {
namespace {

struct PlanCliOptions {
  std::string model;
  std::string gpus;
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 8;
  double gpu_memory_utilization = 0.9;
  int64_t max_num_batched_tokens = 8192;
  std::string dtype;
  std::string kv_cache_dtype = "auto";
  std::string quantization;  // catalog models: awq, gptq, gptq-int8, fp8
  int64_t group_size = 128;
  bool lm_head = false;  // --quantization gptq/gptq-int8: the lm_head quantized too (untied)
  std::string objective = "latency";
  int nodes = 1;
  double inter_node_gbit = 100.0;  // Gb/s
  double reserve_gib = static_cast<double>(kDefaultGpuReserveBytes) / kGiB;
  int64_t block_size = kDefaultBlockSize;
  bool json = false;
  bool enable_expert_parallel = false;
  std::string tensor_split;                 // --tensor-split: evaluate only this split
  std::vector<int64_t> pp_layer_partition;  // --pp-layer-partition: only this split of the layers
  double inter_node_latency_us = -1;        // < 0: by link type
  std::string plot;                         // --plot FILE.svg
  std::string speculative_config;           // --speculative-config JSON (cli/speculative_config_flag.h)
};

struct ResolvedModel {
  ModelSpec spec;
  std::string name;
  std::string hf_repo;
  int64_t official_total = -1;  // catalog: the official index total
  CheckpointHeaders headers;    // directory: what the safetensors headers say
  std::filesystem::path dir;    // its directory ("" for a catalog model)
};

ResolvedModel resolve_model(const std::string& model) {
  namespace fs = std::filesystem;
  ResolvedModel out;
  std::error_code ec;
  fs::path dir;
  if (fs::is_directory(model, ec)) {
    dir = model;
    if (!fs::exists(dir / "config.json"))
      fail(ErrorCode::kNotFound, model, ": directory has no config.json; give a Hugging Face model directory, a config.json"
           " or a catalog name (", catalog_names(), ")");
    out.spec = load_model_config(dir / "config.json");
  } else if (fs::is_regular_file(model, ec)) {
    out.spec = load_model_config(model);
    dir = fs::path(model).parent_path();
    if (dir.empty()) dir = ".";
  } else {
    const CatalogModel* m = find_catalog_model(model);
    if (!m)
      fail(ErrorCode::kNotFound, "model \"", model, "\" is not a directory, a config.json or a catalog name; the built-in "
           "catalog has: ", catalog_names());
    out.spec = catalog_model_spec(model);
    out.name = m->name;
    out.hf_repo = hf_repo_id(out.spec, m->hf_name);
    out.official_total = m->hf_total_size_bytes;
    return out;
  }
  out.name = model;
  out.hf_repo = model;
  out.dir = dir;
  out.headers = read_checkpoint_headers(dir);
  // Quantized checkpoints store their scales in F16, BF16 or F32: count what this one holds.
  for (const TensorSpec& t : expected_tensors(out.spec)) {
    if (t.part != QuantPart::kScales && t.part != QuantPart::kScaleInv) continue;
    auto it = out.headers.tensors.find(t.name);
    DType d;
    if (it != out.headers.tensors.end() && parse_safetensors_dtype(it->second.dtype, &d)) out.spec.quant.scales_dtype = d;
    break;
  }
  if (out.headers.n_files > 0) check_headers_match_spec(out.headers, out.spec);
  return out;
}

int usage_error(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return 2;
}

int run_plan(const PlanCliOptions& o) {
  ResolvedModel model = resolve_model(o.model);  // problems reading the model: Error → exit 1

  PlanOptions options;
  options.max_model_len = o.max_model_len;
  options.budget.max_num_seqs = o.max_num_seqs;
  options.budget.gpu_memory_utilization = o.gpu_memory_utilization;
  options.budget.max_num_batched_tokens = o.max_num_batched_tokens;
  options.budget.block_size = o.block_size;
  if (!(o.reserve_gib >= 0)) return usage_error("--reserve-gib must not be negative");
  options.budget.reserve_bytes = static_cast<int64_t>(o.reserve_gib * kGiB);
  options.objective = o.objective == "throughput" ? Objective::kThroughput : Objective::kLatency;
  if (o.enable_expert_parallel && !model.spec.is_moe())
    return usage_error("--enable-expert-parallel: " + model.spec.architecture +
                       " is a dense model without experts; the flag applies to mixture-of-experts models");
  options.expert_parallel = o.enable_expert_parallel;
  try {
    if (!o.tensor_split.empty()) options.tensor_split = parse_tensor_split(o.tensor_split);
  } catch (const Error& e) {
    return usage_error(e.what());
  }
  options.pp_layer_partition = o.pp_layer_partition;
  if (o.inter_node_latency_us != -1 && !(o.inter_node_latency_us >= 0))
    return usage_error("--inter-node-latency-us must not be negative");
  options.inter_node_latency = o.inter_node_latency_us < 0 ? -1 : o.inter_node_latency_us * 1e-6;
  if (!parse_kv_cache_dtype(o.kv_cache_dtype, &options.budget.kv_cache_dtype))
    return usage_error("--kv-cache-dtype \"" + o.kv_cache_dtype + "\": expected auto, bf16, f16, f32 or fp8");
  if (!o.dtype.empty()) {
    DType d;
    if (!parse_dtype(o.dtype, &d)) return usage_error("--dtype \"" + o.dtype + "\": expected bf16, f16 or f32");
    model.spec.dtype = d;
  } else if (model.headers.n_files > 0) {
    DType d;
    if (!model.headers.dtype.empty() && parse_dtype(model.headers.dtype, &d)) model.spec.dtype = d;
  }

  if (o.lm_head && o.quantization.empty())
    return usage_error("--lm-head needs --quantization gptq or gptq-int8 (a checkpoint's own quantization_config "
                       "says whether its lm_head is quantized)");
  if (!o.quantization.empty()) {
    if (model.spec.quant.enabled() || model.headers.n_files > 0)
      return usage_error("--quantization sizes a catalog model as its published quantized checkpoint; " + o.model +
                         " is a checkpoint, whose own quantization_config plan reads");
    try {
      model.spec.quant = published_quant_config(o.quantization, o.group_size, false, true, "--quantization");
      if (o.lm_head) {  // as `shardlm quantize --lm-head` writes it: a tied model untied
        enable_quantized_lm_head(model.spec.quant, "--lm-head");
        model.spec.tie_word_embeddings = false;
      }
      check_quantized_shapes(model.spec, "--quantization " + o.quantization);
    } catch (const Error& e) {
      return usage_error(e.what());
    }
    // As the published repositories: AWQ and GPTQ keep the rest in float16, FP8 in bfloat16.
    if (o.dtype.empty()) model.spec.dtype = o.quantization == "fp8" ? DType::kBF16 : DType::kF16;
    model.official_total = -1;  // the index total is the unquantized checkpoint's
  }

  // --speculative-config, parsed as serve parses it. A draft model is read
  // as the target is (config.json, its checkpoint's dtype) and must speak
  // the target's vocabulary (checked where the target is a directory).
  SpeculativeOptions so;
  try {
    so = parse_speculative_config(o.speculative_config);
  } catch (const Error& e) {
    return usage_error(e.what());
  }
  ModelSpec draft_spec;
  if (so.uses_draft_model()) {
    ResolvedModel draft = resolve_model(so.draft_model);  // a missing or bad config.json: Error → exit 1
    draft_spec = draft.spec;
    if (!model.dir.empty()) check_draft_vocabulary(model.dir, model.spec, draft.dir, draft.spec);
  }
  if (so.enabled()) {
    add_speculation(options.budget, so.num_speculative_tokens, so.uses_draft_model() ? &draft_spec : nullptr);
    options.speculative_config = o.speculative_config;
    options.num_speculative_tokens = so.num_speculative_tokens;
    options.draft_model = so.draft_model;
  }

  Plan plan;
  try {
    DeviceInventory devices = parse_device_inventory(o.gpus, o.nodes, o.inter_node_gbit * 1e9 / 8.0);
    plan = make_plan(model.spec, devices, options, model.name, model.hf_repo);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInvalidArgument) return usage_error(e.what());
    throw;
  }

  if (!o.plot.empty()) write_plan_svg(plan, o.plot);  // a file it cannot write: Error → exit 1
  if (o.json) {
    nlohmann::json j = plan_json(plan);
    j["model"]["official_total_bytes"] = model.official_total >= 0 ? nlohmann::json(model.official_total) : nlohmann::json();
    if (model.headers.n_files > 0)
      j["checkpoint"] = {{"files", model.headers.n_files},
                         {"total_bytes", model.headers.total_bytes},
                         {"dtype", model.headers.dtype},
                         {"tensors", model.headers.tensors.size()}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << render_plan_text(plan);
    if (model.official_total >= 0)
      std::cout << "Official checkpoint index total: " << with_commas(model.official_total) << " bytes ("
                << (model.official_total == plan.checkpoint_bytes ? "equal to" : "differs from")
                << " the shapes' total in " << dtype_torch_name(model.spec.dtype) << ")\n";
    if (model.headers.n_files > 0)
      std::cout << "Checkpoint: " << model.headers.n_files << " .safetensors file(s), " << model.headers.tensors.size()
                << " tensors, " << with_commas(model.headers.total_bytes) << " bytes by their headers"
                << (model.headers.dtype.empty() ? " (mixed dtypes)" : " (" + model.headers.dtype + ")") << "\n";
  }
  return plan.recommended >= 0 ? 0 : 1;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("plan", "Lay a model over devices: per-rank memory, every TP/PP/DP layout, vLLM's verdict");
  auto o = std::make_shared<PlanCliOptions>();
  sub->add_option("model", o->model, "Model directory, config.json, or catalog name (e.g. qwen2.5-7b)")->required();
  sub->add_option("--gpus", o->gpus,
                  "Devices: COUNTxNAME or COUNTxMEMORY, comma-separated groups (6xA100-40GB, 4x24GiB, "
                  "2xA100-80GB,2xA100-40GB)")
      ->required();
  sub->add_option("--max-model-len", o->max_model_len, "Context length to plan for (default: the largest that fits)");
  sub->add_option("--max-num-seqs", o->max_num_seqs, "Sequences per step")->capture_default_str();
  sub->add_option("--gpu-memory-utilization", o->gpu_memory_utilization, "Fraction of each device's memory to use")
      ->capture_default_str();
  sub->add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens per forward step (sizes the workspace)")
      ->capture_default_str();
  sub->add_option("--dtype", o->dtype, "Weight dtype: bf16, f16, f32 (default: the checkpoint's)");
  sub->add_option("--kv-cache-dtype", o->kv_cache_dtype, "KV cache dtype: auto, bf16, f16, f32, fp8")->capture_default_str();
  sub->add_option("--quantization", o->quantization,
                  "Size a catalog model as its published quantized checkpoint: awq, gptq, gptq-int8, fp8");
  sub->add_option("--group-size", o->group_size, "Group size for --quantization awq/gptq")->capture_default_str();
  sub->add_flag("--lm-head", o->lm_head,
                "With --quantization gptq/gptq-int8: the lm_head quantized too (\"lm_head\": true; a tied model untied)");
  sub->add_option("--objective", o->objective, "latency (one stream) or throughput (all streams)")
      ->check(CLI::IsMember({"latency", "throughput"}))
      ->capture_default_str();
  sub->add_option("--nodes", o->nodes, "Hosts the devices are split over, evenly and in order")->capture_default_str();
  sub->add_option("--inter-node-bandwidth", o->inter_node_gbit, "Link between hosts in Gb/s (100 = EDR InfiniBand / 100 GbE)")
      ->capture_default_str();
  sub->add_option("--inter-node-latency-us", o->inter_node_latency_us,
                  "Latency of one message hop between hosts in µs (default: 30 for ≥ 100 Gb/s InfiniBand/RoCE, 100 for "
                  "slower TCP Ethernet)");
  sub->add_option("--tensor-split", o->tensor_split,
                  "Evaluate only this split of the TP ranks (one weight per TP rank, or TP × PP stage-major; default: "
                  "even, or chosen from each device's memory and bandwidth on mixed devices)");
  sub->add_option("--pp-layer-partition", o->pp_layer_partition,
                  "Evaluate only this split of the layers, e.g. 10,18 (default: balanced by modelled time within memory)")
      ->delimiter(',');
  sub->add_option("--plot", o->plot, "Write an SVG picture of the recommended layout: bytes per device against capacity, "
                  "TP groups / PP stages / replicas, the chosen split beside the even one");
  sub->add_option("--reserve-gib", o->reserve_gib, "Runtime reserve per device in GiB (CUDA context, cuBLAS, NCCL)")
      ->capture_default_str();
  sub->add_option("--block-size", o->block_size, "Tokens per KV block")->capture_default_str();
  sub->add_option("--speculative-config", o->speculative_config,
                  std::string(kSpeculativeConfigHelp) +
                      ". plan counts what serve allocates for it: a draft model's weights, step buffers and KV cache "
                      "beside each replica's rank 0, and the k + 1 verification rows of logits per sequence");
  sub->add_flag("--json", o->json, "Print the full plan as JSON");
  sub->add_flag("--enable-expert-parallel", o->enable_expert_parallel,
                "MoE: experts go whole to the TP ranks (EP = TP), as vLLM's flag; attention stays tensor-parallel");
  set_command_action(sub, [o] { return run_plan(*o); });
}

}  // namespace
}  // namespace shardlm::cli

static void plan_setup(CLI::App& app) { shardlm::cli::setup(app); }
SHARDLM_REGISTER_COMMAND(plan_setup);
