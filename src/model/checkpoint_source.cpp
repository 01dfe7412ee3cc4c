// open_checkpoint: the model directory's safetensors files as one WeightSource.
// Which files: those model.safetensors.index.json's weight_map names when it
// exists (a sharded HF checkpoint), else every *.safetensors in the folder.
#include <algorithm>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/bounded_json_file.h"
#include "core/error.h"
#include "loader/checkpoint.h"
#include "loader/safetensors.h"
#include "model/weight_source.h"

namespace shardlm {

namespace {

class SafetensorsDirSource final : public WeightSource {
 public:
  explicit SafetensorsDirSource(const std::filesystem::path& dir) : dir_(dir) {
    std::set<std::filesystem::path> paths;
    const auto index = dir / "model.safetensors.index.json";
    if (std::filesystem::exists(index)) {
      std::ifstream in(index);
      nlohmann::json j;
      try {
        j = parse_json_file(in, index.string());
      } catch (const nlohmann::json::exception& e) {
        fail(ErrorCode::kCorruptFile, index.string(), ": not valid JSON (", e.what(), ")");
      }
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        fail(ErrorCode::kCorruptFile, index.string(), ": field \"weight_map\" must be an object of tensor -> file");
      for (const auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string())
          fail(ErrorCode::kCorruptFile, index.string(), ": weight_map[\"", name, "\"] must be a file name");
        // verify refuses it too (Checkpoint::scan): a shard outside the model directory is never opened.
        if (!is_plain_file_name(file.get<std::string>()))
          fail(ErrorCode::kCorruptFile, index.string(), ": weight_map[\"", name, "\"] is ",
               file.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
               ", not the plain name of a file in the model directory");
        paths.insert(dir / file.get<std::string>());
      }
    } else {
      if (!std::filesystem::is_directory(dir))
        fail(ErrorCode::kNotFound, "model directory ", dir.string(), " does not exist");
      for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.path().extension() == ".safetensors") paths.insert(e.path());
    }
    if (paths.empty())
      fail(ErrorCode::kNotFound, "model directory ", dir.string(),
           " has no *.safetensors files; download the weights or run `shardlm make-model`");
    for (const auto& p : paths) files_.push_back(SafetensorsFile::open(p));
    for (const auto& f : files_) {
      for (const TensorView& t : f.tensors()) {
        if (refs_.count(t.name))
          fail(ErrorCode::kCorruptFile, "tensor ", t.name, " is in both ", refs_[t.name].second, " and ", f.name(),
               "; a checkpoint holds each tensor once");
        refs_[t.name] = {WeightRef{t.name, t.dtype, t.shape, t.data}, f.name()};
      }
    }
  }
  const WeightRef* find(const std::string& name) const override {
    auto it = refs_.find(name);
    return it == refs_.end() ? nullptr : &it->second.first;
  }
  std::string describe() const override { return "checkpoint " + dir_.string(); }

 private:
  std::filesystem::path dir_;
  std::vector<SafetensorsFile> files_;  // keep the mappings alive
  std::map<std::string, std::pair<WeightRef, std::string>> refs_;  // name -> (view, file)
};

}  // namespace

std::shared_ptr<const WeightSource> open_checkpoint(const std::filesystem::path& model_dir) {
  return std::make_shared<SafetensorsDirSource>(model_dir);
}

}  // namespace shardlm
