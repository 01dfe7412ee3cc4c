#!/usr/bin/python3
"""The table of bench/llama_cpp_compare.sh: medians of its rounds, ratios, targets.

    /usr/bin/python3 bench/llama_cpp_table.py RESULTS.tsv WORK_DIR --threads T --rounds R --models "0.5b 1.5b"

RESULTS.tsv holds one "key<TAB>value" line per measurement (a key repeats once per round); every
figure printed is the median over the rounds, and every ratio is a ratio of those medians.
Targets are issue 28's (CPU speed on every x86 server), with the issue each comes from where it is
an earlier one's (#10, the BF16 CPU engine; #14, quantized decode); "met?" only reads them off,
nothing here fails on timing. Issue 28 counts 16 streams as decode tokens/s: llama-batched-bench's
S_TG against serve's 16 ÷ median TPOT, and "serve at 16 streams ≥ 6× its own batch 1" as that rate
over batch-1 decode; the output rate with prefill included is printed beside it.
"""
import argparse
import json
import os
import statistics
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("work")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--serve", type=int, default=1)
    a = ap.parse_args()

    vals, text = {}, {}
    for line in open(a.results):
        key, _, value = line.rstrip("\n").partition("\t")
        try:
            vals.setdefault(key, []).append(float(value))
        except ValueError:
            text[key] = value

    def med(key):
        v = vals.get(key)
        return statistics.median(v) if v else None

    bw = med("bw.read")  # bytes/s
    fma = med("fma")  # flop/s
    rows = []  # (metric, llama, shardlm, ratio, target, met)

    def fmt(x, unit=""):
        if x is None:
            return "n/a"
        if unit == "%":
            return "%.0f%%" % (100 * x)
        return "%.1f" % x if x >= 10 else "%.2f" % x

    def row(metric, ll, sh, target="", met=None, ratio=None, unit=""):
        own = ratio is not None  # a ratio of shardlm's own figures: no llama.cpp column
        if ratio is None and ll and sh:
            ratio = sh / ll
        rows.append((metric, "—" if own and ll is None else fmt(ll, unit), fmt(sh, unit), "" if ratio is None else "%.2f×" % ratio, target,
                     "" if met is None else ("yes" if met else "no")))

    for m in a.models.split():
        cfg = json.load(open(os.path.join(a.work, "qwen2.5-" + m, "bf16", "config.json")))
        h, inter, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
        nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = cfg.get("head_dim") or h // nh
        # flops per prompt token at pp512: 2 per weight of every decoder matrix, plus causal
        # attention (QK^T and PV: 2 x 2 x heads x head_dim per cached position, 256.5 on average).
        lin = L * (h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * inter)
        flops_tok = 2 * lin + L * 4 * nh * hd * (512 + 1) / 2

        tag = "Qwen2.5-%s" % m.upper()
        ll_tg, sh_tg = med(m + ".llama.tg"), med(m + ".shard.dec.1")
        row("%s decode batch 1 (tg64), tok/s" % tag, ll_tg, sh_tg, "≥ 1.15×",
            (sh_tg / ll_tg >= 1.15) if ll_tg and sh_tg else None)
        ll_b, sh_b = med(m + ".llama.tg.bytes"), med(m + ".shard.dec.1.bytes")
        ll_share = ll_tg / (bw / ll_b) if ll_tg and bw and ll_b else None
        sh_share = sh_tg / (bw / sh_b) if sh_tg and bw and sh_b else None
        row("%s decode share of roofline (%.0f / %.0f MB per token)" % (tag, (ll_b or 0) / 1e6, (sh_b or 0) / 1e6),
            ll_share, sh_share, "≥ 85% (shardlm)", (sh_share >= 0.85) if sh_share else None, unit="%")
        ll_pp, sh_pp = med(m + ".llama.pp"), med(m + ".shard.pp")
        row("%s prefill pp512, tok/s" % tag, ll_pp, sh_pp, "≥ 1.1×",
            (sh_pp / ll_pp >= 1.1) if ll_pp and sh_pp else None)
        ll_f = ll_pp * flops_tok / fma if ll_pp and fma else None
        sh_f = sh_pp * flops_tok / fma if sh_pp and fma else None
        row("%s pp512 share of f32 FMA peak (%.2f GFLOP per token)" % (tag, flops_tok / 1e9), ll_f, sh_f,
            "≥ 75% (#10)", (sh_f >= 0.75) if sh_f else None, unit="%")
        if m != "0.5b":
            continue
        for n in (4, 16):
            lb, sb = med("%s.llama.batched.%d" % (m, n)), med("%s.shard.batched.%d" % (m, n))
            # Issue 28's "16 streams ≥ 1.3× llama.cpp's S_TG": decode steps against decode steps.
            row("%s %d streams, decode tok/s (in process, context 128; vs S_TG)" % (tag, n), lb, sb,
                "≥ 1.3×" if n == 16 else "", ((sb / lb >= 1.3) if lb and sb else None) if n == 16 else None)
        ll16, sv16 = med(m + ".llama.batched.16"), med(m + ".shard.serve16")
        if a.serve:
            # Like with like: llama-batched-bench's output tokens/s over the same 16 × (128 prompt + 64
            # output) workload, prefill included, as shardlm bench's output tok/s includes it.
            lsv = med(m + ".llama.serve16")
            row("%s 16 streams via shardlm serve, output tok/s incl. prefill (npp 128, ntg 64)" % tag, lsv, sv16)
            st = med(m + ".shard.serve16.tpot")
            row("%s 16 streams via shardlm serve, 16 ÷ median TPOT (vs S_TG)" % tag, ll16, st, "≥ 1.3×",
                (st / ll16 >= 1.3) if st and ll16 else None)
            row("%s serve 16 streams (16 ÷ median TPOT) ÷ shardlm's own batch 1" % tag, None, st, "≥ 6×",
                (st / sh_tg >= 6) if st and sh_tg else None, ratio=(st / sh_tg) if st and sh_tg else None)
            # Without the prefill of late arrivals that a TPOT can hold (llama_cpp_compare.sh).
            si = med(m + ".shard.serve16.itl")
            row("%s serve 16 streams (16 ÷ median ITL) ÷ shardlm's own batch 1" % tag, None, si,
                ratio=(si / sh_tg) if si and sh_tg else None)
            row("%s serve 16 streams (output tok/s incl. prefill) ÷ shardlm's own batch 1" % tag, None, sv16,
                ratio=(sv16 / sh_tg) if sv16 and sh_tg else None)
        tp2 = med(m + ".shard.tp2.1")
        # per-token time TP=2 ÷ TP=1 = TP=1 tok/s ÷ TP=2 tok/s
        row("%s TP=2 as threads, tok/s (ratio: time per token vs TP=1)" % tag, None, tp2, "≤ 1.10×",
            (sh_tg / tp2 <= 1.10) if tp2 and sh_tg else None, ratio=(sh_tg / tp2) if tp2 and sh_tg else None)
        for ll_key, sh_key, ll_name, sh_name, target in (("q4_0", "awq", "Q4_0", "AWQ-4bit", 2.5),
                                                         ("q8_0", "int8", "Q8_0", "GPTQ-int8", 1.6),
                                                         ("q8_0", "int8lm", "Q8_0", "GPTQ-int8 + lm_head", 1.6)):
            lq, sq = med("%s.llama.%s" % (m, ll_key)), med("%s.shard.%s.1" % (m, sh_key))
            row("%s batch 1, llama.cpp %s vs shardlm %s, tok/s" % (tag, ll_name, sh_name), lq, sq, "≥ 1×",
                (sq >= lq) if lq and sq else None)
            lb, sb = med("%s.llama.%s.bytes" % (m, ll_key)), med("%s.shard.%s.1.bytes" % (m, sh_key))
            ls = lq / (bw / lb) if lq and bw and lb else None
            ss = sq / (bw / sb) if sq and bw and sb else None
            row("%s %s / %s share of roofline (%.0f / %.0f MB per token)" % (tag, ll_name, sh_name, (lb or 0) / 1e6,
                                                                            (sb or 0) / 1e6), ls, ss, unit="%")
            row("%s shardlm %s ÷ shardlm BF16, batch 1" % (tag, sh_name), None, sq, "≥ %.1f× (#14)" % target,
                (sq / sh_tg >= target) if sq and sh_tg else None, ratio=(sq / sh_tg) if sq and sh_tg else None)

    head = ("metric", "llama.cpp", "shardlm", "ratio", "target", "met?")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(6)]
    print()
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    print()
    print("Medians of %d interleaved round(s), %d threads each side; ratio = shardlm ÷ llama.cpp unless the metric "
          "says otherwise." % (a.rounds, a.threads))
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print("CPU: %s, %d logical cores." % (cpu, os.cpu_count()))
    print("Machine, same rounds: read bandwidth %s GB/s, f32 FMA peak %s GFLOP/s (bench/machine_peak)." %
          (fmt(bw / 1e9 if bw else None), fmt(fma / 1e9 if fma else None)))
    loads = sorted(k for k in vals if k.startswith("load."))
    if loads:
        print("1-minute load average at the start of each round: %s (other processes share these cores)." %
              ", ".join("%.1f" % vals[k][0] for k in loads))
    for m in a.models.split():
        if "agree." + m in text:
            print("Greedy tokens, Qwen2.5-%s BF16, prompt 1,17,300,42,5,99,260,7: %s." % (m.upper(), text["agree." + m]))


if __name__ == "__main__":
    sys.exit(main())
