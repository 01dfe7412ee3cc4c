#!/usr/bin/env python3
"""What speculative decoding buys on a real draft/target pair, at batch 1 on this CPU.

  python3 bench/speculative_demo.py [--cli build/src/cli/shardlm] [--rounds 3] [--max-tokens 128]

Target: models/shardlm-demo (8.9 M parameters); draft: models/shardlm-demo-draft (1.4 M, same
tokenizer and training corpus). For each prompt, `shardlm generate` greedy (temperature 0) runs
three ways, interleaved round by round (off, draft, ngram, off, draft, ngram, ...):
  off    plain decoding on the batch-invariant kernels (what speculation verifies against);
  draft  --speculative-config '{"model": DRAFT, "num_speculative_tokens": K}';
  ngram  --speculative-config '{"method": "ngram", "num_speculative_tokens": K, ...}'.
Prompts, in three categories: ordinary ones (three verse openings; three chat questions, whose
answers end at the model's EOS), and a copy-and-edit one: a held-out passage, then its first
verse again with one word changed, so that the continuation can copy the passage (what prompt
lookup is for).
Decode tok/s of a category = its generated tokens after the first / their decode seconds
(generate --json; the first token comes from the prefill), median over rounds; acceptance =
accepted / drafted tokens over all rounds. Every run's
tokens must equal the off run's (the guarantee); a difference is printed as an error.
It prints; it never fails on timing, and it is not part of CI.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def copy_edit_prompt(heldout):
    with open(heldout, encoding="utf-8") as f:
        lines = [l for l in f.read().split("\n") if l.strip()]
    passage = lines[2:8]  # six verses of the first held-out chapter
    first = passage[0].split(" ")
    first[3] = "came"  # one word changed ("went" in Genesis 13:1)
    return "\n".join(passage) + "\n\n" + " ".join(first) + "\n"


def run(cli, model, prompt_args, max_tokens, extra):
    cmd = [cli, "generate", model, *prompt_args, "--max-tokens", str(max_tokens), "--temperature", "0", "--json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {r.returncode}:\n{r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "src", "cli", "shardlm"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "shardlm-demo"))
    ap.add_argument("--draft", default=os.path.join(ROOT, "models", "shardlm-demo-draft"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("-k", type=int, default=4, help="num_speculative_tokens")
    a = ap.parse_args()

    categories = [
        ("verse openings", [["--prompt", p] for p in ("And the LORD spake unto Moses, saying,",
                                                       "Blessed is the man that walketh not",
                                                       "Now these are the generations of")]),
        ("chat questions", [["--chat", f"What does {ref} say?"] for ref in ("John 3:16", "Psalms 23:1", "Genesis 1:3")]),
        ("copy-and-edit", [["--prompt", copy_edit_prompt(os.path.join(a.model, "heldout.txt"))]]),
    ]
    modes = {
        "off": ["--batch-invariant"],
        "draft": ["--speculative-config", json.dumps({"model": a.draft, "num_speculative_tokens": a.k})],
        "ngram": ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": a.k,
                                                      "prompt_lookup_max": 4, "prompt_lookup_min": 2})],
    }
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; 1-minute load {os.getloadavg()[0]:.1f}")
    print(f"target {a.model}, draft {a.draft}; k = {a.k}, {a.max_tokens} tokens, {a.rounds} interleaved rounds\n")
    rows = []
    for name, prompts in categories:
        tps = {m: [] for m in modes}  # per round: the category's decoded tokens / its decode seconds
        acc = {m: [0, 0] for m in modes}
        tokens = {}  # prompt index -> the first run's tokens
        for _ in range(a.rounds):
            for mode, extra in modes.items():
                n_tokens, seconds = 0, 0.0
                for i, args in enumerate(prompts):
                    out = run(a.cli, a.model, args, a.max_tokens, extra)
                    n_tokens += max(len(out["token_ids"]) - 1, 0)
                    seconds += out["decode_seconds"]
                    if tokens.setdefault(i, out["token_ids"]) != out["token_ids"]:
                        print(f"error: {name} #{i}, {mode}: tokens differ from the plain run's", file=sys.stderr)
                    if "speculative" in out:
                        acc[mode][0] += out["speculative"]["num_accepted_tokens"]
                        acc[mode][1] += out["speculative"]["num_draft_tokens"]
                tps[mode].append(n_tokens / seconds if seconds > 0 else 0.0)
        med = {m: statistics.median(v) for m, v in tps.items()}
        rows.append((name, sum(len(t) for t in tokens.values()), med, acc))

    print("| prompts | tokens | off tok/s | draft model tok/s | speed-up | accepted | n-gram tok/s | speed-up | accepted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, n, med, acc in rows:
        def rate(m):
            return f"{100.0 * acc[m][0] / acc[m][1]:.0f}%" if acc[m][1] else "no drafts"
        print(f"| {name} | {n} | {med['off']:.1f} | {med['draft']:.1f} | {med['draft'] / med['off']:.2f}× | {rate('draft')} "
              f"| {med['ngram']:.1f} | {med['ngram'] / med['off']:.2f}× | {rate('ngram')} |")


if __name__ == "__main__":
    main()
