#include "loadgen/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/bounded_json_file.h"
#include "core/error.h"

namespace shardlm::loadgen {

const std::vector<std::string>& one_token_words() {
  // Frequent English words; " word" is a single token in GPT-2/Llama-3/Qwen2 BPE.
  static const std::vector<std::string> words = {
      "the",    "of",     "and",    "to",     "in",     "is",     "that",   "for",    "it",
      "as",     "was",    "with",   "be",     "by",     "on",     "not",    "he",     "this",
      "are",    "or",     "his",    "from",   "at",     "which",  "but",    "have",   "an",
      "had",    "they",   "you",    "were",   "their",  "one",    "all",    "we",     "can",
      "her",    "has",    "there",  "been",   "if",     "more",   "when",   "will",   "would",
      "who",    "so",     "no",     "time",   "people", "year",   "way",    "day",    "man",
      "thing",  "woman",  "life",   "child",  "world",  "school", "state",  "family", "student",
      "group",  "country", "problem", "hand", "part",   "place",  "case",   "week",   "company",
      "system", "program", "question", "work", "government", "number", "night", "point", "home",
      "water",  "room",   "mother", "area",   "money",  "story",  "fact",   "month",  "lot",
      "right",  "study",  "book",   "eye",    "job",    "word",   "business", "issue", "side",
      "kind",   "head",   "house",  "service", "friend", "father", "power", "hour",   "game",
      "line",   "end",    "member", "law",    "car",    "city",   "name",   "team",   "minute",
      "idea",   "kid",    "body",   "back",   "parent", "face",   "others", "level",  "office",
      "door",   "health", "person", "art",    "war",    "history", "party", "result", "change",
      "morning", "reason", "research", "girl", "guy",   "moment", "air",    "teacher", "force",
      "good",   "new",    "first",  "last",   "long",   "great",  "little", "own",    "other",
      "old",    "big",    "high",   "small",  "large",  "next",   "early",  "young",  "important",
      "few",    "public", "bad",    "same",   "able",   "make",   "go",     "know",   "take",
      "see",    "come",   "think",  "look",   "want",   "give",   "use",    "find",   "tell",
      "ask",    "seem",   "feel",   "try",    "leave",  "call",   "keep",   "let",    "begin",
      "show",   "hear",   "play",   "run",    "move",   "like",   "live",   "believe", "hold",
      "bring",  "happen", "write",  "provide", "sit",   "stand",  "lose",   "pay",    "meet",
      "include", "continue", "set",  "learn",  "lead",   "understand", "watch", "follow", "stop",
      "create", "speak",  "read",   "allow",  "add",    "spend",  "grow",   "open",   "walk",
      "win",    "offer",  "remember", "love", "consider", "appear", "buy",  "wait",   "serve",
      "die",    "send",   "expect", "build",  "stay",   "fall",   "cut",    "reach",  "kill",
      "remain", "suggest", "raise", "pass",   "sell",   "require", "report", "decide", "pull"};
  return words;
}

namespace {

int64_t sample_len(std::mt19937_64& rng, int64_t len, double ratio) {
  if (ratio <= 0.0) return len;
  // The epsilon keeps 100 * 1.1 = 110.00000000000001 from rounding up to 111.
  int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1.0 - ratio) + 1e-9)));
  int64_t hi = std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(len * (1.0 + ratio) - 1e-9)));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

std::string random_words(std::mt19937_64& rng, int64_t n) {
  const auto& words = one_token_words();
  std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
  std::string text;
  text.reserve(static_cast<size_t>(n) * 7);
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0) text.push_back(' ');
    text += words[pick(rng)];
  }
  return text;
}

std::vector<int64_t> random_ids(std::mt19937_64& rng, int64_t n, int64_t vocab_size) {
  std::uniform_int_distribution<int64_t> pick(kFirstTokenId, vocab_size - 1);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = pick(rng);
  return ids;
}

void check_common(int64_t n_prompts, int64_t output_len, bool token_ids, int64_t vocab_size) {
  if (n_prompts < 1)
    fail(ErrorCode::kInvalidArgument, "--num-prompts must be at least 1 (got ", n_prompts, ")");
  if (output_len < 1)
    fail(ErrorCode::kInvalidArgument, "--output-len must be at least 1 (got ", output_len, ")");
  if (token_ids && vocab_size <= kFirstTokenId)
    fail(ErrorCode::kInvalidArgument, "--vocab-size must exceed ", kFirstTokenId,
         " to draw random token ids (got ", vocab_size, ")");
}

}  // namespace

std::vector<SampleRequest> make_random_dataset(const RandomDatasetOptions& o) {
  check_common(o.n_prompts, o.output_len, o.token_ids, o.vocab_size);
  if (o.input_len < 1)
    fail(ErrorCode::kInvalidArgument, "--input-len must be at least 1 (got ", o.input_len, ")");
  if (!(o.range_ratio >= 0.0 && o.range_ratio < 1.0))
    fail(ErrorCode::kInvalidArgument, "--range-ratio must be in [0, 1) (got ", o.range_ratio, ")");
  std::mt19937_64 rng(o.seed);
  std::vector<SampleRequest> out;
  out.reserve(static_cast<size_t>(o.n_prompts));
  for (int64_t i = 0; i < o.n_prompts; ++i) {
    SampleRequest r;
    r.prompt_len = sample_len(rng, o.input_len, o.range_ratio);
    r.output_len = sample_len(rng, o.output_len, o.range_ratio);
    if (o.token_ids)
      r.prompt_ids = random_ids(rng, r.prompt_len, o.vocab_size);
    else
      r.prompt = random_words(rng, r.prompt_len);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<SampleRequest> make_shared_prefix_dataset(const SharedPrefixOptions& o) {
  check_common(o.n_prompts, o.output_len, o.token_ids, o.vocab_size);
  if (o.n_prefixes < 1)
    fail(ErrorCode::kInvalidArgument, "--num-prefixes must be at least 1 (got ", o.n_prefixes, ")");
  if (o.prefix_len < 1 || o.suffix_len < 1)
    fail(ErrorCode::kInvalidArgument, "--prefix-len and --input-len must be at least 1 (got ",
         o.prefix_len, " and ", o.suffix_len, ")");
  std::mt19937_64 rng(o.seed);
  std::vector<std::string> text_prefixes;
  std::vector<std::vector<int64_t>> id_prefixes;
  for (int64_t p = 0; p < o.n_prefixes; ++p) {
    if (o.token_ids)
      id_prefixes.push_back(random_ids(rng, o.prefix_len, o.vocab_size));
    else
      text_prefixes.push_back(random_words(rng, o.prefix_len));
  }
  std::vector<int64_t> which(static_cast<size_t>(o.n_prompts));
  for (int64_t i = 0; i < o.n_prompts; ++i) which[static_cast<size_t>(i)] = i % o.n_prefixes;
  std::shuffle(which.begin(), which.end(), rng);
  std::vector<SampleRequest> out;
  for (int64_t i = 0; i < o.n_prompts; ++i) {
    SampleRequest r;
    size_t p = static_cast<size_t>(which[static_cast<size_t>(i)]);
    r.prompt_len = o.prefix_len + o.suffix_len;
    r.output_len = o.output_len;
    if (o.token_ids) {
      r.prompt_ids = id_prefixes[p];
      auto suffix = random_ids(rng, o.suffix_len, o.vocab_size);
      r.prompt_ids.insert(r.prompt_ids.end(), suffix.begin(), suffix.end());
    } else {
      r.prompt = text_prefixes[p] + " " + random_words(rng, o.suffix_len);
    }
    out.push_back(std::move(r));
  }
  return out;
}

int64_t estimate_tokens(const std::string& text) {
  return std::max<int64_t>(1, static_cast<int64_t>((text.size() + 3) / 4));
}

std::vector<SampleRequest> parse_jsonl_dataset(const std::string& text, const std::string& source,
                                               int64_t n_prompts, int64_t default_output_len) {
  check_common(n_prompts, default_output_len, false, 0);
  std::vector<SampleRequest> records;
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = parse_json_file(std::string_view(line), source + ":" + std::to_string(line_no));
    } catch (const nlohmann::json::parse_error& e) {
      fail(ErrorCode::kCorruptFile, source, ":", line_no, ": not valid JSON (", e.what(),
           "); each line must be one JSON object such as {\"prompt\": \"...\"}");
    }
    if (!j.is_object())
      fail(ErrorCode::kCorruptFile, source, ":", line_no, ": expected a JSON object, found ",
           j.type_name());
    SampleRequest r;
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string())
        fail(ErrorCode::kCorruptFile, source, ":", line_no, ": \"prompt\" must be a string, found ",
             j["prompt"].type_name());
      r.prompt = j["prompt"].get<std::string>();
    } else if (j.contains("conversations")) {
      const auto& conv = j["conversations"];
      if (!conv.is_array())
        fail(ErrorCode::kCorruptFile, source, ":", line_no, ": \"conversations\" must be an array");
      bool found = false;
      for (const auto& turn : conv) {
        if (!turn.is_object()) continue;
        std::string from = turn.value("from", turn.value("role", std::string()));
        if (from != "human" && from != "user") continue;
        const auto* value = turn.contains("value") ? &turn["value"]
                            : turn.contains("content") ? &turn["content"] : nullptr;
        if (value == nullptr || !value->is_string())
          fail(ErrorCode::kCorruptFile, source, ":", line_no,
               ": the first human turn has no string \"value\"");
        r.prompt = value->get<std::string>();
        found = true;
        break;
      }
      if (!found)
        fail(ErrorCode::kCorruptFile, source, ":", line_no,
             ": \"conversations\" has no turn with \"from\": \"human\"");
    } else {
      fail(ErrorCode::kCorruptFile, source, ":", line_no,
           ": needs a \"prompt\" string or a ShareGPT \"conversations\" array");
    }
    if (r.prompt.empty())
      fail(ErrorCode::kCorruptFile, source, ":", line_no, ": the prompt is empty");
    r.output_len = default_output_len;
    if (j.contains("output_len")) {
      if (!j["output_len"].is_number_integer() || j["output_len"].get<int64_t>() < 1)
        fail(ErrorCode::kCorruptFile, source, ":", line_no,
             ": \"output_len\" must be a positive integer, found ", j["output_len"].dump());
      r.output_len = j["output_len"].get<int64_t>();
    }
    r.prompt_len = estimate_tokens(r.prompt);
    records.push_back(std::move(r));
  }
  if (records.empty())
    fail(ErrorCode::kCorruptFile, source, ": holds no prompts; expected one JSON object per line");
  std::vector<SampleRequest> out;
  out.reserve(static_cast<size_t>(n_prompts));
  for (int64_t i = 0; i < n_prompts; ++i) out.push_back(records[static_cast<size_t>(i) % records.size()]);
  return out;
}

std::vector<SampleRequest> load_jsonl_dataset(const std::string& path, int64_t n_prompts,
                                              int64_t default_output_len) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kNotFound, "dataset file ", path, " cannot be opened; check the path");
  std::ostringstream buf;
  buf << in.rdbuf();
  return parse_jsonl_dataset(buf.str(), path, n_prompts, default_output_len);
}

}  // namespace shardlm::loadgen
