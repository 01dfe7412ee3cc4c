#!/usr/bin/python3
"""The kernel paths of bench/llama_cpp_compare.sh: the CPU, and which kernel each engine took.

    /usr/bin/python3 bench/llama_cpp_paths.py WORK_DIR --models "0.5b 1.5b"

Reads what the script left in WORK_DIR:
  lscpu.txt                    `lscpu` (model name, family/model, flags);
  kernels/<model>.<config>.txt shardlm's SHARDLM_KERNEL_REPORT of that configuration's round-1 run:
                               counts taken where the CPU backend dispatched each matmul
                               (src/backend/cpu/kernel_report.h), one block per process;
  llama_greedy.<model>.out     llama_greedy's "system_info:" line (llama_print_system_info: the
                               CPU features ggml was built for, e.g. AVX512_BF16 = 1, AMX_INT8 = 1,
                               LLAMAFILE = 1, REPACK = 1);
  llama_load.<model>.<type>.err llama-bench -v's load log of that GGUF: its buffer types (CPU_REPACK,
                               AMX, CPU_Mapped) and "repack tensor ... with q4_0_8x8" lines.
llama.cpp's matmul path per weight type follows from those, by ggml 80fb11a's rules
(ggml-cpu.c ggml_compute_forward_mul_mat, llamafile/sgemm.cpp): a tensor repacked by CPU_REPACK
(or held by the AMX buffer) runs that buffer's kernels; any other goes to llamafile's tinyBLAS
when LLAMAFILE = 1 and the batch has 2 rows or more (BF16 x BF16 on AVX512_BF16 dot products
where the build has them; Q4_0/Q8_0 x Q8_0 on its AVX kernels), else to ggml_vec_dot_<type>
(BF16: AVX512_BF16 when built with it; Q4_0/Q8_0: against Q8_0 activations).
"""
import argparse
import collections
import os
import re
import sys

CONFIGS = [  # (file key, label) in the order of the script's rounds
    ("dec", "decode batch 1"),
    ("pp", "pp512 (decode_bench --prompt 512)"),
    ("batched", "4 and 16 streams (decode-bench 4,16)"),
    ("tp2", "TP=2 as threads, batch 1"),
    ("awq", "AWQ batch 1"),
    ("int8", "GPTQ-int8 batch 1"),
    ("int8lm", "GPTQ-int8 + lm_head batch 1"),
    ("serve16", "serve, 16 streams"),
]


def cpu_lines(work):
    path = os.path.join(work, "lscpu.txt")
    if not os.path.exists(path):
        return ["CPU: (no lscpu output)"]
    fields = {}
    for line in open(path):
        k, _, v = line.partition(":")
        fields[k.strip()] = v.strip()
    flags = set(fields.get("Flags", "").split())
    have = lambda f: "yes" if f in flags else "no"
    return [
        "CPU: %s (family %s, model %s, stepping %s), %s CPUs"
        % (fields.get("Model name", "?"), fields.get("CPU family", "?"), fields.get("Model", "?"),
           fields.get("Stepping", "?"), fields.get("CPU(s)", "?")),
        "  AMX (amx_tile/amx_bf16/amx_int8): %s/%s/%s | AVX512_BF16: %s | AVX512_VNNI: %s | AVX-512 (avx512f): %s | AVX2: %s"
        % (have("amx_tile"), have("amx_bf16"), have("amx_int8"), have("avx512_bf16"), have("avx512_vnni"),
           have("avx512f"), have("avx2")),
    ]


def shard_report(path):
    """Rows of every block in the file: (path, weights, rows, mxk, calls); and the header lines."""
    rows, headers = [], []
    in_table = False
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("kernel report"):
            headers.append(line)
        elif line.startswith("path "):
            in_table = True
        elif line == "end of kernel report":
            in_table = False
        elif in_table and line.strip():
            p, w, r, mk, c = line.split()
            rows.append((p, w, r, mk, int(c)))
    return rows, headers


def rows_key(r):
    lo = r.split("-")[0]
    return int(lo)


def shard_lines(work, model):
    out = []
    for key, label in CONFIGS:
        path = os.path.join(work, "kernels", "%s.%s.txt" % (model, key))
        if not os.path.exists(path):
            continue
        rows, headers = shard_report(path)
        if not headers:
            out.append("  %-38s no report (the process did not exit normally)" % label)
            continue
        # One line per (path, weights, rows): its shapes and calls.
        group = collections.OrderedDict()
        for p, w, r, mk, c in sorted(rows, key=lambda x: (rows_key(x[2]), x[0], x[1], x[3])):
            g = group.setdefault((p, w, r), [set(), 0])
            g[0].add(mk)
            g[1] += c
        first = True
        for (p, w, r), (shapes, calls) in group.items():
            out.append("  %-38s %-20s %-9s rows %-8s %8d calls  m×k: %s"
                       % (label if first else "", p, w, r, calls,
                          " ".join(sorted(shapes, key=lambda s: [int(x) for x in s.split("x")]))))
            first = False
    return out


def llama_lines(work, model):
    out = []
    sysinfo = ""
    p = os.path.join(work, "llama_greedy.%s.out" % model)
    if os.path.exists(p):
        for line in open(p):
            if line.startswith("system_info: "):
                sysinfo = line[len("system_info: "):].strip()
    feats = dict(re.findall(r"([A-Z0-9_]+) = (\d+)", sysinfo))
    if sysinfo:
        out.append("  system_info: " + sysinfo)
    llamafile = feats.get("LLAMAFILE") == "1"
    bf16dot = feats.get("AVX512_BF16") == "1"
    for typ in ("bf16", "Q4_0", "Q8_0"):
        p = os.path.join(work, "llama_load.%s.%s.err" % (model, typ))
        if not os.path.exists(p):
            continue
        text = open(p, errors="replace").read()
        repacked = collections.Counter(re.findall(r"repack tensor \S+ with (\S+)", text))
        buffers = re.findall(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+ MiB)", text)
        declined = re.search(r"tensor '([^']+)' \((\w+)\) \(and (\d+) others\) cannot be used with preferred buffer type (\S+)",
                             text)
        types = re.findall(r"- type\s+(\w+):\s+(\d+) tensors", text)
        out.append("  %s.gguf: tensors %s; buffers %s" % (
            typ, ", ".join("%s %s" % (n, t) for t, n in types) or "?",
            ", ".join("%s %s" % b for b in buffers) or "?"))
        if repacked:
            out.append("    CPU_REPACK: %s (its gemv/gemm kernels, batch 1 and batches)"
                       % ", ".join("%d tensors repacked with %s" % (n, k) for k, n in repacked.items()))
        if any(b[0].startswith("AMX") for b in buffers):
            out.append("    AMX buffer: its tensors on AMX tiles (AMX_INT8 = %s)" % feats.get("AMX_INT8", "?"))
        if declined:
            out.append("    not repacked: '%s' (%s) and %s other tensors stay in plain CPU buffers"
                       % (declined.group(1), declined.group(2), declined.group(3)))
        # The weight matrices in plain CPU buffers: the whole GGUF's type, or (repacked GGUFs)
        # the type of the first tensor the repack buffer declined, the tied embedding/lm_head.
        plain = (declined.group(2) if declined and repacked else typ).lower()
        if plain == "bf16":
            out.append("    plain CPU bf16: batch 1 ggml_vec_dot_bf16 (%s); batches of 2+ rows %s"
                       % ("AVX512_BF16 dot products" if bf16dot else "no AVX512_BF16: widened to f32",
                          "llamafile tinyBLAS BF16 (LLAMAFILE = 1)" if llamafile else "ggml_vec_dot_bf16 (LLAMAFILE off)"))
        elif plain in ("q4_0", "q8_0") and (declined or not repacked):
            out.append("    plain CPU %s: batch 1 ggml_vec_dot_%s against Q8_0 activations; batches of 2+ rows %s"
                       % (plain, plain,
                          "llamafile tinyBLAS_Q0_AVX (LLAMAFILE = 1)" if llamafile else "the same vec_dot (LLAMAFILE off)"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--models", required=True)
    a = ap.parse_args()
    lines = ["", "Kernel paths"] + cpu_lines(a.work)
    for m in a.models.split():
        lines.append("shardlm, qwen2.5-%s (SHARDLM_KERNEL_REPORT of round 1; rows = tokens per matmul call):" % m)
        lines += shard_lines(a.work, m) or ["  (no kernel reports)"]
        lines.append("llama.cpp, qwen2.5-%s:" % m)
        lines += llama_lines(a.work, m) or ["  (no load logs)"]
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
