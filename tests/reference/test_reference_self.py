#!/usr/bin/python3
"""Self-checks of reference.py that need no shardlm forward: incremental
decode with the KV cache equals a full recompute (cache, mask and positions),
RoPE is a rotation (norms kept, position 0 is identity), llama3 inv_freq
scaling matches hand values, and BF16 decoding is a bit shift."""
import argparse
import math
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference as R  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    fails = []
    for like, extra in [("qwen3-0.6b", ["--hidden", "128", "--heads", "4", "--kv-heads", "2", "--head-dim", "32"]),
                        ("qwen2.5-0.5b", ["--hidden", "128", "--heads", "4", "--kv-heads", "2"]),
                        ("llama-3.1-8b", ["--hidden", "128", "--heads", "4", "--kv-heads", "1"])]:
        d = os.path.join(a.work, like)
        subprocess.run([a.cli, "make-model", "--like", like, "--out", d, "--layers", "2", "--vocab", "300",
                        "--intermediate", "256", "--dtype", "f32"] + extra, check=True, capture_output=True)
        ids = [5, 77, 12, 260, 3, 9, 140, 33, 1, 2]
        full = R.Model(d).forward(ids, 0)
        m = R.Model(d)
        inc = np.concatenate([m.forward(ids[:4], 0), m.forward(ids[4:5], 4), m.forward(ids[5:], 5)])
        err = np.abs(full - inc).max()
        print(f"{like}: incremental vs full max diff {err:.2e}")
        if err > 1e-9:
            fails.append(f"{like}: incremental decode differs from full recompute by {err}")
        x = np.random.default_rng(0).standard_normal((m.n_heads, 3, m.head_dim))
        y = m.rope(x, np.array([0, 7, 1000]))
        if np.abs(np.linalg.norm(x, axis=-1) - np.linalg.norm(y, axis=-1)).max() > 1e-9 or np.abs(y[:, 0] - x[:, 0]).max() > 0:
            fails.append(f"{like}: RoPE is not a rotation / not identity at position 0")
    # llama3: high-frequency components untouched, low-frequency ones divided by factor.
    inv = 1.0 / (500000.0 ** (np.arange(0, 128, 2) / 128))
    scaled = R.llama3_inv_freq(inv, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192})
    wavelen = 2 * math.pi / inv
    if not (np.allclose(scaled[wavelen < 2048], inv[wavelen < 2048]) and np.allclose(scaled[wavelen > 8192], inv[wavelen > 8192] / 8)):
        fails.append("llama3 inv_freq scaling")
    mid = (wavelen >= 2048) & (wavelen <= 8192)
    if not np.all((scaled[mid] <= inv[mid]) & (scaled[mid] >= inv[mid] / 8)):
        fails.append("llama3 smoothed band outside [inv/8, inv]")
    # bf16 0x3FC0 = 1.5, 0xC000 = -2.0
    path = os.path.join(a.work, "bf16.safetensors")
    import json
    import struct
    header = json.dumps({"t": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + struct.pack("<HH", 0x3FC0, 0xC000))
    if list(R.read_safetensors(path)["t"]) != [1.5, -2.0]:
        fails.append("bf16 decoding")
    for f in fails:
        print("FAIL:", f)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
