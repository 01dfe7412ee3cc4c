#include "server/tool_call_json.h"

#include <nlohmann/json.hpp>

namespace shardlm::server {

namespace {
bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
}  // namespace

std::string JsonCallScanner::take_arguments() {
  std::string out;
  out.swap(arguments_);
  return out;
}

void JsonCallScanner::begin_value(char c) {
  in_value_ = false;
  const bool is_arguments = key_ == "arguments" || key_ == "parameters";
  if (key_ == "name" && c == '"') {
    reading_name_ = true;
    raw_string_.assign(1, c);
  }
  if (is_arguments && !saw_arguments_) {
    in_arguments_ = true;
    saw_arguments_ = true;
    arguments_depth_ = depth_;
    arguments_scalar_ = c != '{' && c != '[' && c != '"';
  }
}

void JsonCallScanner::push(char c) {
  if (state_ == State::kDone || state_ == State::kFailed) return;
  if (state_ == State::kBefore) {
    if (is_space(c)) return;
    if (c != '{') {
      state_ = State::kFailed;
      return;
    }
    state_ = State::kInObject;
    depth_ = 1;
    expect_key_ = true;
    return;
  }
  // A scalar arguments value (a number, true, ...) ends before ',' or '}'.
  if (in_arguments_ && arguments_scalar_ && !in_string_ && depth_ == arguments_depth_ && (c == ',' || c == '}'))
    in_arguments_ = false;
  if (in_value_ && !is_space(c)) begin_value(c);
  if (in_arguments_) arguments_ += c;

  if (in_string_) {
    if (reading_key_ || reading_name_) raw_string_ += c;
    if (escape_) {
      escape_ = false;
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '"') {
      in_string_ = false;
      if (reading_key_ || reading_name_) {
        std::string decoded;
        try {
          decoded = nlohmann::json::parse(raw_string_).get<std::string>();
        } catch (const nlohmann::json::exception&) {
          state_ = State::kFailed;
          return;
        }
        if (reading_key_) key_ = decoded;
        else name_ = decoded;
        reading_key_ = reading_name_ = false;
      }
      if (in_arguments_ && depth_ == arguments_depth_) in_arguments_ = false;  // a string value closed
    }
    return;
  }
  switch (c) {
    case '"':
      in_string_ = true;
      if (depth_ == 1 && expect_key_) {
        reading_key_ = true;
        expect_key_ = false;
        raw_string_.assign(1, c);
      }
      break;
    case '{':
    case '[':
      ++depth_;
      break;
    case '}':
    case ']':
      --depth_;
      if (in_arguments_ && depth_ == arguments_depth_) in_arguments_ = false;
      if (depth_ == 0) {
        if (c != '}') state_ = State::kFailed;
        else state_ = State::kDone;
      } else if (depth_ < 0) {
        state_ = State::kFailed;
      }
      break;
    case ':':
      if (depth_ == 1) in_value_ = true;
      break;
    case ',':
      if (depth_ == 1) expect_key_ = true;
      break;
    default:
      break;
  }
}

void StreamedCall::push(char c, std::vector<ToolCallDelta>* out) {
  raw_ += c;
  scanner_.push(c);
  if (scanner_.failed()) return;
  if (!emitted_ && scanner_.name()) {
    emitted_ = true;
    out->push_back({index_, id_, *scanner_.name(), scanner_.take_arguments()});
  } else if (emitted_) {
    std::string args = scanner_.take_arguments();
    if (!args.empty()) {
      if (!out->empty() && out->back().index == index_) out->back().arguments += args;
      else out->push_back({index_, "", "", std::move(args)});
    }
  }
  if (scanner_.done() && emitted_ && !scanner_.saw_arguments()) out->push_back({index_, "", "", "{}"});
}

}  // namespace shardlm::server
