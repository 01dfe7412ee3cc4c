// Layers shared by every family: pre-norm attention and SwiGLU MLP blocks
// on a tensor-parallel rank's slices, vocab-parallel embedding and lm_head.
// Each collective over the TP group is visible here where it happens.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "plan/sharding.h"

namespace shardlm {

struct Linear {
  backend::MatrixView w;   // [out_local, in_local] as stored
  backend::VectorView b;   // [out_local]; b.data == nullptr when absent
  const backend::VectorView* bias() const { return b.data ? &b : nullptr; }
};

// One decoder layer as held by a rank (local slices, checkpoint dtype).
struct DecoderLayerWeights {
  int64_t layer = 0;                // global index
  backend::VectorView input_norm;   // [hidden]
  backend::VectorView post_norm;    // [hidden]
  Linear q, k, v;                   // q: [n_q_local × head_dim, hidden]; k, v: [n_kv_local × head_dim, hidden]
  backend::VectorView q_norm, k_norm;  // Qwen3: [head_dim]; data == nullptr otherwise
  Linear o;                         // [hidden, n_q_local × head_dim] (column slice)
  Linear gate, up;                  // [inter_local, hidden]
  Linear down;                      // [hidden, inter_local] (column slice)
};

// Sizes on this rank, fixed at load.
struct RankDims {
  int64_t hidden = 0;
  int64_t head_dim = 0;
  int64_t n_q_local = 0;
  int64_t n_kv_local = 0;
  int64_t inter_local = 0;
  float eps = 1e-6f;
  backend::AttentionHeads heads;
};

// What one step's tokens are: [n_tokens] positions and the chunks.
struct StepTokens {
  int64_t n_tokens = 0;
  const int32_t* positions = nullptr;  // [n_tokens]
  const backend::AttentionSeq* seqs = nullptr;
  int64_t n_seqs = 0;
};

// Reused buffers of one rank (grown on demand).
struct Scratch {
  std::vector<float> normed, q, k, v, attn, proj, gate, up;
};

// hidden[n_tokens, hidden] += o_proj(attention(...)) summed over the TP group.
void attention_block(const RankDims& dims, const DecoderLayerWeights& w, const float* inv_freq,
                     const backend::KvLayerView& cache, const StepTokens& step, float* hidden, Communicator& tp,
                     Scratch& s);

// hidden[n_tokens, hidden] += down(silu(gate(x)) × up(x)), x = post_norm(hidden), summed over the TP group.
void mlp_block(const RankDims& dims, const DecoderLayerWeights& w, const StepTokens& step, float* hidden,
               Communicator& tp, Scratch& s);

// out[n, hidden]: rows of the embedding for ids in this rank's vocab range,
// zeros elsewhere, then summed over the TP group. emb: [vocab.size(), hidden].
// Throws kInvalidArgument for an id outside [0, vocab_size).
void embed_tokens(const backend::MatrixView& emb, Range vocab, int64_t vocab_size, const int32_t* ids, int64_t n,
                  float* out, Communicator& tp);

// logits[n, vocab_size] on every TP rank: local slice x × head_localᵀ, then
// all_gather of the slices; vocab_ranges[r] is TP rank r's vocabulary range.
void lm_head_logits(const float* x, int64_t n, const backend::MatrixView& head, const std::vector<Range>& vocab_ranges,
                    float* logits, Communicator& tp);

}  // namespace shardlm
