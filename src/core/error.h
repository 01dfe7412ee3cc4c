// Typed errors for library code. Throw where the problem is found, with the
// context a user needs (file, tensor, field, expected vs found, how to fix);
// catch only at boundaries: main, the HTTP handler, the public API.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace shardlm {

enum class ErrorCode {
  kInvalidArgument,  // a user-supplied value is out of range or malformed
  kNotFound,         // a file, tensor, model or key does not exist
  kCorruptFile,      // a file exists but its bytes are not what its format requires
  kUnsupported,      // valid input we do not handle (architecture, dtype, feature)
  kOutOfMemory,      // a budget or allocation cannot be met
  kIo,               // the OS refused (open, mmap, read, socket)
  kDistributed,      // a peer rank failed or a collective could not complete
  kInternal,         // a bug in shardlm
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// str_cat("tensor ", name, " has ", n, " bytes") — std::format is not in GCC 12.
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(ErrorCode code, Args&&... args) {
  throw Error(code, str_cat(std::forward<Args>(args)...));
}

}  // namespace shardlm

// Checks on internal invariants (bugs, not user input): always on, even under NDEBUG.
#define SHARDLM_CHECK(cond, ...)                                                         \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::shardlm::fail(::shardlm::ErrorCode::kInternal, __FILE__, ":", __LINE__,          \
                      ": check failed: " #cond " ", ##__VA_ARGS__);                     \
  } while (0)
