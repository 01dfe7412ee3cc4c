// The mixture-of-experts MLP block, the sparse variant of mlp_block:
//   x = post_norm(hidden)                                  [n_tokens, hidden]
//   logits = x × routerᵀ                                   [n_tokens, n_experts] (router replicated)
//   ids, w = top_k(softmax(logits)) (renormalised per family)  [n_tokens, top_k]
//   partial = Σ_{j: ids[t,j] held here} w[t,j] × expert_{ids[t,j]}(x_t)
//   hidden += all_reduce_sum(partial) over the TP group
// Every rank of a stage holds every token (attention is tensor-parallel), so
// each computes the partial output of the experts it holds (whole experts
// under --enable-expert-parallel, a column slice of every expert without) for
// all tokens, and the all-reduce that follows a dense MLP combines them: no
// all_to_all dispatch is needed (plan's speed model compares the two).
#pragma once

#include <cstdint>
#include <vector>

#include "model/layers.h"

namespace shardlm {

// trace, when given, receives the step's routing: ids [n_tokens × top_k]
// appended (the experts chosen per token, best first).
void moe_block(backend::Backend& b, const RankDims& dims, const DecoderLayerWeights& w, const StepContext& step,
               Tensor& hidden, Communicator& tp, Workspace& ws, std::vector<int32_t>* trace);

}  // namespace shardlm
