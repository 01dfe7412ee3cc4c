// The real HttpServer's ServingBackend over a CadenceEngine: every request
// gets max_tokens tokens (one letter each) at the engine's step, so
// connections_bench measures the HTTP layer (cpp-httplib + WorkerPool, one
// thread per open connection) and not a model.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>

#include "bench/cadence_engine.h"
#include "server/serving_backend.h"

namespace shardlm::bench {

class CadenceStream : public server::RequestStream {
 public:
  CadenceStream(CadenceEngine& engine, const server::GenerateParams& p)
      : engine_(engine), state_(std::make_shared<State>()), prompt_tokens_(static_cast<int64_t>(p.prompt_ids.size())) {
    std::weak_ptr<State> weak = state_;
    id_ = engine_.submit(p.max_tokens, [weak](int64_t token, bool last) {
      auto s = weak.lock();
      if (!s) return;
      server::GenerateEvent e;
      e.text = std::string(1, static_cast<char>('a' + token % 26));
      e.token_ids = {static_cast<int32_t>('a' + token % 26)};
      if (last) e.finish_reason = "length";
      std::lock_guard<std::mutex> lock(s->mutex);
      s->events.push_back(std::move(e));
      ++s->completion;
      if (last) s->producing = false;
      s->cv.notify_all();
    });
  }
  ~CadenceStream() override { engine_.cancel(id_); }

  bool next(std::vector<server::GenerateEvent>* out, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->cv.wait_for(lock, timeout, [&] { return !state_->events.empty() || !state_->producing; });
    if (state_->events.empty()) return false;
    for (auto& e : state_->events) out->push_back(std::move(e));
    state_->events.clear();
    return true;
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return !state_->producing && state_->events.empty();
  }
  void cancel() override {
    engine_.cancel(id_);
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->producing = false;
    state_->cv.notify_all();
  }
  int64_t prompt_tokens() const override { return prompt_tokens_; }
  int64_t completion_tokens() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->completion;
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<server::GenerateEvent> events;
    int64_t completion = 0;
    bool producing = true;
  };
  CadenceEngine& engine_;
  std::shared_ptr<State> state_;
  int64_t prompt_tokens_;
  uint64_t id_ = 0;
};

class CadenceBackend : public server::ServingBackend {
 public:
  explicit CadenceBackend(CadenceEngine& engine) : engine_(engine) {}
  bool ready() const override { return true; }
  int64_t max_model_len() const override { return 4096; }
  std::vector<int32_t> tokenize(const std::string& text, bool) const override {
    return std::vector<int32_t>(text.begin(), text.end());
  }
  std::string detokenize(const std::vector<int32_t>& ids) const override {
    return std::string(ids.begin(), ids.end());
  }
  std::vector<std::string> token_strings(const std::vector<int32_t>& ids) const override {
    std::vector<std::string> out;
    for (int32_t id : ids) out.emplace_back(1, static_cast<char>(id));
    return out;
  }
  std::string render_chat(const server::ordered_json&, const server::ordered_json&, bool,
                          const server::ordered_json&) const override {
    throw server::ApiException({400, "connections_bench serves /v1/completions only", "invalid_request_error", "", ""});
  }
  std::unique_ptr<server::RequestStream> submit(const server::GenerateParams& params) override {
    return std::make_unique<CadenceStream>(engine_, params);
  }
  std::string metrics() const override { return ""; }
  int64_t vocab_size() const override { return 256; }

 private:
  CadenceEngine& engine_;
};

}  // namespace shardlm::bench
