#include "tokenizer/bpe.h"

#include <cstdio>
#include <queue>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

std::string json_string_or_empty(const nlohmann::json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return {};
  return config[key].get<std::string>();
}

uint64_t mix(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  return key;
}

}  // namespace

const BpeModel::Merge* BpeModel::find_merge(TokenId left, TokenId right) const {
  if (merge_keys_.empty()) return nullptr;
  uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    if (merge_keys_[slot] == key) return &merge_values_[slot];
    if (merge_keys_[slot] == kNoKey) return nullptr;
  }
}

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
  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  merge_keys_.assign(capacity, kNoKey);
  merge_values_.assign(capacity, Merge{0, 0});
  merge_mask_ = capacity - 1;
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
    uint64_t key = pair_key(l->second, r->second);
    uint64_t slot = mix(key) & merge_mask_;
    while (merge_keys_[slot] != kNoKey && merge_keys_[slot] != key) slot = (slot + 1) & merge_mask_;
    // A repeated merge takes its last rank, as HF's HashMap collect and transformers.js's Map do.
    merge_keys_[slot] = key;
    merge_values_[slot] = Merge{static_cast<uint32_t>(rank), merged->second};
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
  if (continuing_subword_prefix_.empty() && end_of_word_suffix_.empty()) {
    small_char_id_.assign(0x200, -1);
    for (uint32_t cp = 0; cp < 0x200; ++cp) {
      std::string ch;
      utf8::append(ch, cp);
      auto it = vocab_.find(ch);
      if (it != vocab_.end()) small_char_id_[cp] = it->second;
    }
  }
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
    if (!small_char_id_.empty() && n <= 2) {
      uint32_t cp = utf8::decode_at(piece, pos, n);
      if (cp < small_char_id_.size() && small_char_id_[cp] >= 0) {
        symbols.push_back(small_char_id_[cp]);
        last_unk = false;
        pos += n;
        continue;
      }
    }
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
    if (const Merge* m = find_merge(ids[pos], ids[next[pos]])) heap.push({m->rank, pos, ids[pos], ids[next[pos]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    // Stale when either side has been merged away or changed since the push.
    if (!alive[c.pos] || next[c.pos] < 0 || ids[c.pos] != c.left || ids[next[c.pos]] != c.right) continue;
    int32_t right = next[c.pos];
    ids[c.pos] = find_merge(c.left, c.right)->merged;
    alive[right] = 0;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

}  // namespace shardlm
