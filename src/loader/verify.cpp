#include "loader/verify.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "loader/checkpoint.h"
#include "loader/generation_config.h"
#include "loader/sha256.h"
#include "core/bounded_json_file.h"
#include "core/defaults.h"

namespace shardlm {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

Problem problem(std::string file, std::string message, std::string fix, ErrorCode code = ErrorCode::kCorruptFile) {
  return {Severity::kError, code, std::move(file), "", std::move(message), std::move(fix)};
}

// Reads a JSON file; on failure adds a problem and returns nullopt.
std::optional<json> read_json(const fs::path& path, const std::string& name, std::vector<Problem>* problems) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    problems->push_back(problem(name, "cannot be read", "check the file's permissions", ErrorCode::kIo));
    return std::nullopt;
  }
  try {
    return parse_json_file(in, name);
  } catch (const Error& e) {  // nested too deep
    const std::string why = e.what();  // "<name>: JSON nested deeper than ..."
    problems->push_back(problem(name, why.substr(why.find(": ") + 2), str_cat("download ", name, " again")));
    return std::nullopt;
  } catch (const json::exception& e) {
    std::string reason = e.what();
    if (auto pos = reason.find("] "); pos != std::string::npos) reason = reason.substr(pos + 2);
    if (reason.size() > 200) reason = reason.substr(0, 197) + "...";
    problems->push_back(problem(name, str_cat("is not valid JSON (", reason, ")"), str_cat("download ", name, " again")));
    return std::nullopt;
  }
}

// parse_model_config's messages start with "config.json: "; the file is reported separately.
std::string without_prefix(std::string message, const std::string& prefix) {
  if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
  return message;
}

void check_config(const fs::path& dir, VerifyReport* report) {
  if (!fs::is_regular_file(dir / "config.json")) {
    report->problems.push_back(problem("config.json", "missing; it says which model the weights are",
                                       "download config.json from the model's repository", ErrorCode::kNotFound));
    return;
  }
  std::optional<json> config = read_json(dir / "config.json", "config.json", &report->problems);
  if (!config) return;
  try {
    report->spec = parse_model_config(*config, "config.json");
    // Older GPTQ checkpoints (and GPTQModel's lm_head field) keep their
    // settings beside config.json, as load_model_config reads them.
    if (!config->contains("quantization_config") && fs::is_regular_file(dir / "quantize_config.json")) {
      std::optional<json> q = read_json(dir / "quantize_config.json", "quantize_config.json", &report->problems);
      if (!q) return;
      report->spec->quant = parse_quantization_config(*q, "quantize_config.json", true);
      check_quantized_shapes(*report->spec, "quantize_config.json");
    }
  } catch (const Error& e) {
    report->spec.reset();  // half read: nothing to check the tensors against
    const bool separate = std::string(e.what()).rfind("quantize_config.json", 0) == 0;
    report->problems.push_back(
        problem(separate ? "quantize_config.json" : "config.json",
                without_prefix(e.what(), separate ? "quantize_config.json: " : "config.json: "),
                e.code() == ErrorCode::kUnsupported ? "use a model shardlm supports (Qwen2/2.5, Qwen3, Llama 3)"
                                                    : "download config.json again",
                e.code()));
    return;
  }
  if (report->spec->quant.enabled())
    report->notes.push_back(str_cat("quantized: ", report->spec->quant.describe(), " (", report->spec->quant.source,
                                    "); generate, serve and perplexity run it with its weights kept packed"));
  if (report->spec->is_moe())
    report->notes.push_back(str_cat(report->spec->architecture, " is a mixture-of-experts model (", report->spec->n_experts,
                                    " experts, top-", report->spec->n_experts_per_token,
                                    "); serve runs it with experts split over TP ranks, or whole with --enable-expert-parallel"));
}

void check_tokenizer(const fs::path& dir, VerifyReport* report) {
  if (!fs::is_regular_file(dir / "tokenizer.json")) {
    report->problems.push_back(problem("tokenizer.json", "missing; the server needs it to turn text into tokens",
                                       "download tokenizer.json from the model's repository", ErrorCode::kNotFound));
  } else if (std::error_code ec; fs::file_size(dir / "tokenizer.json", ec) > kMaxTokenizerFileBytes && !ec) {
    report->problems.push_back(problem("tokenizer.json",
                                       str_cat(fs::file_size(dir / "tokenizer.json", ec), " bytes, more than the limit of ",
                                               kMaxTokenizerFileBytes >> 20, " MiB for a tokenizer file"),
                                       "download tokenizer.json again", ErrorCode::kInvalidArgument));
  } else if (auto tok = read_json(dir / "tokenizer.json", "tokenizer.json", &report->problems)) {
    const json* vocab = nullptr;
    if (tok->is_object()) {
      auto model = tok->find("model");
      if (model != tok->end() && model->is_object()) {
        auto v = model->find("vocab");
        if (v != model->end()) vocab = &*v;
      }
    }
    if (vocab == nullptr || !(vocab->is_object() || vocab->is_array()) || vocab->empty())
      report->problems.push_back(problem("tokenizer.json", "has no model.vocab; it is not a Hugging Face tokenizer file",
                                         "download tokenizer.json again"));
  }
  if (!fs::is_regular_file(dir / "tokenizer_config.json")) {
    report->problems.push_back(problem("tokenizer_config.json",
                                       "missing; it holds the chat template and the special tokens",
                                       "download tokenizer_config.json from the model's repository",
                                       ErrorCode::kNotFound));
  } else if (auto cfg = read_json(dir / "tokenizer_config.json", "tokenizer_config.json", &report->problems)) {
    if (!cfg->is_object())
      report->problems.push_back(problem("tokenizer_config.json", "is not a JSON object", "download it again"));
  }
  if (fs::is_regular_file(dir / "generation_config.json")) {
    if (auto gen = read_json(dir / "generation_config.json", "generation_config.json", &report->problems)) {
      if (!gen->is_object()) {
        report->problems.push_back(problem("generation_config.json", "is not a JSON object", "download it again"));
      } else {
        // The checks serve makes at load: eos ids inside the vocabulary,
        // sampling defaults in range.
        const std::string prefix = (dir / "generation_config.json").string() + ": ";
        try {
          if (report->spec) load_eos_token_ids(dir, *report->spec);
          load_generation_defaults(dir);
        } catch (const Error& e) {
          report->problems.push_back(problem("generation_config.json", without_prefix(e.what(), prefix),
                                             "correct the field or remove it", e.code()));
        }
      }
    }
  }
}

void add_file(const fs::path& dir, const std::string& name, const std::string& role, VerifyReport* report) {
  VerifiedFile file;
  file.name = name;
  file.role = role;
  std::error_code ec;
  file.present = fs::is_regular_file(dir / name, ec);
  if (file.present) file.bytes = fs::file_size(dir / name, ec);
  report->files.push_back(std::move(file));
}

void check_hashes(const fs::path& dir, const VerifyOptions& options, VerifyReport* report) {
  std::map<std::string, std::string> expected;  // name -> hex
  std::string manifest_name;
  if (options.manifest) {
    manifest_name = options.manifest->filename().string();
    std::ifstream in(*options.manifest, std::ios::binary);
    if (!in) fail(ErrorCode::kNotFound, options.manifest->string(), ": cannot read the SHA-256 manifest");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    std::vector<std::string> bad;
    for (const ManifestEntry& e : parse_sha256_manifest(text, &bad)) expected[e.name] = e.sha256;
    for (const std::string& line : bad)
      report->problems.push_back(problem(manifest_name, str_cat(line, " is not \"SHA256  FILENAME\""),
                                         "write the manifest with `sha256sum FILES > MANIFEST`",
                                         ErrorCode::kInvalidArgument));
  }
  std::map<std::string, bool> hashed;
  for (VerifiedFile& file : report->files) {
    if (!file.present || hashed.count(file.name)) continue;
    file.sha256 = sha256_file(dir / file.name);
    hashed[file.name] = true;
    if (!options.manifest) continue;
    auto it = expected.find(file.name);
    if (it == expected.end()) {
      report->notes.push_back(str_cat(file.name, " is not in ", manifest_name, "; its SHA-256 is ", file.sha256));
    } else if (it->second != file.sha256) {
      report->problems.push_back(problem(file.name,
                                         str_cat("SHA-256 is ", file.sha256, " but ", manifest_name, " says ",
                                                 it->second, " — the file is damaged or from another version"),
                                         "download this file again"));
    } else {
      ++report->n_manifest_matches;
    }
  }
  // Files only the manifest names: present ones are hashed too, absent ones are problems.
  for (const auto& [name, hex] : expected) {
    if (hashed.count(name)) continue;
    std::error_code ec;
    if (!fs::is_regular_file(dir / name, ec)) {
      report->problems.push_back(problem(name, str_cat("listed in ", manifest_name, " but missing"),
                                         "download this file", ErrorCode::kNotFound));
      continue;
    }
    add_file(dir, name, "other", report);
    VerifiedFile& file = report->files.back();
    file.sha256 = sha256_file(dir / name);
    hashed[name] = true;
    if (file.sha256 != hex) {
      report->problems.push_back(problem(name,
                                         str_cat("SHA-256 is ", file.sha256, " but ", manifest_name, " says ", hex,
                                                 " — the file is damaged or from another version"),
                                         "download this file again"));
    } else {
      ++report->n_manifest_matches;
    }
  }
}

}  // namespace

VerifyReport verify_model_dir(const fs::path& dir, const VerifyOptions& options) {
  VerifyReport report;
  report.dir = dir;
  Checkpoint checkpoint = Checkpoint::inspect(dir);  // throws if dir is not a directory

  check_config(dir, &report);
  for (const Problem& p : checkpoint.problems()) report.problems.push_back(p);
  if (report.spec) {
    for (Problem& p : validate_against_spec(checkpoint, *report.spec)) report.problems.push_back(std::move(p));
  }
  check_tokenizer(dir, &report);

  add_file(dir, "config.json", "config", &report);
  if (checkpoint.sharded()) add_file(dir, kWeightsIndexFile, "index", &report);
  for (const std::string& name : checkpoint.weight_file_names()) {
    add_file(dir, name, "weights", &report);
    for (const SafetensorsFile& f : checkpoint.files())
      if (f.name() == name) report.files.back().n_tensors = f.header().tensors.size();
  }
  add_file(dir, "tokenizer.json", "tokenizer", &report);
  add_file(dir, "tokenizer_config.json", "tokenizer_config", &report);
  if (fs::is_regular_file(dir / "generation_config.json"))
    add_file(dir, "generation_config.json", "generation_config", &report);

  report.n_tensors = checkpoint.n_tensors();
  report.tensor_bytes = checkpoint.tensor_bytes();
  if (options.sha256 || options.manifest) check_hashes(dir, options, &report);
  return report;
}

}  // namespace shardlm
