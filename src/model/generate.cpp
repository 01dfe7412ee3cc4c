#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/backend.h"
#include "comm/local_comm.h"
#include "core/error.h"
#include "model/causal_lm.h"
#include "model/draft_model.h"
#include "model/rank_group.h"

namespace shardlm {

int32_t argmax_token(const float* logits, int64_t vocab_size) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab_size; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

void validate_generate(const ModelSpec& spec, const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  if (prompt.empty()) fail(ErrorCode::kInvalidArgument, "generate: the prompt has no tokens");
  if (opt.max_tokens < 1) fail(ErrorCode::kInvalidArgument, "generate: --max-tokens must be at least 1, got ", opt.max_tokens);
  validate_layout(spec, opt.layout);
  if (opt.speculative.enabled()) {
    opt.speculative.validate();
    if (opt.device_sampling)
      fail(ErrorCode::kUnsupported, "--speculative-config with --sampling-device device: verification samples on the host");
  }
  if (opt.layout.dp != 1) fail(ErrorCode::kInvalidArgument, "generate runs one replica; data parallelism is for serve");
  if (!opt.dump_tensors.empty()) {
    TensorDump check(opt.dump_tensors);  // refuses an unknown name
    if (opt.layout.pp != 1)
      fail(ErrorCode::kInvalidArgument, "--dump-tensors needs --pipeline-parallel-size 1 (the driver records the layers it runs), got ",
           opt.layout.pp);
    const std::vector<std::string> moe_only = {"ffn_moe_logits", "ffn_moe_topk", "ffn_moe_weights"};
    for (const std::string& n : opt.dump_tensors)
      if (!spec.is_moe() && std::find(moe_only.begin(), moe_only.end(), n) != moe_only.end())
        fail(ErrorCode::kInvalidArgument, "--dump-tensors ", n, ": ", spec.architecture,
             " is a dense model; it has no experts to route to");
  }
}

int64_t generate_kv_blocks(const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  const int64_t total = static_cast<int64_t>(prompt.size()) + opt.max_tokens;
  return (total + opt.block_size - 1) / opt.block_size;
}

GenerateResult generate_steps(const GenerateStep& step, int64_t vocab_size, int64_t n_blocks,
                              const std::vector<int32_t>& prompt, const GenerateOptions& opt, bool keep_all_logits,
                              Communicator* group, bool is_driver) {
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(b);
  std::vector<float> logits(static_cast<size_t>(vocab_size));
  std::vector<int32_t> generated;
  GenerateResult local;
  const int64_t chunk = opt.prefill_chunk > 0 ? opt.prefill_chunk : static_cast<int64_t>(prompt.size());
  auto t0 = std::chrono::steady_clock::now();
  auto t_first = t0;
  int64_t n_past = 0;
  std::vector<int32_t> pending(prompt);  // tokens still to feed
  if (opt.speculative.enabled() && keep_all_logits)
    fail(ErrorCode::kInvalidArgument, "generate: speculative decoding keeps no per-step logits");
  std::vector<float> verify_logits;  // [k+1, vocab]
  while (true) {
    if (opt.speculative.enabled() && !generated.empty()) {
      // pending == {the last generated token}: draft after it, verify all in one (k+1)-row step.
      std::vector<int32_t> context(prompt);
      context.insert(context.end(), generated.begin(), generated.end());
      const int64_t room = opt.max_tokens - static_cast<int64_t>(generated.size()) - 1;
      std::vector<int32_t> draft;
      if (!opt.speculative.uses_draft_model()) {
        draft = ngram_draft(context, opt.speculative, room);  // the same on every rank
      } else {
        // The driver's draft model proposes; the other ranks get its tokens.
        std::vector<int32_t> wire(static_cast<size_t>(opt.speculative.num_speculative_tokens + 1), 0);
        if (is_driver) {
          SHARDLM_CHECK(opt.draft);
          draft = opt.draft(context, std::min<int64_t>(room, opt.speculative.num_speculative_tokens));
          wire[0] = static_cast<int32_t>(draft.size());
          std::copy(draft.begin(), draft.end(), wire.begin() + 1);
        }
        if (group) group->broadcast(wire.data(), wire.size() * sizeof(int32_t), 0);
        draft.assign(wire.begin() + 1, wire.begin() + 1 + wire[0]);
      }
      if (!draft.empty()) {
        const int64_t d = static_cast<int64_t>(draft.size());
        ForwardBatch batch;
        // Row j feeds token j (the pending one, then the drafts) at position n_past + j, as its own
        // one-token sequence over the shared block table: each row computes what a 1-row decode
        // step at that position would (batch-invariant kernels), attending to the rows before it.
        for (int64_t j = 0; j <= d; ++j) {
          batch.token_ids.push_back(j == 0 ? pending[0] : draft[static_cast<size_t>(j - 1)]);
          SequenceChunk c;
          c.n_tokens = 1;
          c.n_past = static_cast<int32_t>(n_past + j);
          c.block_table = table;
          c.need_logits = true;
          c.long_context = opt.long_context;
          batch.seqs.push_back(c);
        }
        verify_logits.resize(static_cast<size_t>((d + 1) * vocab_size));
        step(batch, verify_logits.data());
        // out[0]: how many tokens the target produced; out[1..]: them.
        std::vector<int32_t> out(static_cast<size_t>(d + 2), 0);
        if (is_driver) {
          std::vector<int32_t> seen(generated);
          for (int64_t j = 0; j <= d; ++j) {
            const float* row = verify_logits.data() + j * vocab_size;
            const int32_t t = opt.pick ? opt.pick(row, vocab_size, seen) : argmax_token(row, vocab_size);
            seen.push_back(t);
            out[static_cast<size_t>(++out[0])] = t;
            const bool stop = std::find(opt.eos_token_ids.begin(), opt.eos_token_ids.end(), t) != opt.eos_token_ids.end();
            if (stop || static_cast<int64_t>(seen.size()) >= opt.max_tokens) break;
            if (j < d && t != draft[static_cast<size_t>(j)]) break;
          }
        }
        if (group) group->broadcast(out.data(), out.size() * sizeof(int32_t), 0);
        int64_t accepted = 0;
        while (accepted < out[0] && accepted < d && out[static_cast<size_t>(accepted + 1)] == draft[static_cast<size_t>(accepted)])
          ++accepted;
        local.speculative.n_drafts += 1;
        local.speculative.n_draft_tokens += d;
        local.speculative.n_accepted_tokens += accepted;
        // Rollback: only the pending token and the accepted drafts hold valid KV; the rest lie past n_past.
        n_past += 1 + accepted;
        bool stop = false;
        for (int32_t i = 1; i <= out[0]; ++i) {
          generated.push_back(out[static_cast<size_t>(i)]);
          stop = std::find(opt.eos_token_ids.begin(), opt.eos_token_ids.end(), generated.back()) != opt.eos_token_ids.end();
        }
        if (stop || static_cast<int64_t>(generated.size()) >= opt.max_tokens) {
          local.finish_reason = stop ? "stop" : "length";
          break;
        }
        pending.assign(1, generated.back());
        continue;
      }
    }
    // Feed the pending tokens (the prompt in chunks, then one token per step).
    bool produced = false;
    while (!pending.empty()) {
      const int64_t take = std::min<int64_t>(chunk, static_cast<int64_t>(pending.size()));
      ForwardBatch batch;
      batch.token_ids.assign(pending.begin(), pending.begin() + take);
      SequenceChunk c;
      c.n_tokens = static_cast<int32_t>(take);
      c.n_past = static_cast<int32_t>(n_past);
      c.block_table = table;
      c.need_logits = take == static_cast<int64_t>(pending.size());
      c.long_context = opt.long_context;
      batch.seqs.push_back(c);
      step(batch, logits.data());
      n_past += take;
      pending.erase(pending.begin(), pending.begin() + take);
      produced = c.need_logits;
    }
    SHARDLM_CHECK(produced);
    int32_t next = 0;
    if (is_driver) {
      next = opt.pick ? opt.pick(logits.data(), vocab_size, generated) : argmax_token(logits.data(), vocab_size);
      if (generated.empty()) {
        local.prompt_logits = logits;
        t_first = std::chrono::steady_clock::now();
      }
      if (keep_all_logits) local.step_logits.push_back(logits);
    }
    if (group) group->broadcast(&next, sizeof next, 0);
    generated.push_back(next);
    const bool stop = std::find(opt.eos_token_ids.begin(), opt.eos_token_ids.end(), next) != opt.eos_token_ids.end();
    if (stop || static_cast<int64_t>(generated.size()) >= opt.max_tokens) {
      local.finish_reason = stop ? "stop" : "length";
      break;
    }
    pending.push_back(next);
  }
  if (is_driver) {
    auto t_end = std::chrono::steady_clock::now();
    local.tokens = generated;
    local.prefill_seconds = std::chrono::duration<double>(t_first - t0).count();
    local.decode_seconds = std::chrono::duration<double>(t_end - t_first).count();
  }
  return local;
}

GenerateResult generate_local(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                              const std::vector<int32_t>& prompt, const GenerateOptions& opt, bool keep_all_logits) {
  validate_generate(spec, prompt, opt);
  const int n_ranks = opt.layout.tp * opt.layout.pp;
  const int64_t n_blocks = generate_kv_blocks(prompt, opt);
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  GenerateResult result;
  std::mutex mu;
  run_rank_group(opt.layout, opt.device, std::max(1, static_cast<int>(hw) / n_ranks), [&](RankContext& r) {
    auto model = CausalLM::load(spec, weights, opt.layout, r.tp_rank, r.pp_rank, *r.comms.tp, *r.comms.pp, r.backend);
    KvCache cache = model->make_kv_cache(n_blocks, opt.block_size, opt.kv_dtype);
    std::optional<TensorDump> dump;
    if (!opt.dump_tensors.empty() && model->is_driver()) {
      dump.emplace(opt.dump_tensors);
      model->dump_tensors(&*dump);
    }
    std::string graphs;
    if (opt.graphs.enabled) {
      backend::DecodeGraphOptions g = opt.graphs;
      g.max_batch = 1;  // one request
      g.max_context = static_cast<int64_t>(prompt.size()) + opt.max_tokens;
      graphs = model->enable_decode_graphs(g);
    }
    GenerateStep step = [&](const ForwardBatch& batch, float* logits) { model->forward(batch, cache, logits); };
    GenerateOptions o = opt;
    std::unique_ptr<DraftModel> draft;  // on the driver, on its backend (model/draft_model.h)
    if (opt.speculative.uses_draft_model() && model->is_driver()) {
      draft = std::make_unique<DraftModel>(opt.speculative.draft_model, spec.vocab_size, r.backend,
                                           static_cast<int64_t>(prompt.size()) + opt.max_tokens, opt.block_size,
                                           opt.kv_dtype);
      o.draft = [&](std::span<const int32_t> context, int64_t k) { return draft->propose(context, k); };
    }
    o.long_context = o.long_context || spec.long_context(static_cast<int64_t>(prompt.size()));
    backend::DeviceSampleRow row = opt.device_row;
    int32_t sampled = 0;
    if (opt.device_sampling) {
      if (keep_all_logits)
        fail(ErrorCode::kInvalidArgument, "generate: sampling on the device keeps the logits there; none can be kept");
      // forward_sampled refuses TP/PP > 1 and a backend without a sampler.
      step = [&](const ForwardBatch& batch, float*) {
        const size_t n = static_cast<size_t>(batch.n_logits());
        model->forward_sampled(batch, cache, std::span<const backend::DeviceSampleRow>(&row, n), &sampled, nullptr);
        row.step += n;
      };
      o.pick = [&](const float*, int64_t, const std::vector<int32_t>&) { return sampled; };
    }
    GenerateResult local =
        generate_steps(step, spec.vocab_size, n_blocks, prompt, o, keep_all_logits, &r.world, model->is_driver());
    if (opt.device_sampling) local.prompt_logits.clear();  // never left the device
    if (model->is_driver()) {
      local.weight_bytes_rank0 = model->weight_bytes();
      if (draft) {
        local.draft_weight_bytes = draft->weight_bytes();
        local.draft_kv_bytes = draft->kv_bytes();
      }
      model->dump_tensors(nullptr);
      if (dump) local.tensors = dump->tensors();
      local.graphs = graphs;
      if (const backend::DecodeGraphs* dg = model->decode_graphs()) local.graph_replays = dg->cache().n_replays();
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(local);
    }
  }, opt.batch_invariant || opt.speculative.enabled());
  return result;
}

}  // namespace shardlm
