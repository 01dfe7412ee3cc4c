#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace shardlm {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamDecoder::feed(TokenId id) {
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return {};
  pending_.append(tokenizer_.token_bytes(id));
  size_t hold = utf8::incomplete_tail(pending_);
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace shardlm
