// Incremental scanner of one tool call written as a JSON object,
// {"name": "...", "arguments": {...}} (Llama 3.1 writes "parameters"), fed
// one character at a time so its name and argument text can be streamed as
// they are generated. Shared by the hermes and llama3_json parsers.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/tool_call_parser.h"

namespace shardlm::server {

class JsonCallScanner {
 public:
  // Consumes one character of model output.
  void push(char c);
  // The outer object closed: the call is complete.
  bool done() const { return state_ == State::kDone; }
  // The text is not a JSON object (first non-space character was not '{',
  // or the structure broke): the caller treats the block as plain text.
  bool failed() const { return state_ == State::kFailed; }
  // Inside a JSON string at the moment (an end tag there is data, not a tag).
  bool in_string() const { return in_string_; }
  // The decoded "name" once its string has closed.
  const std::optional<std::string>& name() const { return name_; }
  // Raw JSON text of the "arguments"/"parameters" value scanned since the
  // last call (exactly as generated, whitespace inside kept).
  std::string take_arguments();
  // The object had an arguments value (complete or not).
  bool saw_arguments() const { return saw_arguments_; }

 private:
  enum class State { kBefore, kInObject, kDone, kFailed };
  enum class Slot { kNone, kKey, kValue };
  void begin_value(char c);

  State state_ = State::kBefore;
  int depth_ = 0;            // nesting depth; the call object is depth 1
  bool in_string_ = false;
  bool escape_ = false;
  bool expect_key_ = false;  // depth 1: the next string is a key
  std::string key_;          // the key being read / just read at depth 1
  std::string raw_string_;   // raw text of the depth-1 string being read (with quotes)
  bool reading_key_ = false;
  bool reading_name_ = false;
  bool in_value_ = false;    // between ':' and the value's first character at depth 1
  bool in_arguments_ = false;
  int arguments_depth_ = 0;  // depth at which the arguments value started
  bool arguments_scalar_ = false;
  bool saw_arguments_ = false;
  std::string arguments_;    // not yet taken
  std::optional<std::string> name_;
};

// One call being streamed: feeds its scanner and emits the call's deltas
// (the first, with id and name, once the name is known; then argument text).
class StreamedCall {
 public:
  StreamedCall(int index, std::string id) : index_(index), id_(std::move(id)) {}
  void push(char c, std::vector<ToolCallDelta>* out);
  bool emitted() const { return emitted_; }   // the first delta went out
  const JsonCallScanner& scanner() const { return scanner_; }
  const std::string& raw() const { return raw_; }  // every character pushed

 private:
  int index_;
  std::string id_;
  JsonCallScanner scanner_;
  std::string raw_;
  bool emitted_ = false;
};

}  // namespace shardlm::server
