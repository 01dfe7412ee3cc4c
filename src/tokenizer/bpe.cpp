#include "tokenizer/bpe.h"

#include <cstdio>
#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

std::string json_string_or_empty(const nlohmann::json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return {};
  return config[key].get<std::string>();
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& config, const std::string& where) {
  if (!config.is_object()) fail(ErrorCode::kCorruptFile, where, ": expected an object");
  std::string type = config.value("type", "BPE");
  if (type != "BPE")
    fail(ErrorCode::kUnsupported, where, ".type: \"", type, "\" is not supported; only BPE tokenizers are");
  if (config.value("dropout", nlohmann::json()).is_number() && config["dropout"].get<double>() > 0)
    fail(ErrorCode::kUnsupported, where, ".dropout: BPE dropout is not supported (set it to null)");

  const auto& vocab = config.value("vocab", nlohmann::json());
  if (!vocab.is_object() || vocab.empty())
    fail(ErrorCode::kCorruptFile, where, ".vocab: expected a non-empty object {token: id}");
  vocab_.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 || id_json.get<int64_t>() > INT32_MAX)
      fail(ErrorCode::kCorruptFile, where, ".vocab[\"", token, "\"]: expected a non-negative integer id, found ",
           id_json.dump());
    auto id = id_json.get<TokenId>();
    vocab_.emplace(token, id);
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(static_cast<size_t>(id) + 1);
    id_to_token_[static_cast<size_t>(id)] = token;
  }

  const auto& merges = config.value("merges", nlohmann::json::array());
  if (!merges.is_array()) fail(ErrorCode::kCorruptFile, where, ".merges: expected an array");
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& m = merges[rank];
    std::string left, right;
    if (m.is_string()) {  // "a b"
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ', 1);
      if (space == std::string::npos)
        fail(ErrorCode::kCorruptFile, where, ".merges[", rank, "]: \"", s, "\" is not two tokens separated by a space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
      left = m[0];
      right = m[1];
    } else {
      fail(ErrorCode::kCorruptFile, where, ".merges[", rank, "]: expected \"a b\" or [\"a\", \"b\"], found ",
           m.dump());
    }
    auto l = vocab_.find(left), r = vocab_.find(right), merged = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || merged == vocab_.end())
      fail(ErrorCode::kCorruptFile, where, ".merges[", rank, "]: \"", left, "\" + \"", right,
           "\" uses a token that is not in the vocab");
    merges_.emplace(pair_key(l->second, r->second), Merge{static_cast<uint32_t>(rank), merged->second});
  }

  std::string unk = json_string_or_empty(config, "unk_token");
  if (!unk.empty()) {
    auto it = vocab_.find(unk);
    if (it == vocab_.end()) fail(ErrorCode::kCorruptFile, where, ".unk_token: \"", unk, "\" is not in the vocab");
    unk_id_ = it->second;
  }
  byte_fallback_ = config.value("byte_fallback", false);
  ignore_merges_ = config.value("ignore_merges", false);
  fuse_unk_ = config.value("fuse_unk", false);
  continuing_subword_prefix_ = json_string_or_empty(config, "continuing_subword_prefix");
  end_of_word_suffix_ = json_string_or_empty(config, "end_of_word_suffix");
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::initial_symbols(std::string_view piece, std::vector<TokenId>& symbols) const {
  std::string key;
  size_t pos = 0;
  bool last_unk = false;
  while (pos < piece.size()) {
    size_t n = utf8::sequence_length(piece, pos);
    if (n == 0) n = 1;  // pieces are valid UTF-8; be safe anyway
    bool first = pos == 0, last = pos + n == piece.size();
    key.clear();
    if (!first) key += continuing_subword_prefix_;
    key.append(piece.substr(pos, n));
    if (last) key += end_of_word_suffix_;
    auto it = vocab_.find(key);
    if (it != vocab_.end()) {
      symbols.push_back(it->second);
      last_unk = false;
    } else if (byte_fallback_) {
      bool all = true;
      std::vector<TokenId> bytes;
      for (size_t i = 0; i < n && all; ++i) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<uint8_t>(piece[pos + i]));
        auto b = vocab_.find(name);
        if (b == vocab_.end()) all = false;
        else bytes.push_back(b->second);
      }
      if (all) symbols.insert(symbols.end(), bytes.begin(), bytes.end());
      else if (unk_id_) symbols.push_back(*unk_id_);
    } else if (unk_id_) {
      if (!(fuse_unk_ && last_unk)) symbols.push_back(*unk_id_);
      last_unk = true;
    }
    // Without unk and byte fallback HF drops the character; so do we.
    pos += n;
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(piece));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<TokenId> ids;
  initial_symbols(piece, ids);
  const size_t n = ids.size();
  if (n <= 1) {
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  // Doubly linked list over symbol slots; a merge keeps the left slot.
  std::vector<int32_t> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Candidate {
    uint32_t rank;
    int32_t pos;  // left slot
    TokenId left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(pair_key(ids[pos], ids[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, ids[pos], ids[next[pos]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    // Stale when either side has been merged away or changed since the push.
    if (!alive[c.pos] || next[c.pos] < 0 || ids[c.pos] != c.left || ids[next[c.pos]] != c.right) continue;
    int32_t right = next[c.pos];
    ids[c.pos] = merges_.at(pair_key(c.left, c.right)).merged;
    alive[right] = 0;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace shardlm
