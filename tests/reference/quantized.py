#!/usr/bin/python3
"""Unpacks quantized checkpoints (AWQ, GPTQ, FP8) into dequantized weights.

Independent of shardlm: it reads the safetensors bytes itself and follows
the published layouts, written from the packers' descriptions rather than
from shardlm's code:

  * AWQ (AutoAWQ GEMM): qweight [K, N/8] int32, qzeros [K/g, N/8] int32,
    scales [K/g, N] f16. AutoAWQ packs channel order [0,2,4,6,1,3,5,7] into
    nibbles 0..7, so channel j of a word is read from nibble
    [0,4,1,5,2,6,3,7][j] (AutoAWQ's AWQ_REVERSE_ORDER).
    w[k, n] = (q[k, n] - z[k // g, n]) * s[k // g, n]
  * GPTQ (AutoGPTQ): qweight [K / (32/b), N] packed along the input rows,
    qzeros [G, N / (32/b)] packed along the output channels, scales [G, N],
    g_idx [K]; the stored zero is one less than the real one unless
    checkpoint_format is "gptq_v2".
    w[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]
  * FP8 (float8_e4m3fn) weight [N, K] with weight_scale_inv blocks
    [ceil(N/bn), ceil(K/bk)] (or one scale, or one per output channel).

load_dequantized(dir) returns {name: float64 array}: every unquantized
tensor as stored, and "<module>.weight" [N, K] for each quantized Linear.
"""
import json
import os
import struct

import numpy as np

AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def read_raw(path):
    """name -> (dtype, shape, bytes)"""
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
        out[name] = (info["dtype"], tuple(info["shape"]), data[base + begin : base + end])
    return out


def e4m3_table():
    """float8_e4m3fn byte -> value (NaN for 0x7f / 0xff)."""
    table = np.zeros(256, dtype=np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            table[b] = float("nan")
        elif e == 0:
            table[b] = sign * (m / 8.0) * 2.0 ** -6
        else:
            table[b] = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return table


def as_float(dtype, shape, raw):
    if dtype == "F32":
        arr = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    elif dtype == "F16":
        arr = np.frombuffer(raw, dtype="<f2").astype(np.float64)
    elif dtype == "BF16":
        arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    elif dtype == "F8_E4M3":
        arr = e4m3_table()[np.frombuffer(raw, dtype=np.uint8)]
    else:
        raise SystemExit(f"quantized.py: dtype {dtype} is not a float")
    return arr.reshape(shape)


def as_u32(dtype, shape, raw):
    if dtype != "I32":
        raise SystemExit(f"quantized.py: expected I32, found {dtype}")
    return np.frombuffer(raw, dtype="<u4").astype(np.int64).reshape(shape)


def quantization_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config")
    if q is None and os.path.exists(os.path.join(model_dir, "quantize_config.json")):
        with open(os.path.join(model_dir, "quantize_config.json")) as f:
            q = json.load(f)
        q.setdefault("quant_method", "gptq")
    return q


def int8_activation_modules(model_dir):
    """The Linear modules shardlm multiplies with int8 activations by default
    (SHARDLM_QUANT_ACTIVATIONS=int8): AWQ, and GPTQ without act-order (desc_act),
    whose input size and group size are multiples of 32."""
    q = quantization_config(model_dir)
    if q is None or q["quant_method"] not in ("awq", "gptq") or q.get("desc_act"):
        return set()
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = set()
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n).decode("utf-8"))
        for t, info in header.items():
            if not t.endswith(".qweight"):
                continue
            rows = info["shape"][0] * (1 if q["quant_method"] == "awq" else 32 // q["bits"])
            g = q["group_size"] if q["group_size"] > 0 else rows
            if rows % 32 == 0 and g % 32 == 0:
                out.add(t[: -len(".qweight")])
    return out


def quantize_activations(x):
    """x [..., K] rounded to int8 per 32 inputs as shardlm does: d = max|x| / 127,
    x_hat = d * round(x / d) (round half to even)."""
    s = x.shape
    xb = x.reshape(s[:-1] + (s[-1] // 32, 32))
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    safe = np.where(amax > 0, amax, 1.0)
    q = np.where(amax > 0, np.round(xb * (127.0 / safe)), 0.0)
    return (q * (amax / 127.0)).reshape(s)


def unpack_awq(raw, module, q):
    bits, g = q["bits"], q["group_size"]
    mask = (1 << bits) - 1
    shifts = np.array(AWQ_REVERSE_ORDER, dtype=np.int64) * bits

    def unpack(name):
        words = as_u32(*raw[name])  # [rows, N/8]
        vals = (words[:, :, None] >> shifts[None, None, :]) & mask  # [rows, N/8, 8]
        return vals.reshape(words.shape[0], -1)

    iw = unpack(module + ".qweight")  # [K, N]
    z = unpack(module + ".qzeros")  # [K/g, N]
    s = as_float(*raw[module + ".scales"])  # [K/g, N]
    k = np.arange(iw.shape[0]) // g
    return ((iw - z[k]) * s[k]).T


def unpack_gptq(raw, module, q):
    bits = q["bits"]
    p = 32 // bits
    mask = (1 << bits) - 1
    shifts = np.arange(p, dtype=np.int64) * bits
    words = as_u32(*raw[module + ".qweight"])  # [K/p, N]
    iw = ((words[:, None, :] >> shifts[None, :, None]) & mask).reshape(words.shape[0] * p, words.shape[1])
    zw = as_u32(*raw[module + ".qzeros"])  # [G, N/p]
    z = ((zw[:, :, None] >> shifts[None, None, :]) & mask).reshape(zw.shape[0], -1)
    if q.get("checkpoint_format", "gptq") == "gptq":
        z = z + 1
    s = as_float(*raw[module + ".scales"])  # [G, N]
    g_idx = np.frombuffer(raw[module + ".g_idx"][2], dtype="<i4").astype(np.int64)
    return ((iw - z[g_idx]) * s[g_idx]).T


def unpack_fp8(raw, module, q):
    w = as_float(*raw[module + ".weight"])  # [N, K]
    s = as_float(*raw[module + ".weight_scale_inv"])
    n, k = w.shape
    block = q.get("weight_block_size")
    if block:
        full = np.repeat(np.repeat(s, block[0], axis=0), block[1], axis=1)[:n, :k]
    elif s.size == 1:
        full = s.reshape(())
    else:
        full = s.reshape(n, 1)
    return w * full


def load_dequantized(model_dir):
    q = quantization_config(model_dir)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    raw = {}
    for name in files:
        raw.update(read_raw(os.path.join(model_dir, name)))
    method = q["quant_method"]
    out = {}
    done = set()
    for name, (dtype, shape, data) in raw.items():
        if method in ("awq", "gptq") and name.endswith(".qweight"):
            module = name[: -len(".qweight")]
            out[module + ".weight"] = (unpack_awq if method == "awq" else unpack_gptq)(raw, module, q)
            done.update(module + s for s in (".qweight", ".qzeros", ".scales", ".g_idx"))
        elif method == "fp8" and name.endswith(".weight_scale_inv"):
            module = name[: -len(".weight_scale_inv")]
            out[module + ".weight"] = unpack_fp8(raw, module, q)
            done.update((name, module + ".weight"))
    for name, (dtype, shape, data) in raw.items():
        if name not in done:
            out[name] = as_float(dtype, shape, data)
    return out
