#!/usr/bin/python3
"""Independent numpy reference for Qwen2 / Qwen3 / Llama-3 / Qwen3-MoE / Mixtral / Phi-3 / Gemma 3 checkpoints.

Shares no code with shardlm: it parses safetensors itself (struct + json),
reads config.json / generation_config.json and runs the Hugging Face
transformers forward (Qwen2Model, Qwen3Model, LlamaModel) in float64:

  * weights: BF16 -> f32 by shifting the bits left 16 (exact), F16 via
    numpy (exact), then widened to float64 (exact);
  * every activation, the KV cache and the logits are float64, so the
    reference is the exact-arithmetic answer for the stored weights up to
    ~1e-15 relative; shardlm (f32 activations over bf16/f32 weights) should
    differ from it only by its own f32 rounding.
  * RMSNorm: x / sqrt(mean(x^2) + eps) * weight; rotate_half RoPE with
    inv_freq = theta^(-2i/d) (llama3 rope_scaling applied as in
    transformers' _compute_llama3_parameters); GQA (Q head h uses KV head
    h // (n_heads / n_kv_heads)); causal softmax with scale 1/sqrt(head_dim);
    SwiGLU MLP down(silu(gate(x)) * up(x)); Qwen2 q/k/v biases; Qwen3
    q_norm/k_norm over each head before RoPE; tied embeddings when
    tie_word_embeddings (or when lm_head.weight is absent).
  * mixture of experts, as transformers' Qwen3MoeSparseMoeBlock and
    MixtralSparseMoeBlock: router logits h @ gate.T; Qwen3-MoE takes the
    softmax over all experts, the top num_experts_per_tok, and divides by
    their sum when norm_topk_prob; Mixtral takes the top-k logits and a
    softmax over those alone (written separately on purpose: shardlm uses one
    routine for both, and this checks they agree). Each token's output is the
    weighted sum of its experts' SwiGLU MLPs. Qwen3-MoE layers outside the
    sparse set ((l + 1) % decoder_sparse_step != 0, or in mlp_only_layers)
    keep the dense MLP. The experts chosen for every position fed are
    recorded (best first) and printed as "routing".
  * Phi-3 / Phi-4 (transformers' Phi3Attention, Phi3MLP): q, k, v are the
    column ranges [0, q), [q, q + kv), [q + kv, q + 2 kv) of one qkv_proj
    output; gate and up the two halves of gate_up_proj's output (gate first,
    up * silu(gate)). Full rotary and no rope scaling only (refused
    otherwise, like shardlm).
  * Phi-3-mini-128k / Phi-4-mini: rope on the first partial_rotary_factor of
    each head, LongRoPE's factors dividing the frequencies and its attention
    factor on cos and sin. As transformers' dynamic longrope update: a
    forward whose positions reach original_max_position_embeddings (seq_len =
    max position + 1 above it) rotates every token with the long factors, any
    other with the short ones; what was cached keeps its rotation.
  * Mistral, Mixtral and Phi-3 with a sliding_window below
    max_position_embeddings: every layer sees the keys q - W < k <= q.
  * Gemma 3 text (transformers' Gemma3DecoderLayer, Gemma3RMSNorm,
    Gemma3TextScaledWordEmbedding): every RMSNorm multiplies by (1 + w);
    the embeddings by sqrt(hidden_size) rounded to the checkpoint dtype;
    q/k norms; attention scaled by query_pre_attn_scalar^-0.5; local layers
    (layer_types, or (l + 1) % sliding_window_pattern != 0) see the keys
    with q - W < k <= q (W = sliding_window) and use rope base
    rope_local_base_freq without scaling, global layers rope_theta with
    rope_scaling (linear divides inv_freq by factor); norms after attention
    and after the MLP before each residual add; GeGLU with the tanh gelu.

Quantized checkpoints (config.json quantization_config: AWQ, GPTQ, FP8) are
unpacked by quantized.py, with its own code, and the forward runs on the
dequantized weights. With --activations int8 the inputs of the AWQ/GPTQ
Linears that shardlm runs on int8 activations are rounded the same way first
(quantized.quantize_activations, its own code).

Greedy decoding (argmax, lowest id on ties) with an incremental KV cache.
Stops at max_tokens or at an eos id (config.json eos_token_id and
generation_config.json eos_token_id, unless --ignore-eos).

usage: reference.py DIR --prompt-ids 1,2,3 --max-tokens 32 [--dump-logits F]
prints JSON {"prompt_token_ids", "token_ids", "finish_reason", "margins"} (margins:
top-1 minus top-2 logit at each generated step), plus for MoE models
"routing": {layer: [[expert ids, best first] per position fed]} and
"routing_margins": the smallest gap between the k-th and (k+1)-th router
logit of any position, per layer; --dump-logits
writes the logits of the last prompt position as little-endian f32 [vocab].
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    """name -> float64 ndarray, for F32/F16/BF16 tensors."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin : base + end]
        shape = tuple(info["shape"])
        dtype = info["dtype"]
        if dtype == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dtype == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name}: dtype {dtype} not supported by the reference")
        out[name] = arr.astype(np.float64).reshape(shape)
    return out


def load_weights(model_dir):
    import quantized  # tests/reference/quantized.py: AWQ / GPTQ / FP8 unpacked to float64

    if quantized.quantization_config(model_dir) is not None:
        return quantized.load_dequantized(model_dir)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(read_safetensors(os.path.join(model_dir, name)))
    return weights


def llama3_inv_freq(inv_freq, rs):
    factor = rs["factor"]
    low = rs.get("low_freq_factor", 1.0)
    high = rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    low_wavelen = old / low
    high_wavelen = old / high
    wavelen = 2 * math.pi / inv_freq
    out = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, out)


def round_e4m3(x):
    """float8_e4m3fn rounding (nearest, ties to the even code), saturating at +-448:
    what a KV cache of that dtype stores (scale 1)."""
    import quantized

    table = quantized.e4m3_table()
    codes = np.arange(128)
    finite = codes[np.isfinite(table[:128])]  # 0x00..0x7e, increasing values
    vals = table[finite]
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)
    lo = hi - 1
    d_lo, d_hi = a - vals[lo], vals[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (finite[hi] % 2 == 0))
    return np.sign(x) * np.where(pick_hi, vals[hi], vals[lo])


# transformers' Gemma3TextConfig defaults: what a released text_config leaves out.
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256,
    "sliding_window": 4096, "sliding_window_pattern": 6, "tie_word_embeddings": True, "rope_scaling": None,
}


class Model:
    def __init__(self, model_dir, kv_cache_dtype="f64", activations="f64"):
        self.kv_round = round_e4m3 if kv_cache_dtype == "fp8" else (lambda a: a)
        self.int8_modules = set()
        if activations == "int8":
            import quantized
            self.int8_modules = quantized.int8_activation_modules(model_dir)
        with open(os.path.join(model_dir, "config.json")) as f:
            self.config = c = json.load(f)
        self.arch = c["architectures"][0]
        prefix = ""
        if self.arch == "Gemma3ForConditionalGeneration":
            # The language model only: text_config over Gemma3TextConfig's defaults,
            # its weights under language_model. (the vision tower is not read).
            text = dict(GEMMA3_TEXT_DEFAULTS)
            text.update(c["text_config"])
            for key in ("torch_dtype", "eos_token_id", "bos_token_id"):
                if key in c:
                    text[key] = c[key]
            self.config = c = text
            self.arch = "Gemma3ForCausalLM"
            prefix = "language_model."
        if self.arch not in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
                             "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM",
                             "Gemma3ForCausalLM"):
            raise SystemExit(f"reference: architecture {self.arch} not supported")
        self.w = load_weights(model_dir)
        if prefix:
            self.w = {k[len(prefix):]: v for k, v in self.w.items() if k.startswith(prefix)}
        self.hidden = c["hidden_size"]
        self.n_layers = c["num_hidden_layers"]
        self.n_heads = c["num_attention_heads"]
        self.n_kv = c.get("num_key_value_heads") or self.n_heads
        self.head_dim = c.get("head_dim") or self.hidden // self.n_heads
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.vocab = c["vocab_size"]
        theta = c.get("rope_theta", 10000.0)
        d = self.head_dim
        # Phi's partial_rotary_factor: rope turns the first rot dims of each head, the rest pass through.
        self.rot = rot = int(d * c.get("partial_rotary_factor", 1.0))
        inv_freq = 1.0 / (theta ** (np.arange(0, rot, 2, dtype=np.int64).astype(np.float64) / rot))
        self.rope_mscale = 1.0
        self.long_from = None  # LongRoPE: original_max_position_embeddings
        self.long_inv_freq = None
        rs = c.get("rope_scaling")
        if rs:
            kind = rs.get("rope_type", rs.get("type"))
            if kind == "llama3":
                inv_freq = llama3_inv_freq(inv_freq, rs)
            elif kind == "linear":
                inv_freq = inv_freq / rs["factor"]
            elif kind in ("longrope", "su"):
                # transformers' _compute_longrope_parameters, short factors (sequences up to
                # original_max_position_embeddings); cos and sin times the attention factor.
                original = c["original_max_position_embeddings"]
                factor = c.get("max_position_embeddings", 4096) / original
                self.long_inv_freq = inv_freq / np.array(rs["long_factor"], dtype=np.float64)
                inv_freq = inv_freq / np.array(rs["short_factor"], dtype=np.float64)
                self.rope_mscale = rs.get("attention_factor") or (
                    1.0 if factor <= 1.0 else math.sqrt(1.0 + math.log(factor) / math.log(original)))
                self.long_from = original
            elif kind != "default":
                raise SystemExit(f"reference: rope_scaling {kind} not supported")
        self.inv_freq = inv_freq
        self.gemma = self.arch == "Gemma3ForCausalLM"
        self.final_softcap = None
        self.norm_offset = 1.0 if self.gemma else 0.0
        self.window = [None] * self.n_layers  # keys a layer sees: None (all) or the last W
        self.layer_inv_freq = [inv_freq] * self.n_layers
        self.attn_scale = 1.0 / math.sqrt(d)
        self.embed_scale = 1.0
        sw = c.get("sliding_window")
        if self.arch in ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM") and sw is not None \
                and sw < c.get("max_position_embeddings", 4096):
            self.window = [sw] * self.n_layers  # transformers' Mistral / Phi-3: every layer
        if self.gemma:
            if c.get("attn_logit_softcapping") is not None:
                raise SystemExit("reference: Gemma 3 attn_logit_softcapping not supported")
            self.final_softcap = c.get("final_logit_softcapping")
            local = 1.0 / (c.get("rope_local_base_freq", 10000.0)
                           ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float64) / d))
            types = c.get("layer_types")
            if types is None:
                pattern = c.get("sliding_window_pattern", 6)
                types = ["sliding_attention" if (l + 1) % pattern else "full_attention" for l in range(self.n_layers)]
            for l, t in enumerate(types):
                if t == "sliding_attention":
                    self.window[l] = c.get("sliding_window", 4096)
                    self.layer_inv_freq[l] = local
            self.attn_scale = c.get("query_pre_attn_scalar", 256) ** -0.5
            root = np.float32(math.sqrt(self.hidden))
            dtype = c.get("torch_dtype", "bfloat16")
            if dtype == "bfloat16":  # round to nearest even in the top 16 bits
                bits = int(root.view(np.uint32))
                bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
                root = np.uint32(bits).view(np.float32)
            elif dtype == "float16":
                root = np.float32(np.float16(root))
            self.embed_scale = float(root)
        self.lm_head = self.w.get("lm_head.weight")
        if self.lm_head is None or c.get("tie_word_embeddings", self.arch == "Gemma3ForCausalLM"):
            self.lm_head = self.w["model.embed_tokens.weight"]
        self.eos = set()
        for path in ("config.json", "generation_config.json"):
            p = os.path.join(model_dir, path)
            if os.path.exists(p):
                with open(p) as f:
                    e = json.load(f).get("eos_token_id")
                if isinstance(e, int):
                    self.eos.add(e)
                elif isinstance(e, list):
                    self.eos.update(e)
        self.routing = {}  # layer -> [[expert ids] per position]
        self.routing_margin = {}  # layer -> smallest k-th vs (k+1)-th router logit gap
        self.k_cache = [np.zeros((self.n_kv, 0, d)) for _ in range(self.n_layers)]
        self.v_cache = [np.zeros((self.n_kv, 0, d)) for _ in range(self.n_layers)]

    def rms_norm(self, x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * (self.norm_offset + weight)

    def rope(self, x, positions, inv_freq=None):
        # x: [n_heads, n_tokens, head_dim]; inv_freq: the layer's (default: the global one, with its
        # rotary width and attention factor)
        mscale = 1.0
        if inv_freq is None or inv_freq is self.inv_freq:
            inv_freq, mscale = self.inv_freq, self.rope_mscale
            if self.long_from is not None and positions.max() + 1 > self.long_from:
                inv_freq = self.long_inv_freq
        freqs = np.outer(positions.astype(np.float64), inv_freq)  # [n_tokens, rot/2]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb) * mscale, np.sin(emb) * mscale
        rot = 2 * len(inv_freq)
        half = rot // 2
        xr, xp = x[..., :rot], x[..., rot:]
        turned = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
        return np.concatenate([xr * cos + turned * sin, xp], axis=-1)

    def linear(self, x, name, bias=False):
        if name in self.int8_modules:
            import quantized
            x = quantized.quantize_activations(x)
        y = x @ self.w[name + ".weight"].T
        if bias and (name + ".bias") in self.w:
            y = y + self.w[name + ".bias"]
        return y

    def sparse_layer(self, l):
        c = self.config
        if self.arch == "MixtralForCausalLM":
            return True
        if self.arch != "Qwen3MoeForCausalLM":
            return False
        return l not in (c.get("mlp_only_layers") or []) and (l + 1) % c.get("decoder_sparse_step", 1) == 0

    def mlp(self, h, l):
        p = f"model.layers.{l}."
        if self.arch == "Phi3ForCausalLM":
            gate_up = self.linear(h, p + "mlp.gate_up_proj")  # [n, 2 * intermediate]
            gate, up = np.split(gate_up, 2, axis=-1)
            return self.linear(up * (gate / (1 + np.exp(-gate))), p + "mlp.down_proj")
        if self.gemma:  # GeGLU, gelu_pytorch_tanh
            gate = self.linear(h, p + "mlp.gate_proj")
            up = self.linear(h, p + "mlp.up_proj")
            act = 0.5 * gate * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate ** 3)))
            return self.linear(act * up, p + "mlp.down_proj")
        if not self.sparse_layer(l):
            gate = self.linear(h, p + "mlp.gate_proj")
            up = self.linear(h, p + "mlp.up_proj")
            return self.linear(gate / (1 + np.exp(-gate)) * up, p + "mlp.down_proj")
        c = self.config
        k = c["num_experts_per_tok"]
        if self.arch == "MixtralForCausalLM":
            block, names = p + "block_sparse_moe.", ("w1", "w3", "w2")
        else:
            block, names = p + "mlp.", ("gate_proj", "up_proj", "down_proj")
        logits = h @ self.w[block + "gate.weight"].T  # [n, n_experts]
        order = np.argsort(-logits, axis=1, kind="stable")  # best first, lower id on ties
        chosen = order[:, :k]
        if self.arch == "MixtralForCausalLM":
            top = np.take_along_axis(logits, chosen, axis=1)
            e = np.exp(top - top.max(axis=1, keepdims=True))
            weights = e / e.sum(axis=1, keepdims=True)  # softmax over the selected logits
        else:
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs = e / e.sum(axis=1, keepdims=True)  # softmax over every expert
            weights = np.take_along_axis(probs, chosen, axis=1)
            if c.get("norm_topk_prob", False):
                weights = weights / weights.sum(axis=1, keepdims=True)
        if logits.shape[1] > k:
            kth = np.take_along_axis(logits, order[:, k - 1 : k], axis=1)
            nxt = np.take_along_axis(logits, order[:, k : k + 1], axis=1)
            gap = float((kth - nxt).min())
            self.routing_margin[l] = min(self.routing_margin.get(l, gap), gap)
        self.routing.setdefault(l, []).extend(chosen.tolist())
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            for j in range(k):
                ep = block + f"experts.{int(chosen[t, j])}."
                x = h[t : t + 1]
                gate = x @ self.w[ep + names[0] + ".weight"].T
                up = x @ self.w[ep + names[1] + ".weight"].T
                out[t] += weights[t, j] * ((gate / (1 + np.exp(-gate)) * up) @ self.w[ep + names[2] + ".weight"].T)[0]
        return out

    def forward(self, token_ids, start):
        """Appends token_ids at positions start.. to the cache; returns logits [n, vocab]."""
        n = len(token_ids)
        positions = np.arange(start, start + n)
        x = self.w["model.embed_tokens.weight"][np.array(token_ids)] * self.embed_scale  # [n, hidden]
        d, group = self.head_dim, self.n_heads // self.n_kv
        for l in range(self.n_layers):
            p = f"model.layers.{l}."
            h = self.rms_norm(x, self.w[p + "input_layernorm.weight"])
            if self.arch == "Phi3ForCausalLM":
                qkv = self.linear(h, p + "self_attn.qkv_proj")  # [n, (n_heads + 2 n_kv) * d]
                qe, ke = self.n_heads * d, self.n_heads * d + self.n_kv * d
                q, k, v = qkv[:, :qe], qkv[:, qe:ke], qkv[:, ke:]
            else:
                q = self.linear(h, p + "self_attn.q_proj", True)
                k = self.linear(h, p + "self_attn.k_proj", True)
                v = self.linear(h, p + "self_attn.v_proj", True)
            q = q.reshape(n, self.n_heads, d).transpose(1, 0, 2)
            k = k.reshape(n, self.n_kv, d).transpose(1, 0, 2)
            v = v.reshape(n, self.n_kv, d).transpose(1, 0, 2)
            if p + "self_attn.q_norm.weight" in self.w:
                q = self.rms_norm(q, self.w[p + "self_attn.q_norm.weight"])
                k = self.rms_norm(k, self.w[p + "self_attn.k_norm.weight"])
            q = self.rope(q, positions, self.layer_inv_freq[l])
            k = self.rope(k, positions, self.layer_inv_freq[l])
            self.k_cache[l] = np.concatenate([self.k_cache[l], self.kv_round(k)], axis=1)
            self.v_cache[l] = np.concatenate([self.v_cache[l], self.kv_round(v)], axis=1)
            K = np.repeat(self.k_cache[l], group, axis=0)  # [n_heads, T, d]
            V = np.repeat(self.v_cache[l], group, axis=0)
            T = K.shape[1]
            scores = q @ K.transpose(0, 2, 1) * self.attn_scale  # [n_heads, n, T]
            mask = np.arange(T)[None, :] > (positions[:, None])  # key after query: masked
            if self.window[l] is not None:  # and keys W or more positions back
                mask |= np.arange(T)[None, :] <= positions[:, None] - self.window[l]
            scores = np.where(mask[None], -np.inf, scores)
            scores = scores - scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = (probs @ V).transpose(1, 0, 2).reshape(n, self.n_heads * d)
            if self.gemma:
                a = self.rms_norm(self.linear(attn, p + "self_attn.o_proj"), self.w[p + "post_attention_layernorm.weight"])
                x = x + a
                h = self.rms_norm(x, self.w[p + "pre_feedforward_layernorm.weight"])
                x = x + self.rms_norm(self.mlp(h, l), self.w[p + "post_feedforward_layernorm.weight"])
                continue
            x = x + self.linear(attn, p + "self_attn.o_proj")
            h = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            x = x + self.mlp(h, l)
        x = self.rms_norm(x, self.w["model.norm.weight"])
        if "lm_head" in self.int8_modules:  # a GPTQ lm_head ("lm_head": true) takes int8 inputs like the decoder's
            import quantized
            x = quantized.quantize_activations(x)
        logits = x @ self.lm_head.T
        if self.final_softcap is not None:  # transformers' Gemma3ForCausalLM: cap * tanh(logits / cap)
            logits = self.final_softcap * np.tanh(logits / self.final_softcap)
        return logits


def generate(model, prompt, max_tokens, ignore_eos=False):
    logits = model.forward(prompt, 0)
    first_logits = logits[-1].copy()
    out, margins, reason = [], [], "length"
    last = logits[-1]
    pos = len(prompt)
    for _ in range(max_tokens):
        tok = int(np.argmax(last))  # first maximum: lowest id on ties
        top2 = np.sort(last)[-2:]
        margins.append(float(top2[1] - top2[0]))
        out.append(tok)
        if not ignore_eos and tok in model.eos:
            reason = "stop"
            break
        if len(out) == max_tokens:
            break
        last = model.forward([tok], pos)[-1]
        pos += 1
    return first_logits, out, reason, margins


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dump-logits")
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--kv-cache-dtype", choices=["f64", "fp8"], default="f64",
                    help="fp8: keys and values rounded to float8_e4m3fn as they enter the cache")
    ap.add_argument("--activations", choices=["f64", "int8"], default="f64",
                    help="int8: the inputs of AWQ/GPTQ Linears (not act-order) rounded to int8 per 32, as "
                         "shardlm's default SHARDLM_QUANT_ACTIVATIONS=int8 does")
    args = ap.parse_args()
    prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    model = Model(args.model_dir, args.kv_cache_dtype, args.activations)
    for t in prompt:
        if not 0 <= t < model.vocab:
            raise SystemExit(f"prompt id {t} outside [0, {model.vocab})")
    first_logits, out, reason, margins = generate(model, prompt, args.max_tokens, args.ignore_eos)
    if args.dump_logits:
        first_logits.astype("<f4").tofile(args.dump_logits)
    result = {"prompt_token_ids": prompt, "token_ids": out, "finish_reason": reason,
              "margins": [round(m, 6) for m in margins]}
    if model.routing:
        result["routing"] = {str(l): r for l, r in sorted(model.routing.items())}
        result["routing_margins"] = {str(l): round(m, 6) for l, m in sorted(model.routing_margin.items())}
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
