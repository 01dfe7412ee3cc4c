#include "loader/problem.h"

namespace shardlm {

std::string Problem::text() const {
  std::string out = file.empty() ? message : file + ": " + message;
  if (!fix.empty()) out += "; " + fix;
  return out;
}

bool has_errors(const std::vector<Problem>& problems) {
  for (const Problem& p : problems)
    if (p.severity == Severity::kError) return true;
  return false;
}

void throw_first_error(const std::vector<Problem>& problems, const std::string& hint) {
  const Problem* first = nullptr;
  size_t n_errors = 0;
  for (const Problem& p : problems) {
    if (p.severity != Severity::kError) continue;
    if (first == nullptr) first = &p;
    ++n_errors;
  }
  if (first == nullptr) return;
  std::string message = first->text();
  if (n_errors > 1) {
    message += str_cat(" (and ", n_errors - 1, " more problem", n_errors > 2 ? "s" : "");
    message += hint.empty() ? ")" : "; " + hint + ")";
  }
  throw Error(first->code, message);
}

}  // namespace shardlm
