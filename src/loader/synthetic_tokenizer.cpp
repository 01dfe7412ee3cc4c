#include "loader/synthetic_tokenizer.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {

using nlohmann::json;

const char* const kQwen2PretokenizeRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* const kSyntheticChatTemplate =
    R"({% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %})"
    R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %})"
    R"({% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";

const char* const kSyntheticTrainingText = R"(The quick brown fox jumps over the lazy dog. A language model reads
a sequence of tokens and predicts the next one. Each token is a piece of text:
a whole word, part of a word, a number, or a single byte. The model is trained
on a large amount of text, and then it is used to answer questions, write code,
and translate between languages. When the model runs on many devices, the
weights are split so that every device holds a part of each layer, and the
devices exchange their partial results after every layer.

The server receives a request, renders the chat template, and turns the text
into token ids. Then the scheduler decides which sequences run in the next step,
how many tokens each one computes, and which blocks of the cache they use. The
sampler picks the next token from the logits, with a temperature, top-k, top-p
and penalties for repeated tokens. The tokens are sent back to the client as
soon as they are ready, so the user sees the answer while it is being written.

def forward(self, input_ids, positions):
    hidden = self.embed_tokens(input_ids)
    for layer in self.layers:
        hidden = layer(hidden, positions)
    return self.norm(hidden)

for (int i = 0; i < n; ++i) {
  sum += weights[i] * input[i];
}
return sum;

class Attention:
    def __init__(self, hidden_size, num_heads, head_dim):
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = head_dim

User: What is the capital of France?
Assistant: The capital of France is Paris. It is the largest city in the country,
and it is known for its museums, its food and its long history.
User: How many days are there in a year?
Assistant: There are 365 days in a year, and 366 days in a leap year.
The numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14 are used in this text.
)";

namespace {

// GPT-2 bytes_to_unicode(): printable bytes map to themselves, the rest to
// code points 256, 257, ... in byte order.
std::vector<uint32_t> byte_code_points() {
  std::vector<uint32_t> cp(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) cp[b] = printable[b] ? static_cast<uint32_t>(b) : next++;
  return cp;
}

std::string utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// GPT-2 order of the byte tokens: the printable ranges first, then the rest
// (the order of bytes_to_unicode's list `bs`).
std::vector<uint8_t> byte_token_order() {
  std::vector<uint8_t> order;
  for (int b = '!'; b <= '~'; ++b) order.push_back(static_cast<uint8_t>(b));
  for (int b = 0xA1; b <= 0xAC; ++b) order.push_back(static_cast<uint8_t>(b));
  for (int b = 0xAE; b <= 0xFF; ++b) order.push_back(static_cast<uint8_t>(b));
  for (int b = 0; b < 256; ++b)
    if (std::find(order.begin(), order.end(), static_cast<uint8_t>(b)) == order.end()) order.push_back(static_cast<uint8_t>(b));
  return order;
}

bool is_letter(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// An ASCII approximation of the Qwen2 pre-tokenizer, enough to learn merges
// that never cross pre-token boundaries on the training text.
std::vector<std::string> pretokenize_ascii(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0, n = text.size();
  while (i < n) {
    size_t j = i;
    unsigned char c = text[i];
    if (is_letter(c) || (!is_digit(c) && c != '\n' && c != '\r' && i + 1 < n && is_letter(text[i + 1]))) {
      j = i + 1;
      while (j < n && is_letter(text[j])) ++j;
    } else if (is_digit(c)) {
      j = i + 1;
    } else if (!is_space(c) || (c == ' ' && i + 1 < n && !is_space(text[i + 1]) && !is_letter(text[i + 1]) && !is_digit(text[i + 1]))) {
      j = (c == ' ') ? i + 1 : i;
      while (j < n && !is_space(text[j]) && !is_letter(text[j]) && !is_digit(text[j])) ++j;
      while (j < n && (text[j] == '\n' || text[j] == '\r')) ++j;
    } else {
      while (j < n && is_space(text[j])) ++j;
      // \s+(?!\S): leave the last space to the next word.
      if (j < n && j - i > 1 && text[j - 1] == ' ') --j;
    }
    if (j == i) j = i + 1;
    out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

std::string byte_to_unicode(uint8_t b) {
  static const std::vector<uint32_t> cp = byte_code_points();
  return utf8(cp[b]);
}

namespace {

// Byte-pair merges learned from the training text, in rank order, each with
// whether it spelled a new token. Greedy: the first k merges of a longer run
// are the k-merge run, so one run of the most merges serves every size.
struct LearnedMerges {
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<bool> new_token;
};

LearnedMerges learn_merges(int max_merges) {
  // Symbols as ids into `spelling`; words as id sequences with their counts.
  std::vector<std::string> spelling;
  std::unordered_map<std::string, int32_t> id_of;
  auto intern = [&](const std::string& text) {
    auto [it, inserted] = id_of.try_emplace(text, static_cast<int32_t>(spelling.size()));
    if (inserted) spelling.push_back(text);
    return it->second;
  };
  std::map<std::vector<int32_t>, int64_t> counted;
  for (const auto& piece : pretokenize_ascii(kSyntheticTrainingText)) {
    std::vector<int32_t> symbols;
    for (unsigned char c : piece) symbols.push_back(intern(byte_to_unicode(c)));
    ++counted[symbols];
  }
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words(counted.begin(), counted.end());
  std::unordered_set<std::string> merged_tokens;
  LearnedMerges out;
  std::unordered_map<uint64_t, int64_t> pairs;
  auto key = [](int32_t a, int32_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b); };
  for (int m = 0; m < max_merges; ++m) {
    pairs.clear();
    for (const auto& [symbols, count] : words)
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[key(symbols[i], symbols[i + 1])] += count;
    if (pairs.empty()) break;
    // Highest count; ties: the smallest pair of spellings, so the result is fixed.
    int32_t best_a = -1, best_b = -1;
    int64_t best_count = 0;
    for (const auto& [k, count] : pairs) {
      const auto a = static_cast<int32_t>(k >> 32), b = static_cast<int32_t>(k & 0xffffffffu);
      if (count > best_count ||
          (count == best_count && std::tie(spelling[a], spelling[b]) < std::tie(spelling[best_a], spelling[best_b]))) {
        best_a = a;
        best_b = b;
        best_count = count;
      }
    }
    const std::string joined = spelling[best_a] + spelling[best_b];
    out.merges.push_back({spelling[best_a], spelling[best_b]});
    // Two different pairs can spell the same token ("a"+"bc", "ab"+"c"):
    // the token keeps its first id, as the Hugging Face trainer does.
    out.new_token.push_back(merged_tokens.insert(joined).second);
    const int32_t joined_id = intern(joined);
    for (auto& [symbols, count] : words) {
      size_t w = 0;
      for (size_t i = 0; i < symbols.size(); ++i, ++w) {
        if (i + 1 < symbols.size() && symbols[i] == best_a && symbols[i + 1] == best_b) {
          symbols[w] = joined_id;
          ++i;
        } else {
          symbols[w] = symbols[i];
        }
      }
      symbols.resize(w);
    }
  }
  return out;
}

}  // namespace

SyntheticTokenizer build_synthetic_tokenizer(int64_t model_vocab, int n_merges) {
  const int64_t minimum = kSyntheticByteTokens + kSyntheticSpecialTokens;
  if (model_vocab < minimum)
    fail(ErrorCode::kInvalidArgument, "vocab ", model_vocab, " is too small for the synthetic tokenizer: it needs at least ",
         minimum, " ids (256 byte tokens + 3 special tokens); use --vocab ", minimum, " or more");
  if (n_merges < 0) fail(ErrorCode::kInvalidArgument, "synthetic tokenizer: merges must be >= 0, found ", n_merges);
  n_merges = static_cast<int>(std::min<int64_t>(n_merges, model_vocab - minimum));

  static const LearnedMerges default_run = learn_merges(kSyntheticDefaultMerges);
  const LearnedMerges longer_run = n_merges > kSyntheticDefaultMerges ? learn_merges(n_merges) : LearnedMerges{};
  const LearnedMerges& learned = n_merges > kSyntheticDefaultMerges ? longer_run : default_run;

  SyntheticTokenizer tok;
  for (uint8_t b : byte_token_order()) tok.tokens.push_back(byte_to_unicode(b));
  const size_t n = std::min(learned.merges.size(), static_cast<size_t>(n_merges));
  for (size_t m = 0; m < n; ++m) {
    const auto& [a, b] = learned.merges[m];
    tok.merges.push_back({a, b});
    if (learned.new_token[m]) tok.tokens.push_back(a + b);
  }
  tok.endoftext_id = tok.n_vocab();
  tok.tokens.push_back("<|endoftext|>");
  tok.im_start_id = tok.n_vocab();
  tok.tokens.push_back("<|im_start|>");
  tok.im_end_id = tok.n_vocab();
  tok.tokens.push_back("<|im_end|>");
  return tok;
}

json synthetic_tokenizer_json(const SyntheticTokenizer& tok) {
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  json vocab = json::object();
  const int64_t n_model = tok.n_vocab() - kSyntheticSpecialTokens;
  for (int64_t id = 0; id < n_model; ++id) vocab[tok.tokens[id]] = id;
  json merges = json::array();
  for (const auto& [a, b] : tok.merges) merges.push_back(a + " " + b);
  json added = json::array();
  for (int64_t id = n_model; id < tok.n_vocab(); ++id)
    added.push_back({{"id", id}, {"content", tok.tokens[id]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = added;
  t["normalizer"] = {{"type", "NFC"}};
  t["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "Split"},
                                                        {"pattern", {{"Regex", kQwen2PretokenizeRegex}}},
                                                        {"behavior", "Isolated"},
                                                        {"invert", false}},
                                                       byte_level})}};
  t["post_processor"] = byte_level;
  t["decoder"] = byte_level;
  t["model"] = {{"type", "BPE"},          {"dropout", nullptr},          {"unk_token", nullptr},
                {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false},     {"vocab", vocab},
                {"merges", merges}};
  return t;
}

json synthetic_tokenizer_config_json(const SyntheticTokenizer& tok, int64_t model_max_length) {
  json decoder = json::object();
  const int64_t n_model = tok.n_vocab() - kSyntheticSpecialTokens;
  for (int64_t id = n_model; id < tok.n_vocab(); ++id)
    decoder[std::to_string(id)] = {{"content", tok.tokens[id]}, {"lstrip", false}, {"normalized", false},
                                   {"rstrip", false}, {"single_word", false}, {"special", true}};
  json c;
  c["add_bos_token"] = false;
  c["add_prefix_space"] = false;
  c["added_tokens_decoder"] = decoder;
  c["additional_special_tokens"] = json::array({"<|im_start|>", "<|im_end|>"});
  c["bos_token"] = nullptr;
  c["chat_template"] = kSyntheticChatTemplate;
  c["clean_up_tokenization_spaces"] = false;
  c["eos_token"] = "<|im_end|>";
  c["errors"] = "replace";
  c["model_max_length"] = model_max_length;
  c["pad_token"] = "<|endoftext|>";
  c["split_special_tokens"] = false;
  c["tokenizer_class"] = "Qwen2Tokenizer";
  c["unk_token"] = nullptr;
  return c;
}

}  // namespace shardlm
