// shardlm generate: one prompt through the model on this machine, ranks of a
// TP × PP layout as threads (LocalComm); under mpirun with more than one
// process, the ranks are the processes (generate_mpi) and rank 0 prints. --json prints one object:
//   {"prompt_token_ids": [...], "token_ids": [...], "text": "...", "finish_reason": "length"|"stop"}
// --dump-logits FILE writes the logits of the last prompt position (the
// distribution the first new token came from) as raw little-endian f32 [vocab].
// --dump-tensors NAMES prints the named intermediates (model/tensor_dump.h)
// per layer and step to stderr; --dump-tensors-json FILE writes them whole.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "plan/tensor_split.h"
#include "cli/command.h"
#include "cli/default_model.h"
#include "loader/generation_config.h"
#include "cli/auto_layout_flag.h"
#include "cli/device_flag.h"
#include "cli/speculative_config_flag.h"
#include "backend/device/decode_graphs.h"
#include "backend/device/device_choice.h"
#include "comm/mpi_comm.h"
#include "core/error.h"
#include "engine/mpi_group_executor.h"
#include "loader/model_spec.h"
#include "model/decode_bench.h"
#include "model/draft_model.h"
#include "model/generate.h"
#include "sampling/device_sampling.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"
#if __has_include("tokenizer/chat_template/chat_template.h")
#include "tokenizer/chat_template/chat_template.h"
#include "tokenizer/chat_template/model_template.h"
#define SHARDLM_HAVE_CHAT_TEMPLATE 1
#endif

namespace shardlm::cli {
namespace {

struct GenerateCliOptions {
  std::string model;
  std::string prompt;
  std::string prompt_ids;
  std::string chat;
  int64_t max_tokens = 16;
  double temperature = 0.0;
  double top_p = 1.0;
  int32_t top_k = -1;
  double min_p = 0.0;
  std::optional<uint64_t> seed;
  bool json = false;
  std::string dump_logits;
  std::string dump_routing;
  std::string dump_tensors;       // comma-separated names
  std::string dump_tensors_json;  // FILE
  bool enable_expert_parallel = false;
  std::string tp = "1";  // a degree, or auto
  int pp = 1;
  std::string tensor_split;                // --tensor-split W0,W1,...
  std::vector<int64_t> pp_layer_partition; // --pp-layer-partition
  std::string kv_dtype;  // "": f32 on cpu (exact), bf16 on cuda; bf16 halves the bytes at ~1e-3 relative logit error
  std::string device = "cpu";
  std::string decode_bench;  // "1,8,64": time decode steps of these many sequences instead of generating
  std::string cuda_graphs;   // --cuda-graphs on|off ("" = the device's default)
  bool batch_invariant = false;  // --batch-invariant
  std::string speculative_config;  // --speculative-config JSON (vLLM's flag)
  std::string quant_activations;  // --quant-activations int8|f32 ("" = the environment's, else int8)
  std::string dense_activations;  // --dense-activations f32|bf16 ("" = the environment's, else f32)
  std::string sampling_device = "host";  // --sampling-device host|device
  int64_t decode_context = 256;
  int64_t decode_steps = 32;
  int64_t block_size = 16;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && item[used] == ' ') ++used;
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      fail(ErrorCode::kInvalidArgument, "--prompt-ids: \"", item, "\" is not a token id; give comma-separated ids like 1,2,3");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) fail(ErrorCode::kInvalidArgument, "--prompt-ids is empty; give comma-separated ids like 1,2,3");
  return ids;
}


#ifdef SHARDLM_HAVE_CHAT_TEMPLATE
// tokenizer_config.json's "chat_template" (a string, or a list of {name,
// template} where "default" is used) rendered for one user message.
std::string render_chat_prompt(const std::filesystem::path& dir, const std::string& message) {
  auto tmpl = chat_template::load_model_chat_template(dir);
  if (!tmpl)
    fail(ErrorCode::kNotFound, (dir / "tokenizer_config.json").string(),
         " has no \"chat_template\"; use --prompt with the text instead of --chat");
  chat_template::ChatInputs inputs;
  inputs.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", message}}});
  inputs.add_generation_prompt = true;
  return tmpl->render(inputs);
}
#else
std::string render_chat_prompt(const std::filesystem::path&, const std::string&) { return ""; }
#endif

// Processes mpirun started (1 when not under mpirun).
int mpi_world_size() {
  const char* n = launched_by_mpirun() ? std::getenv("OMPI_COMM_WORLD_SIZE") : nullptr;
  return n ? std::max(1, std::atoi(n)) : 1;
}

// --decode-bench B1,B2,...: decode steps of B sequences, each holding
// --decode-context cached tokens, for each B over one load of the model; one
// JSON line (with --json) or a sentence per B.
int run_decode_bench(const GenerateCliOptions& o) {
  if (!o.prompt.empty() || !o.prompt_ids.empty() || !o.chat.empty())
    fail(ErrorCode::kInvalidArgument, "--decode-bench times decode steps on synthetic sequences; give no prompt with it");
  if (mpi_world_size() > 1) fail(ErrorCode::kUnsupported, "--decode-bench runs its ranks as threads; run it without mpirun");
  const std::filesystem::path dir(resolve_model_dir(o.model, "generate"));
  const ModelSpec spec = load_model_config(dir / "config.json");
  DecodeBenchOptions d;
  d.layout.tp = parse_tp_flag(o.tp);
  if (d.layout.tp == kAutoDegree) fail(ErrorCode::kInvalidArgument, "--decode-bench needs an explicit --tp");
  d.layout.pp = o.pp;
  if (!o.tensor_split.empty()) d.layout.tensor_split = parse_tensor_split(o.tensor_split);
  d.layout.pp_layer_partition = o.pp_layer_partition;
  validate_layout(spec, d.layout);
  d.device = device_for_thread_ranks(o.device, d.layout.tp * d.layout.pp);
  d.graphs.enabled = backend::parse_cuda_graphs_flag(o.cuda_graphs, !d.device.is_cpu());
  d.batch_invariant = o.batch_invariant;
  std::vector<int64_t> batches;
  for (int32_t b : parse_ids(o.decode_bench)) {
    if (b < 1 || b > 4096)
      fail(ErrorCode::kInvalidArgument, "--decode-bench ", o.decode_bench, ": each batch must be 1 to 4096");
    batches.push_back(b);
  }
  d.context = o.decode_context;
  d.n_steps = o.decode_steps;
  d.block_size = o.block_size;
  if (o.kv_dtype.empty()) {
    d.kv_dtype = default_kv_dtype(d.device);
  } else if (o.kv_dtype == "auto") {
    d.kv_dtype = spec.dtype;
  } else if (o.kv_dtype == "fp8" || o.kv_dtype == "fp8_e4m3") {
    d.kv_dtype = DType::kF8E4M3;
  } else if (!parse_dtype(o.kv_dtype, &d.kv_dtype)) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-dtype \"", o.kv_dtype, "\": use auto, bf16, f16, f32 or fp8 (E4M3)");
  }
  const std::vector<DecodeBenchResult> results = decode_bench_batches(spec, open_checkpoint(dir), d, batches);
  if (!results.empty() && !results[0].graphs.empty()) std::fprintf(stderr, "%s\n", results[0].graphs.c_str());
  for (size_t k = 0; k < batches.size(); ++k) {
    const DecodeBenchResult& r = results[k];
    if (o.json) {
      nlohmann::json j = {{"device", d.device.to_string()}, {"layout", d.layout.to_string()}, {"batch", batches[k]},
                          {"context", d.context},           {"steps", r.n_steps},           {"seconds", r.seconds},
                          {"tok_per_s", r.tokens_per_second}, {"ms_per_step", 1e3 * r.seconds / r.n_steps},
                          {"weight_bytes", r.weight_bytes}, {"weight_bytes_read_per_step", r.weight_bytes_read},
                          {"kv_bytes_read_per_step", r.kv_bytes_read},
                          {"bytes_per_step", r.bytes_per_step()}, {"cuda_graphs", d.graphs.enabled},
                          {"graph_replays", r.graph_replays}, {"prefill_tokens", r.prefill_tokens},
                          {"prefill_tok_per_s", r.prefill_tokens_per_second()}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      if (k == 0)
        std::printf("prefill of %lld tokens on %s, %s: %.1f tok/s\n", static_cast<long long>(r.prefill_tokens),
                    d.device.to_string().c_str(), d.layout.to_string().c_str(), r.prefill_tokens_per_second());
      std::printf("decode batch %lld at context %lld on %s, %s: %.1f tok/s (%.3f ms/step; %lld bytes read per step)\n",
                  static_cast<long long>(batches[k]), static_cast<long long>(d.context), d.device.to_string().c_str(),
                  d.layout.to_string().c_str(), r.tokens_per_second, 1e3 * r.seconds / r.n_steps,
                  static_cast<long long>(r.bytes_per_step()));
    }
  }
  return 0;
}

int run_generate(const GenerateCliOptions& o) {
  apply_quant_activations(o.quant_activations);
  apply_dense_activations(o.dense_activations, o.device);
  if (!o.decode_bench.empty()) return run_decode_bench(o);
  const int n_inputs = !o.prompt.empty() + !o.prompt_ids.empty() + !o.chat.empty();
  if (n_inputs != 1)
    fail(ErrorCode::kInvalidArgument, "give exactly one of --prompt TEXT, --prompt-ids 1,2,3 or --chat TEXT");
#ifndef SHARDLM_HAVE_CHAT_TEMPLATE
  if (!o.chat.empty())
    fail(ErrorCode::kUnsupported, "--chat needs the chat template renderer, which this build does not have; ",
         "use --prompt with the rendered text or --prompt-ids");
#endif
  const std::filesystem::path dir(resolve_model_dir(o.model, "generate"));
  const ModelSpec spec = load_model_config(dir / "config.json");
  // The tokenizer is needed for --prompt; with --prompt-ids it only turns the
  // output into text, when the directory has one.
  std::optional<Tokenizer> tokenizer;
  if (o.prompt_ids.empty() || std::filesystem::exists(dir / "tokenizer.json")) tokenizer = Tokenizer::load(dir);
  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty()) {
    prompt = parse_ids(o.prompt_ids);
  } else if (!o.prompt.empty()) {
    prompt = tokenizer->encode(o.prompt, true);
  } else {
    // As transformers' apply_chat_template(tokenize=True): render, then encode without the post-processor.
    prompt = tokenizer->encode(render_chat_prompt(dir, o.chat), false);
  }
  if (prompt.empty()) fail(ErrorCode::kInvalidArgument, "--prompt encodes to no tokens; give some text");

  GenerateOptions g;
  g.layout.tp = parse_tp_flag(o.tp);
  g.layout.pp = o.pp;
  g.layout.expert_parallel = o.enable_expert_parallel;
  if (!o.dump_routing.empty() && !spec.is_moe())
    fail(ErrorCode::kInvalidArgument, "--dump-routing: ", spec.architecture, " is a dense model; it has no experts to route to");
  if (!o.dump_tensors_json.empty() && o.dump_tensors.empty())
    fail(ErrorCode::kInvalidArgument, "--dump-tensors-json needs --dump-tensors NAMES (which intermediates to write)");
  for (std::string_view rest = o.dump_tensors; !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string name(rest.substr(0, comma));
    if (!name.empty()) g.dump_tensors.push_back(name);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  if (!o.dump_routing.empty()) g.dump_tensors.push_back("ffn_moe_topk");  // the routing is that intermediate
  if (!o.tensor_split.empty()) g.layout.tensor_split = parse_tensor_split(o.tensor_split);
  g.layout.pp_layer_partition = o.pp_layer_partition;
  if (o.enable_expert_parallel && !spec.is_moe())
    fail(ErrorCode::kInvalidArgument, "--enable-expert-parallel: ", spec.architecture,
         " is a dense model without experts; drop the flag (it applies to mixture-of-experts models)");
  const bool tp_auto = g.layout.tp == kAutoDegree;
  check_auto_alone(tp_auto, o.pp, 1, !o.pp_layer_partition.empty() || !o.tensor_split.empty());
  if (!tp_auto) validate_layout(spec, g.layout);  // a bad --tensor-split / --pp-layer-partition fails before loading
  g.max_tokens = o.max_tokens;
  g.eos_token_ids = load_eos_token_ids(dir, spec);
  g.block_size = o.block_size;
  g.batch_invariant = o.batch_invariant;
  g.speculative = parse_speculative_config(o.speculative_config);
  if (g.speculative.enabled()) g.batch_invariant = true;  // verification's rows must equal 1-row decode steps
  if (g.speculative.uses_draft_model())
    check_draft_vocabulary(dir, spec, g.speculative.draft_model,
                           load_model_config(std::filesystem::path(g.speculative.draft_model) / "config.json"));
  const bool under_mpi = mpi_world_size() > 1;
  if (!under_mpi) g.device = device_for_thread_ranks(o.device, tp_auto ? 1 : g.layout.tp * g.layout.pp);
  if (!under_mpi) g.graphs.enabled = backend::parse_cuda_graphs_flag(o.cuda_graphs, !g.device.is_cpu());
  if (o.kv_dtype.empty()) {
    g.kv_dtype = default_kv_dtype(g.device);
  } else if (o.kv_dtype == "auto") {
    g.kv_dtype = spec.dtype;
  } else if (o.kv_dtype == "fp8" || o.kv_dtype == "fp8_e4m3") {
    g.kv_dtype = DType::kF8E4M3;  // written with scale 1, widened in registers by attention
  } else if (!parse_dtype(o.kv_dtype, &g.kv_dtype)) {
    fail(ErrorCode::kInvalidArgument, "--kv-cache-dtype \"", o.kv_dtype, "\": use auto, bf16, f16, f32 or fp8 (E4M3)");
  }
  SamplingParams params;
  params.temperature = o.temperature;
  params.top_p = o.top_p;
  params.top_k = o.top_k;
  params.min_p = o.min_p;
  params.seed = o.seed;
  params.validate();
  if (o.sampling_device == "device") {
    if (under_mpi)
      fail(ErrorCode::kUnsupported, "--sampling-device device: generate under mpirun samples on the host; drop the flag");
    if (g.device.is_cpu())
      fail(ErrorCode::kInvalidArgument, "--sampling-device device needs a GPU (--device cuda): the CPU backend has no "
           "device sampler (its logits are already in host memory)");
    if (!o.dump_logits.empty())
      fail(ErrorCode::kInvalidArgument, "--dump-logits needs the logits on the host; use --sampling-device host");
    const SamplingFallback why = row_sampling_fallback(RowSamplingNeeds{&params}, /*device_sampler=*/true);
    if (why == SamplingFallback::kNone) {
      g.device_sampling = true;
      g.device_row.temperature = static_cast<float>(params.temperature);
      g.device_row.top_k = params.top_k;
      g.device_row.top_p = static_cast<float>(params.top_p);
      g.device_row.min_p = static_cast<float>(params.min_p);
    } else {
      std::fprintf(stderr, "%s\n", SamplingFallbackLog().note(why).c_str());
    }
  }
  auto sampler = std::make_shared<std::optional<Sampler>>();
  g.pick = [&, sampler](const float* logits, int64_t vocab, const std::vector<int32_t>&) -> int32_t {
    if (!sampler->has_value()) sampler->emplace(params, prompt, vocab);
    return (*sampler)->sample({logits, static_cast<size_t>(vocab)}).token;
  };

  // -tp auto: one stream, so plan's latency objective and no replicas.
  auto choose_layout = [&]() {
    PlanOptions po;
    po.objective = Objective::kLatency;
    po.max_model_len = std::min<int64_t>(static_cast<int64_t>(prompt.size()) + o.max_tokens, spec.max_position_embeddings);
    po.budget.max_num_seqs = 1;
    po.budget.max_num_batched_tokens = static_cast<int64_t>(prompt.size());
    po.budget.block_size = o.block_size;
    po.expert_parallel = o.enable_expert_parallel;
    if (!parse_kv_cache_dtype(o.kv_dtype.empty() ? std::string(g.device.is_cpu() ? "f32" : "bf16") : o.kv_dtype,
                              &po.budget.kv_cache_dtype))
      fail(ErrorCode::kInvalidArgument, "--kv-cache-dtype \"", o.kv_dtype, "\": use auto, bf16, f16, f32 or fp8 (E4M3)");
    const AutoLayoutChoice c = plan_auto_layout(spec, run_ranks(), po, /*max_dp=*/1);
    std::fprintf(stderr, "%s\n", c.reason.c_str());
    return c.layout;
  };

  GenerateResult r;
  if (under_mpi) {
    if (!g.dump_tensors.empty())
      fail(ErrorCode::kInvalidArgument, o.dump_routing.empty() ? "--dump-tensors" : "--dump-routing",
           " is for the threads path; run without mpirun to record intermediates");
#ifdef SHARDLM_HAVE_MPI
    g.device = device_for_mpi_process(o.device);  // one GPU per process: local rank % GPUs
    if (o.cuda_graphs == "on")
      fail(ErrorCode::kUnsupported, "--cuda-graphs on: generate under mpirun runs its steps eagerly (graphs are "
           "wired into the threads path, TP = PP = 1); run without mpirun, or drop the flag");
    if (o.kv_dtype.empty()) g.kv_dtype = default_kv_dtype(g.device);
    MpiRuntime runtime(nullptr, nullptr);
    auto world = runtime.world();
    if (tp_auto) g.layout = agree_on_layout(*world, choose_layout);
    std::vector<RankBytes> bytes;
    r = generate_mpi(*world, dir, prompt, g, &bytes);
    if (world->rank() != 0) return 0;  // rank 0 alone prints
    std::fprintf(stderr, "%s", describe_rank_bytes(bytes).c_str());
#else
    fail(ErrorCode::kUnsupported, "started by mpirun with ", mpi_world_size(),
         " processes, but this build has no MPI; configure with -DSHARDLM_MPI=ON");
#endif
  } else {
    if (tp_auto) g.layout = choose_layout();
    r = generate_local(spec, open_checkpoint(dir), prompt, g);
    if (!r.graphs.empty())
      std::fprintf(stderr, "%s; %lld decode steps replayed\n", r.graphs.c_str(), static_cast<long long>(r.graph_replays));
  }
  if (!o.dump_logits.empty()) {
    std::ofstream out(o.dump_logits, std::ios::binary);
    out.write(reinterpret_cast<const char*>(r.prompt_logits.data()),
              static_cast<std::streamsize>(r.prompt_logits.size() * sizeof(float)));
    if (!out) fail(ErrorCode::kIo, "--dump-logits: cannot write ", o.dump_logits);
  }
  if (!o.dump_routing.empty()) {
    // {"top_k": k, "layers": {"L": [[e0, e1, ...] per position]}} for the sparse layers.
    nlohmann::json j;
    j["top_k"] = spec.n_experts_per_token;
    j["layers"] = nlohmann::json::object();
    for (const DumpedTensor& t : r.tensors) {
      if (t.name != "ffn_moe_topk") continue;
      nlohmann::json& rows = j["layers"][std::to_string(t.layer)];
      if (rows.is_null()) rows = nlohmann::json::array();
      const size_t k = static_cast<size_t>(t.shape.back());  // [n_tokens, top_k]
      for (size_t i = 0; i + k <= t.values.size(); i += k) {
        std::vector<int32_t> row;
        for (size_t e = 0; e < k; ++e) row.push_back(static_cast<int32_t>(t.values[i + e]));
        rows.push_back(row);
      }
    }
    std::ofstream out(o.dump_routing);
    out << j.dump() << "\n";
    if (!out) fail(ErrorCode::kIo, "--dump-routing: cannot write ", o.dump_routing);
  }
  if (!o.dump_tensors.empty()) {
    // One line per (name, layer, step) to stderr: shape, the first values, mean |x|.
    for (const DumpedTensor& t : r.tensors) {
      if (std::find(g.dump_tensors.begin(), g.dump_tensors.end(), t.name) == g.dump_tensors.end() &&
          std::find(g.dump_tensors.begin(), g.dump_tensors.end(), "all") == g.dump_tensors.end())
        continue;  // only asked for by --dump-routing
      double sum_abs = 0;
      for (float v : t.values) sum_abs += std::abs(v);
      std::ostringstream line;
      line << t.name << " layer " << t.layer << " " << shape_string(t.shape) << ":";
      for (size_t i = 0; i < std::min<size_t>(6, t.values.size()); ++i) line << " " << t.values[i];
      if (t.values.size() > 6) line << " ...";
      line << " mean|x| " << (t.values.empty() ? 0.0 : sum_abs / static_cast<double>(t.values.size()));
      std::fprintf(stderr, "%s\n", line.str().c_str());
    }
    if (!o.dump_tensors_json.empty()) {
      nlohmann::json all = nlohmann::json::array();
      for (const DumpedTensor& t : r.tensors)
        all.push_back({{"name", t.name}, {"layer", t.layer}, {"shape", t.shape}, {"values", t.values}});
      std::ofstream out(o.dump_tensors_json);
      out << all.dump() << "\n";
      if (!out) fail(ErrorCode::kIo, "--dump-tensors-json: cannot write ", o.dump_tensors_json);
    }
  }
  if (o.json) {
    nlohmann::json j;
    j["prompt_token_ids"] = prompt;
    j["token_ids"] = r.tokens;
    // vLLM's default: special tokens (the EOS that stopped us) are not text.
    j["text"] = tokenizer ? tokenizer->decode(r.tokens, /*skip_special_tokens=*/true) : "";
    j["finish_reason"] = r.finish_reason;
    // Wall times of this one generation (the first token comes from the prefill;
    // decode covers the rest), for scripts such as bench/speculative_demo.sh.
    j["prefill_seconds"] = r.prefill_seconds;
    j["decode_seconds"] = r.decode_seconds;
    if (g.speculative.enabled())
      j["speculative"] = {{"num_drafts", r.speculative.n_drafts},
                          {"num_draft_tokens", r.speculative.n_draft_tokens},
                          {"num_accepted_tokens", r.speculative.n_accepted_tokens}};
    if (g.speculative.uses_draft_model()) {
      j["speculative"]["draft_weight_bytes"] = r.draft_weight_bytes;
      j["speculative"]["draft_kv_bytes"] = r.draft_kv_bytes;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("token_ids:");
    for (int32_t t : r.tokens) std::printf(" %d", t);
    std::printf("\n");
    if (tokenizer) std::printf("text: %s\n", tokenizer->decode(r.tokens, true).c_str());
    std::printf("finish_reason: %s\n", r.finish_reason.c_str());
    const double decode_tps = r.tokens.size() > 1 ? (r.tokens.size() - 1) / r.decode_seconds : 0.0;
    std::fprintf(stderr, "%s: prefill %zu tokens in %.3f s (%.1f tok/s), decode %.1f tok/s\n",
                 g.layout.to_string().c_str(), prompt.size(), r.prefill_seconds, prompt.size() / r.prefill_seconds,
                 decode_tps);
    if (g.speculative.enabled())
      std::fprintf(stderr, "speculative (%s): %lld drafts, %lld draft tokens, %lld accepted (%.1f%%)\n",
                   g.speculative.uses_draft_model() ? "draft model" : "ngram", static_cast<long long>(r.speculative.n_drafts), static_cast<long long>(r.speculative.n_draft_tokens),
                   static_cast<long long>(r.speculative.n_accepted_tokens),
                   r.speculative.n_draft_tokens > 0
                       ? 100.0 * r.speculative.n_accepted_tokens / r.speculative.n_draft_tokens
                       : 0.0);
  }
  return 0;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Generate tokens for one prompt (ranks as threads; as processes under mpirun)");
  auto o = std::make_shared<GenerateCliOptions>();
  sub->add_option("model", o->model, "Model directory (config.json + *.safetensors); default: the demo model");
  sub->add_option("--prompt", o->prompt, "Prompt text (needs the tokenizer)");
  sub->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids: 1,2,3");
  sub->add_option("--chat", o->chat, "A user message, rendered with the chat template (needs the tokenizer)");
  sub->add_option("--max-tokens", o->max_tokens, "Tokens to generate at most")->capture_default_str();
  sub->add_option("--temperature", o->temperature, "0 = greedy (argmax, lowest id on ties)")->capture_default_str();
  sub->add_option("--top-p", o->top_p, "Nucleus sampling mass")->capture_default_str();
  sub->add_option("--top-k", o->top_k, "Keep the k most likely tokens (-1: off)")->capture_default_str();
  sub->add_option("--min-p", o->min_p, "Drop tokens below min_p × p_max")->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed of the sampler's RNG");
  sub->add_flag("--json", o->json, "Print one JSON object");
  sub->add_option("--dump-logits", o->dump_logits, "Write the last prompt position's logits (f32 LE [vocab]) here");
  sub->add_option("--tp,--tensor-parallel-size", o->tp,
                  "Tensor-parallel ranks (threads, or processes under mpirun); auto: the layout plan recommends for "
                  "the ranks mpirun started")
      ->capture_default_str();
  sub->add_option("--dump-routing", o->dump_routing,
                  "MoE: write the experts chosen per token and layer (JSON) for every position fed");
  sub->add_option("--dump-tensors", o->dump_tensors,
                  "Print these intermediates (comma-separated names: q, kqv, attn_out, ffn_out, l_out, ..., or all) "
                  "per layer and step to stderr, as the driver rank computes them");
  sub->add_option("--dump-tensors-json", o->dump_tensors_json,
                  "With --dump-tensors: write them whole as JSON [{name, layer, shape, values}] here");
  sub->add_flag("--enable-expert-parallel", o->enable_expert_parallel,
                "MoE: experts go whole to the TP ranks (EP = TP), as vLLM's flag; attention stays tensor-parallel");
  sub->add_option("--pp,--pipeline-parallel-size", o->pp, "Pipeline stages (threads, or processes under mpirun)")->capture_default_str();
  sub->add_option("--tensor-split", o->tensor_split, "Relative shares of the TP ranks (mixed devices): one weight per TP rank, or TP × PP stage-major, e.g. 3,1 (default: even)");
  sub->add_option("--pp-layer-partition", o->pp_layer_partition, "Layers per stage, e.g. 10,18 (default: balanced by bytes)")
      ->delimiter(',');
  sub->add_option("--kv-cache-dtype", o->kv_dtype,
                  "f32, bf16, f16, fp8 (E4M3), or auto (the weights' dtype); default f32 on cpu, bf16 on cuda");
  add_device_option(sub, &o->device);
  add_cuda_graphs_option(sub, &o->cuda_graphs);
  add_quant_activations_option(sub, &o->quant_activations);
  add_dense_activations_option(sub, &o->dense_activations);
  sub->add_option("--sampling-device", o->sampling_device,
                  "host or device: device samples where the logits are (a GPU), so only the token id crosses; "
                  "a request that needs what the device sampler lacks (a seed, penalties, ...) says so and samples on "
                  "the host")
      ->check(CLI::IsMember({"host", "device"}))
      ->capture_default_str();
  sub->add_option("--speculative-config", o->speculative_config, kSpeculativeConfigHelp);
  sub->add_flag("--batch-invariant", o->batch_invariant,
                "Batch-invariant kernels: each row's reductions in an order independent of the step's row count "
                "(the path speculative verification needs; refused by a backend without them)");
  sub->add_option("--decode-bench", o->decode_bench,
                  "Instead of generating: time decode steps of B sequences, for each B of a list like 1,8,64 (one "
                  "load; prints tok/s and bytes read per step)");
  sub->add_option("--decode-context", o->decode_context, "--decode-bench: cached tokens per sequence")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--decode-steps", o->decode_steps, "--decode-bench: timed steps")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--block-size", o->block_size, "Tokens per KV block")->capture_default_str();
  set_command_action(sub, [o] { return run_generate(*o); });
}

SHARDLM_REGISTER_COMMAND(setup);

}  // namespace
}  // namespace shardlm::cli
