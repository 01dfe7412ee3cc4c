// `shardlm tokenize MODEL --text "..." [--json]` and
// `shardlm detokenize MODEL --ids 1,2,3 [--json]`: MODEL is a directory with
// tokenizer.json (tokenizer_config.json optional).
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace shardlm::cli {

namespace {

struct TokenizeOptions {
  std::string model;
  std::string text;
  std::string file;
  bool json = false;
  bool no_special = false;
};

struct DetokenizeOptions {
  std::string model;
  std::string ids;
  bool json = false;
  bool skip_special = false;
};

int run_tokenize(const TokenizeOptions& opts, bool text_given, bool file_given) {
  if (text_given == file_given) {
    std::cerr << "error: give exactly one of --text TEXT or --file PATH\n";
    return 2;
  }
  std::string text = opts.text;
  if (file_given) {
    std::ifstream in(opts.file, std::ios::binary);
    if (!in) fail(ErrorCode::kIo, opts.file, ": cannot open for reading (--file)");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  Tokenizer tokenizer = Tokenizer::load(opts.model);
  std::vector<TokenId> ids = tokenizer.encode(text, !opts.no_special);
  if (opts.json) {
    nlohmann::json out;
    out["ids"] = ids;
    auto tokens = nlohmann::json::array();
    for (TokenId id : ids) {
      // Byte-level token spellings are valid UTF-8; token_bytes may not be.
      auto token = tokenizer.id_to_token(id);
      tokens.push_back(token ? std::string(*token) : std::string());
    }
    out["tokens"] = tokens;
    out["n_tokens"] = ids.size();
    std::cout << out.dump() << "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

int run_detokenize(const DetokenizeOptions& opts) {
  std::vector<TokenId> ids;
  size_t pos = 0;
  const std::string& s = opts.ids;
  while (pos <= s.size() && !s.empty()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    bool ok = !item.empty() && item.size() <= 10 && item.find_first_not_of("0123456789") == std::string::npos &&
              std::stoll(item) <= INT32_MAX;
    if (!ok) {
      std::cerr << "error: --ids: \"" << item
                << "\" is not a token id; expected non-negative integers separated by commas, e.g. --ids 9707,11,1879\n";
      return 2;
    }
    ids.push_back(static_cast<TokenId>(std::stoll(item)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  Tokenizer tokenizer = Tokenizer::load(opts.model);
  std::string text = tokenizer.decode(ids, opts.skip_special);
  if (opts.json) {
    nlohmann::json out;
    out["text"] = text;
    out["ids"] = ids;
    auto unknown = nlohmann::json::array();
    for (TokenId id : ids)
      if (!tokenizer.id_to_token(id)) unknown.push_back(id);
    out["unknown_ids"] = unknown;
    std::cout << out.dump() << "\n";
  } else {
    std::cout << text << "\n";
  }
  return 0;
}

void setup(CLI::App& app) {
  auto* tok = app.add_subcommand("tokenize", "Encode text into token ids with MODEL/tokenizer.json");
  auto t = std::make_shared<TokenizeOptions>();
  tok->add_option("model", t->model, "Model directory holding tokenizer.json")->required();
  auto* text_opt = tok->add_option("--text", t->text, "Text to encode");
  auto* file_opt = tok->add_option("--file", t->file, "Read the text to encode from this file");
  tok->add_flag("--json", t->json, "Print {\"ids\": [...], \"tokens\": [...], \"n_tokens\": N}");
  tok->add_flag("--no-special", t->no_special, "Do not add the post-processor's special tokens (e.g. BOS)");
  set_command_action(tok, [t, text_opt, file_opt] {
    return run_tokenize(*t, text_opt->count() > 0, file_opt->count() > 0);
  });

  auto* detok = app.add_subcommand("detokenize", "Decode comma-separated token ids with MODEL/tokenizer.json");
  auto d = std::make_shared<DetokenizeOptions>();
  detok->add_option("model", d->model, "Model directory holding tokenizer.json")->required();
  detok->add_option("--ids", d->ids, "Token ids, e.g. 9707,11,1879")->required();
  detok->add_flag("--json", d->json, "Print {\"text\": ..., \"ids\": [...], \"unknown_ids\": [...]}");
  detok->add_flag("--skip-special", d->skip_special, "Leave out special tokens such as <|im_end|>");
  set_command_action(detok, [d] { return run_detokenize(*d); });
}

}  // namespace

SHARDLM_REGISTER_COMMAND(setup);

}  // namespace shardlm::cli
