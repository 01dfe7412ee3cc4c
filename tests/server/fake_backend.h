// A scripted ServingBackend: one token per byte, output "abcd..." produced
// by a thread at a fixed pace. Lets the HTTP layer be tested without a model.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <nlohmann/json.hpp>

#include "engine/arrivals.h"
#include "server/connection_server.h"
#include "server/serving_backend.h"

namespace shardlm::server::testing {

class FakeStream : public RequestStream {
 public:
  // `script`: the text each choice generates (one byte per token, then
  // "stop"); empty: "abcd..." until max_tokens.
  FakeStream(const GenerateParams& p, std::chrono::milliseconds pace, std::atomic<int>* cancelled, std::atomic<int>* live,
             std::string script = "", int64_t cached = 0)
      : params_(p), cancelled_(cancelled), live_(live), script_(std::move(script)), cached_(cached) {
    ++*live_;
    // A stop string in the script ends it there, as the engine's stop strings
    // do (excluded from the text, reported as stop_string).
    size_t cut = std::string::npos;
    for (const auto& s : params_.stop)
      if (size_t at = script_.find(s); at != std::string::npos && at > 0 && at < cut) cut = at, stop_string_ = s;
    if (stop_string_) script_.resize(cut);
    worker_ = std::thread([this, pace] {
      const int64_t n_tokens = script_.empty() ? params_.max_tokens
                                               : std::min<int64_t>(params_.max_tokens, static_cast<int64_t>(script_.size()));
      for (int c = 0; c < params_.n; ++c) remaining_.push_back(n_tokens);
      for (int64_t step = 0;; ++step) {
        std::this_thread::sleep_for(pace);
        std::lock_guard<std::mutex> lock(mutex_);
        if (cancel_) break;
        bool any = false;
        for (int c = 0; c < params_.n; ++c) {
          if (remaining_[c] == 0) continue;
          any = true;
          GenerateEvent e;
          e.index = c;
          char ch = script_.empty() ? static_cast<char>('a' + (step % 26)) : script_[step];
          e.text = std::string(1, ch);
          e.token_ids = {static_cast<int32_t>(ch)};
          if (params_.logprobs >= 0) {
            e.logprobs = {-0.5f};
            e.tokens = {e.text};
            e.top_logprobs = {{TopLogprob{ch, e.text, -0.5f}}};
          }
          // Prompt logprobs with choice 0's first token: token i scores
          // -0.25 i with rank 1 + i % 3; its top-k are 'A', 'B', ... at -0.1 (j + 1).
          if (c == 0 && step == 0 && params_.prompt_logprobs >= 0) {
            for (size_t i = 0; i < params_.prompt_ids.size(); ++i) {
              PromptTokenLogprob p;
              p.token_id = params_.prompt_ids[i];
              p.token = std::string(1, static_cast<char>(p.token_id));
              if (i > 0) {
                p.scored = true;
                p.logprob = -0.25f * static_cast<float>(i);
                p.rank = 1 + static_cast<int32_t>(i % 3);
                for (int j = 0; j < params_.prompt_logprobs; ++j)
                  p.top.push_back(TopLogprob{'A' + j, std::string(1, static_cast<char>('A' + j)), -0.1f * (j + 1)});
              }
              e.prompt_logprobs.push_back(std::move(p));
            }
          }
          if (--remaining_[c] == 0)
            e.finish_reason = !script_.empty() && step + 1 == static_cast<int64_t>(script_.size()) ? "stop" : "length";
          if (e.finish_reason == "stop") e.stop_string = stop_string_;
          ++completion_;
          events_.push_back(e);
        }
        cv_.notify_all();
        if (!any) break;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancel_) {
        for (int c = 0; c < params_.n; ++c) {
          if (remaining_[c] == 0) continue;
          GenerateEvent e;
          e.index = c;
          e.finish_reason = "abort";
          events_.push_back(e);
          remaining_[c] = 0;
        }
      }
      producing_ = false;
      cv_.notify_all();
    });
  }
  ~FakeStream() override {
    cancel();
    worker_.join();
    --*live_;
  }
  bool next(std::vector<GenerateEvent>* out, std::chrono::milliseconds timeout) override {
    ConnectionServer::release_current_arrival();  // as EngineStream: the handler now waits for output
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty() || !producing_; });
    if (events_.empty()) return false;
    while (!events_.empty()) {
      out->push_back(events_.front());
      events_.pop_front();
    }
    return true;
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return !producing_ && events_.empty();
  }
  void cancel() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!cancel_ && producing_) ++*cancelled_;
    cancel_ = true;
  }
  int64_t prompt_tokens() const override { return static_cast<int64_t>(params_.prompt_ids.size()); }
  int64_t completion_tokens() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return completion_;
  }
  int64_t cached_tokens() const override { return cached_; }

 private:
  GenerateParams params_;
  std::atomic<int>* cancelled_;
  std::atomic<int>* live_;
  std::string script_;
  std::optional<std::string> stop_string_;  // the stop string that cut script_
  int64_t cached_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<GenerateEvent> events_;
  std::vector<int64_t> remaining_;
  int64_t completion_ = 0;
  bool cancel_ = false;
  bool producing_ = true;
  std::thread worker_;
};

class FakeBackend : public ServingBackend {
 public:
  std::atomic<bool> is_ready{true};
  std::atomic<int> cancelled{0};
  std::atomic<int> live{0};
  std::atomic<int> max_live{1000};  // more concurrent requests than this: 429 (tests change it while serving)
  std::chrono::milliseconds pace{5};
  int64_t max_len = 256;
  std::string script;                 // what every choice generates (empty: "abcd...")
  std::string template_source;        // chat_template_source()
  int64_t vocab = 0;                  // vocab_size()
  int64_t cached = 0;                 // cached_tokens() of every request
  SamplingDefaults defaults;          // sampling_defaults()
  Deployment layout = two_rank_layout();  // deployment(); available = false: "not known yet"
  mutable std::mutex seen_mutex;
  mutable ordered_json last_messages;  // what render_chat last got
  mutable ordered_json last_tools;
  GenerateParams last_params;          // what submit last got
  std::shared_ptr<Arrivals> arrivals_board;  // arrivals(); null: none
  std::vector<int64_t> pending_at_submit;    // arrivals_board->n_pending() at each submit (under seen_mutex)

  bool ready() const override { return is_ready; }
  std::string health_error() const override {
    std::lock_guard<std::mutex> lock(health_mutex);
    return down;
  }
  void set_down(std::string why) {
    std::lock_guard<std::mutex> lock(health_mutex);
    down = std::move(why);
  }
  mutable std::mutex health_mutex;
  std::string down;  // non-empty: the executor is down for this reason
  int64_t max_model_len() const override { return max_len; }
  std::vector<int32_t> tokenize(const std::string& text, bool) const override {
    return std::vector<int32_t>(text.begin(), text.end());
  }
  std::string detokenize(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids) s.push_back(static_cast<char>(id));
    return s;
  }
  // One byte per id: the vocabulary string of id i is the byte i.
  std::vector<std::string> token_strings(const std::vector<int32_t>& ids) const override {
    std::vector<std::string> out;
    for (int32_t id : ids) out.emplace_back(1, static_cast<char>(id));
    return out;
  }
  std::string render_chat(const ordered_json& messages, const ordered_json& tools, bool add_generation_prompt,
                          const ordered_json&) const override {
    {
      std::lock_guard<std::mutex> lock(seen_mutex);
      last_messages = messages;
      last_tools = tools;
    }
    std::string out;
    for (const auto& m : messages) out += m["role"].get<std::string>() + ":" + m.value("content", "") + "\n";
    if (add_generation_prompt) out += "assistant:";
    return out;
  }
  std::unique_ptr<RequestStream> submit(const GenerateParams& params) override {
    if (live >= max_live) throw ApiException({429, "the waiting queue is full", "rate_limit_error", "", "queue_full"});
    {
      std::lock_guard<std::mutex> lock(seen_mutex);
      last_params = params;
      if (arrivals_board) pending_at_submit.push_back(arrivals_board->n_pending());
    }
    return std::make_unique<FakeStream>(params, pace, &cancelled, &live, script, cached);
  }
  std::string chat_template_source() const override { return template_source; }
  int64_t vocab_size() const override { return vocab; }
  // accept_grammars: every grammar "compiles" to none, and `script` plays
  // what the grammar would have made the model write.
  std::shared_ptr<const grammar::CompiledGrammar> compile_grammar(const grammar::GrammarSpec& spec) const override {
    if (accept_grammars) return nullptr;
    return ServingBackend::compile_grammar(spec);
  }
  bool accept_grammars = false;
  SamplingDefaults sampling_defaults() const override { return defaults; }
  Deployment deployment() const override { return layout; }
  std::shared_ptr<Arrivals> arrivals() const override { return arrivals_board; }
  // TP=2 on one replica; rank 1's measured weights differ from plan by 1 byte.
  static Deployment two_rank_layout() {
    Deployment d;
    d.available = true;
    d.model = "tiny";
    d.architecture = "Qwen2ForCausalLM";
    d.dtype = "BF16";
    d.tp = 2;
    d.n_layers = 2;
    d.n_heads = 4;
    d.n_kv_heads = 2;
    d.head_dim = 32;
    d.max_model_len = 256;
    d.block_size = 16;
    d.kv_tokens_per_replica = 4096;
    for (int r = 0; r < 2; ++r) {
      RankDeployment rd;
      rd.rank = rd.tp_rank = r;
      rd.device = "cpu";
      rd.memory_bytes = rd.capacity_bytes = 3'000'000;
      rd.planned_weight_bytes = 300'000 + r;
      rd.planned_kv_cache_bytes = 2'000'000;
      rd.planned_workspace_bytes = 500'000;
      rd.measured_weight_bytes = 300'000 + 2 * r;
      rd.measured_kv_cache_bytes = 2'000'000;
      rd.n_kv_blocks = 256;
      rd.kv_bytes_per_token = 512;
      rd.q_heads = {2 * r, 2 * r + 2};
      rd.kv_heads = {r, r + 1};
      rd.layers = {0, 2};
      d.ranks.push_back(rd);
    }
    return d;
  }
  std::string metrics() const override { return "vllm:num_requests_running " + std::to_string(live.load()) + "\n"; }
};

}  // namespace shardlm::server::testing
