#!/usr/bin/env python3
"""Soak: mixed load against `shardlm serve` for --seconds (loopback only,
bounded in time): streaming and not, clients that hang up mid-request,
prompts sharing a prefix, n > 1. Every request that is not cancelled must
complete; afterwards the KV cache is empty and nothing runs or waits, the
server's RSS at the end is within a bound of its RSS after warm-up, the log
holds no sanitizer report, and the server exits 0 on SIGTERM. Built to run
under ASan (scripts/test.sh's second pass runs the 60 s version).

  soak.py --cli build/src/cli/shardlm --seconds 60
"""
import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load_streams import free_port, get, metric, wait_healthy  # noqa: E402


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


async def request(port, body, cancel_after=None):
    """Returns 'ok', 'cancelled' or an error string."""
    raw = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n").encode()
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout=10)
    try:
        writer.write(head + raw)
        await writer.drain()
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            return "cancelled"  # hang up (finally closes), whatever was sent
        data = await asyncio.wait_for(reader.read(), timeout=120)
    finally:
        writer.close()
    text = data.decode(errors="replace")
    status = text.split("\r\n", 1)[0]
    if " 200 " not in status:
        return f"{status}: {text[-300:]}"
    payload = text.split("\r\n\r\n", 1)[1] if "\r\n\r\n" in text else ""
    if body.get("stream"):
        if "data: [DONE]" not in payload:
            return "stream without [DONE]"
        if '"error"' in payload:
            return "stream carried an error: " + payload[-300:]
        return "ok"
    if "chunked" in text.split("\r\n\r\n", 1)[0].lower():
        return "ok"  # not expected for JSON; accept
    obj = json.loads(payload)
    if len(obj.get("choices", [])) != body.get("n", 1):
        return f"expected {body.get('n', 1)} choices: {payload[:300]}"
    return "ok"


async def worker(port, rng, stop_at, counts, errors, prefix):
    while time.time() < stop_at:
        kind = rng.choice(["stream", "plain", "cancel_stream", "cancel_plain", "prefix", "n2"])
        prompt = [rng.randrange(3, 500) for _ in range(rng.randrange(4, 24))]
        body = {"model": "m", "prompt": prompt, "max_tokens": rng.randrange(1, 24), "temperature": 0.7,
                "seed": rng.randrange(1 << 30), "ignore_eos": True}
        cancel = None
        if kind in ("stream", "cancel_stream"):
            body["stream"] = True
        if kind == "prefix":
            body["prompt"] = prefix + prompt[:4]
        if kind == "n2":
            body["n"] = 2
        if kind.startswith("cancel"):
            body["max_tokens"] = 200
            cancel = rng.uniform(0.0, 0.3)
        try:
            r = await request(port, body, cancel)
        except Exception as e:
            r = f"{type(e).__name__}: {e}"
        counts[kind] = counts.get(kind, 0) + 1
        if r not in ("ok", "cancelled"):
            errors.append(f"{kind}: {r}")


async def run(port, seconds, concurrency, seed):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 500) for _ in range(48)]  # three full blocks of 16
    counts, errors = {}, []
    stop_at = time.time() + seconds
    await asyncio.gather(*(worker(port, random.Random(seed + i), stop_at, counts, errors, prefix)
                           for i in range(concurrency)))
    return counts, errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rss-growth-mib", type=float, default=48.0,
                    help="allowed RSS growth from after warm-up (a quarter of the run) to the end")
    a = ap.parse_args()
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    # Under ASan, freed memory sits in a quarantine of 256 MiB by default:
    # bound it so a steady state is reached within the run.
    asan = env.get("ASAN_OPTIONS", "")
    env["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "quarantine_size_mb=16"
    work = tempfile.mkdtemp(prefix="soak.")
    proc = None
    try:
        model = os.path.join(work, "model")
        subprocess.run([a.cli, "make-model", "--like", "qwen2.5-7b", "--layers", "2", "--vocab", "512", "--hidden", "128",
                        "--heads", "4", "--kv-heads", "2", "--intermediate", "256", "--dtype", "f32", "--seed", "2",
                        "--out", model], check=True, stdout=subprocess.DEVNULL, env=env)
        port = free_port()
        log_path = os.path.join(work, "serve.log")
        log = open(log_path, "w")
        proc = subprocess.Popen([a.cli, "serve", model, "--port", str(port), "--served-model-name", "m",
                                 "--max-num-seqs", "16", "--max-model-len", "512", "--kv-cache-memory", "4MiB"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_healthy(port, proc, deadline_s=180)
        rss = {}

        async def sample_rss():
            await asyncio.sleep(a.seconds / 4)
            rss["warm"] = rss_kib(proc.pid)

        async def both():
            return (await asyncio.gather(run(port, a.seconds, a.concurrency, a.seed), sample_rss()))[0]

        t0 = time.time()
        counts, errors = asyncio.run(both())
        wall = time.time() - t0
        # Cancelled requests end at the engine's next turn.
        idle, deadline = None, time.time() + 10
        while time.time() < deadline:
            text = get(port, "/metrics")[1]
            idle = (metric(text, "vllm:num_requests_running"), metric(text, "vllm:num_requests_waiting"),
                    metric(text, "vllm:kv_cache_usage_perc"))
            if idle == (0.0, 0.0, 0.0):
                break
            time.sleep(0.1)
        rss["end"] = rss_kib(proc.pid)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        log.close()
        log_text = open(log_path).read()
        growth_mib = (rss["end"] - rss["warm"]) / 1024
        figures = {"seconds": round(wall, 1), "requests": sum(counts.values()), "by_kind": counts, "errors": len(errors),
                   "idle_after": idle, "rss_warm_mib": round(rss["warm"] / 1024, 1),
                   "rss_end_mib": round(rss["end"] / 1024, 1), "rss_growth_mib": round(growth_mib, 1), "exit": rc}
        print(json.dumps(figures))
        problems = []
        if errors:
            problems.append(f"{len(errors)} requests failed, e.g. {errors[:3]}")
        if idle != (0.0, 0.0, 0.0):
            problems.append(f"not idle after the load (running, waiting, KV usage) = {idle}")
        if growth_mib > a.rss_growth_mib:
            problems.append(f"RSS grew {growth_mib:.1f} MiB after warm-up (allowed {a.rss_growth_mib})")
        if rc != 0:
            problems.append(f"serve exited {rc} on SIGTERM")
        for needle in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "WARNING: ThreadSanitizer"):
            if needle in log_text:
                problems.append(f"the server log holds '{needle}'")
        if problems:
            for p in problems:
                print("FAIL:", p, file=sys.stderr)
            print(log_text[-4000:], file=sys.stderr)
            return 1
        print("soak: OK")
        return 0
    finally:
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
