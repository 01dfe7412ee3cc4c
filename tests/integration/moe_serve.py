#!/usr/bin/python3
"""`shardlm serve` on mixture-of-experts checkpoints, as a user runs it.

For a Qwen3-MoE checkpoint (128 experts, top-8, Qwen3-30B-A3B's routing) and
a Mixtral one (8 experts, top-2), each layout answers a chat request
(/v1/chat/completions, greedy) with the text of -tp 1:
  --tp 2 --enable-expert-parallel, --tp 3 (experts split like a dense MLP),
  --tp 2 --pp 2 --enable-expert-parallel, --dp 2 --tp 2 --enable-expert-parallel,
  and mpirun -np 2 serve --tp 2 --enable-expert-parallel;
its start-up log says each rank allocated what plan predicted, and a dense
model with --enable-expert-parallel is refused naming the flag.

usage: moe_serve.py --cli PATH --work DIR [--mpirun PATH]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

FAILURES = []


def check(ok, what):
    if not ok:
        FAILURES.append(what)
        print("FAIL:", what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(cmd_prefix, cli, model, flags, log_path):
    port = free_port()
    cmd = cmd_prefix + [cli, "serve", model, "--port", str(port), "--kv-cache-memory", "16MiB",
                        "--served-model-name", "moe"] + flags
    log = open(log_path, "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if p.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return p, port
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.1)
    stop(p)
    return None, port


def stop(p):
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode


def chat(port, content):
    body = {"model": "moe", "messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        j = json.loads(r.read())
    return j["choices"][0]["message"]["content"], j["usage"]["completion_tokens"]


def read(path):
    with open(path) as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    models = {
        "qwen3_moe": ["--like", "qwen3-30b-a3b", "--layers", "2", "--vocab", "512", "--hidden", "256", "--heads", "32",
                      "--kv-heads", "4", "--head-dim", "32", "--moe-intermediate", "64", "--seed", "3"],
        "mixtral": ["--like", "mixtral-8x7b", "--layers", "2", "--vocab", "512", "--hidden", "256", "--heads", "32",
                    "--kv-heads", "8", "--head-dim", "16", "--intermediate", "128", "--seed", "5"],
    }
    layouts = [["--tp", "2", "--enable-expert-parallel"], ["--tp", "3"],
               ["--tp", "2", "--pp", "2", "--enable-expert-parallel"],
               ["--dp", "2", "--tp", "2", "--enable-expert-parallel"]]
    prompts = ["Hello there", "Name three colours"]
    for name, args in models.items():
        model = os.path.join(a.work, name)
        r = subprocess.run([a.cli, "make-model", "--out", model] + args, capture_output=True, text=True)
        check(r.returncode == 0, f"make-model {name}: {r.stderr}")
        p, port = serve([], a.cli, model, [], os.path.join(a.work, f"{name}_tp1.log"))
        check(p is not None, f"{name} -tp 1 did not start: {read(os.path.join(a.work, f'{name}_tp1.log'))}")
        if p is None:
            continue
        try:
            expected = [chat(port, q) for q in prompts]
        finally:
            stop(p)
        check(all(n == 12 for _, n in expected), f"{name} tp1 completion lengths {expected}")
        runs = [([], l) for l in layouts]
        if a.mpirun:
            runs.append(([a.mpirun, "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader", "-np", "2"],
                         ["--tp", "2", "--enable-expert-parallel"]))
        for prefix, flags in runs:
            tag = ("mpirun " if prefix else "") + " ".join(flags)
            log = os.path.join(a.work, f"{name}_{len(FAILURES)}_{abs(hash(tag))}.log")
            p, port = serve(prefix, a.cli, model, flags, log)
            check(p is not None, f"{name} {tag} did not start: {read(log)}")
            if p is None:
                continue
            try:
                got = [chat(port, q) for q in prompts]
            finally:
                rc = stop(p)
            check(got == expected, f"{name} {tag}: {got} != tp1 {expected}")
            text = read(log)
            check("(as planned)" in text and "DIFFERS" not in text, f"{name} {tag}: allocation vs plan:\n{text}")
            if "--enable-expert-parallel" in flags:
                check("EP=2" in text, f"{name} {tag}: the log does not name EP=2:\n{text}")
            print(f"ok: {name} {tag} -> {got[0][0]!r} (exit {rc})")
    # A dense model refuses the flag, naming it.
    dense = os.path.join(a.work, "dense")
    subprocess.run([a.cli, "make-model", "--out", dense, "--like", "qwen3-0.6b", "--layers", "1", "--vocab", "300"],
                   capture_output=True, check=True)
    r = subprocess.run([a.cli, "serve", dense, "--port", str(free_port()), "--tp", "2", "--enable-expert-parallel"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "--enable-expert-parallel" in r.stderr and "dense" in r.stderr,
          f"dense + --enable-expert-parallel: rc {r.returncode}, {r.stderr}")
    print(f"{len(FAILURES)} failure(s)")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
