#include "engine/tokenizer_detokenizer.h"

namespace shardlm {

namespace {
class Stream final : public DetokenizerStream {
 public:
  Stream(const Tokenizer& tokenizer, bool skip_special_tokens) : decoder_(tokenizer, skip_special_tokens) {}
  std::string push(int32_t token_id) override { return decoder_.feed(token_id); }
  std::string flush() override { return decoder_.flush(); }

 private:
  StreamDecoder decoder_;
};
}  // namespace

// Byte-level BPE decodes the generated ids on their own (no leading-space
// rule depends on the prompt), so prompt_ids are not needed here.
std::unique_ptr<DetokenizerStream> TokenizerDetokenizer::stream(std::span<const int32_t>,
                                                                bool skip_special_tokens) const {
  return std::make_unique<Stream>(tokenizer_, skip_special_tokens);
}

}  // namespace shardlm
