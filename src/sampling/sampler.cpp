#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace shardlm {

namespace {

// NaN-safe "lo <= x <= hi".
bool in_range(double x, double lo, double hi) { return x >= lo && x <= hi; }

}  // namespace

void SamplingParams::validate() const {
  if (!in_range(temperature, 0.0, 2.0))
    fail(ErrorCode::kInvalidArgument, "temperature must be in [0, 2] (0 = greedy), found ", temperature);
  if (!(top_p > 0.0 && top_p <= 1.0))
    fail(ErrorCode::kInvalidArgument, "top_p must be in (0, 1] (1 = off), found ", top_p);
  if (top_k < -1)
    fail(ErrorCode::kInvalidArgument, "top_k must be -1 or 0 (off) or at least 1, found ", top_k);
  if (!in_range(min_p, 0.0, 1.0))
    fail(ErrorCode::kInvalidArgument, "min_p must be in [0, 1] (0 = off), found ", min_p);
  if (!in_range(presence_penalty, -2.0, 2.0))
    fail(ErrorCode::kInvalidArgument, "presence_penalty must be in [-2, 2], found ", presence_penalty);
  if (!in_range(frequency_penalty, -2.0, 2.0))
    fail(ErrorCode::kInvalidArgument, "frequency_penalty must be in [-2, 2], found ", frequency_penalty);
  if (!(repetition_penalty > 0.0 && repetition_penalty <= 2.0))
    fail(ErrorCode::kInvalidArgument, "repetition_penalty must be in (0, 2] (1 = off), found ", repetition_penalty);
  if (logprobs < 0 || logprobs > kMaxLogprobs)
    fail(ErrorCode::kInvalidArgument, "logprobs must be in [0, ", kMaxLogprobs, "], found ", logprobs);
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0) fail(ErrorCode::kInvalidArgument, "logit_bias token ids must be non-negative, found ", token);
    if (!in_range(bias, -100.0, 100.0))
      fail(ErrorCode::kInvalidArgument, "logit_bias for token ", token, " must be in [-100, 100], found ", bias);
  }
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best < 0 ? 0 : best;
}

void apply_penalties(const SamplingParams& p, std::span<float> logits, std::span<const uint8_t> in_prompt,
                     const std::unordered_map<int32_t, int32_t>& output_count) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (p.repetition_penalty != 1.0) {
    const float rp = static_cast<float>(p.repetition_penalty);
    auto penalise = [&](int64_t t) { logits[t] = logits[t] > 0 ? logits[t] / rp : logits[t] * rp; };
    for (int64_t t = 0; t < vocab && t < static_cast<int64_t>(in_prompt.size()); ++t) {
      if (in_prompt[t]) penalise(t);
    }
    for (const auto& [t, n] : output_count) {
      if (t >= 0 && t < vocab && !(t < static_cast<int64_t>(in_prompt.size()) && in_prompt[t])) penalise(t);
    }
  }
  if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) {
    for (const auto& [t, n] : output_count) {
      if (t < 0 || t >= vocab || n <= 0) continue;
      logits[t] -= static_cast<float>(p.frequency_penalty * n + p.presence_penalty);
    }
  }
}

std::vector<double> sampling_distribution(const SamplingParams& p, std::span<const float> logits) {
  const size_t vocab = logits.size();
  std::vector<double> prob(vocab, 0.0);
  const double inv_t = 1.0 / std::max(p.temperature, kGreedyTemperature);
  double max_z = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) max_z = std::max(max_z, logits[i] * inv_t);
  double total = 0.0;
  for (size_t i = 0; i < vocab; ++i) {
    const double z = logits[i] * inv_t;
    prob[i] = std::isnan(logits[i]) || std::isinf(z) ? 0.0 : std::exp(z - max_z);
    total += prob[i];
  }
  if (!(total > 0.0)) {  // all -inf / NaN: fall back to the argmax
    std::fill(prob.begin(), prob.end(), 0.0);
    prob[argmax(logits)] = 1.0;
    return prob;
  }
  for (double& x : prob) x /= total;

  if (p.min_p > 0.0) {
    const double threshold = p.min_p * *std::max_element(prob.begin(), prob.end());
    for (double& x : prob)
      if (x < threshold) x = 0.0;
  }
  // Kept tokens, most likely first, lowest id on ties.
  std::vector<int32_t> kept;
  for (size_t i = 0; i < vocab; ++i)
    if (prob[i] > 0.0) kept.push_back(static_cast<int32_t>(i));
  auto more_likely = [&](int32_t a, int32_t b) { return prob[a] != prob[b] ? prob[a] > prob[b] : a < b; };
  const bool top_k_on = p.top_k > 0 && static_cast<size_t>(p.top_k) < kept.size();
  if (top_k_on) {
    std::nth_element(kept.begin(), kept.begin() + p.top_k, kept.end(), more_likely);
    for (size_t j = p.top_k; j < kept.size(); ++j) prob[kept[j]] = 0.0;
    kept.resize(p.top_k);
  }
  if (p.top_p < 1.0) {
    std::sort(kept.begin(), kept.end(), more_likely);
    double kept_mass = 0.0;
    for (int32_t t : kept) kept_mass += prob[t];
    // Keep a token while the mass of the more likely ones is below top_p
    // (vLLM: drop the tail whose cumulative mass is <= 1 - top_p); the most
    // likely token always stays.
    double before = 0.0;
    size_t n_keep = 0;
    for (int32_t t : kept) {
      if (n_keep > 0 && before >= p.top_p * kept_mass) break;
      before += prob[t];
      ++n_keep;
    }
    for (size_t j = n_keep; j < kept.size(); ++j) prob[kept[j]] = 0.0;
  }
  total = 0.0;
  for (double x : prob) total += x;
  for (double& x : prob) x /= total;
  return prob;
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt_ids, int64_t vocab_size)
    : params_(params), vocab_size_(vocab_size) {
  params_.validate();
  if (vocab_size <= 0) fail(ErrorCode::kInvalidArgument, "sampler: vocab_size must be positive, found ", vocab_size);
  for (const auto& [token, bias] : params_.logit_bias)
    if (token >= vocab_size)
      fail(ErrorCode::kInvalidArgument, "logit_bias token ", token, " is outside the vocabulary of ", vocab_size, " tokens");
  in_prompt_.assign(static_cast<size_t>(vocab_size), 0);
  for (int32_t t : prompt_ids)
    if (t >= 0 && t < vocab_size) in_prompt_[t] = 1;
  rng_.seed(params_.seed ? *params_.seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}());
}

void Sampler::accept(int32_t token) {
  output_ids_.push_back(token);
  ++output_count_[token];
}

SampleResult Sampler::sample(std::span<const float> logits) {
  if (static_cast<int64_t>(logits.size()) != vocab_size_)
    fail(ErrorCode::kInvalidArgument, "sampler: logits have ", logits.size(), " entries, the vocabulary has ", vocab_size_);
  SampleResult result;
  std::vector<float> processed(logits.begin(), logits.end());
  for (const auto& [token, bias] : params_.logit_bias) processed[token] += bias;
  apply_penalties(params_, processed, in_prompt_, output_count_);
  if (params_.greedy()) {
    result.token = argmax(processed);
  } else {
    const std::vector<double> prob = sampling_distribution(params_, processed);
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    double cum = 0.0;
    int32_t last_kept = -1;
    result.token = -1;
    for (size_t i = 0; i < prob.size(); ++i) {
      if (prob[i] <= 0.0) continue;
      last_kept = static_cast<int32_t>(i);
      cum += prob[i];
      if (cum > u) {
        result.token = last_kept;
        break;
      }
    }
    if (result.token < 0) result.token = last_kept;  // u within rounding of 1
  }

  // Raw logprobs: log_softmax of the model's logits.
  double max_l = -std::numeric_limits<double>::infinity();
  for (float x : logits)
    if (!std::isnan(x)) max_l = std::max(max_l, static_cast<double>(x));
  double sum = 0.0;
  for (float x : logits)
    if (!std::isnan(x)) sum += std::exp(x - max_l);
  const double log_z = max_l + std::log(sum);
  result.logprob = static_cast<float>(logits[result.token] - log_z);
  if (params_.logprobs > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    auto better = [&](int32_t a, int32_t b) {
      const float la = std::isnan(logits[a]) ? -INFINITY : logits[a];
      const float lb = std::isnan(logits[b]) ? -INFINITY : logits[b];
      return la != lb ? la > lb : a < b;
    };
    const size_t n = std::min<size_t>(params_.logprobs, ids.size());
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), better);
    for (size_t j = 0; j < n; ++j)
      result.top_logprobs.push_back({ids[j], static_cast<float>(logits[ids[j]] - log_z)});
  }
  accept(result.token);
  return result;
}

}  // namespace shardlm
