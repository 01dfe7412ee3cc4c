#include "tokenizer/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/bounded_json_file.h"
#include "core/defaults.h"
#include "core/error.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace shardlm {

struct Tokenizer::Impl {
  std::string source;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  BpeModel model;
  AddedVocab added;
  PostProcessor post_processor;
  Decoder decoder;

  std::vector<std::string> id_to_token;  // [vocab_size] vocab or added-token content
  std::vector<std::string> id_to_bytes;  // [vocab_size] what each id decodes to
  std::vector<char> special;             // [vocab_size] 1 for special added tokens
  std::unordered_map<std::string, TokenId> added_by_content;
  std::optional<TokenId> bos, eos, pad, unk;

  std::optional<TokenId> lookup(std::string_view token) const {
    auto it = added_by_content.find(std::string(token));
    if (it != added_by_content.end()) return it->second;
    return model.token_to_id(token);
  }
  // piece -> [offset, offset + count) of its ids in the output vector
  using PieceCache = std::unordered_map<std::string, std::pair<uint32_t, uint32_t>>;
  // first_section: text starts the input (Metaspace prepend_scheme "first").
  void encode_plain(std::string_view text, bool first_section, std::vector<TokenId>& out, PieceCache& cache) const;
};

namespace {

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  try {
    return parse_json_file(text, source);
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorCode::kCorruptFile, source, ": not valid JSON: ", e.what());
  }
}

std::string read_file(const std::filesystem::path& path) {
  // A padded tokenizer.json of 1 GiB would take 3 GiB before failing (core/defaults.h).
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  if (!ec && bytes > kMaxTokenizerFileBytes)
    fail(ErrorCode::kInvalidArgument, path.string(), ": ", bytes, " bytes, more than the limit of ",
         kMaxTokenizerFileBytes >> 20, " MiB for a tokenizer file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::kIo, path.string(), ": cannot open for reading");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// tokenizer_config.json token fields: "<s>", {"content": "<s>", ...} or null.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key, const std::string& source) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  fail(ErrorCode::kCorruptFile, source, ": field ", key, ": expected a string, {\"content\": string} or null, found ",
       v.dump());
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  std::filesystem::path json_path = dir / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(json_path, ec))
    fail(ErrorCode::kNotFound, json_path.string(),
         ": not found (a model directory must hold the Hugging Face tokenizer.json)");
  std::string json = read_file(json_path);
  std::filesystem::path config_path = dir / "tokenizer_config.json";
  std::string config;
  if (std::filesystem::is_regular_file(config_path, ec)) config = read_file(config_path);
  return from_json(json, config, json_path.string());
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               const std::string& source) {
  auto impl = std::make_shared<Impl>();
  impl->source = source;
  nlohmann::json root = parse_json(tokenizer_json, source);
  if (!root.is_object()) fail(ErrorCode::kCorruptFile, source, ": expected a JSON object at the top level");
  if (!root.contains("model"))
    fail(ErrorCode::kCorruptFile, source, ": field model is missing (is this a Hugging Face tokenizer.json?)");
  auto field = [&](const char* key) { return root.contains(key) ? root[key] : nlohmann::json(); };
  auto where = [&](const char* key) { return str_cat(source, ": field ", key); };

  // The readers check the shapes they expect; a value of another type they
  // did not foresee surfaces as nlohmann's type_error ("type must be string,
  // but is number"), which named neither file nor field.
  auto build = [&](const char* key, auto&& read) {
    try {
      read();
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorCode::kCorruptFile, where(key), ": a value has the wrong type (", e.what(), ")");
    }
  };
  build("model", [&] { impl->model = BpeModel(root["model"], where("model")); });
  build("normalizer", [&] { impl->normalizer = Normalizer(field("normalizer"), where("normalizer")); });
  build("pre_tokenizer", [&] { impl->pre_tokenizer = PreTokenizer(field("pre_tokenizer"), where("pre_tokenizer")); });
  build("added_tokens", [&] { impl->added = AddedVocab(field("added_tokens"), where("added_tokens")); });
  build("decoder", [&] { impl->decoder = Decoder(field("decoder"), where("decoder")); });

  // Id tables covering vocab and added tokens.
  const auto& vocab_tokens = impl->model.id_to_token();
  size_t n_ids = vocab_tokens.size();
  for (const auto& t : impl->added.tokens()) n_ids = std::max(n_ids, static_cast<size_t>(t.id) + 1);
  impl->id_to_token.assign(n_ids, {});
  impl->id_to_bytes.assign(n_ids, {});
  impl->special.assign(n_ids, 0);
  for (size_t id = 0; id < vocab_tokens.size(); ++id) {
    const std::string& token = vocab_tokens[id];
    impl->id_to_token[id] = token;
    impl->id_to_bytes[id] = impl->decoder.token_bytes(token);
  }
  for (const auto& t : impl->added.tokens()) {
    auto id = static_cast<size_t>(t.id);
    impl->id_to_token[id] = t.content;
    // transformers passes added tokens through the decoder too: Gemma's
    // whitespace runs ("▁▁", ids 138-...) are added tokens that decode to spaces.
    impl->id_to_bytes[id] = impl->decoder.token_bytes(t.content);
    impl->special[id] = t.special ? 1 : 0;
    impl->added_by_content[t.content] = t.id;
  }

  const Impl* raw = impl.get();
  build("post_processor", [&] {
    impl->post_processor = PostProcessor(field("post_processor"), where("post_processor"),
                                         [raw](std::string_view token) { return raw->lookup(token); });
  });

  if (!config_json.empty()) {
    std::string config_source =
        (std::filesystem::path(source).parent_path() / "tokenizer_config.json").string();
    nlohmann::json config = parse_json(config_json, config_source);
    if (!config.is_object()) fail(ErrorCode::kCorruptFile, config_source, ": expected a JSON object");
    auto resolve = [&](const char* key) -> std::optional<TokenId> {
      auto token = config_token(config, key, config_source);
      if (!token) return std::nullopt;
      auto id = raw->lookup(*token);
      if (!id)
        fail(ErrorCode::kCorruptFile, config_source, ": field ", key, ": token \"", *token, "\" is not in ", source);
      return id;
    };
    impl->bos = resolve("bos_token");
    impl->eos = resolve("eos_token");
    impl->pad = resolve("pad_token");
    impl->unk = resolve("unk_token");
  }
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_plain(std::string_view text, bool first_section, std::vector<TokenId>& out,
                                   PieceCache& cache) const {
  if (text.empty()) return;
  std::string normalized = normalizer.empty() ? std::string(text) : normalizer.apply(text);
  std::vector<std::string> pieces;
  pre_tokenizer.apply(normalized, pieces, first_section);
  // Per-call cache: repeated words (" the", "\n") are merged once. A cache
  // shared across calls would need locking; one call is where repeats are.
  for (const auto& piece : pieces) {
    auto it = cache.find(piece);
    if (it != cache.end()) {
      auto [offset, count] = it->second;
      for (uint32_t i = 0; i < count; ++i) out.push_back(out[offset + i]);
      continue;
    }
    size_t before = out.size();
    model.encode_piece(piece, out);
    cache.emplace(piece, std::make_pair(static_cast<uint32_t>(before), static_cast<uint32_t>(out.size() - before)));
  }
}

namespace {

void check_utf8(std::string_view text) {
  size_t offset = 0;
  if (!utf8::is_valid(text, &offset))
    fail(ErrorCode::kInvalidArgument, "text to encode is not valid UTF-8 at byte ", offset);
}

}  // namespace

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  check_utf8(text);
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 8);
  Impl::PieceCache cache;
  for (const auto& section : impl_->added.split(text)) {
    if (section.token)
      ids.push_back(section.token->id);
    else
      impl_->encode_plain(section.text, section.text.data() == text.data(), ids, cache);
  }
  if (add_special_tokens) return impl_->post_processor.apply(std::move(ids));
  return ids;
}

std::vector<TokenId> Tokenizer::encode_ordinary(std::string_view text) const {
  check_utf8(text);
  std::vector<TokenId> ids;
  Impl::PieceCache cache;
  impl_->encode_plain(text, true, ids, cache);
  return ids;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_bytes.size()) continue;
    if (skip_special_tokens && impl_->special[static_cast<size_t>(id)]) continue;
    bytes.append(impl_->id_to_bytes[static_cast<size_t>(id)]);
  }
  size_t strip = 0;
  while (strip < impl_->decoder.leading_spaces_stripped() && strip < bytes.size() && bytes[strip] == ' ') ++strip;
  return utf8::lossy(std::string_view(bytes).substr(strip));
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_bytes.size()) return {};
  return impl_->id_to_bytes[static_cast<size_t>(id)];
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const { return impl_->lookup(token); }

std::optional<std::string_view> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size()) return std::nullopt;
  const std::string& token = impl_->id_to_token[static_cast<size_t>(id)];
  if (token.empty()) return std::nullopt;
  return std::string_view(token);
}

size_t Tokenizer::leading_spaces_stripped() const { return impl_->decoder.leading_spaces_stripped(); }

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<TokenId> Tokenizer::pad_id() const { return impl_->pad; }
std::optional<TokenId> Tokenizer::unk_id() const { return impl_->unk; }

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[static_cast<size_t>(id)];
}

std::vector<TokenId> Tokenizer::special_ids() const {
  std::vector<TokenId> ids;
  for (size_t id = 0; id < impl_->special.size(); ++id)
    if (impl_->special[id]) ids.push_back(static_cast<TokenId>(id));
  return ids;
}

std::string Tokenizer::normalize(std::string_view text) const {
  check_utf8(text);
  return impl_->normalizer.empty() ? std::string(text) : impl_->normalizer.apply(text);
}

}  // namespace shardlm
