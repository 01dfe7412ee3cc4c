// Prompt sets for `shardlm bench`. We hold no tokenizer, so text prompts
// control their length approximately: they are made of common English words
// that are one token each (with their leading space) in the GPT-2, Llama-3
// and Qwen2 BPE vocabularies, so n words ≈ n tokens. The chat template adds
// its own tokens on top (roughly 10–30). The server's usage.prompt_tokens
// replaces our estimate in the results whenever the server reports it.
// For exact lengths with --endpoint completions, prompts can be token ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardlm::loadgen {

struct SampleRequest {
  std::string prompt;              // text prompt (empty when prompt_ids is used)
  std::vector<int64_t> prompt_ids;  // [prompt_len] token ids, completions endpoint only
  int64_t prompt_len = 0;           // estimated (text) or exact (ids) prompt tokens
  int64_t output_len = 0;           // max tokens to request
};

struct RandomDatasetOptions {
  int64_t n_prompts = 200;
  int64_t input_len = 512;
  int64_t output_len = 128;
  double range_ratio = 0.1;  // lengths uniform in [len*(1-r), len*(1+r)], as vLLM's random set
  uint64_t seed = 0;
  bool token_ids = false;     // emit prompt_ids instead of text
  int64_t vocab_size = 30000;  // ids drawn from [kFirstTokenId, vocab_size)
};

struct SharedPrefixOptions {
  int64_t n_prompts = 200;
  int64_t n_prefixes = 4;
  int64_t prefix_len = 1024;
  int64_t suffix_len = 512;  // --input-len
  int64_t output_len = 128;
  uint64_t seed = 0;
  bool token_ids = false;
  int64_t vocab_size = 30000;
};

// Ids below this are special/control tokens in common vocabularies.
inline constexpr int64_t kFirstTokenId = 1000;

// The fixed word list: each word is one token when preceded by a space.
const std::vector<std::string>& one_token_words();

std::vector<SampleRequest> make_random_dataset(const RandomDatasetOptions& options);
// n_prefixes random prefixes of prefix_len; request i uses prefix i % n_prefixes
// (order shuffled by seed) followed by its own random suffix of suffix_len.
std::vector<SampleRequest> make_shared_prefix_dataset(const SharedPrefixOptions& options);

// JSONL: each line {"prompt": "..."} or ShareGPT-like
// {"conversations": [{"from": "human", "value": "..."}, ...]} (the first
// human/user turn is the prompt); an optional integer "output_len" overrides
// default_output_len. Blank lines are skipped. The first n_prompts records
// are used, cycling when the file has fewer. Malformed lines throw with the
// file and line number.
std::vector<SampleRequest> load_jsonl_dataset(const std::string& path, int64_t n_prompts,
                                              int64_t default_output_len);
// Same, from text already in memory (`source` names it in errors).
std::vector<SampleRequest> parse_jsonl_dataset(const std::string& text, const std::string& source,
                                               int64_t n_prompts, int64_t default_output_len);

// Rough prompt-token estimate for arbitrary text: ~4 bytes per token.
int64_t estimate_tokens(const std::string& text);

}  // namespace shardlm::loadgen
