#include "engine/sampling_options.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "core/error.h"

namespace shardlm {

namespace {

constexpr int32_t kMaxLogprobs = 20;  // vLLM's default --max-logprobs

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) for the draw after `n_generated` tokens.
double uniform(uint64_t seed, uint64_t n_generated) {
  uint64_t r = splitmix64(seed ^ splitmix64(n_generated + 0x51ed270b27cd7d3bULL));
  return double(r >> 11) * (1.0 / 9007199254740992.0);
}

int32_t argmax(std::span<const float> x) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(x.size()); ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

void validate(const SamplingOptions& o, int64_t vocab_size) {
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    fail(ErrorCode::kInvalidArgument, "temperature must be a finite number >= 0, got ", o.temperature);
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
    fail(ErrorCode::kInvalidArgument, "top_p must be in (0, 1], got ", o.top_p);
  if (o.top_k < -1)
    fail(ErrorCode::kInvalidArgument, "top_k must be -1 or 0 (off) or a positive count, got ", o.top_k);
  if (!(o.min_p >= 0.0f && o.min_p <= 1.0f))
    fail(ErrorCode::kInvalidArgument, "min_p must be in [0, 1], got ", o.min_p);
  if (!(o.presence_penalty >= -2.0f && o.presence_penalty <= 2.0f))
    fail(ErrorCode::kInvalidArgument, "presence_penalty must be in [-2, 2], got ", o.presence_penalty);
  if (!(o.frequency_penalty >= -2.0f && o.frequency_penalty <= 2.0f))
    fail(ErrorCode::kInvalidArgument, "frequency_penalty must be in [-2, 2], got ", o.frequency_penalty);
  if (!(o.repetition_penalty > 0.0f) || !std::isfinite(o.repetition_penalty))
    fail(ErrorCode::kInvalidArgument, "repetition_penalty must be > 0, got ", o.repetition_penalty);
  if (o.logprobs < -1 || o.logprobs > kMaxLogprobs || o.logprobs > vocab_size)
    fail(ErrorCode::kInvalidArgument, "logprobs must be between 0 and ", kMaxLogprobs, " (or absent), got ",
         o.logprobs);
}

SampleResult sample_token(std::span<float> logits, const SamplingOptions& o, const SamplingContext& ctx) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  SampleResult result;

  // Logprobs come from the raw distribution (vLLM's default), before penalties.
  std::vector<float> raw;
  if (o.logprobs >= 0) raw.assign(logits.begin(), logits.end());

  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int32_t t : ctx.banned_token_ids)
    if (t >= 0 && t < vocab) logits[t] = kNegInf;

  if (o.repetition_penalty != 1.0f) {
    auto penalize = [&](int32_t t) {
      if (t < 0 || t >= vocab) return;
      float& l = logits[t];
      l = l > 0 ? l / o.repetition_penalty : l * o.repetition_penalty;
    };
    std::vector<char> seen(vocab, 0);
    for (auto ids : {ctx.prompt_ids, ctx.output_ids})
      for (int32_t t : ids)
        if (t >= 0 && t < vocab && !seen[t]) {
          seen[t] = 1;
          penalize(t);
        }
  }
  if (o.presence_penalty != 0.0f || o.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t t : ctx.output_ids) ++counts[t];
    for (auto [t, n] : counts)
      if (t >= 0 && t < vocab) logits[t] -= o.frequency_penalty * float(n) + o.presence_penalty;
  }

  if (o.temperature < 1e-5f) {
    result.token_id = argmax(logits);
  } else {
    const float max_l = logits[argmax(logits)];
    std::vector<float> p(vocab);  // unnormalized, the most likely token has 1
    for (int32_t i = 0; i < vocab; ++i) p[i] = std::exp((logits[i] - max_l) / o.temperature);
    std::vector<int32_t> cand;
    cand.reserve(vocab);
    for (int32_t i = 0; i < vocab; ++i)
      if (p[i] > 0.0f && p[i] >= o.min_p) cand.push_back(i);
    auto more_likely = [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
    if (o.top_k > 0 && o.top_k < static_cast<int32_t>(cand.size())) {
      std::nth_element(cand.begin(), cand.begin() + o.top_k, cand.end(), more_likely);
      cand.resize(o.top_k);
    }
    if (o.top_p < 1.0f) {
      std::sort(cand.begin(), cand.end(), more_likely);
      double total = 0;
      for (int32_t i : cand) total += p[i];
      double acc = 0;
      size_t keep = 0;
      while (keep < cand.size()) {
        acc += p[cand[keep++]];
        if (acc >= o.top_p * total) break;
      }
      cand.resize(std::max<size_t>(keep, 1));
    }
    std::sort(cand.begin(), cand.end());  // draw in token order: independent of how candidates were found
    double total = 0;
    for (int32_t i : cand) total += p[i];
    const double target = uniform(ctx.seed, ctx.output_ids.size()) * total;
    double acc = 0;
    result.token_id = cand.back();
    for (int32_t i : cand) {
      acc += p[i];
      if (acc > target) {
        result.token_id = i;
        break;
      }
    }
  }

  if (o.logprobs >= 0) {
    const float max_l = raw[argmax(raw)];
    double sum = 0;
    for (float l : raw) sum += std::exp(double(l) - max_l);
    const float lse = max_l + float(std::log(sum));
    TokenLogprobs lp;
    lp.token_id = result.token_id;
    lp.logprob = raw[result.token_id] - lse;
    lp.rank = 1;
    for (float l : raw) lp.rank += l > raw[result.token_id] ? 1 : 0;
    std::vector<int32_t> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    const int32_t k = std::min(o.logprobs, vocab);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return raw[a] > raw[b] || (raw[a] == raw[b] && a < b); });
    for (int32_t i = 0; i < k; ++i) lp.top.push_back({idx[i], raw[idx[i]] - lse});
    result.logprobs = std::move(lp);
  }
  return result;
}

}  // namespace shardlm
