#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_context* context = nullptr;  // the limits below; read-only once set, shared by threads
  bool jit = false;
  ~Impl() {
    if (context) pcre2_match_context_free(context);
    if (code) pcre2_code_free(code);
  }
};

namespace {

// A pattern that backtracks exponentially ((a+)+$ and kin, from a hostile
// tokenizer.json) would take exponential time per input byte. Each match
// attempt is bounded instead (PCRE2's own default is 10 M steps and 20 MiB):
// a real pre-tokenizer pattern takes tens of steps per token.
constexpr uint32_t kMatchLimit = 1'000'000;  // backtracking steps per attempt (~10 ms)
constexpr uint32_t kDepthLimit = 10'000;     // nested backtracking points (interpreter)
constexpr uint32_t kHeapLimitKiB = 8192;     // backtracking memory per attempt

// Probes run at load: runs of one character class, then a character that
// fails a trailing anchor or class, catch the usual catastrophic shapes.
const std::vector<std::string>& probes() {
  static const std::vector<std::string> p = [] {
    std::vector<std::string> out;
    for (const char* run : {"a", "A", "1", " ", "\n", "'", ".", "\xc3\xa9"}) {
      std::string s;
      for (int i = 0; i < 48; ++i) s += run;
      out.push_back(s + "!");
      out.push_back(s + "\x01");
    }
    out.push_back("ab1 ab1 ab1 ab1 ab1 ab1 ab1 ab1 ab1 ab1 ab1 ab1 ab1 ab1 ab1 ab1!");
    return out;
  }();
  return p;
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where)
    : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail(ErrorCode::kUnsupported, where, ": regex ", pattern, " does not compile at offset ", error_offset,
         ": ", reinterpret_cast<const char*>(message));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
  impl_->context = pcre2_match_context_create(nullptr);
  if (!impl_->context) fail(ErrorCode::kOutOfMemory, where, ": cannot allocate a regex match context");
  pcre2_set_match_limit(impl_->context, kMatchLimit);
  pcre2_set_depth_limit(impl_->context, kDepthLimit);
  pcre2_set_heap_limit(impl_->context, kHeapLimitKiB);
  // A pattern that already hits a limit on short probes would on real text:
  // refuse it at load, naming the file and field it came from.
  for (const std::string& probe : probes()) {
    try {
      find_all(probe);
    } catch (const Error& e) {
      fail(ErrorCode::kUnsupported, where, ": the regex backtracks without bound (", e.what(),
           "); a tokenizer pre-tokenizer pattern must match in linear time");
    }
  }
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  // Match data is per call so that one Regex can serve several threads.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, 0, data.get(), impl_->context)
                        : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                      data.get(), impl_->context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      const bool limit = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT ||
                         rc == PCRE2_ERROR_JIT_STACKLIMIT;
      fail(ErrorCode::kInvalidArgument, "regex ", pattern_.substr(0, 120), pattern_.size() > 120 ? "..." : "",
           " failed on the input at byte ", start, ": ", reinterpret_cast<const char*>(message),
           limit ? str_cat(" (the tokenizer's regex limits: ", kMatchLimit, " steps, depth ", kDepthLimit, ", ",
                           kHeapLimitKiB, " KiB per match)")
                 : std::string());
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.get());
    size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {
      // Empty match: step over one character so the scan moves on.
      if (begin >= text.size()) break;
      size_t n = utf8::sequence_length(text, begin);
      start = begin + (n ? n : 1);
    }
  }
  return matches;
}

}  // namespace shardlm
