#include "loader/checkpoint.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/bounded_json_file.h"
#include "core/units.h"

namespace shardlm {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kListedPerKind = 20;  // longer lists of missing/unexpected tensors are summarised
constexpr const char* kFixRedownloadBoth =
    "the index and the shards come from different downloads; download the model again";

Problem make_problem(Severity severity, ErrorCode code, std::string file, std::string tensor, std::string message,
                     std::string fix) {
  return {severity, code, std::move(file), std::move(tensor), std::move(message), std::move(fix)};
}

std::optional<fs::path> existing(const fs::path& dir, const char* name) {
  fs::path p = dir / name;
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return p;
  return std::nullopt;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}


std::string plural(size_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name.find('/') == std::string_view::npos && name.find('\\') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos && name != "." && name != "..";
}

Checkpoint Checkpoint::inspect(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail(ErrorCode::kNotFound, dir.string(), ": no such directory");
  if (!fs::is_directory(dir, ec))
    fail(ErrorCode::kInvalidArgument, dir.string(), ": not a directory; give the model directory (the one with config.json)");
  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  checkpoint.config_json_ = existing(dir, "config.json");
  checkpoint.tokenizer_json_ = existing(dir, "tokenizer.json");
  checkpoint.tokenizer_config_json_ = existing(dir, "tokenizer_config.json");
  checkpoint.generation_config_json_ = existing(dir, "generation_config.json");
  checkpoint.scan();
  return checkpoint;
}

Checkpoint Checkpoint::open(const fs::path& dir) {
  Checkpoint checkpoint = inspect(dir);
  throw_first_error(checkpoint.problems_, str_cat("run `shardlm verify ", dir.string(), "` to list them"));
  return checkpoint;
}

void Checkpoint::scan() {
  std::vector<Problem>& problems = problems_;
  // weight_map: tensor -> file, as the index says (sharded checkpoints only).
  std::map<std::string, std::string> weight_map;
  bool index_usable = false;

  if (existing(dir_, kSingleWeightsFile)) {
    // transformers prefers model.safetensors when both are present; so do we.
    weight_file_names_ = {kSingleWeightsFile};
  } else if (existing(dir_, kWeightsIndexFile)) {
    sharded_ = true;
    std::ifstream in(dir_ / kWeightsIndexFile, std::ios::binary);
    json index;
    std::string index_error;
    try {
      index = parse_json_file(in, (dir_ / kWeightsIndexFile).string());
    } catch (const json::exception& e) {
      index_error = str_cat("is not valid JSON (", e.what(), ")");
    }
    if (index_error.empty() && !index.is_object()) index_error = "is not a JSON object";
    auto map = index_error.empty() ? index.find("weight_map") : index.end();
    if (index_error.empty() && (map == index.end() || !map->is_object()))
      index_error = "has no \"weight_map\" object mapping tensor names to shard files";
    if (!index_error.empty()) {
      problems.push_back(make_problem(Severity::kError, ErrorCode::kCorruptFile, kWeightsIndexFile, "",
                                      index_error, "download model.safetensors.index.json again"));
    } else {
      index_usable = true;
      for (const auto& [tensor, file] : map->items()) {
        if (!file.is_string() || !is_plain_file_name(file.get<std::string>())) {
          problems.push_back(make_problem(
              Severity::kError, ErrorCode::kCorruptFile, kWeightsIndexFile, tensor,
              str_cat("weight_map entry for tensor ", tensor, " is ", file.dump(),
                      ", expected the name of a .safetensors file in the model directory"),
              "download model.safetensors.index.json again"));
          continue;
        }
        weight_map[tensor] = file.get<std::string>();
      }
    }
    if (index_usable) {
      std::set<std::string> names;
      for (const auto& [tensor, file] : weight_map) names.insert(file);
      weight_file_names_.assign(names.begin(), names.end());
      for (const auto& [tensor, file] : weight_map) all_names_.insert(tensor);
    } else {
      // Without an index, still check every shard's header.
      std::set<std::string> names;
      for (const auto& entry : fs::directory_iterator(dir_))
        if (entry.path().extension() == ".safetensors") names.insert(entry.path().filename().string());
      weight_file_names_.assign(names.begin(), names.end());
    }
  } else {
    std::vector<std::string> found;
    bool has_bin = false;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      if (entry.path().extension() == ".safetensors") found.push_back(entry.path().filename().string());
      if (entry.path().extension() == ".bin" || entry.path().extension() == ".pth") has_bin = true;
    }
    std::sort(found.begin(), found.end());
    if (!found.empty()) {
      problems.push_back(make_problem(
          Severity::kError, ErrorCode::kNotFound, kWeightsIndexFile, "",
          str_cat("missing: the directory has ", plural(found.size(), "shard", "shards"), " (", found.front(),
                  found.size() > 1 ? ", ..." : "", ") but no index saying which tensor is in which"),
          "download model.safetensors.index.json"));
    } else {
      problems.push_back(make_problem(
          Severity::kError, ErrorCode::kNotFound, kSingleWeightsFile, "",
          str_cat("missing: the directory has neither model.safetensors nor model.safetensors.index.json",
                  has_bin ? " (it has PyTorch .bin/.pth weights, which shardlm does not read)" : ""),
          "download the model's .safetensors files (and model.safetensors.index.json if sharded)"));
    }
    return;
  }

  // Map every weight file; count what the index expects in each.
  std::map<std::string, size_t> n_expected;
  for (const auto& [tensor, file] : weight_map) ++n_expected[file];
  std::map<std::string, size_t> file_slot;  // name -> index into files_
  for (const std::string& name : weight_file_names_) {
    try {
      files_.push_back(SafetensorsFile::inspect(dir_ / name, name));
      file_slot[name] = files_.size() - 1;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kNotFound) {
        problems.push_back(make_problem(
            Severity::kError, ErrorCode::kNotFound, name, "",
            sharded_ && index_usable
                ? str_cat("missing: ", kWeightsIndexFile, " puts ", plural(n_expected[name], "tensor", "tensors"),
                          " in this file")
                : std::string("missing"),
            "download this file"));
      } else {
        problems.push_back(
            make_problem(Severity::kError, e.code(), name, "", e.what(), "check the file's permissions"));
      }
    }
  }

  // Per-file problems, then names across files.
  std::map<std::string, std::string> first_file_of;  // tensor -> first file naming it
  for (size_t f = 0; f < files_.size(); ++f) {
    const SafetensorsFile& file = files_[f];
    for (const Problem& p : file.header().problems) problems.push_back(p);
    for (const SafetensorsEntry& e : file.header().tensors) {
      all_names_.insert(e.name);
      auto [it, inserted] = first_file_of.emplace(e.name, file.name());
      if (!inserted) {
        problems.push_back(make_problem(
            Severity::kError, ErrorCode::kCorruptFile, file.name(), e.name,
            str_cat("tensor ", e.name, " is also in ", it->second, "; a tensor must be in exactly one file"),
            kFixRedownloadBoth));
      }
    }
    for (size_t v = 0; v < file.tensors().size(); ++v) by_name_.emplace(file.tensors()[v].name, Location{f, v});
  }

  if (!(sharded_ && index_usable)) return;
  // The index against the shards, for shards whose header could be read.
  auto parsed = [&](const std::string& name) {
    auto it = file_slot.find(name);
    return it != file_slot.end() && files_[it->second].header().parsed;
  };
  std::map<std::string, std::set<std::string>> names_in;  // file -> tensors its header names
  for (const SafetensorsFile& file : files_)
    for (const SafetensorsEntry& e : file.header().tensors) names_in[file.name()].insert(e.name);
  for (const auto& [tensor, file] : weight_map) {
    if (!parsed(file) || names_in[file].count(tensor)) continue;
    auto elsewhere = first_file_of.find(tensor);
    problems.push_back(make_problem(
        Severity::kError, ErrorCode::kCorruptFile, file, tensor,
        str_cat(kWeightsIndexFile, " puts tensor ", tensor, " in this file, but the file does not have it",
                elsewhere != first_file_of.end() ? str_cat(" (it is in ", elsewhere->second, ")") : ""),
        kFixRedownloadBoth));
  }
  for (const SafetensorsFile& file : files_) {
    for (const SafetensorsEntry& e : file.header().tensors) {
      auto it = weight_map.find(e.name);
      if (it != weight_map.end()) continue;  // listed (maybe under another file: reported above)
      problems.push_back(make_problem(Severity::kError, ErrorCode::kCorruptFile, file.name(), e.name,
                                      str_cat("tensor ", e.name, " is in this file but ", kWeightsIndexFile,
                                              " does not list it"),
                                      kFixRedownloadBoth));
    }
  }
}

const TensorView* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return nullptr;
  return &files_[it->second.file].tensors()[it->second.view];
}

const TensorView& Checkpoint::at(std::string_view name) const {
  const TensorView* view = find(name);
  if (view == nullptr) fail(ErrorCode::kNotFound, dir_.string(), ": the checkpoint has no tensor ", name);
  return *view;
}

const SafetensorsFile* Checkpoint::file_of(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &files_[it->second.file];
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(by_name_.size());
  for (const auto& [name, loc] : by_name_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

uint64_t Checkpoint::tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, loc] : by_name_) total += files_[loc.file].tensors()[loc.view].n_bytes;
  return total;
}

// ---------------------------------------------------------------------------
// Against config.json

namespace {

std::string heads_reason(const char* field, int64_t n, const ModelSpec& s) {
  return str_cat(field, "=", n, ", head_dim=", s.head_dim);
}

// Which config.json fields set dimension `dim` of tensor `name`.
std::string dim_reason(const std::string& name, size_t dim, const ModelSpec& s) {
  const std::string hidden = str_cat("hidden_size=", s.hidden_size);
  const std::string q = heads_reason("num_attention_heads", s.n_heads, s);
  const std::string kv = heads_reason("num_key_value_heads", s.n_kv_heads, s);
  const bool expert = name.find(".experts.") != std::string::npos;
  const std::string inter = !expert ? str_cat("intermediate_size=", s.intermediate_size)
                            : s.family == Family::kQwen3Moe ? str_cat("moe_intermediate_size=", s.moe_intermediate_size)
                                                            : str_cat("intermediate_size=", s.moe_intermediate_size);
  const std::string experts = str_cat(s.family == Family::kMixtral ? "num_local_experts=" : "num_experts=", s.n_experts);
  auto pick = [dim](const std::string& d0, const std::string& d1) { return dim == 0 ? d0 : d1; };
  if (ends_with(name, "embed_tokens.weight") || ends_with(name, "lm_head.weight"))
    return pick(str_cat("vocab_size=", s.vocab_size), hidden);
  if (ends_with(name, "q_proj.weight") || ends_with(name, "q_proj.bias")) return pick(q, hidden);
  if (ends_with(name, "k_proj.weight") || ends_with(name, "k_proj.bias") || ends_with(name, "v_proj.weight") ||
      ends_with(name, "v_proj.bias"))
    return pick(kv, hidden);
  if (ends_with(name, "o_proj.weight")) return pick(hidden, q);
  if (ends_with(name, "q_norm.weight") || ends_with(name, "k_norm.weight")) return str_cat("head_dim=", s.head_dim);
  if (ends_with(name, "norm.weight")) return hidden;
  if (ends_with(name, "gate_proj.weight") || ends_with(name, "up_proj.weight") || ends_with(name, "w1.weight") ||
      ends_with(name, "w3.weight"))
    return pick(inter, hidden);
  if (ends_with(name, "down_proj.weight") || ends_with(name, "w2.weight")) return pick(hidden, inter);
  if (ends_with(name, "gate.weight")) return pick(experts, hidden);
  return "";
}

std::string shape_reasons(const std::string& name, const std::vector<int64_t>& found,
                          const std::vector<int64_t>& expected, const ModelSpec& s) {
  std::vector<std::string> reasons;
  for (size_t d = 0; d < expected.size(); ++d) {
    if (found.size() == expected.size() && found[d] == expected[d]) continue;
    std::string r = dim_reason(name, d, s);
    if (!r.empty() && std::find(reasons.begin(), reasons.end(), r) == reasons.end()) reasons.push_back(r);
  }
  std::string out;
  for (const std::string& r : reasons) out += (out.empty() ? "" : ", ") + r;
  return out.empty() ? "" : " (" + out + ")";
}

// Tensors that old checkpoints carry and loaders ignore.
// Tensors of a multimodal checkpoint outside its language model (the vision
// tower) are not loaded either.
bool ignorable_extra(const std::string& name, const ModelSpec& spec) {
  for (const std::string& prefix : spec.ignored_tensor_prefixes)
    if (name.rfind(prefix, 0) == 0) return true;
  return ends_with(name, ".rotary_emb.inv_freq");
}

}  // namespace

std::vector<Problem> validate_against_spec(const Checkpoint& checkpoint, const ModelSpec& spec) {
  std::vector<Problem> out;
  const std::string weights_file = checkpoint.sharded() ? kWeightsIndexFile : kSingleWeightsFile;
  const std::string described = str_cat(spec.architecture, " with ", spec.n_layers, " layers");
  const char* fix_mismatch = "the weights and config.json do not belong together; use the config.json "
                             "that came with these weights (or download the model again)";

  const std::vector<TensorSpec> expected = expected_tensors(spec);
  const std::vector<std::string> names = checkpoint.tensor_names();
  // Quantized storage under a config.json that does not say how to read it:
  // say so first, rather than only that the plain weights are missing.
  if (!spec.quant.enabled()) {
    for (const std::string& name : names) {
      const TensorView* view = checkpoint.find(name);
      const bool quant_name = ends_with(name, ".qweight") || ends_with(name, ".qzeros") || ends_with(name, ".g_idx") ||
                              ends_with(name, ".weight_scale_inv") || ends_with(name, ".weight_scale");
      if (!quant_name && is_compute_dtype(view->dtype)) continue;
      out.push_back(make_problem(
          Severity::kError, ErrorCode::kUnsupported, checkpoint.file_of(name)->name(), name,
          str_cat("tensor ", name, " (", dtype_safetensors_name(view->dtype), " ", shape_string(view->shape),
                  ") is quantized storage, but config.json has no quantization_config saying how to read it"),
          "use the config.json that came with these weights (AWQ, GPTQ and FP8 checkpoints carry a "
          "quantization_config; older GPTQ ones a quantize_config.json)"));
      break;
    }
  }
  std::unordered_set<std::string> expected_names;
  std::unordered_set<std::string> own_dtype;  // tensors whose dtype the quantization fixes
  std::vector<const TensorSpec*> missing;
  for (const TensorSpec& t : expected) {
    expected_names.insert(t.name);
    if (!t.dtypes.empty()) own_dtype.insert(t.name);
    const TensorView* view = checkpoint.find(t.name);
    if (view == nullptr) {
      // Named but unusable (truncated, bad dtype): its file's problem already says so.
      if (!t.optional && !checkpoint.names(t.name)) missing.push_back(&t);
      continue;
    }
    if (t.part != QuantPart::kNone) {
      const bool shape_ok = view->shape == t.shape ||
                            std::find(t.other_shapes.begin(), t.other_shapes.end(), view->shape) != t.other_shapes.end();
      if (!shape_ok) {
        std::string accepted = shape_string(t.shape);
        for (const auto& o : t.other_shapes) accepted += " or " + shape_string(o);
        out.push_back(make_problem(
            Severity::kError, ErrorCode::kInvalidArgument, checkpoint.file_of(t.name)->name(), t.name,
            str_cat("tensor ", t.name, " has shape ", shape_string(view->shape), ", but ", spec.quant.source, " (",
                    spec.quant.describe(), ") stores the [", t.out_features, ", ", t.in_features, "] Linear ",
                    t.module, " with ", quant_part_name(t.part), " ", accepted),
            fix_mismatch));
      }
      if (std::find(t.dtypes.begin(), t.dtypes.end(), view->dtype) == t.dtypes.end()) {
        std::string accepted;
        for (DType d : t.dtypes) accepted += (accepted.empty() ? "" : " or ") + std::string(dtype_safetensors_name(d));
        out.push_back(make_problem(
            Severity::kError, ErrorCode::kUnsupported, checkpoint.file_of(t.name)->name(), t.name,
            str_cat("tensor ", t.name, " is ", dtype_safetensors_name(view->dtype), ", but ",
                    quant_method_name(spec.quant.method), " stores ", quant_part_name(t.part), " as ", accepted),
            fix_mismatch));
      }
      continue;
    }
    if (spec.quant.enabled() && !is_compute_dtype(view->dtype)) {
      out.push_back(make_problem(
          Severity::kError, ErrorCode::kUnsupported, checkpoint.file_of(t.name)->name(), t.name,
          str_cat("tensor ", t.name, " is ", dtype_safetensors_name(view->dtype), ", but ", spec.quant.source, " (",
                  spec.quant.describe(), ") leaves it unquantized: expected ", dtype_safetensors_name(spec.dtype),
                  " (torch_dtype)"),
          fix_mismatch));
      continue;
    }
    if (view->shape != t.shape) {
      out.push_back(make_problem(Severity::kError, ErrorCode::kInvalidArgument, checkpoint.file_of(t.name)->name(),
                                 t.name,
                                 str_cat("tensor ", t.name, " has shape ", shape_string(view->shape),
                                         ", config.json implies ", shape_string(t.shape),
                                         shape_reasons(t.name, view->shape, t.shape, spec)),
                                 fix_mismatch));
    }
  }
  for (size_t i = 0; i < missing.size() && i < kListedPerKind; ++i) {
    const std::string& name = missing[i]->name;
    const bool quantized_head = missing[i]->slot == TensorSlot::kLmHead && missing[i]->part != QuantPart::kNone;
    std::string why = quantized_head
                          ? str_cat(spec.quant.source, " has \"lm_head\": true, so the lm_head is stored quantized (",
                                    spec.quant.describe(), ") as ", missing[i]->module, ".",
                                    quant_part_name(missing[i]->part))
                      : ends_with(name, "lm_head.weight")
                          ? "config.json has tie_word_embeddings=false, so the model needs its own lm_head"
                          : str_cat("config.json (", described, ") requires it");
    out.push_back(make_problem(Severity::kError, ErrorCode::kNotFound, weights_file, name,
                               str_cat("tensor ", name, " is missing; ", why), fix_mismatch));
  }
  if (missing.size() > kListedPerKind) {
    out.push_back(make_problem(Severity::kError, ErrorCode::kNotFound, weights_file, "",
                               str_cat("and ", missing.size() - kListedPerKind, " more tensors are missing (",
                                       missing.size(), " in all; config.json describes ", described, ")"),
                               fix_mismatch));
  }

  std::vector<std::string> extra;
  std::map<DType, size_t> n_by_dtype;
  for (const std::string& name : names) {
    if (ignorable_extra(name, spec) || own_dtype.count(name)) continue;
    n_by_dtype[checkpoint.find(name)->dtype]++;
    if (!expected_names.count(name)) extra.push_back(name);
  }
  for (size_t i = 0; i < extra.size() && i < kListedPerKind; ++i) {
    out.push_back(make_problem(Severity::kError, ErrorCode::kInvalidArgument, checkpoint.file_of(extra[i])->name(),
                               extra[i],
                               str_cat("tensor ", extra[i], " is not part of a ", described,
                                       " as config.json describes it",
                                       extra[i].find("lm_head.q") != std::string::npos && spec.quant.enabled()
                                           ? str_cat(" (a quantized lm_head: ", spec.quant.source,
                                                     " would need \"lm_head\": true, which GPTQ checkpoints may carry)")
                                           : std::string()),
                               fix_mismatch));
  }
  if (extra.size() > kListedPerKind) {
    out.push_back(make_problem(Severity::kError, ErrorCode::kInvalidArgument, weights_file, "",
                               str_cat("and ", extra.size() - kListedPerKind, " more unexpected tensors (",
                                       extra.size(), " in all)"),
                               fix_mismatch));
  }

  // One dtype per checkpoint: the most common one (config.json's on a tie).
  if (n_by_dtype.size() > 1) {
    DType main_dtype = spec.dtype;
    size_t best = 0;
    for (const auto& [dtype, n] : n_by_dtype) {
      if (n > best || (n == best && dtype == spec.dtype)) {
        best = n;
        main_dtype = dtype;
      }
    }
    size_t n_listed = 0, n_odd = 0;
    for (const std::string& name : names) {
      const TensorView* view = checkpoint.find(name);
      if (view->dtype == main_dtype || ignorable_extra(name, spec) || own_dtype.count(name)) continue;
      ++n_odd;
      if (n_listed++ >= kListedPerKind) continue;
      out.push_back(make_problem(
          Severity::kError, ErrorCode::kUnsupported, checkpoint.file_of(name)->name(), name,
          str_cat("tensor ", name, " is ", dtype_safetensors_name(view->dtype), " but ", with_commas(static_cast<int64_t>(best)),
                  " other tensors are ", dtype_safetensors_name(main_dtype),
                  "; shardlm needs one dtype per checkpoint"),
          str_cat("convert the checkpoint to one dtype (e.g. save it again with torch_dtype=",
                  dtype_torch_name(main_dtype), ")")));
    }
    if (n_odd > kListedPerKind) {
      out.push_back(make_problem(Severity::kError, ErrorCode::kUnsupported, weights_file, "",
                                 str_cat("and ", n_odd - kListedPerKind, " more tensors not in ",
                                         dtype_safetensors_name(main_dtype)),
                                 "convert the checkpoint to one dtype"));
    }
  }
  return out;
}

void require_matches_spec(const Checkpoint& checkpoint, const ModelSpec& spec) {
  throw_first_error(validate_against_spec(checkpoint, spec),
                    str_cat("run `shardlm verify ", checkpoint.dir().string(), "` to list them"));
}

}  // namespace shardlm
