#include "loader/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "core/bounded_json_file.h"
#include "core/units.h"

namespace shardlm {

namespace {

using nlohmann::json;

constexpr const char* kFixDownloadAgain = "download this file again";
constexpr const char* kFixCorrupt = "the file is corrupt; download it again";

// Every dtype the safetensors format defines, with its size in bits.
struct FormatDType {
  const char* name;
  int bits;
};
constexpr FormatDType kFormatDTypes[] = {
    {"BOOL", 8},     {"U8", 8},       {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8},  {"I16", 16},     {"U16", 16}, {"F16", 16},    {"BF16", 16},
    {"I32", 32},     {"U32", 32},     {"F32", 32}, {"F64", 64},    {"I64", 64},
    {"U64", 64},     {"C64", 64},     {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
};

const FormatDType* find_format_dtype(std::string_view name) {
  for (const FormatDType& d : kFormatDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::optional<DType> supported_dtype(std::string_view name) {
  DType d;
  if (parse_safetensors_dtype(name, &d)) return d;
  return std::nullopt;
}

const char* json_kind(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number";
    default: return "an unexpected value";
  }
}

// JSON text of a small value for a message, cut to a readable length.
std::string json_excerpt(const json& value) {
  std::string text = value.dump(-1, ' ', true, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// nlohmann's parse_error text without its "[json.exception...] parse error at
// line 1, column 8: " prefix, with non-printable bytes replaced.
std::string parse_error_reason(const char* what) {
  std::string text = what;
  if (auto pos = text.find("] "); pos != std::string::npos && text.rfind("[json", 0) == 0)
    text = text.substr(pos + 2);
  if (text.rfind("parse error", 0) == 0)
    if (auto pos = text.find(": "); pos != std::string::npos) text = text.substr(pos + 2);
  for (char& c : text) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';
  }
  if (text.size() > 200) text = text.substr(0, 197) + "...";
  return text;
}

class Collector {
 public:
  Collector(std::string file, std::vector<Problem>* out) : file_(std::move(file)), out_(out) {}

  void error(ErrorCode code, std::string tensor, std::string message, std::string fix) {
    out_->push_back({Severity::kError, code, file_, std::move(tensor), std::move(message), std::move(fix)});
  }
  void warning(std::string tensor, std::string message, std::string fix) {
    out_->push_back({Severity::kWarning, ErrorCode::kCorruptFile, file_, std::move(tensor),
                     std::move(message), std::move(fix)});
  }

 private:
  std::string file_;
  std::vector<Problem>* out_;
};

// A list of non-negative integers, or nullopt.
std::optional<std::vector<uint64_t>> unsigned_list(const json& value) {
  if (!value.is_array()) return std::nullopt;
  std::vector<uint64_t> out;
  out.reserve(value.size());
  for (const json& v : value) {
    if (!v.is_number_unsigned()) return std::nullopt;
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

// Parses one {dtype, shape, data_offsets} entry; false if its layout is unusable.
bool parse_entry(const std::string& name, const json& value, Collector& problems,
                 SafetensorsEntry* entry) {
  entry->name = name;
  if (!value.is_object()) {
    problems.error(ErrorCode::kCorruptFile, name,
                   str_cat("header entry for tensor ", name, " is ", json_kind(value),
                           ", expected an object with dtype, shape and data_offsets"),
                   kFixCorrupt);
    return false;
  }
  bool ok = true;

  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) {
    problems.error(ErrorCode::kCorruptFile, name,
                   dtype_it == value.end()
                       ? str_cat("tensor ", name, " has no \"dtype\"")
                       : str_cat("tensor ", name, ": \"dtype\" is ", json_kind(*dtype_it),
                                 ", expected a string such as \"BF16\""),
                   kFixCorrupt);
  } else {
    entry->dtype_name = dtype_it->get<std::string>();
    entry->dtype = supported_dtype(entry->dtype_name);
    if (!entry->dtype) {
      if (find_format_dtype(entry->dtype_name) != nullptr) {
        problems.error(ErrorCode::kUnsupported, name,
                       str_cat("tensor ", name, " has dtype ", entry->dtype_name,
                               ", which shardlm does not support (supported: ", supported_safetensors_dtypes(), ")"),
                       "use a bf16, f16 or f32 checkpoint of this model, or one quantized with AWQ, GPTQ or FP8");
      } else {
        problems.error(ErrorCode::kCorruptFile, name,
                       str_cat("tensor ", name, " has dtype ", json_excerpt(*dtype_it),
                               ", which is not a safetensors dtype"),
                       kFixCorrupt);
      }
    }
  }

  auto shape_it = value.find("shape");
  std::optional<std::vector<uint64_t>> shape;
  if (shape_it != value.end()) shape = unsigned_list(*shape_it);
  if (!shape) {
    problems.error(ErrorCode::kCorruptFile, name,
                   shape_it == value.end()
                       ? str_cat("tensor ", name, " has no \"shape\"")
                       : str_cat("tensor ", name, ": shape must be a list of non-negative integers, found ",
                                 json_excerpt(*shape_it)),
                   kFixCorrupt);
    ok = false;
  } else {
    for (uint64_t d : *shape) {
      if (d > static_cast<uint64_t>(INT64_MAX)) {
        problems.error(ErrorCode::kCorruptFile, name,
                       str_cat("tensor ", name, ": shape dimension ", d, " is too large"), kFixCorrupt);
        ok = false;
        break;
      }
      entry->shape.push_back(static_cast<int64_t>(d));
    }
  }

  auto offsets_it = value.find("data_offsets");
  std::optional<std::vector<uint64_t>> offsets;
  if (offsets_it != value.end()) offsets = unsigned_list(*offsets_it);
  if (!offsets || offsets->size() != 2 || (*offsets)[0] > (*offsets)[1]) {
    problems.error(ErrorCode::kCorruptFile, name,
                   offsets_it == value.end()
                       ? str_cat("tensor ", name, " has no \"data_offsets\"")
                       : str_cat("tensor ", name,
                                 ": data_offsets must be [begin, end] with 0 <= begin <= end, found ",
                                 json_excerpt(*offsets_it)),
                   kFixCorrupt);
    ok = false;
  } else {
    entry->begin = (*offsets)[0];
    entry->end = (*offsets)[1];
  }
  if (!ok) return false;

  // Byte count: product(shape) x element size must equal end - begin.
  const FormatDType* format = find_format_dtype(entry->dtype_name);
  if (format == nullptr) return true;  // dtype problem already reported; layout still checked
  uint64_t n_elements = 1;
  bool overflow = false;
  for (int64_t d : entry->shape)
    overflow = overflow || __builtin_mul_overflow(n_elements, static_cast<uint64_t>(d), &n_elements);
  uint64_t n_bits = 0;
  overflow = overflow || __builtin_mul_overflow(n_elements, static_cast<uint64_t>(format->bits), &n_bits);
  uint64_t n_span = entry->end - entry->begin;
  if (overflow) {
    problems.error(ErrorCode::kCorruptFile, name,
                   str_cat("tensor ", name, " has shape ", shape_string(entry->shape),
                           ", too many elements to exist"),
                   kFixCorrupt);
    return true;
  }
  uint64_t n_bytes = (n_bits + 7) / 8;
  if (n_bytes != n_span) {
    problems.error(ErrorCode::kCorruptFile, name,
                   str_cat("tensor ", name, " has shape ", shape_string(entry->shape), " and dtype ",
                           entry->dtype_name, ", so ", with_commas(static_cast<int64_t>(n_bytes)),
                           " bytes, but data_offsets [", entry->begin, ", ", entry->end, "] span ",
                           with_commas(static_cast<int64_t>(n_span)), " bytes"),
                   kFixCorrupt);
    return true;
  }
  entry->usable = entry->dtype.has_value();  // inside-the-file is checked with the layout
  return true;
}

// Overlaps, holes, truncation and trailing bytes, over entries sorted by offset.
// Gaps are reported only when every entry's place is known (a malformed
// entry's bytes would otherwise show up as a gap too).
void check_layout(SafetensorsHeader& header, bool report_gaps, Collector& problems) {
  std::vector<SafetensorsEntry>& entries = header.tensors;
  std::sort(entries.begin(), entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  const uint64_t data_size = header.file_size - header.data_start;

  uint64_t cursor = 0;           // end of the data covered so far
  const SafetensorsEntry* last = nullptr;  // the tensor that ends at cursor
  uint64_t max_end = 0;
  for (const SafetensorsEntry& e : entries) {
    max_end = std::max(max_end, e.end);
    if (e.begin == e.end) continue;  // empty tensors occupy no bytes
    if (e.begin < cursor) {
      problems.error(ErrorCode::kCorruptFile, e.name,
                     str_cat("tensors ", last->name, " [", last->begin, ", ", last->end, ") and ", e.name,
                             " [", e.begin, ", ", e.end, ") overlap"),
                     kFixCorrupt);
    } else if (e.begin > cursor && report_gaps) {
      problems.warning(e.name,
                       str_cat("bytes [", cursor, ", ", e.begin, ") of the data section (",
                               with_commas(static_cast<int64_t>(e.begin - cursor)), " bytes) belong to no tensor",
                               last ? str_cat(" (between ", last->name, " and ", e.name, ")")
                                    : str_cat(" (before ", e.name, ")")),
                       "loading ignores them, but no standard safetensors writer leaves gaps; "
                       "download the file again if unsure");
    }
    if (e.end > cursor) {
      cursor = e.end;
      last = &e;
    }
  }

  // max_end <= data_size is the file-size check; written without 8 + N + end overflowing.
  if (max_end > data_size) {
    const SafetensorsEntry* first_past = nullptr;
    size_t n_past = 0;
    for (SafetensorsEntry& e : entries) {
      if (e.end <= data_size) continue;
      e.usable = false;
      if (first_past == nullptr) first_past = &e;
      ++n_past;
    }
    uint64_t expected = max_end > UINT64_MAX - header.data_start ? UINT64_MAX : header.data_start + max_end;
    std::string expected_text = expected > static_cast<uint64_t>(INT64_MAX)
                                    ? std::to_string(expected)
                                    : with_commas(static_cast<int64_t>(expected));
    problems.error(ErrorCode::kCorruptFile, first_past->name,
                   str_cat(with_commas(static_cast<int64_t>(header.file_size)), " of ", expected_text,
                           " bytes — the download was cut (", n_past, n_past == 1 ? " tensor ends" : " tensors end",
                           " past the end of the file, the first is ", first_past->name, ")"),
                   kFixDownloadAgain);
  } else if (max_end < data_size && report_gaps) {
    problems.warning("",
                     str_cat("the last tensor ends at byte ", with_commas(static_cast<int64_t>(header.data_start + max_end)),
                             " but the file has ", with_commas(static_cast<int64_t>(header.file_size)), " bytes (",
                             with_commas(static_cast<int64_t>(data_size - max_end)), " bytes belong to no tensor)"),
                     "loading ignores them; download the file again if it should match the published one");
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> bytes, std::string_view file_name) {
  SafetensorsHeader header;
  header.file = std::string(file_name);
  header.file_size = bytes.size();
  Collector problems(header.file, &header.problems);

  if (bytes.size() < 8) {
    problems.error(ErrorCode::kCorruptFile, "",
                   str_cat("only ", bytes.size(), " bytes — a safetensors file starts with an 8-byte header "
                           "length; the download was cut"),
                   kFixDownloadAgain);
    return header;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  header.header_size = n;
  if (n > kMaxSafetensorsHeaderBytes) {
    problems.error(ErrorCode::kCorruptFile, "",
                   str_cat("the header length field says ", n, " bytes, more than the ",
                           with_commas(static_cast<int64_t>(kMaxSafetensorsHeaderBytes)),
                           "-byte limit — the file is corrupt or not a safetensors file"),
                   kFixDownloadAgain);
    return header;
  }
  if (n > bytes.size() - 8) {
    problems.error(ErrorCode::kCorruptFile, "",
                   str_cat("the header length field says ", with_commas(static_cast<int64_t>(n)),
                           " bytes but only ", with_commas(static_cast<int64_t>(bytes.size() - 8)),
                           " bytes follow it — the file is cut short or corrupt"),
                   kFixDownloadAgain);
    return header;
  }
  header.data_start = 8 + n;

  // Duplicate names would otherwise silently collapse to the last one.
  std::set<std::string> seen;
  std::vector<std::string> duplicates;
  json root;
  size_t n_unplaced = 0;  // entries whose data_offsets are unknown
  bool too_deep = false;
  try {
    const char* text = reinterpret_cast<const char*>(bytes.data()) + 8;
    root = json::parse(text, text + n, [&](int depth, json::parse_event_t event, json& parsed) {
      // Deeper than any real header: dropped as it is read, so nothing
      // recursive (dump, ==) ever walks it; reported below.
      if (depth >= kMaxFileJsonDepth &&
          (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start)) {
        too_deep = true;
        return false;
      }
      if (depth == 1 && event == json::parse_event_t::key && parsed.is_string()) {
        if (!seen.insert(parsed.get<std::string>()).second) duplicates.push_back(parsed.get<std::string>());
      }
      return true;
    });
  } catch (const json::parse_error& e) {
    problems.error(ErrorCode::kCorruptFile, "",
                   str_cat("the header is not valid JSON (at byte ", e.byte, " of ",
                           with_commas(static_cast<int64_t>(n)), ": ", parse_error_reason(e.what()), ")"),
                   kFixCorrupt);
    return header;
  } catch (const json::exception& e) {
    problems.error(ErrorCode::kCorruptFile, "",
                   str_cat("the header is not valid JSON (", parse_error_reason(e.what()), ")"), kFixCorrupt);
    return header;
  }
  if (too_deep) {
    problems.error(ErrorCode::kCorruptFile, "",
                   str_cat("the header nests JSON deeper than ", kMaxFileJsonDepth,
                           " levels; a safetensors header never does"),
                   kFixCorrupt);
    return header;
  }
  if (!root.is_object()) {
    problems.error(ErrorCode::kCorruptFile, "",
                   str_cat("the header is ", json_kind(root),
                           ", expected a JSON object mapping tensor names to {dtype, shape, data_offsets}"),
                   kFixCorrupt);
    return header;
  }
  header.parsed = true;
  for (const std::string& name : duplicates) {
    problems.error(ErrorCode::kCorruptFile, name == "__metadata__" ? "" : name,
                   str_cat("\"", name, "\" appears more than once in the header"), kFixCorrupt);
  }

  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        problems.error(ErrorCode::kCorruptFile, "",
                       str_cat("__metadata__ is ", json_kind(value), ", expected an object of strings"),
                       kFixCorrupt);
        continue;
      }
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) {
          problems.error(ErrorCode::kCorruptFile, "",
                         str_cat("__metadata__ key \"", key, "\" is ", json_kind(item), ", expected a string"),
                         kFixCorrupt);
          continue;
        }
        header.metadata[key] = item.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry entry;
    if (parse_entry(name, value, problems, &entry))
      header.tensors.push_back(std::move(entry));
    else
      ++n_unplaced;
  }
  check_layout(header, n_unplaced == 0, problems);
  return header;
}

int64_t TensorView::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t TensorView::row_bytes() const {
  size_t n = dtype_size(dtype);
  for (size_t i = 1; i < shape.size(); ++i) n *= static_cast<size_t>(shape[i]);
  return n;
}

TensorView slice_rows(const TensorView& tensor, int64_t r0, int64_t r1) {
  if (tensor.shape.empty())
    fail(ErrorCode::kInvalidArgument, "tensor ", tensor.name, " is a scalar; it has no rows to slice");
  if (r0 < 0 || r1 < r0 || r1 > tensor.shape[0])
    fail(ErrorCode::kInvalidArgument, "tensor ", tensor.name, " ", shape_string(tensor.shape), ": rows [", r0,
         ", ", r1, ") are outside [0, ", tensor.shape[0], ")");
  TensorView out = tensor;
  size_t row = tensor.row_bytes();
  out.shape[0] = r1 - r0;
  out.data = static_cast<const uint8_t*>(tensor.data) + static_cast<size_t>(r0) * row;
  out.n_bytes = static_cast<size_t>(r1 - r0) * row;
  return out;
}

void copy_block(const TensorView& tensor, int64_t r0, int64_t r1, int64_t c0, int64_t c1, void* dst) {
  if (tensor.rank() != 2)
    fail(ErrorCode::kInvalidArgument, "tensor ", tensor.name, " has shape ", shape_string(tensor.shape),
         "; column slices need a 2-D tensor");
  const int64_t n_rows = tensor.shape[0], n_cols = tensor.shape[1];
  if (r0 < 0 || r1 < r0 || r1 > n_rows || c0 < 0 || c1 < c0 || c1 > n_cols)
    fail(ErrorCode::kInvalidArgument, "tensor ", tensor.name, " ", shape_string(tensor.shape), ": block rows [",
         r0, ", ", r1, ") x columns [", c0, ", ", c1, ") is outside it");
  const size_t elem = dtype_size(tensor.dtype);
  const size_t src_row = static_cast<size_t>(n_cols) * elem;
  const size_t dst_row = static_cast<size_t>(c1 - c0) * elem;
  if (dst_row == 0) return;
  const auto* src = static_cast<const uint8_t*>(tensor.data) + static_cast<size_t>(c0) * elem;
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t r = r0; r < r1; ++r) {
    std::memcpy(out, src + static_cast<size_t>(r) * src_row, dst_row);
    out += dst_row;
  }
}

void copy_columns(const TensorView& tensor, int64_t c0, int64_t c1, void* dst) {
  if (tensor.rank() != 2)
    fail(ErrorCode::kInvalidArgument, "tensor ", tensor.name, " has shape ", shape_string(tensor.shape),
         "; column slices need a 2-D tensor");
  copy_block(tensor, 0, tensor.shape[0], c0, c1, dst);
}

SafetensorsFile SafetensorsFile::inspect(const std::filesystem::path& path, std::string display_name) {
  SafetensorsFile file;
  file.path_ = path;
  file.map_ = MappedFile(path);
  if (display_name.empty()) display_name = path.filename().string();
  file.header_ = parse_safetensors_header(file.map_.bytes(), display_name);
  const uint8_t* data = file.map_.bytes().data() + file.header_.data_start;
  for (const SafetensorsEntry& e : file.header_.tensors) {
    if (!e.usable) continue;
    TensorView view;
    view.name = e.name;
    view.dtype = *e.dtype;
    view.shape = e.shape;
    view.data = data + e.begin;
    view.n_bytes = e.end - e.begin;
    file.by_name_.emplace(e.name, file.views_.size());
    file.views_.push_back(std::move(view));
  }
  return file;
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path, std::string display_name) {
  SafetensorsFile file = inspect(path, std::move(display_name));
  throw_first_error(file.header_.problems, "run `shardlm verify` on the model directory to list them");
  return file;
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &views_[it->second];
}

const TensorView& SafetensorsFile::at(std::string_view name) const {
  const TensorView* view = find(name);
  if (view == nullptr) fail(ErrorCode::kNotFound, header_.file, ": no tensor named ", name);
  return *view;
}

uint64_t SafetensorsFile::tensor_bytes() const {
  uint64_t total = 0;
  for (const TensorView& v : views_) total += v.n_bytes;
  return total;
}

}  // namespace shardlm
