#include "model/draft_model.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/local_comm.h"
#include "core/error.h"
#include "model/weight_source.h"
#include "model/forward_batch.h"
#include "model/generate.h"

namespace shardlm {
namespace {

// tokenizer.json's id map: model.vocab (token -> id) and added_tokens (id, content).
struct TokenizerIds {
  nlohmann::json vocab;
  std::vector<std::pair<int64_t, std::string>> added;
};

TokenizerIds tokenizer_ids(const std::filesystem::path& file) {
  std::ifstream in(file);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    fail(ErrorCode::kInvalidArgument, file.string(), ": not a JSON object (a tokenizer.json was expected)");
  TokenizerIds ids;
  if (j.contains("model") && j["model"].is_object() && j["model"].contains("vocab")) ids.vocab = j["model"]["vocab"];
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
          t["content"].is_string())
        ids.added.emplace_back(t["id"].get<int64_t>(), t["content"].get<std::string>());
  std::sort(ids.added.begin(), ids.added.end());
  return ids;
}

}  // namespace

void check_draft_vocabulary(const std::filesystem::path& target_dir, const ModelSpec& target,
                            const std::filesystem::path& draft_dir, const ModelSpec& draft) {
  const std::filesystem::path tt = target_dir / "tokenizer.json", dt = draft_dir / "tokenizer.json";
  const bool t_has = std::filesystem::exists(tt), d_has = std::filesystem::exists(dt);
  const std::string names = " (target " + target_dir.string() + ", draft " + draft_dir.string() + ")";
  if (t_has && d_has) {
    const TokenizerIds a = tokenizer_ids(tt), b = tokenizer_ids(dt);
    if (a.vocab != b.vocab || a.added != b.added)
      fail(ErrorCode::kInvalidArgument, "--speculative-config \"model\": the draft's tokenizer is not the target's",
           names, ": ", dt.string(), " maps tokens to other ids than ", tt.string(),
           "; a draft must share the target's vocabulary (the same tokenizer family and version)");
    return;
  }
  if (t_has != d_has)
    fail(ErrorCode::kInvalidArgument, "--speculative-config \"model\": only the ", t_has ? "target" : "draft",
         " has a tokenizer.json", names, ", so the two vocabularies cannot be compared; add the draft's tokenizer");
  if (target.vocab_size != draft.vocab_size)
    fail(ErrorCode::kInvalidArgument, "--speculative-config \"model\": the draft's vocab_size ", draft.vocab_size,
         " is not the target's ", target.vocab_size, names, "; a draft must share the target's vocabulary");
}

DraftModel::DraftModel(const std::filesystem::path& dir, int64_t target_vocab,
                       std::shared_ptr<backend::Backend> backend, int64_t max_len, int64_t block_size,
                       DType kv_dtype, int64_t n_blocks, int64_t max_step_tokens, int64_t max_step_seqs)
    : spec_(load_model_config(dir / "config.json")),
      vocab_(std::min(target_vocab, spec_.vocab_size)),
      max_len_(std::min<int64_t>(max_len, spec_.max_position_embeddings)),
      block_size_(block_size),
      max_step_tokens_(max_step_tokens > 0 ? max_step_tokens : INT64_MAX),
      max_step_seqs_(max_step_seqs > 0 ? max_step_seqs : INT64_MAX) {
  SHARDLM_CHECK(block_size > 0 && n_blocks >= 0 && max_step_tokens >= 0 && max_step_seqs >= 0, "DraftModel: block_size ",
                block_size, ", n_blocks ", n_blocks, ", max_step_tokens ", max_step_tokens, ", max_step_seqs ",
                max_step_seqs);
  for (int i = 0; i < 2; ++i) comms_.push_back(std::move(LocalComm::create_world(1)[0]));
  model_ = CausalLM::load(spec_, open_checkpoint(dir), Layout{}, 0, 0, *comms_[0], *comms_[1], std::move(backend));
  if (max_step_tokens > 0 && max_step_seqs > 0) {
    // Every step's buffers now, measured by the allocator: [T, hidden] and
    // the layers' workspace for T tokens, [S, vocab] logits (S rows at most:
    // one per sequence), and the host rows they are copied to.
    const int64_t before = model_->backend().allocated_bytes();
    model_->reserve_step_buffers(max_step_tokens, max_step_seqs);
    logits_.reserve(static_cast<size_t>(max_step_seqs * spec_.vocab_size));
    workspace_bytes_ = model_->backend().allocated_bytes() - before +
                       static_cast<int64_t>(logits_.capacity() * sizeof(float));
  }
  if (n_blocks == 0) n_blocks = (max_len_ + block_size) / block_size;  // max_len_ positions, and one spare
  cache_ = model_->make_kv_cache(n_blocks, block_size, kv_dtype);
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_blocks_.push_back(static_cast<int32_t>(b));
}

DraftModel::~DraftModel() = default;

int64_t DraftModel::weight_bytes() const { return model_->weight_bytes(); }

void DraftModel::release(int64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) free_blocks_.push_back(*b);
  seqs_.erase(it);
}

bool DraftModel::reserve(Sequence& s, int64_t n_positions, std::span<const Query> busy) {
  const size_t need = static_cast<size_t>((n_positions + block_size_ - 1) / block_size_);
  while (s.blocks.size() + free_blocks_.size() < need) {
    // The least recently used sequence that this call is not drafting for.
    int64_t victim = 0;
    uint64_t oldest = UINT64_MAX;
    for (const auto& [id, other] : seqs_) {
      if (&other == &s || other.last_use >= oldest) continue;
      bool in_call = false;
      for (const Query& q : busy) in_call = in_call || q.id == id;
      if (!in_call) victim = id, oldest = other.last_use;
    }
    if (oldest == UINT64_MAX) return false;
    release(victim);
  }
  while (s.blocks.size() < need) {
    s.blocks.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  return true;
}

std::vector<int32_t> DraftModel::propose(std::span<const int32_t> context, int64_t max_draft) {
  const Query q{0, context, max_draft};
  return std::move(propose(std::span<const Query>(&q, 1))[0]);
}

std::vector<std::vector<int32_t>> DraftModel::propose(std::span<const Query> queries) {
  std::vector<std::vector<int32_t>> drafts(queries.size());
  struct Active {
    size_t query;
    Sequence* seq;  // stable: unordered_map nodes do not move
    int64_t k;      // drafts it gets
    std::span<const int32_t> pending;  // what it feeds next: the context it has not fed, then its last draft
  };
  std::vector<Active> active;
  for (size_t i = 0; i < queries.size(); ++i) {
    const Query& q = queries[i];
    // Past its own context length the draft has nothing to say.
    const int64_t n = static_cast<int64_t>(q.context.size());
    const int64_t k = std::min<int64_t>(q.max_draft, max_len_ - n);
    if (k <= 0 || n == 0) continue;
    Sequence& s = seqs_[q.id];
    s.last_use = ++clock_;
    // Keep the KV of the longest prefix fed before that the context still has;
    // a rejected draft's slots are overwritten.
    size_t keep = 0;
    while (keep < s.fed.size() && keep < q.context.size() && s.fed[keep] == q.context[keep]) ++keep;
    if (keep == q.context.size()) --keep;  // the last token is fed again: its logits propose the first draft
    s.fed.resize(keep);
    // It will hold the context and all but the last draft.
    if (!reserve(s, n + k - 1, queries)) {
      release(q.id);
      continue;
    }
    active.push_back({i, &s, k, q.context.subspan(keep)});
  }
  // Each step: up to max_step_seqs_ sequences and max_step_tokens_ tokens,
  // the sequences in query order; a catch-up longer than what is left of the
  // step is fed in chunks, and only its last chunk asks a logits row (the
  // first draft). Then one row each per draft step.
  for (;;) {
    ForwardBatch batch;
    std::vector<size_t> rows;  // active index of each logits row
    int64_t tokens_left = max_step_tokens_, seqs_left = max_step_seqs_;
    for (size_t a = 0; a < active.size() && tokens_left > 0 && seqs_left > 0; ++a) {
      Active& act = active[a];
      if (act.pending.empty()) continue;  // it has all its drafts
      const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(act.pending.size()), tokens_left));
      const std::span<const int32_t> feed = act.pending.first(n);
      SequenceChunk c;
      c.n_tokens = static_cast<int32_t>(n);
      c.n_past = static_cast<int32_t>(act.seq->fed.size());
      c.block_table = act.seq->blocks;
      c.need_logits = n == act.pending.size();
      batch.seqs.push_back(std::move(c));
      batch.token_ids.insert(batch.token_ids.end(), feed.begin(), feed.end());
      act.seq->fed.insert(act.seq->fed.end(), feed.begin(), feed.end());
      act.pending = act.pending.subspan(n);
      if (batch.seqs.back().need_logits) rows.push_back(a);
      tokens_left -= static_cast<int64_t>(n);
      --seqs_left;
    }
    if (batch.seqs.empty()) break;
    logits_.resize(rows.size() * static_cast<size_t>(spec_.vocab_size));
    model_->forward(batch, cache_, logits_.data());
    for (size_t r = 0; r < rows.size(); ++r) {
      Active& act = active[rows[r]];
      std::vector<int32_t>& out = drafts[act.query];
      out.push_back(argmax_token(logits_.data() + r * static_cast<size_t>(spec_.vocab_size), vocab_));
      if (static_cast<int64_t>(out.size()) < act.k) act.pending = std::span<const int32_t>(&out.back(), 1);
    }
  }
  return drafts;
}

}  // namespace shardlm
