#!/usr/bin/python3
"""make-model --quantize against the published layouts, checked by quantized.py.

For each format: the checkpoint's config fields, tensor names, dtypes and
shapes are those of the real repositories; the weights quantized.py unpacks
(its own code) are the seeded weights of the unquantized checkpoint of the
same seed within the quantization's error bound; the reference forward runs
on them, and its greedy tokens are compared (reported, not required) with
the unquantized model's; `shardlm verify` accepts the checkpoint, `shardlm
plan` counts exactly its header bytes, and `shardlm generate` (quantized
kernels) gives the reference's greedy tokens; `shardlm quantize` of the f32
checkpoint of the same seed writes the same quantized parts; `shardlm quantize
--lm-head` writes GPTQ's quantized lm_head (check_lm_head).

usage: test_quantized.py --cli build/src/cli/shardlm --work DIR
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quantized  # noqa: E402
import reference  # noqa: E402

SHAPE = ["--like", "qwen2.5-0.5b", "--layers", "2", "--vocab", "512", "--hidden", "256", "--heads", "4",
         "--kv-heads", "2", "--intermediate", "512"]
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]

# name, make-model flags, expected quantization_config subset, per-part dtypes
CASES = [
    ("awq", ["--quantize", "awq", "--group-size", "64"],
     {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"},
     {"qweight": "I32", "qzeros": "I32", "scales": "F16"}),
    ("gptq", ["--quantize", "gptq", "--group-size", "64"],
     {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True, "desc_act": False},
     {"qweight": "I32", "qzeros": "I32", "scales": "F16", "g_idx": "I32"}),
    ("gptq_act_asym", ["--quantize", "gptq", "--group-size", "32", "--desc-act", "--asym"],
     {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": True},
     {"qweight": "I32", "qzeros": "I32", "scales": "F16", "g_idx": "I32"}),
    ("gptq_int8", ["--quantize", "gptq-int8", "--group-size", "128"],
     {"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": True},
     {"qweight": "I32", "qzeros": "I32", "scales": "F16", "g_idx": "I32"}),
    ("fp8", ["--quantize", "fp8"],
     {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
      "modules_to_not_convert": ["lm_head"]},
     {"weight": "F8_E4M3", "weight_scale_inv": "BF16"}),
]

failures = []


def check(cond, message):
    if not cond:
        failures.append(message)
        print("FAIL:", message)


def run(cmd, expect_rc=0):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if expect_rc is not None and p.returncode != expect_rc:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def headers(model_dir):
    out = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            for t, (dtype, shape, _) in quantized.read_raw(os.path.join(model_dir, name)).items():
                out[t] = (dtype, shape)
    return out


def greedy(model_dir, max_tokens=12):
    # shardlm generate runs with this process's SHARDLM_QUANT_ACTIVATIONS (int8 unless set to f32).
    acts = "f64" if os.environ.get("SHARDLM_QUANT_ACTIVATIONS") == "f32" else "int8"
    m = reference.Model(model_dir, activations=acts)
    return reference.generate(m, [1, 2, 3, 4, 5], max_tokens, ignore_eos=True)[1]


def check_lm_head(a, plain, w32):
    """`shardlm quantize --lm-head` (GPTQ 4- and 8-bit) of the tied f32 checkpoint: lm_head stored
    as GPTQ parts ("lm_head": true), the model untied (tie_word_embeddings false, the embedding kept
    in f32), the unpacked lm_head within half a step of the embedding it came from; verify and plan
    accept it, generate gives the reference's tokens. Then a config claiming "lm_head": true over an
    F16 lm_head: verify names the missing lm_head.qweight."""
    n_vocab, hidden, g = 512, 256, 64
    for bits, fmt in ((4, "gptq"), (8, "gptq-int8")):
        name = f"{fmt}_lm_head"
        d = os.path.join(a.work, name)
        run([a.cli, "quantize", plain, "--quantize", fmt, "--group-size", str(g), "--lm-head", "--out", d])
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        check(cfg["tie_word_embeddings"] is False, f"{name}: tie_word_embeddings {cfg['tie_word_embeddings']}")
        check(cfg["quantization_config"].get("lm_head") is True, f"{name}: {cfg['quantization_config']}")
        h = headers(d)
        p = 32 // bits
        want = {"lm_head.qweight": ("I32", [hidden // p, n_vocab]), "lm_head.qzeros": ("I32", [hidden // g, n_vocab // p]),
                "lm_head.scales": ("F16", [hidden // g, n_vocab]), "lm_head.g_idx": ("I32", [hidden])}
        for t, v in want.items():
            check(h.get(t) == (v[0], tuple(v[1])), f"{name}: {t} is {h.get(t)}, expected {v}")
        check("lm_head.weight" not in h, f"{name}: lm_head.weight must not be stored")
        check(h.get("model.embed_tokens.weight", ("?",))[0] == "F32", f"{name}: the embedding is not kept in F32")
        deq = quantized.load_dequantized(d)
        words = quantized.as_float(*quantized.read_raw(os.path.join(d, "model.safetensors"))["lm_head.scales"])
        step = np.repeat(words, g, axis=0).T  # [vocab, hidden]: each element's quantization step
        ratio = np.abs(deq["lm_head.weight"] - w32["model.embed_tokens.weight"]) / step
        check(np.mean(ratio <= 0.5 + 1e-6) > 0.99, f"{name}: lm_head: {np.mean(ratio <= 0.5 + 1e-6):.4f} within half a step")
        v = run([a.cli, "verify", d], expect_rc=None)
        check(v.returncode == 0, f"{name}: shardlm verify exit {v.returncode}: {v.stdout}{v.stderr}")
        pj = json.loads(run([a.cli, "plan", d, "--gpus", "1xH100-80GB", "--json"]).stdout)
        check(pj["checkpoint"]["total_bytes"] == pj["model"]["weight_bytes"],
              f"{name}: plan counts {pj['model']['weight_bytes']} bytes, headers hold {pj['checkpoint']['total_bytes']}")
        tokens = greedy(d)
        gen = run([a.cli, "generate", d, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "12", "--temperature", "0",
                   "--json"], expect_rc=None)
        check(gen.returncode == 0, f"{name}: shardlm generate exit {gen.returncode}: {gen.stderr}")
        if gen.returncode == 0:
            ours = json.loads(gen.stdout.strip().splitlines()[-1])["token_ids"]
            check(len(ours) > 0 and ours == tokens[:len(ours)], f"{name}: shardlm generate {ours}, reference {tokens}")
        print(f"{name}: lm_head max error {float(ratio.max()):.3f} steps; generate = reference")
    d = os.path.join(a.work, "gptq_lm_head_claimed")
    run([a.cli, "make-model", *SHAPE, "--seed", "11", "--quantize", "gptq", "--group-size", "64", "--no-tie", "--out", d])
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"]["lm_head"] = True
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    v = run([a.cli, "verify", d], expect_rc=None)
    check(v.returncode != 0 and "lm_head.qweight is missing" in v.stdout + v.stderr,
          f"verify of a claimed but absent quantized lm_head: exit {v.returncode}: {v.stdout}{v.stderr}")
    # The same claim in a separate quantize_config.json (older GPTQ layouts keep it there).
    q = cfg.pop("quantization_config")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    with open(os.path.join(d, "quantize_config.json"), "w") as f:
        json.dump(q, f)
    v = run([a.cli, "verify", d], expect_rc=None)
    check(v.returncode != 0 and "quantize_config.json has \"lm_head\": true" in v.stdout + v.stderr,
          f"verify with quantize_config.json: exit {v.returncode}: {v.stdout}{v.stderr}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    seed = "11"
    plain = os.path.join(a.work, "f32")
    run([a.cli, "make-model", *SHAPE, "--dtype", "f32", "--seed", seed, "--out", plain])
    w32 = reference.load_weights(plain)
    base_tokens = greedy(plain)

    for name, flags, config_fields, part_dtypes in CASES:
        d = os.path.join(a.work, name)
        run([a.cli, "make-model", *SHAPE, "--seed", seed, *flags, "--out", d])
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        q = cfg.get("quantization_config", {})
        for k, v in config_fields.items():
            check(q.get(k) == v, f"{name}: quantization_config.{k} = {q.get(k)!r}, expected {v!r}")
        method = q["quant_method"]
        check(cfg["torch_dtype"] == ("bfloat16" if method == "fp8" else "float16"),
              f"{name}: torch_dtype {cfg['torch_dtype']}")

        h = headers(d)
        deq = quantized.load_dequantized(d)
        hidden, inter, q_dim, kv_dim = 256, 512, 256, 128
        dims = {"self_attn.q_proj": (q_dim, hidden), "self_attn.k_proj": (kv_dim, hidden),
                "self_attn.v_proj": (kv_dim, hidden), "self_attn.o_proj": (hidden, q_dim),
                "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
        worst = 0.0
        for layer in range(2):
            for lin in LINEARS:
                module = f"model.layers.{layer}.{lin}"
                n_out, n_in = dims[lin]
                for part, dtype in part_dtypes.items():
                    t = h.get(f"{module}.{part}")
                    check(t is not None and t[0] == dtype, f"{name}: {module}.{part} is {t}, expected dtype {dtype}")
                if method != "fp8":
                    check(f"{module}.weight" not in h, f"{name}: {module}.weight must not be stored")
                    bits, g = q["bits"], q["group_size"]
                    p = 32 // bits
                    groups = n_in // g
                    if method == "awq":
                        want = {"qweight": (n_in, n_out // 8), "qzeros": (groups, n_out // 8), "scales": (groups, n_out)}
                    else:
                        want = {"qweight": (n_in // p, n_out), "qzeros": (groups, n_out // p),
                                "scales": (groups, n_out), "g_idx": (n_in,)}
                else:
                    want = {"weight": (n_out, n_in), "weight_scale_inv": ((n_out + 127) // 128, (n_in + 127) // 128)}
                for part, shape in want.items():
                    t = h.get(f"{module}.{part}")
                    check(t is not None and tuple(t[1]) == shape, f"{name}: {module}.{part} shape {t}, expected {shape}")
                w = w32[f"{module}.weight"]
                wq = deq[f"{module}.weight"]
                err = np.abs(w - wq)
                if method == "fp8":
                    # E4M3 keeps 3 mantissa bits: half an ulp is 1/16 of the value (2^-10 x scale below 2^-6).
                    s = quantized.as_float(*quantized.read_raw(os.path.join(d, "model.safetensors"))[
                        f"{module}.weight_scale_inv"])
                    bound = np.abs(w) / 16.0 + s.max() * 2.0 ** -10 + 1e-12
                    check(np.all(err <= bound), f"{name}: {module}: fp8 error {err.max():.3g} beyond half an ulp")
                    worst = max(worst, float((err / (np.abs(w) + 1e-30)).max()))
                else:
                    # Round to nearest: at most half a step, one step where the stored (rounded) scale
                    # pushes the extreme value of a group past the last code.
                    raw = quantized.read_raw(os.path.join(d, "model.safetensors"))
                    s = quantized.as_float(*raw[f"{module}.scales"])  # [G, N]
                    if method == "gptq":
                        gi = np.frombuffer(raw[f"{module}.g_idx"][2], dtype="<i4")
                    else:
                        gi = np.arange(n_in) // q["group_size"]
                    step = s[gi].T  # [N, K]
                    ratio = err / step
                    check(np.all(ratio <= 1.0 + 1e-6), f"{name}: {module}: error {ratio.max():.3f} steps")
                    check(np.mean(ratio <= 0.5 + 1e-6) > 0.99,
                          f"{name}: {module}: only {np.mean(ratio <= 0.5 + 1e-6):.4f} of the elements within half a step")
                    worst = max(worst, float(ratio.max()))
                    if method == "gptq" and q.get("desc_act"):
                        check(not np.all(np.diff(gi) >= 0), f"{name}: {module}: act-order g_idx is monotonic")
                        counts = np.bincount(gi, minlength=n_in // q["group_size"])
                        check(np.all(counts == q["group_size"]), f"{name}: {module}: act-order groups {counts}")
        # Unquantized tensors: the same seeded values, in torch_dtype.
        for t in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.bias"):
            check(np.allclose(deq[t], w32[t], rtol=2 ** -8, atol=1e-6), f"{name}: {t} differs from the seeded values")

        tokens = greedy(d)
        agree = sum(1 for x, y in zip(tokens, base_tokens) if x == y)
        print(f"{name}: max error {worst:.3f} {'(relative)' if method == 'fp8' else 'steps'}; reference greedy "
              f"tokens equal to the f32 model's at {agree}/{len(base_tokens)} steps (random weights: indicative only)")

        # `shardlm quantize` of the f32 checkpoint of the same seed: the same parts, byte for byte
        # (make-model quantizes the same seeded f32 values); unquantized tensors keep the source's f32.
        d2 = os.path.join(a.work, name + "_from_f32")
        run([a.cli, "quantize", plain, *flags, "--out", d2])
        raw_mm = quantized.read_raw(os.path.join(d, "model.safetensors"))
        raw_q = quantized.read_raw(os.path.join(d2, "model.safetensors"))
        compared = 0
        for t, (dtype, shape, data) in raw_mm.items():
            if any(t.endswith("." + p) for p in part_dtypes) and not t.endswith("_layernorm.weight") and \
                    t != "model.norm.weight" and t != "model.embed_tokens.weight" and "q_norm" not in t and \
                    "k_norm" not in t and ("proj" in t):
                check(t in raw_q and raw_q[t] == (dtype, shape, data), f"{name}: shardlm quantize differs at {t}")
                compared += 1
        check(compared == 2 * len(LINEARS) * len(part_dtypes), f"{name}: compared {compared} quantized parts")
        with open(os.path.join(d2, "config.json")) as f:
            q2 = json.load(f).get("quantization_config", {})
        check(q2 == q, f"{name}: shardlm quantize wrote quantization_config {q2}, make-model {q}")
        check(quantized.read_raw(os.path.join(d2, "model.safetensors"))["model.norm.weight"][0] == "F32",
              f"{name}: shardlm quantize changed the dtype of an unquantized tensor")

        v = run([a.cli, "verify", d], expect_rc=None)
        check(v.returncode == 0, f"{name}: shardlm verify exit {v.returncode}: {v.stdout}{v.stderr}")
        check("quantized" in v.stdout, f"{name}: verify does not say the checkpoint is quantized: {v.stdout}")
        pj = json.loads(run([a.cli, "plan", d, "--gpus", "1xH100-80GB", "--json"]).stdout)
        check(pj["checkpoint"]["total_bytes"] == pj["model"]["weight_bytes"],
              f"{name}: plan counts {pj['model']['weight_bytes']} bytes, headers hold {pj['checkpoint']['total_bytes']}")
        g = run([a.cli, "generate", d, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "12", "--temperature", "0",
                 "--json"], expect_rc=None)
        check(g.returncode == 0, f"{name}: shardlm generate exit {g.returncode}: {g.stderr}")
        if g.returncode == 0:
            ours = json.loads(g.stdout.strip().splitlines()[-1])["token_ids"]
            # generate stops at an eos (kept); the reference ran on past it.
            check(len(ours) > 0 and ours == tokens[:len(ours)],
                  f"{name}: shardlm generate {ours}, reference on the unpacked weights {tokens}")

    check_lm_head(a, plain, w32)

    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("all quantized checkpoints OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
