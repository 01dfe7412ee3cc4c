// The engine streaming text through the real tokenizer (a synthetic
// byte-level BPE): deltas concatenate to Tokenizer::decode of the tokens, and
// a stop string cuts the text before it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/tokenizer_detokenizer.h"
#include "fake_model.h"
#include "loader/synthetic_tokenizer.h"

namespace shardlm {
namespace {

TEST(TokenizerDetokenizer, StreamedTextEqualsDecodeAndStopsCut) {
  Tokenizer tok = Tokenizer::from_json(synthetic_tokenizer_json(build_synthetic_tokenizer(512)).dump());
  const int64_t vocab = 512;
  TokenizerDetokenizer detok(tok);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = 64;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_model_len = 128;
  testing::FakeModel model(vocab, 64, 4);
  Engine engine(cfg, model, &detok);
  std::vector<int32_t> prompt{10, 20, 30, 40, 50};
  std::vector<int32_t> ids;
  std::string text;
  auto run = [&](EngineRequest r) {
    ids.clear();
    text.clear();
    engine.submit(r, {[&](const SequenceOutput& o) {
      ids.insert(ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      text += o.text_delta;
    }});
    engine.run_until_idle();
  };
  EngineRequest r;
  r.request_id = "a";
  r.prompt_token_ids = prompt;
  r.sampling.temperature = 0.0;
  r.stop.max_tokens = 40;
  r.stop.ignore_eos = true;
  run(r);
  ASSERT_EQ(ids.size(), 40u);
  const std::string full = tok.decode(ids, /*skip_special_tokens=*/true);
  EXPECT_EQ(text, full);
  ASSERT_GT(full.size(), 12u);
  // Stop at a 2-byte string from the middle of that text (not splitting a character).
  size_t pos = 6;
  while (pos + 2 < full.size() && ((full[pos] & 0xC0) == 0x80 || (full[pos] & 0x80) || (full[pos + 1] & 0x80))) ++pos;
  ASSERT_LT(pos + 2, full.size());
  const std::string stop = full.substr(pos, 2);
  r.request_id = "b";
  r.stop.stop = {stop};
  run(r);
  EXPECT_EQ(text, full.substr(0, full.find(stop)));
  EXPECT_TRUE(model.errors.empty());
}

}  // namespace
}  // namespace shardlm
