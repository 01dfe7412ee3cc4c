#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace shardlm {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens), strip_left_(tokenizer.leading_spaces_stripped()) {}

std::string StreamDecoder::feed(TokenId id) {
  if (skip_special_tokens_ && tokenizer_.is_special(id)) return {};
  std::string_view bytes = tokenizer_.token_bytes(id);
  while (strip_left_ > 0 && !bytes.empty()) {
    if (bytes.front() != ' ') {
      strip_left_ = 0;
      break;
    }
    bytes.remove_prefix(1);
    --strip_left_;
  }
  pending_.append(bytes);
  size_t hold = utf8::incomplete_tail(pending_);
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  strip_left_ = tokenizer_.leading_spaces_stripped();
  return out;
}

}  // namespace shardlm
