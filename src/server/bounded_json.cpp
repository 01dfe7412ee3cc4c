#include "server/bounded_json.h"

#include <vector>

#include "core/error.h"
#include "server/serving_backend.h"

namespace shardlm::server {

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped byte cannot end the string
      else if (c == '"') in_string = false;
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > limit) return deepest;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;  // unbalanced: the parser says so
        break;
      default: break;
    }
  }
  return deepest;
}

namespace {

using Json = nlohmann::ordered_json;

// nlohmann's DOM builder behind a SAX filter that counts nesting (refusing
// past the limit before the level is built: the parser itself is iterative)
// and tracks where it is ("messages[0].content"), so an error names the field.
class BoundedSax {
 public:
  BoundedSax(Json* out, int max_depth) : dom_(*out, /*allow_exceptions=*/false), max_depth_(max_depth) {}

  bool null() { return value() && scalar(dom_.null()); }
  bool boolean(bool v) { return value() && scalar(dom_.boolean(v)); }
  bool number_integer(Json::number_integer_t v) { return value() && scalar(dom_.number_integer(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return value() && scalar(dom_.number_unsigned(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t& s) { return value() && scalar(dom_.number_float(v, s)); }
  bool string(Json::string_t& v) { return value() && scalar(dom_.string(v)); }
  bool binary(Json::binary_t& v) { return value() && scalar(dom_.binary(v)); }
  bool start_object(std::size_t n) { return value() && open(false) && dom_.start_object(n); }
  bool key(Json::string_t& k) {
    Frame& f = frames_.back();
    // The DOM's insert scans the members so far (a repeated key replaces one).
    n_comparisons_ += f.n_members;
    if (frames_.size() == 1) f.key.clear();  // a refusal at the top names no field
    if (++f.n_members > kMaxJsonObjectMembers) return refuse(str_cat("an object with more than ", kMaxJsonObjectMembers,
                                                                    " members (the limit on JSON object members)"));
    if (n_comparisons_ > kMaxJsonKeyComparisons)
      return refuse(str_cat("objects too large in all: more than ", kMaxJsonKeyComparisons,
                            " key comparisons to build them (the limit on JSON object work; send fewer or smaller objects)"));
    f.key = k;
    return dom_.key(k);
  }
  bool end_object() { return close(dom_.end_object()); }
  bool start_array(std::size_t n) { return value() && open(true) && dom_.start_array(n); }
  bool end_array() { return close(dom_.end_array()); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) {
    error_ = e.what();
    return false;
  }

  bool too_deep() const { return too_deep_; }
  const std::string& too_large() const { return too_large_; }  // which size limit stopped the parse
  // The body's member being read ("max_tokens"); "" when the top is not an object.
  std::string field() const {
    return frames_.empty() || frames_[0].is_array ? std::string() : brief_text(frames_[0].key, 120);
  }
  const std::string& error() const { return error_; }
  // Where the parser stopped: "max_tokens", "messages[0].content"; "" at the top.
  std::string path() const {
    std::string p;
    for (size_t f = 1; f < frames_.size(); ++f) {  // frame 0 is the body itself
      const Frame& parent = frames_[f - 1];
      if (parent.is_array) p += str_cat("[", parent.index, "]");
      else p += (p.empty() ? "" : ".") + parent.key;
    }
    if (!frames_.empty()) {
      const Frame& top = frames_.back();
      if (top.is_array) p += str_cat("[", top.index, "]");
      else if (!top.key.empty()) p += (p.empty() ? "" : ".") + top.key;
    }
    return brief_text(p, 120);
  }

 private:
  struct Frame {
    bool is_array = false;
    size_t index = 0;      // arrays: the element being read
    std::string key;       // objects: the member being read
    size_t n_members = 0;  // objects: members so far
  };
  bool open(bool is_array) {
    if (static_cast<int>(frames_.size()) >= max_depth_) {
      too_deep_ = true;
      return false;
    }
    frames_.push_back(Frame{is_array, 0, "", 0});
    return true;
  }
  bool value() {
    if (++n_values_ > kMaxJsonValues)
      return refuse(str_cat("more than ", kMaxJsonValues, " values (the limit on JSON values)"));
    return true;
  }
  bool refuse(std::string why) {
    too_large_ = std::move(why);
    return false;
  }
  bool close(bool ok) {
    frames_.pop_back();
    return scalar(ok);
  }
  bool scalar(bool ok) {  // a value is complete: the enclosing array moves on
    if (!frames_.empty() && frames_.back().is_array) ++frames_.back().index;
    return ok;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  int max_depth_;
  std::vector<Frame> frames_;
  bool too_deep_ = false;
  std::string too_large_;
  size_t n_values_ = 0;
  size_t n_comparisons_ = 0;
  std::string error_;
};

}  // namespace

nlohmann::ordered_json parse_bounded_json(std::string_view text, const std::string& what, const std::string& param,
                                          int max_depth) {
  Json out;
  BoundedSax sax(&out, max_depth);
  if (Json::sax_parse(text, &sax)) return out;
  const std::string where = sax.path();
  auto refuse = [&](const std::string& message) {
    throw ApiException(ApiError{400, message, "invalid_request_error", param.empty() ? where : param, ""});
  };
  const std::string at = where.empty() ? "" : " at '" + where + "'";
  if (sax.too_deep()) {
    // Name the top-level field, not the 64 levels of "[0]" under it.
    throw ApiException(ApiError{400, str_cat(what, " is nested deeper than ", max_depth, " levels",
                                             sax.field().empty() ? "" : " in '" + sax.field() + "'",
                                             " (the limit on JSON nesting)"),
                                "invalid_request_error", param.empty() ? sax.field() : param, ""});
  }
  if (!sax.too_large().empty())  // named by its top-level field, as for depth
    throw ApiException(ApiError{400, str_cat(what, " holds ", sax.too_large(),
                                             sax.field().empty() ? "" : " in '" + sax.field() + "'"),
                                "invalid_request_error", param.empty() ? sax.field() : param, ""});
  // parse_error (malformed) or out_of_range (a number such as 1e400 that
  // does not fit a double). The parser's message quotes the last token,
  // which a client controls: cut it.
  refuse(str_cat(what, " is not valid JSON", at, ": ", brief_text(sax.error(), 200)));
  return {};  // not reached
}

std::string brief_text(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  return std::string(text.substr(0, cut)) + "...";
}

std::string brief_json(const nlohmann::ordered_json& value, size_t max_bytes) {
  // Large containers are not serialised whole only to be cut.
  if ((value.is_array() || value.is_object()) && value.size() > max_bytes)
    return str_cat(value.is_array() ? "a list of " : "an object of ", value.size(), value.is_array() ? " items" : " keys");
  try {
    return brief_text(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), max_bytes);
  } catch (const std::exception&) {
    return "(a value)";
  }
}

std::string string_field(const nlohmann::ordered_json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace shardlm::server
