#include "loader/quantize_checkpoint.h"

#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/bounded_json_file.h"
#include "core/error.h"
#include "loader/checkpoint.h"
#include "loader/quant_pack.h"
#include "loader/safetensors_writer.h"

namespace shardlm {

namespace fs = std::filesystem;
using json = nlohmann::json;

QuantizeCheckpointResult quantize_checkpoint(const fs::path& src, const fs::path& dst, const QuantConfig& quant) {
  std::error_code ec;
  if (fs::exists(dst, ec) && fs::equivalent(src, dst, ec))
    fail(ErrorCode::kInvalidArgument, "quantize: --out ", dst.string(), " is the source directory; write elsewhere");
  const fs::path config_path = src / "config.json";
  std::ifstream in(config_path);
  if (!in) fail(ErrorCode::kNotFound, "quantize: ", config_path.string(), " does not exist");
  json config;
  try {
    config = parse_json_file(in, config_path.string());
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kCorruptFile, config_path.string(), ": not valid JSON (", e.what(), ")");
  }
  ModelSpec spec = parse_model_config(config, config_path.string());
  if (spec.quant.enabled())
    fail(ErrorCode::kInvalidArgument, "quantize: ", src.string(), " is already quantized (", spec.quant.describe(),
         "); start from the unquantized checkpoint");
  spec.quant = quant;
  // --lm-head on a tied model unties it, as a GPTQModel checkpoint must be:
  // lm_head becomes its own quantized Linear made from the embedding table,
  // which stays in the checkpoint dtype.
  const bool untie = quant.lm_head && spec.tie_word_embeddings;
  if (untie) spec.tie_word_embeddings = false;
  check_quantized_shapes(spec, "quantize " + src.string());
  const Checkpoint source = Checkpoint::open(src);

  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::vector<TensorSpec>> modules;  // quantized Linear -> its parts
  std::map<std::string, std::string> module_of;             // part name -> module
  for (const TensorSpec& t : expected_tensors(spec)) {
    if (t.part != QuantPart::kNone) {
      tensors.push_back({t.name, t.dtypes.front(), t.shape});
      modules[t.module].push_back(t);
      module_of[t.name] = t.module;
      continue;
    }
    const TensorView* v = source.find(t.name);
    if (!v) {
      if (t.optional) continue;
      fail(ErrorCode::kNotFound, "quantize: ", src.string(), " has no tensor ", t.name);
    }
    tensors.push_back({t.name, v->dtype, v->shape});
  }
  std::map<std::string, std::vector<uint8_t>> pending;  // parts of a quantized module not yet written
  auto fill = [&](const TensorToWrite& t, int64_t begin, int64_t count, void* out) {
    const size_t esize = dtype_size(t.dtype);
    auto m = module_of.find(t.name);
    if (m == module_of.end()) {
      const TensorView& v = source.at(t.name);
      std::memcpy(out, static_cast<const uint8_t*>(v.data) + begin * esize, static_cast<size_t>(count) * esize);
      return;
    }
    auto it = pending.find(t.name);
    if (it == pending.end()) {
      const std::vector<TensorSpec>& parts = modules.at(m->second);
      const TensorSpec& p0 = parts.front();
      const TensorView* v = source.find(m->second + ".weight");
      if (!v && untie && p0.slot == TensorSlot::kLmHead) v = source.find(spec.tensor_prefix + "model.embed_tokens.weight");
      if (!v) fail(ErrorCode::kNotFound, "quantize: ", src.string(), " has no tensor ", m->second, ".weight");
      const std::vector<int64_t> want = {p0.out_features, p0.in_features};
      if (v->shape != want)
        fail(ErrorCode::kInvalidArgument, "quantize: tensor ", v->name, " has shape ", shape_string(v->shape),
             " but config.json implies ", shape_string(want));
      std::vector<float> w(static_cast<size_t>(v->n_elements()));
      for (size_t i = 0; i < w.size(); ++i) w[i] = load_as_f32(v->data, v->dtype, i);
      auto bytes = quantize_linear(spec.quant, w.data(), p0.out_features, p0.in_features, parts);
      for (const TensorSpec& p : parts) pending[p.name] = std::move(bytes.at(p.part));
      it = pending.find(t.name);
    }
    std::memcpy(out, it->second.data() + begin * esize, static_cast<size_t>(count) * esize);
    if (begin + count == t.n_elements()) pending.erase(it);
  };
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(dst)) {  // stale weights of another run would be read too
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".safetensors" || name == "model.safetensors.index.json") fs::remove(e.path());
  }
  const ShardedWriteResult written = write_sharded_safetensors(dst, tensors, 1, fill);
  config["quantization_config"] = quantization_config_json(spec.quant);
  if (untie) config["tie_word_embeddings"] = false;
  {
    std::ofstream out(dst / "config.json");
    out << config.dump(2) << "\n";
    if (!out) fail(ErrorCode::kIo, "quantize: cannot write ", (dst / "config.json").string());
  }
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || e.path().extension() == ".safetensors" || name == "model.safetensors.index.json" ||
        name == "config.json" || name == "quantize_config.json")
      continue;
    fs::copy_file(e.path(), dst / name, fs::copy_options::overwrite_existing);
  }
  QuantizeCheckpointResult r;
  r.spec = spec;
  r.n_quantized = static_cast<int64_t>(modules.size());
  r.total_size = written.total_size;
  return r;
}

}  // namespace shardlm
