#!/usr/bin/python3
"""Writes a shardlm (HF-layout) Qwen2 safetensors checkpoint as GGUF for llama.cpp, bit for bit.

    /usr/bin/python3 bench/llama_cpp_gguf.py MODEL_DIR OUT.gguf --gguf-py DIR

For bench/llama_cpp_compare.sh. Built on llama.cpp's own gguf-py (GGUFWriter, the tensor name
map); convert_hf_to_gguf.py itself needs torch and transformers, which Debian does not package.
Matrices keep their BF16 bits (the uint16 words are copied, never rounded); 1-D tensors (norms,
q/k/v biases) become F32, which holds every BF16 value exactly and is what llama.cpp's CPU
kernels expect for them (convert_hf_to_gguf.py does the same). The vocabulary is the
checkpoint's tokenizer.json (byte-level BPE, its merges and special tokens), padded with
unused "[PADn]" tokens up to config.json's vocab_size as convert_hf_to_gguf.py pads, so the
embedding and lm_head rows line up with the same ids.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def fail(msg):
    sys.stderr.write("llama_cpp_gguf: " + msg + "\n")
    sys.exit(1)


def read_safetensors(path):
    """{name: (dtype, shape, memmap of the raw bytes)} of one .safetensors file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            fail(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        meta = json.loads(f.read(n))
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + n
    out = {}
    for name, t in meta.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], raw[base + b:base + e])
    return out


def load_tensors(model_dir):
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        fail(f"{model_dir}: no *.safetensors file")
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(model_dir, f)))
    return tensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    a = ap.parse_args()
    sys.path.insert(0, a.gguf_py)
    import gguf  # noqa: E402  (llama.cpp's, from the folder given)

    cfg = json.load(open(os.path.join(a.model_dir, "config.json")))
    if cfg.get("model_type") != "qwen2":
        fail(f"{a.model_dir}/config.json: model_type {cfg.get('model_type')!r}; this converter writes qwen2 only")
    if cfg.get("quantization_config"):
        fail(f"{a.model_dir}: a quantized checkpoint; convert the BF16 one and use llama-quantize")
    n_layer = cfg["num_hidden_layers"]
    n_vocab = cfg["vocab_size"]
    n_head = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    tensors = load_tensors(a.model_dir)

    w = gguf.GGUFWriter(a.out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN2])
    w.add_name(os.path.basename(os.path.normpath(a.model_dir)))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    if head_dim * n_head != cfg["hidden_size"]:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(float(cfg["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

    # Tokenizer: byte-level BPE from tokenizer.json, padded to vocab_size.
    tok = json.load(open(os.path.join(a.model_dir, "tokenizer.json")))
    if tok["model"]["type"] != "BPE":
        fail(f"{a.model_dir}/tokenizer.json: model type {tok['model']['type']!r}; expected BPE")
    id_to_tok = {i: s for s, i in tok["model"]["vocab"].items()}
    special = {}
    for t in tok.get("added_tokens", []):
        id_to_tok[t["id"]] = t["content"]
        special[t["id"]] = t.get("special", False)
    if max(id_to_tok) >= n_vocab:
        fail(f"tokenizer.json has id {max(id_to_tok)} >= config.json vocab_size {n_vocab}")
    tokens, types = [], []
    for i in range(n_vocab):
        if i in id_to_tok:
            tokens.append(id_to_tok[i])
            types.append(gguf.TokenType.CONTROL if special.get(i) else
                         (gguf.TokenType.USER_DEFINED if i in special else gguf.TokenType.NORMAL))
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if cfg.get("bos_token_id") is not None:
        w.add_bos_token_id(cfg["bos_token_id"])
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    if eos is not None:
        w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, n_layer)
    tied = cfg.get("tie_word_embeddings", False)
    n_written = 0
    for name, (dtype, shape, raw) in tensors.items():
        if tied and name == "lm_head.weight":
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            fail(f"tensor {name}: no GGUF name for it in llama.cpp's qwen2 map")
        if dtype != "BF16":
            fail(f"tensor {name}: dtype {dtype}; this converter copies BF16 checkpoints bit for bit")
        bits = raw.view(np.uint16).reshape(shape)
        if len(shape) == 1:
            # BF16 -> F32 is exact: the 16 bits become the high half of the f32 word.
            w.add_tensor(new, (bits.astype(np.uint32) << 16).view(np.float32))
        else:
            w.add_tensor(new, bits, raw_shape=shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        n_written += 1

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # Read the file back with gguf-py's reader: every tensor's bytes must equal the checkpoint's
    # (the BF16 bits, or the exact F32 widening of a 1-D tensor).
    r = gguf.GGUFReader(a.out)
    by_name = {t.name: t for t in r.tensors}
    n_checked = 0
    for name, (dtype, shape, raw) in tensors.items():
        if tied and name == "lm_head.weight":
            continue
        t = by_name[names.get_name(name, try_suffixes=(".weight", ".bias"))]
        bits = raw.view(np.uint16)
        got = np.asarray(t.data)
        if len(shape) == 1:
            same = np.array_equal(got.reshape(-1).view(np.uint32), bits.astype(np.uint32) << 16)
        else:
            same = list(reversed([int(d) for d in t.shape])) == list(shape) and \
                np.array_equal(got.reshape(-1).view(np.uint16), bits)
        if not same:
            fail(f"{a.out}: tensor {t.name} does not hold {name}'s bits")
        n_checked += 1
    print(f"wrote {a.out}: {n_written} tensors ({n_checked} read back bit for bit), "
          f"{n_vocab} tokens ({len(id_to_tok)} from tokenizer.json)")


if __name__ == "__main__":
    main()
