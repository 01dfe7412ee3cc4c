// A family's decoder layer, built from the pieces of model/layers.h the way
// llama.cpp's per-model graph builders are: each family's file says, in
// order, what its layer computes. The weights it reads were placed by the
// slots of the family's tensor table (loader/families/<family>.cpp), so no
// file here reads a Hugging Face name. Adding a family: a file here and a
// line in registry.cpp.
#pragma once

#include "backend/backend.h"
#include "loader/model_spec.h"
#include "model/layers.h"

namespace shardlm {

struct DecoderFamily {
  const char* name;  // "qwen3"
  // Throws kUnsupported naming the field when spec asks for what this graph
  // does not compute (a spec built by hand can disagree with the family's table).
  void (*check)(const ModelSpec& spec);
  // One decoder layer over hidden [n_tokens, hidden], in place; cache is the
  // layer's KV cache on this rank.
  void (*layer)(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache, Tensor& hidden);
};

// The graph of spec.family (registry.cpp); checks spec with it.
const DecoderFamily& decoder_family(const ModelSpec& spec);

// Refuses a spec whose q/k/v biases or q/k norms differ from what a family's
// graph has (`bias`, `qk_norm`), naming the family.
void check_attention_shape(const ModelSpec& spec, const char* family, bool bias, bool qk_norm);

}  // namespace shardlm
