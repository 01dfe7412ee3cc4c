// shardlm verify MODEL_DIR [--json] [--sha256 [MANIFEST]]
// Checks every file a load would read and lists every problem with its fix.
// Exit: 0 OK, 1 problems, 2 usage (no such directory, unreadable manifest).
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/units.h"
#include "loader/verify.h"

namespace shardlm::cli {

namespace {

struct VerifyCommandOptions {
  std::string dir;
  bool json = false;
  std::string manifest;
  CLI::Option* sha256_option = nullptr;
};

nlohmann::json report_json(const VerifyReport& report) {
  nlohmann::json problems = nlohmann::json::array();
  for (const Problem& p : report.problems) {
    nlohmann::json item = {{"file", p.file}, {"message", p.message}, {"fix", p.fix},
                           {"severity", p.severity == Severity::kError ? "error" : "warning"},
                           {"code", error_code_name(p.code)}};
    if (!p.tensor.empty()) item["tensor"] = p.tensor;
    problems.push_back(std::move(item));
  }
  nlohmann::json files = nlohmann::json::array();
  for (const VerifiedFile& f : report.files) {
    nlohmann::json item = {{"name", f.name}, {"role", f.role}, {"present", f.present}, {"bytes", f.bytes}};
    if (f.role == "weights") item["tensors"] = f.n_tensors;
    if (!f.sha256.empty()) item["sha256"] = f.sha256;
    files.push_back(std::move(item));
  }
  nlohmann::json out = {{"ok", report.ok()},
                        {"dir", report.dir.string()},
                        {"problems", problems},
                        {"files", files},
                        {"n_tensors", report.n_tensors},
                        {"tensor_bytes", report.tensor_bytes},
                        {"notes", report.notes}};
  if (report.spec) out["architecture"] = report.spec->architecture;
  return out;
}

int run_verify(const VerifyCommandOptions& opts) {
  namespace fs = std::filesystem;
  std::string dir = opts.dir;
  std::string manifest = opts.manifest;
  const bool sha256 = opts.sha256_option->count() > 0;
  // `verify --sha256 DIR` makes CLI11 read DIR as the manifest; take it back.
  if (dir.empty() && !manifest.empty() && fs::is_directory(manifest)) std::swap(dir, manifest);
  if (dir.empty()) {
    std::cerr << "error: give the model directory: shardlm verify MODEL_DIR [--json] [--sha256 [MANIFEST]]\n";
    return 2;
  }
  if (!fs::is_directory(dir)) {
    std::cerr << "error: " << dir << (fs::exists(dir) ? ": not a directory" : ": no such directory")
              << "; give the model directory (the one with config.json)\n";
    return 2;
  }
  VerifyOptions options;
  options.sha256 = sha256;
  if (!manifest.empty()) {
    if (!fs::is_regular_file(manifest)) {
      std::cerr << "error: " << manifest << ": no such manifest file (expected `sha256sum` output)\n";
      return 2;
    }
    options.manifest = manifest;
  }

  VerifyReport report = verify_model_dir(dir, options);
  if (opts.json) {
    std::cout << report_json(report).dump(2) << "\n";
    return report.ok() ? 0 : 1;
  }
  // With --sha256 and no manifest, stdout is exactly a manifest; the report goes to stderr.
  const bool hashes_only = sha256 && !options.manifest;
  std::ostream& out = hashes_only ? std::cerr : std::cout;
  if (hashes_only) {
    for (const VerifiedFile& f : report.files)
      if (!f.sha256.empty()) std::cout << f.sha256 << "  " << f.name << "\n";
    std::cout.flush();
  }
  size_t n_present = 0;
  for (const VerifiedFile& f : report.files) n_present += f.present ? 1 : 0;
  if (report.ok()) {
    out << "OK: " << dir << ": " << n_present << " files, " << with_commas(static_cast<int64_t>(report.n_tensors))
        << " tensors, " << with_commas(static_cast<int64_t>(report.tensor_bytes)) << " bytes of weights ("
        << format_gib(static_cast<double>(report.tensor_bytes)) << ")";
    if (report.spec)
      out << "; " << report.spec->architecture << ", " << report.spec->n_layers << " layers";
    out << "\n";
    if (options.manifest)
      out << "sha256: " << report.n_manifest_matches << " files match " << fs::path(manifest).filename().string()
          << "\n";
  } else {
    out << report.problems.size() << (report.problems.size() == 1 ? " problem" : " problems") << " in " << dir
        << ":\n";
    for (const Problem& p : report.problems)
      out << "  " << (p.severity == Severity::kWarning ? "warning: " : "") << p.text() << "\n";
  }
  for (const std::string& note : report.notes) out << "note: " << note << "\n";
  return report.ok() ? 0 : 1;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("verify", "Check that a model directory is whole and consistent before loading it");
  auto opts = std::make_shared<VerifyCommandOptions>();
  sub->add_option("model_dir", opts->dir, "Model directory (config.json, *.safetensors, tokenizer files)");
  sub->add_flag("--json", opts->json, "Print the report as JSON");
  opts->sha256_option =
      sub->add_option("--sha256", opts->manifest,
                      "Hash every file; with MANIFEST (sha256sum output) compare, without it print a manifest")
          ->expected(0, 1);
  set_command_action(sub, [opts] { return run_verify(*opts); });
}

}  // namespace

SHARDLM_REGISTER_COMMAND(setup);

}  // namespace shardlm::cli
