#!/usr/bin/python3
"""ctest driver for the demo models (models/shardlm-demo, and its draft
models/shardlm-demo-draft): no torch needed.

  check_demo_model.py --cli PATH --source DIR CHECK

CHECK:
  tokenizer   shardlm's tokenizer encodes heldout.txt exactly as the trainer's
              encoder (tools/demo_model/bpe.py) does, and decodes it back.
  golden      `shardlm generate` greedy tokens equal the training script's
              PyTorch forward (golden.json); first-step logits within
              max|diff| <= 1e-4 * max(1, max|logit|) (the golden logits carry 5 decimals).
  reference   the independent numpy reference (tests/reference/reference.py,
              float64) gives the golden tokens too, and shardlm's logits agree
              with it within 1e-4 * max(1, max|logit|).
  layouts     TP 1..6 x PP 1..2 give the TP1 greedy tokens.
  english     `shardlm generate --prompt "Once upon a time"` with no MODEL
              uses the demo model and continues with English words (at least
              80% of them occur in the held-out chapters).
  perplexity  `shardlm perplexity` on the first 1024 held-out tokens equals the
              numpy reference's perplexity (relative 1e-4), and is well below
              the unigram perplexity of metrics.json.
  serve       `shardlm serve` without MODEL serves the demo model as
              "shardlm-demo" and answers a chat request (labelled integration).
  install     `cmake --install --prefix TMP` installs shardlm and both models, and
              TMP/bin/shardlm generate without MODEL uses TMP/share/shardlm/... .
  speculative with the small model (models/shardlm-demo-draft) as a draft, and with
              n-gram lookup, at TP 1 and TP 3 (uneven heads), the greedy tokens equal
              plain batch-invariant decoding;
              the draft's proposals are accepted; its measured weight bytes equal its
              checkpoint's tensor bytes.
MODEL is SOURCE/models/shardlm-demo unless --model names another (the draft's
own checks pass --model SOURCE/models/shardlm-demo-draft).
"""
import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile

import numpy as np


def run(cmd, what):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {what} exited {r.returncode}\n$ {shlex.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r


def generate(cli, model, ids, n, extra=(), logits_path=None):
    cmd = [cli, "generate"] + ([model] if model else []) + [
        "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(n), "--temperature", "0", "--json"] + list(extra)
    if logits_path:
        cmd += ["--dump-logits", logits_path]
    return json.loads(run(cmd, "shardlm generate").stdout)


def truncate_at_eos(tokens, eos):
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def eos_ids(model):
    with open(os.path.join(model, "generation_config.json")) as f:
        g = json.load(f)
    e = g["eos_token_id"]
    return set(e if isinstance(e, list) else [e])


def check_tokenizer(a, model):
    sys.path.insert(0, os.path.join(a.source, "tools", "demo_model"))
    import bpe
    enc = bpe.Encoder.from_tokenizer_json(os.path.join(model, "tokenizer.json"))
    path = os.path.join(model, "heldout.txt")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    want = enc.encode(text)
    got = json.loads(run([a.cli, "tokenize", model, "--file", path, "--json", "--no-special"], "shardlm tokenize").stdout)["ids"]
    if got != want:
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        sys.exit(f"FAIL: shardlm and bpe.py differ at token {i} of {len(want)}: shardlm {got[i:i+8]} bpe.py {want[i:i+8]}\n"
                 f"text there: {enc.decode(want[max(0, i-4):i+8])!r}")
    if enc.decode(want) != text:
        sys.exit("FAIL: bpe.py does not decode the held-out ids back to the text")
    back = ""
    for k in range(0, len(got), 2000):  # an argument is at most 128 KiB
        chunk = ",".join(map(str, got[k : k + 2000]))
        back += json.loads(run([a.cli, "detokenize", model, "--ids", chunk, "--json"], "shardlm detokenize").stdout)["text"]
    if back != text:
        sys.exit("FAIL: shardlm detokenize does not give the held-out text back")
    print(f"ok: {len(got)} held-out tokens identical ({len(text)} bytes)")


def load_golden(model):
    with open(os.path.join(model, "golden.json")) as f:
        return json.load(f)


def check_golden(a, model):
    g = load_golden(model)
    eos = eos_ids(model)
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for case in g["cases"]:
            want = truncate_at_eos(case["token_ids"], eos)
            path = os.path.join(tmp, "logits.f32")
            out = generate(a.cli, model, case["prompt_token_ids"], g["max_tokens"], logits_path=path)
            if out["token_ids"] != want:
                sys.exit(f"FAIL: {case['prompt']!r}: shardlm {out['token_ids']} != PyTorch {want}")
            ours = np.fromfile(path, dtype="<f4").astype(np.float64)
            ref = np.asarray(case["first_step_logits"], dtype=np.float64)
            diff = float(np.abs(ours - ref).max())
            bound = 1e-4 * max(1.0, float(np.abs(ref).max()))
            worst = max(worst, diff / bound)
            if diff > bound:
                sys.exit(f"FAIL: {case['prompt']!r}: max |logit diff| {diff:.3g} > {bound:.3g}")
            print(f"ok: {case['prompt'][-40:]!r}: {len(want)} tokens identical, max |logit diff| {diff:.2e} (bound {bound:.2e})")


def check_reference(a, model):
    g = load_golden(model)
    eos = eos_ids(model)
    ref_py = os.path.join(a.source, "tests", "reference", "reference.py")
    with tempfile.TemporaryDirectory() as tmp:
        for case in g["cases"]:
            want = truncate_at_eos(case["token_ids"], eos)
            rpath, opath = os.path.join(tmp, "ref.f32"), os.path.join(tmp, "ours.f32")
            ids = ",".join(map(str, case["prompt_token_ids"]))
            ref = json.loads(run([sys.executable, ref_py, model, "--prompt-ids", ids, "--max-tokens", str(g["max_tokens"]),
                                  "--dump-logits", rpath], "reference.py").stdout)
            if ref["token_ids"] != want:
                sys.exit(f"FAIL: {case['prompt']!r}: numpy reference {ref['token_ids']} != PyTorch {want}")
            out = generate(a.cli, model, case["prompt_token_ids"], g["max_tokens"], logits_path=opath)
            if out["token_ids"] != ref["token_ids"]:
                sys.exit(f"FAIL: {case['prompt']!r}: shardlm {out['token_ids']} != numpy reference {ref['token_ids']}")
            r = np.fromfile(rpath, dtype="<f4").astype(np.float64)
            o = np.fromfile(opath, dtype="<f4").astype(np.float64)
            diff, bound = float(np.abs(o - r).max()), 1e-4 * max(1.0, float(np.abs(r).max()))
            if diff > bound:
                sys.exit(f"FAIL: {case['prompt']!r}: shardlm vs numpy max |logit diff| {diff:.3g} > {bound:.3g}")
            print(f"ok: {case['prompt'][-40:]!r}: PyTorch = numpy = shardlm, max |logit diff| {diff:.2e} (bound {bound:.2e})")


def check_layouts(a, model):
    case = load_golden(model)["cases"][0]
    base = None
    for pp in (1, 2):
        for tp in range(1, 7):
            out = generate(a.cli, model, case["prompt_token_ids"], 24, ["--tp", str(tp), "--pp", str(pp)])
            if base is None:
                base = out["token_ids"]
            elif out["token_ids"] != base:
                sys.exit(f"FAIL: TP={tp} PP={pp} gives {out['token_ids']}, TP=1 PP=1 gives {base}")
            print(f"ok: TP={tp} PP={pp}: {len(base)} tokens as TP1")


def check_english(a, model):
    r = run([a.cli, "generate", "--prompt", "Once upon a time", "--max-tokens", "32", "--temperature", "0", "--json"],
            "shardlm generate (no MODEL)")
    if "using the demo model" not in r.stderr:
        sys.exit(f"FAIL: generate without MODEL did not say it uses the demo model:\n{r.stderr}")
    text = json.loads(r.stdout)["text"]
    with open(os.path.join(model, "heldout.txt"), encoding="utf-8") as f:
        known = set(re.findall(r"[a-z]+", f.read().lower()))
    words = re.findall(r"[A-Za-z]+", text)
    hits = [w for w in words if w.lower() in known]
    print(f"text: {text!r}\n{len(hits)} of {len(words)} words are English words of the corpus")
    if len(words) < 5 or len(hits) < 0.8 * len(words):
        sys.exit("FAIL: the continuation is not mostly English words")


def check_perplexity(a, model):
    sys.path.insert(0, os.path.join(a.source, "tests", "reference"))
    import reference
    sys.path.insert(0, os.path.join(a.source, "tools", "demo_model"))
    import bpe
    enc = bpe.Encoder.from_tokenizer_json(os.path.join(model, "tokenizer.json"))
    with open(os.path.join(model, "heldout.txt"), encoding="utf-8") as f:
        ids = enc.encode(f.read())
    n, ctx = 1024, 512
    m = reference.Model(model)
    nll, scored = 0.0, 0
    for s in range(0, n, ctx):
        w = ids[s : s + ctx + 1]
        # Each window starts from an empty cache (forward appends to it).
        m.k_cache = [np.zeros((m.n_kv, 0, m.head_dim)) for _ in range(m.n_layers)]
        m.v_cache = [np.zeros((m.n_kv, 0, m.head_dim)) for _ in range(m.n_layers)]
        logits = m.forward(w[:-1], 0)
        mx = logits.max(axis=1, keepdims=True)
        logp = logits - mx - np.log(np.exp(logits - mx).sum(axis=1, keepdims=True))
        nll -= float(logp[np.arange(len(w) - 1), w[1:]].sum())
        scored += len(w) - 1
    want = math.exp(nll / scored)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(enc.decode(ids))  # the whole file; --max-tokens scores the first n
        path = f.name
    try:
        out = json.loads(run([a.cli, "perplexity", model, path, "--max-tokens", str(n), "--context", str(ctx), "--json"],
                             "shardlm perplexity").stdout)
    finally:
        os.unlink(path)
    got = out["perplexity"]
    print(f"shardlm perplexity {got:.6f} over {out['scored']} tokens; numpy reference {want:.6f}")
    if out["scored"] != scored or abs(got - want) > 1e-4 * want:
        sys.exit("FAIL: shardlm perplexity differs from the reference")
    with open(os.path.join(model, "metrics.json")) as f:
        uni = json.load(f)["unigram_test_perplexity"]
    if not got < 0.5 * uni:
        sys.exit(f"FAIL: perplexity {got:.1f} is not well below the unigram model's {uni:.1f}")
    print(f"ok: perplexity {got:.2f} vs unigram {uni:.2f}")
    # Bad input: a clear message and exit status 1, never a crash.
    with tempfile.TemporaryDirectory() as tmp:
        empty = os.path.join(tmp, "empty.txt")
        open(empty, "w").close()
        for args, says in (([model, os.path.join(tmp, "missing.txt")], "cannot read FILE"),
                           ([model, empty], "it needs at least 2"),
                           ([model, os.path.join(model, "heldout.txt"), "--context", "513"], "--context 513 is outside [1, 512]")):
            r = subprocess.run([a.cli, "perplexity"] + args, capture_output=True, text=True)
            if r.returncode != 1 or says not in r.stderr:
                sys.exit(f"FAIL: perplexity {args}: exit {r.returncode}, stderr {r.stderr!r}; expected 1 and {says!r}")
    print("ok: a missing file, an empty file and a too-long context are refused with the reason")


def check_install(a, model):
    if not a.build:
        sys.exit("FAIL: the install check needs --build DIR")
    with tempfile.TemporaryDirectory() as prefix:
        run(["cmake", "--install", a.build, "--prefix", prefix], "cmake --install")
        cli = os.path.join(prefix, "bin", "shardlm")
        installed = os.path.join(prefix, "share", "shardlm", "models", "shardlm-demo")
        for d in (installed, installed + "-draft"):
            for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
                if not os.path.isfile(os.path.join(d, f)):
                    sys.exit(f"FAIL: cmake --install did not install {d}/{f}")
        # From another directory, the installed binary finds the installed model (not the source tree's).
        r = subprocess.run([cli, "generate", "--prompt", "In the beginning", "--max-tokens", "8", "--temperature", "0", "--json"],
                           capture_output=True, text=True, cwd=prefix)
        if r.returncode != 0 or f"using the demo model {installed}" not in r.stderr:
            sys.exit(f"FAIL: the installed shardlm did not use {installed}:\n{r.stdout}\n{r.stderr}")
        print(f"ok: installed under {prefix}: {json.loads(r.stdout)['text']!r}")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_prompt_logprobs(a, model, base):
    """prompt_logprobs and echo with logprobs over HTTP against the numpy
    reference's log_softmax at every prompt position: each prompt token's
    logprob, its rank (vLLM's: tokens at least as likely) and the top 3."""
    import urllib.request
    sys.path.insert(0, os.path.join(a.source, "tests", "reference"))
    import reference

    def post(path, body):
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=60).read())

    ids = post("/tokenize", {"prompt": "In the beginning God created the heaven and the earth. And the earth was"})["tokens"]
    out = post("/v1/completions", {"model": "shardlm-demo", "prompt": ids, "max_tokens": 1, "temperature": 0,
                                   "prompt_logprobs": 3, "echo": True, "logprobs": 2})
    choice = out["choices"][0]
    got, legacy = choice["prompt_logprobs"], choice["logprobs"]
    logits = reference.Model(model).forward(ids, 0)  # [n, vocab] float64
    logp = logits - logits.max(axis=1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
    if len(got) != len(ids) or got[0] is not None or legacy["token_logprobs"][0] is not None:
        sys.exit(f"FAIL: prompt_logprobs of {len(ids)} tokens: {json.dumps(got)[:300]}")
    # generate's logit bound (check_reference), twice: a logprob is a logit minus a log-sum-exp.
    tol = 2e-4 * max(1.0, float(np.abs(logits).max()))
    worst = 0.0
    for i in range(1, len(ids)):
        row, tok = logp[i - 1], ids[i]
        entry = got[i]
        first_key = next(iter(entry))
        mine = entry[str(tok)]
        worst = max(worst, abs(mine["logprob"] - row[tok]))
        if first_key != str(tok) or abs(mine["logprob"] - row[tok]) > tol:
            sys.exit(f"FAIL: prompt token {i} ({tok}): {entry} vs reference logprob {row[tok]:.6f}")
        if abs(legacy["token_logprobs"][i] - mine["logprob"]) > 1e-6:
            sys.exit(f"FAIL: echo logprob {legacy['token_logprobs'][i]} != prompt_logprobs {mine['logprob']} at {i}")
        # Ranks and the top 3 where the reference's gaps are wider than the tolerance.
        gaps = np.abs(row - row[tok])
        gaps[tok] = np.inf
        if gaps.min() > 2 * tol and mine["rank"] != int((row >= row[tok]).sum()):
            sys.exit(f"FAIL: prompt token {i}: rank {mine['rank']} vs reference {int((row >= row[tok]).sum())}")
        order = np.argsort(-row, kind="stable")[:4]
        if all(row[order[j]] - row[order[j + 1]] > 2 * tol for j in range(3)):
            want = [int(x) for x in order[:3]]
            ranked = sorted({int(k): v["rank"] for k, v in entry.items()}.items(), key=lambda kv: kv[1])
            if [k for k, r in ranked if r <= 3][:3] != want:
                sys.exit(f"FAIL: prompt token {i}: top 3 {ranked} vs reference {want}")
    print(f"ok: prompt_logprobs of {len(ids)} tokens = numpy reference (max |logprob diff| {worst:.2e}, "
          f"bound {tol:.2e}); echo agrees")


def check_serve(a, model):
    import signal
    import time
    import urllib.error
    import urllib.request
    port = free_port()
    log = tempfile.TemporaryFile("w+")
    # An f32 KV cache (serve's default is the weights' bf16), so that the prompt logprobs can be held
    # to the float64 reference within generate's bound, as check_reference does (generate: f32 on cpu).
    server = subprocess.Popen([a.cli, "serve", "--port", str(port), "--kv-cache-memory", "16MiB", "--kv-cache-dtype", "f32"],
                              stdout=log, stderr=log)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=2).read()
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if server.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    sys.exit(f"FAIL: shardlm serve (no MODEL) did not come up:\n{log.read()}")
                time.sleep(0.3)
        models = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=10).read())
        if [m["id"] for m in models["data"]] != ["shardlm-demo"]:
            sys.exit(f"FAIL: /v1/models lists {models}, expected the demo model as 'shardlm-demo'")
        body = json.dumps({"model": "shardlm-demo", "messages": [{"role": "user", "content": "What does John 3:16 say?"}],
                           "max_tokens": 48, "temperature": 0}).encode()
        req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=60).read())
        text = out["choices"][0]["message"]["content"]
        if not re.search(r"[A-Za-z]{2,}", text):
            sys.exit(f"FAIL: the demo model answered {text!r}")
        print(f"ok: shardlm serve without MODEL answers as shardlm-demo: {text!r}")
        check_prompt_logprobs(a, model, base)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def safetensors_tensor_bytes(model):
    total = 0
    for name in os.listdir(model):
        if name.endswith(".safetensors"):
            with open(os.path.join(model, name), "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


def check_speculative(a, model):
    draft = os.path.join(a.source, "models", "shardlm-demo-draft")
    methods = {"draft model": {"model": draft, "num_speculative_tokens": 4},
               "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}}
    n = 48
    totals = {m: [0, 0] for m in methods}  # accepted, drafted
    # TP 3 splits the target's 8 query / 4 KV heads unevenly; the draft runs whole beside the driver.
    cases = [(case, layout) for case in load_golden(model)["cases"] for layout in ([], ["--tp", "3"])]
    for case, layout in cases:
        ids = case["prompt_token_ids"]
        plain = generate(a.cli, model, ids, n, ["--batch-invariant"] + layout)["token_ids"]
        for method, cfg in methods.items():
            out = generate(a.cli, model, ids, n, ["--speculative-config", json.dumps(cfg)] + layout)
            if out["token_ids"] != plain:
                sys.exit(f"FAIL: {case['prompt'][-40:]!r} {' '.join(layout) or 'TP 1'} with {method} speculation: "
                         f"{out['token_ids']} != plain {plain}")
            s = out["speculative"]
            totals[method][0] += s["num_accepted_tokens"]
            totals[method][1] += s["num_draft_tokens"]
            if method == "draft model" and s["draft_weight_bytes"] != safetensors_tensor_bytes(draft):
                sys.exit(f"FAIL: the draft's measured weight bytes {s['draft_weight_bytes']} != its checkpoint's "
                         f"{safetensors_tensor_bytes(draft)}")
        print(f"ok: {case['prompt'][-40:]!r} {' '.join(layout) or 'TP 1'}: {len(plain)} tokens, "
              "the same with the draft model and with n-gram")
    for method, (acc, drafted) in totals.items():
        print(f"{method}: {acc} of {drafted} drafted tokens accepted ({100.0 * acc / max(drafted, 1):.1f}%)")
    acc, drafted = totals["draft model"]
    if drafted == 0 or acc == 0:
        sys.exit("FAIL: the draft model's proposals were never accepted")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", default=None, help="the build directory (install check)")
    ap.add_argument("--model", default=None, help="default: SOURCE/models/shardlm-demo")
    ap.add_argument("check", choices=["tokenizer", "golden", "reference", "layouts", "english", "perplexity", "install", "serve",
                                          "speculative"])
    a = ap.parse_args()
    model = a.model or os.path.join(a.source, "models", "shardlm-demo")
    globals()["check_" + a.check](a, model)


if __name__ == "__main__":
    main()
