// A model directory as Hugging Face ships it: config.json, the weights as
// model.safetensors or as model-0000i-of-0000N.safetensors shards listed in
// model.safetensors.index.json, and the tokenizer files.
//
// Checkpoint maps every weight file and checks the whole directory (each
// header, index against shards, duplicates) before any tensor is used; the
// same checks back strict loading (open) and `shardlm verify` (inspect).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "loader/model_spec.h"
#include "loader/problem.h"
#include "loader/safetensors.h"

namespace shardlm {

constexpr const char* kSingleWeightsFile = "model.safetensors";
constexpr const char* kWeightsIndexFile = "model.safetensors.index.json";

// A name an index (or a config) may give for a file of the model: a plain
// file name inside the model directory. Not "../x", "/etc/x", "a/b", "." or
// "..", nor a name with a NUL: reading one of those would reach outside.
bool is_plain_file_name(std::string_view name);

class Checkpoint {
 public:
  // Opens and checks every weight file; throws an Error carrying the first
  // error found (and how many more there are). Warnings do not throw; they
  // are in problems(). Throws kNotFound if dir does not exist.
  static Checkpoint open(const std::filesystem::path& dir);
  // The same checks without throwing on content problems: everything wrong is
  // in problems(), and the tensors that are usable can still be looked up.
  // Throws only if dir does not exist or is not a directory.
  static Checkpoint inspect(const std::filesystem::path& dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

  const std::filesystem::path& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  // Every weight file a load reads, relative to dir: {"model.safetensors"} or
  // the shard names the index lists (sorted), whether or not they exist.
  const std::vector<std::string>& weight_file_names() const { return weight_file_names_; }
  // The weight files that exist and could be mapped, in weight_file_names order.
  const std::vector<SafetensorsFile>& files() const { return files_; }

  // Usable tensors (supported dtype, whole, in a file that maps) by name.
  const TensorView* find(std::string_view name) const;
  // Throws kNotFound naming the directory.
  const TensorView& at(std::string_view name) const;
  // The file that holds a usable tensor; nullptr if none.
  const SafetensorsFile* file_of(std::string_view name) const;
  // Names of the usable tensors, sorted.
  std::vector<std::string> tensor_names() const;
  size_t n_tensors() const { return by_name_.size(); }
  // Sum of the usable tensors' bytes.
  uint64_t tensor_bytes() const;
  // True when a header or the index names this tensor, usable or not (so a
  // tensor that is only truncated is not also reported as missing).
  bool names(std::string_view name) const { return all_names_.count(std::string(name)) > 0; }

  // Errors and warnings, in the order found.
  const std::vector<Problem>& problems() const { return problems_; }

  // Companion files; set when they exist in dir.
  const std::optional<std::filesystem::path>& config_json() const { return config_json_; }
  const std::optional<std::filesystem::path>& tokenizer_json() const { return tokenizer_json_; }
  const std::optional<std::filesystem::path>& tokenizer_config_json() const { return tokenizer_config_json_; }
  const std::optional<std::filesystem::path>& generation_config_json() const { return generation_config_json_; }

 private:
  Checkpoint() = default;
  void scan();

  std::filesystem::path dir_;
  bool sharded_ = false;
  std::vector<std::string> weight_file_names_;
  std::vector<SafetensorsFile> files_;
  struct Location {
    size_t file;  // index into files_
    size_t view;  // index into files_[file].tensors()
  };
  std::unordered_map<std::string, Location> by_name_;
  std::unordered_set<std::string> all_names_;
  std::vector<Problem> problems_;
  std::optional<std::filesystem::path> config_json_, tokenizer_json_, tokenizer_config_json_,
      generation_config_json_;
};

// Checks the checkpoint's tensors against what config.json implies: missing
// tensors, unexpected ones, wrong shapes (naming the config fields that set
// each dimension) and dtypes that differ within the checkpoint. Returns every
// problem; long lists of missing/unexpected tensors are summarised after 20.
std::vector<Problem> validate_against_spec(const Checkpoint& checkpoint, const ModelSpec& spec);

// Strict loading: throws the first problem of validate_against_spec, if any.
void require_matches_spec(const Checkpoint& checkpoint, const ModelSpec& spec);

}  // namespace shardlm
