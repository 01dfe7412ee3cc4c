#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "core/error.h"
#include "sampling/speculative_sampling.h"
#include "sampling/vocab_kernels.h"

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
  // Two vector passes: the largest non-NaN value, then its first index (the
  // first non-NaN one when that is -inf; none when all are NaN).
  const VocabKernels& vk = vocab_kernels();
  const size_t i = vk.find_equal(logits.data(), logits.size(), vk.max(logits.data(), logits.size()));
  return i < logits.size() ? static_cast<int32_t>(i) : 0;
}

void apply_penalties(const SamplingParams& p, std::span<float> logits, std::span<const uint8_t> in_prompt,
                     const std::unordered_map<int32_t, int32_t>& output_count) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (p.repetition_penalty != 1.0) {
    const float rp = static_cast<float>(p.repetition_penalty);
    auto penalise = [&](int64_t t) { logits[t] = logits[t] > 0 ? logits[t] / rp : logits[t] * rp; };
    // The flags are mostly 0: eight at a time are skipped while all are.
    const size_t n_flags = std::min(in_prompt.size(), static_cast<size_t>(vocab));
    for (size_t t = 0; t < n_flags;) {
      uint64_t eight = 0;
      if (t + 8 <= n_flags) std::memcpy(&eight, in_prompt.data() + t, sizeof eight);
      if (t + 8 <= n_flags && eight == 0) {
        t += 8;
        continue;
      }
      if (in_prompt[t]) penalise(static_cast<int64_t>(t));
      ++t;
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

namespace {

// (logit, id) with the sampler's order: higher logit first, lower id on ties.
using Scored = std::pair<float, int32_t>;
bool more_likely(const Scored& a, const Scored& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; }

// Pushes (key, id) into heap, which keeps the n most likely seen so far
// with the least likely on top (std heap functions with more_likely as
// "less"). Ids arrive in increasing order, so an equal key never displaces.
inline void heap_offer(std::vector<Scored>& heap, size_t n, float key, int32_t id) {
  if (heap.size() < n) {
    heap.emplace_back(key, id);
    std::push_heap(heap.begin(), heap.end(), more_likely);
  } else if (key > heap.front().first) {
    std::pop_heap(heap.begin(), heap.end(), more_likely);
    heap.back() = {key, id};
    std::push_heap(heap.begin(), heap.end(), more_likely);
  }
}

}  // namespace

void top_n(std::span<const float> logits, size_t n, std::vector<std::pair<float, int32_t>>& heap,
           std::vector<int32_t>& out) {
  heap.clear();
  out.clear();
  n = std::min(n, logits.size());
  if (n == 0) return;
  const VocabKernels& vk = vocab_kernels();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (heap.size() == n) {
      // A full heap takes only keys above its least: skip to the next one.
      i += vk.find_greater(logits.data() + i, logits.size() - i, heap.front().first);
      if (i >= logits.size()) break;
    }
    const float key = std::isnan(logits[i]) ? -INFINITY : logits[i];
    heap_offer(heap, n, key, static_cast<int32_t>(i));
  }
  std::sort_heap(heap.begin(), heap.end(), more_likely);  // most likely first
  for (const Scored& e : heap) out.push_back(e.second);
}

namespace {

// The least f32 at or above d >= 0: for an f32 w, w < d exactly when w < it.
float least_float_at_least(double d) {
  const float f = static_cast<float>(d);
  return static_cast<double>(f) < d ? std::nextafter(f, INFINITY) : f;
}

// What the weights of a row need: its largest logit, 1 / temperature and
// the least f32 weight min_p keeps. ok is false when no token has a finite
// positive weight (all -inf or NaN, or a +inf logit).
struct Tempering {
  bool ok = false;
  float max_l = 0.0f, inv_t = 1.0f, min_w = 0.0f;
};

Tempering tempering(const SamplingParams& p, std::span<const float> z) {
  Tempering t;
  t.max_l = vocab_kernels().max(z.data(), z.size());  // NaN skipped
  t.ok = t.max_l > -INFINITY && !std::isinf(t.max_l);
  t.inv_t = static_cast<float>(1.0 / std::max(p.temperature, kGreedyTemperature));
  t.min_w = least_float_at_least(p.min_p);  // w < min_p exactly when w < min_w
  return t;
}

}  // namespace

int32_t draw_unfiltered(const SamplingParams& p, std::span<const float> z, SamplingScratch& s, double u) {
  const VocabKernels& vk = vocab_kernels();
  const Tempering t = tempering(p, z);
  if (!t.ok) return -1;
  s.weight.resize(z.size());
  s.block_sum.resize(z.size() / kVocabLanes);
  const ExpWeights ew = vk.weights(z.data(), z.size(), t.max_l, t.inv_t, t.min_w, s.weight.data(), s.block_sum.data());
  if (!(ew.mass > 0.0)) return -1;
  return static_cast<int32_t>(inverse_cdf_index(s.weight, s.block_sum, u));
}

size_t filter_tokens(const SamplingParams& p, std::span<const float> z, SamplingScratch& s) {
  const VocabKernels& vk = vocab_kernels();
  const size_t vocab = z.size();
  const Tempering t = tempering(p, z);
  if (!t.ok) return 0;
  const float max_l = t.max_l, inv_t = t.inv_t, min_w = t.min_w;
  // Unnormalised probability of logit l: exp((l - max) / t) in (0, 1], in
  // f32 the way vk.weights computes it (the same bits): 1 for the most
  // likely, 0 for -inf and for tokens under ~1e-45 of the most likely.
  auto weight = [&](float l) { return fast_exp((l - max_l) * inv_t); };
  auto order_less = [&](int32_t a, int32_t b) { return z[a] != z[b] ? z[a] > z[b] : a < b; };
  s.weight.resize(vocab);
  s.kept.resize(vocab);
  s.order.resize(vocab);
  size_t n_order = 0;  // candidates in s.order[0, n_order)

  const bool top_k_on = p.top_k > 0 && static_cast<size_t>(p.top_k) < vocab;
  if (top_k_on) {
    // The k most likely finite tokens by logit; min_p keeps an upper set of
    // the same order, so it commutes with top_k and is applied after.
    const size_t k = static_cast<size_t>(p.top_k);
    if (k * 16 <= vocab) {
      // Only a logit above the heap's least (above -inf until it is full)
      // enters: the vector scan skips to the next such one.
      s.heap.clear();
      for (size_t i = 0; i < vocab; ++i) {
        i += vk.find_greater(z.data() + i, vocab - i, s.heap.size() < k ? -INFINITY : s.heap.front().first);
        if (i >= vocab) break;
        heap_offer(s.heap, k, z[i], static_cast<int32_t>(i));
      }
      for (const Scored& e : s.heap) s.order[n_order++] = e.second;
    } else {
      for (size_t i = 0; i < vocab; ++i)
        if (z[i] > -INFINITY) s.order[n_order++] = static_cast<int32_t>(i);
      if (n_order > k) {
        std::nth_element(s.order.begin(), s.order.begin() + k, s.order.begin() + n_order, order_less);
        n_order = k;
      }
    }
    size_t m = 0;
    for (size_t j = 0; j < n_order; ++j) {
      const float w = weight(z[s.order[j]]);
      if (w > 0.0f && w >= min_w) s.order[m++] = s.order[j];
    }
    n_order = m;
    if (n_order == 0) return 0;
    std::sort(s.order.begin(), s.order.begin() + n_order, order_less);
    size_t n_keep = n_order;
    if (p.top_p < 1.0) {
      double kept_mass = 0.0;
      for (size_t j = 0; j < n_order; ++j) kept_mass += weight(z[s.order[j]]);
      const double target = p.top_p * kept_mass;
      double before = 0.0;
      n_keep = 0;
      for (size_t j = 0; j < n_order; ++j) {
        if (n_keep > 0 && before >= target) break;
        before += weight(z[s.order[j]]);
        ++n_keep;
      }
    }
    std::sort(s.order.begin(), s.order.begin() + n_keep);  // id order for the draw
    for (size_t j = 0; j < n_keep; ++j) {
      s.kept[j] = s.order[j];
      s.weight[j] = weight(z[s.order[j]]);
    }
    return n_keep;
  }

  // No top_k: one exp pass over the vocabulary, weights by token id, with
  // their mass and count.
  const ExpWeights ew = vk.weights(z.data(), vocab, max_l, inv_t, min_w, s.weight.data(), nullptr);
  const double kept_mass = ew.mass;
  const size_t n_positive = ew.n_positive;
  if (!(kept_mass > 0.0)) return 0;
  int32_t boundary = -1;  // the least likely token top_p keeps; -1: top_p off
  if (p.top_p < 1.0) {
    // A token lighter than (1 - top_p) * mass / n is never kept: were it
    // kept, it and the tokens below it (each lighter still, at most n in
    // all) would have to outweigh (1 - top_p) * mass. So only heavier
    // tokens are candidates, which for a peaked distribution is a few
    // percent of the vocabulary.
    const double floor_w = (1.0 - p.top_p) * kept_mass / static_cast<double>(n_positive);
    const float min_cand = std::max(least_float_at_least(floor_w), std::numeric_limits<float>::denorm_min());
    // Keep a token while the mass of the more likely ones is below target
    // (the most likely always stays). Mass by logit bucket
    // (VocabKernels::bucket_mass: a lower bucket holds only more likely
    // tokens, ties share one): the buckets before the one where the mass
    // reaches target are kept whole; only that one is sorted and walked.
    // The scale spreads the candidates' logits, max down to about
    // max + t ln(floor_w), over the buckets (lower ones, from rounding,
    // join the last).
    const double target = p.top_p * kept_mass;
    const float scale = static_cast<float>(std::min(kMassBuckets / (-std::log(floor_w) / inv_t), 1e30));
    s.bucket_mass.assign(kMassBuckets, 0.0);
    const size_t last = vk.bucket_mass(z.data(), s.weight.data(), vocab, min_cand, max_l, scale, s.bucket_mass.data());
    double before = 0.0;  // mass of the buckets [0, cut)
    size_t cut = 0;
    while (cut < last && !(before + s.bucket_mass[cut] >= target)) before += s.bucket_mass[cut++];
    n_order = vk.collect_bucket(z.data(), s.weight.data(), vocab, min_cand, max_l, scale, cut, s.order.data());
    std::sort(s.order.begin(), s.order.begin() + n_order, order_less);
    // The cut bucket is not empty (the loop stops where its mass takes
    // before, < target, to target; or at the last bucket with a candidate),
    // and its first token is kept: before < target there.
    size_t n_keep = 0;
    for (size_t j = 0; j < n_order; ++j) {
      if (n_keep > 0 && before >= target) break;
      before += s.weight[s.order[j]];
      ++n_keep;
    }
    SHARDLM_CHECK(n_keep > 0, "filter_tokens: top_p kept nothing of bucket ", cut, " (", n_order, " tokens)");
    boundary = s.order[n_keep - 1];
  }
  // The positive weights ranked at or above the boundary, compacted in place.
  return vk.compact(s.weight.data(), z.data(), vocab, boundary >= 0 ? z[boundary] : -INFINITY, boundary,
                    s.kept.data(), s.weight.data());
}

std::vector<double> sampling_distribution(const SamplingParams& p, std::span<const float> logits) {
  std::vector<double> prob(logits.size(), 0.0);
  SamplingScratch s;
  const size_t n = filter_tokens(p, logits, s);
  if (n == 0) {
    prob[argmax(logits)] = 1.0;
    return prob;
  }
  double total = 0.0;
  for (size_t j = 0; j < n; ++j) total += s.weight[j];
  for (size_t j = 0; j < n; ++j) prob[s.kept[j]] = s.weight[j] / total;
  return prob;
}

namespace {

// Per-thread buffers of sample(): each thread grows them once to the
// largest vocabulary it sees, so steady-state sampling allocates nothing.
struct ThreadScratch {
  std::vector<float> work;  // [vocab] logits after bias and penalties
  SamplingScratch filter;
  std::vector<int32_t> top;
};
thread_local ThreadScratch t_scratch;

}  // namespace

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt_ids, int64_t vocab_size)
    : params_(params), vocab_size_(vocab_size) {
  params_.validate();
  if (vocab_size <= 0) fail(ErrorCode::kInvalidArgument, "sampler: vocab_size must be positive, found ", vocab_size);
  for (const auto& [token, bias] : params_.logit_bias)
    if (token >= vocab_size)
      fail(ErrorCode::kInvalidArgument, "logit_bias token ", token, " is outside the vocabulary of ", vocab_size, " tokens");
  penalised_ = params_.repetition_penalty != 1.0 || params_.frequency_penalty != 0.0 || params_.presence_penalty != 0.0;
  if (params_.repetition_penalty != 1.0) {
    in_prompt_.assign(static_cast<size_t>(vocab_size), 0);
    for (int32_t t : prompt_ids)
      if (t >= 0 && t < vocab_size) in_prompt_[t] = 1;
  }
  rng_.seed(params_.seed ? *params_.seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}());
}

void Sampler::accept(int32_t token) {
  output_ids_.push_back(token);
  if (penalised_) ++output_count_[token];
}

// log(sum(exp(logits))), NaN entries left out: the logprobs' denominator.
// f32 exps (fast_exp) summed in double in the kernels' lane order.
static double log_partition(std::span<const float> logits) {
  const VocabKernels& vk = vocab_kernels();
  const float max_l = vk.max(logits.data(), logits.size());
  return max_l + std::log(vk.sum_exp(logits.data(), logits.size(), max_l));
}

SampleResult Sampler::sample(std::span<const float> logits) {
  if (static_cast<int64_t>(logits.size()) != vocab_size_)
    fail(ErrorCode::kInvalidArgument, "sampler: logits have ", logits.size(), " entries, the vocabulary has ", vocab_size_);
  ThreadScratch& ts = t_scratch;
  SampleResult result;
  // Logits as sampled: the model's own unless a bias or a penalty changes them.
  std::span<const float> z = logits;
  if (!params_.logit_bias.empty() || penalised_) {
    ts.work.assign(logits.begin(), logits.end());
    for (const auto& [token, bias] : params_.logit_bias) ts.work[token] += bias;
    apply_penalties(params_, ts.work, in_prompt_, output_count_);
    z = ts.work;
  }
  if (params_.greedy()) {
    result.token = argmax(z);
  } else if (params_.top_p >= 1.0 && !(params_.top_k > 0 && params_.top_k < vocab_size_)) {
    // Temperature (and min_p) alone: every positive weight is kept.
    const int32_t t = draw_unfiltered(params_, z, ts.filter, uniform_from_draw(rng_()));
    result.token = t >= 0 ? t : argmax(z);
  } else {
    const size_t n = filter_tokens(params_, z, ts.filter);
    const double u = uniform_from_draw(rng_());
    if (n == 0) {
      result.token = argmax(z);
    } else {
      // The first kept token (in id order) whose cumulative mass exceeds u
      // (sampling/speculative_sampling.h: verification draws the same way).
      result.token = ts.filter.kept[inverse_cdf_index(std::span<const float>(ts.filter.weight.data(), n), u)];
    }
  }

  // Raw logprobs: log_softmax of the model's logits, only when asked for.
  if (params_.logprobs > 0 || params_.return_logprob) {
    const double log_z = log_partition(logits);
    result.logprob = static_cast<float>(logits[result.token] - log_z);
    if (params_.logprobs > 0) {
      top_n(logits, static_cast<size_t>(params_.logprobs), ts.filter.heap, ts.top);
      result.top_logprobs.reserve(ts.top.size());
      for (int32_t id : ts.top) result.top_logprobs.push_back({id, static_cast<float>(logits[id] - log_z)});
    }
  }
  accept(result.token);
  return result;
}

int32_t vocab_rank(std::span<const float> logits, int32_t token) {
  const float x = logits[static_cast<size_t>(token)];
  int32_t n = 0;
  for (float v : logits) n += v >= x ? 1 : 0;  // false for NaN on either side
  return std::max(n, 1);
}

RowLogprobs row_logprobs(std::span<const float> logits, int32_t token, size_t n_top,
                         std::vector<std::pair<float, int32_t>>& heap, std::vector<int32_t>& top_ids) {
  SHARDLM_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size(), "row_logprobs: token ", token,
                " outside a row of ", logits.size());
  const double log_z = log_partition(logits);
  RowLogprobs out;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(token)] - log_z);
  out.rank = vocab_rank(logits, token);
  if (n_top > 0) {
    top_n(logits, n_top, heap, top_ids);
    out.top.reserve(top_ids.size());
    for (int32_t id : top_ids) out.top.push_back({id, static_cast<float>(logits[static_cast<size_t>(id)] - log_z)});
  }
  return out;
}

}  // namespace shardlm
