#!/usr/bin/env python3
"""N concurrent streaming clients against `shardlm serve --max-num-seqs S` on
a tiny synthetic model (loopback only, bounded in time), directly or through
`shardlm router` in front of two replicas. Every connection must be accepted,
get 200 and end with `data: [DONE]`; /metrics must never show more than S
running per replica, and must show the rest waiting. Prints the figures:
connections held, peak RSS of each process, TTFT p50/p99, wall time.

Each stream's fate is one of: done (200 and [DONE]); refused (an HTTP
status other than 200: the server said why); silent (the request was sent
and the server closed with no status line: always a server bug); cut (200,
then the stream ended before [DONE]); unfinished (sent, and not done when
the test's time ran out); and the client's own failures, which say
nothing about the server: could not connect or could not send. The client runs at a raised priority where it may
(root: nice -10), so that a machine kept busy starves the server, not the
instrument that measures it.

  load_streams.py --cli build/src/cli/shardlm [--connections 1000] [--router]
"""
import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path, timeout=2.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_healthy(port, proc, deadline_s=90):
    t0 = time.time()
    while time.time() - t0 < deadline_s:
        if proc.poll() is not None:
            raise SystemExit(f"FAIL: process on port {port} exited with {proc.returncode} during start-up")
        try:
            if get(port, "/health")[0] == 200:
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"FAIL: port {port} not healthy after {deadline_s} s")


def peak_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def metric(text, name):
    """Sum of a gauge over its label sets (one per replica)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None


def per_replica(text, name):
    return [float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{") or l.startswith(name + " ")]


class MetricsWatch(threading.Thread):
    def __init__(self, ports):
        super().__init__(daemon=True)
        self.ports, self.stop, self.max_running, self.max_waiting, self.samples = ports, False, 0.0, 0.0, 0

    def run(self):
        while not self.stop:
            for p in self.ports:
                try:
                    text = get(p, "/metrics")[1]
                except Exception:
                    continue
                run = per_replica(text, "vllm:num_requests_running")
                wait = metric(text, "vllm:num_requests_waiting") or 0.0
                if run:
                    self.max_running = max(self.max_running, max(run))
                self.max_waiting = max(self.max_waiting, wait)
                self.samples += 1
            time.sleep(0.05)


async def one_stream(port, i, out_len, deadline):
    body = json.dumps({"model": "m", "prompt": [3 + i % 200, 17, 41, 230, 9, 77, 5, 12], "max_tokens": out_len,
                       "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    t0 = time.perf_counter()
    r = {"ok": False, "ttft": None, "error": None, "chunks": 0, "fate": "client_connect"}
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port),
                                                timeout=max(0.1, deadline - time.time()))
        r["fate"] = "client_send"
        writer.write(head + body)
        await asyncio.wait_for(writer.drain(), timeout=max(0.1, deadline - time.time()))
        r["fate"] = "unfinished"  # until the server says something
        status = await asyncio.wait_for(reader.readline(), timeout=max(0.1, deadline - time.time()))
        if not status:
            r["fate"], r["error"] = "silent", "the server closed the connection with no status line"
            writer.close()
            return r
        if b" 200 " not in status:
            rest = await reader.read(2000)
            r["fate"], r["error"] = "refused", (status + rest).decode(errors="replace")[:300]
            writer.close()
            return r
        r["fate"] = "unfinished"
        while True:
            line = await asyncio.wait_for(reader.readline(), timeout=max(0.1, deadline - time.time()))
            if not line:
                r["fate"] = "cut"
                r["error"] = r["error"] or "connection closed before [DONE]"
                break
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    r["ok"] = r["error"] is None and r["chunks"] > 0
                    r["fate"] = "done" if r["ok"] else "cut"
                    break
                obj = json.loads(payload)
                if "error" in obj:
                    r["error"] = obj["error"].get("message", "error")
                    continue
                if r["ttft"] is None and obj.get("choices") and obj["choices"][0].get("text", "") != "":
                    r["ttft"] = time.perf_counter() - t0
                r["chunks"] += 1
        writer.close()
    except (ConnectionResetError, BrokenPipeError) as e:
        # A reset after the request was sent is the server's doing; before, the client's.
        if r["fate"] == "unfinished":
            r["fate"] = "silent"
        r["error"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # refused connect, timeout
        r["error"] = f"{type(e).__name__}: {e}"
    return r


async def run_clients(port, n, out_len, timeout_s):
    deadline = time.time() + timeout_s
    return await asyncio.gather(*(one_stream(port, i, out_len, deadline) for i in range(n)))


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, int(round(q / 100.0 * (len(xs) - 1)))))
    return xs[k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--router", action="store_true", help="two replicas behind shardlm router")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds for the whole load")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * a.connections + 256)), hard))
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    work = tempfile.mkdtemp(prefix="load_streams.")
    procs = []
    try:
        model = os.path.join(work, "model")
        subprocess.run([a.cli, "make-model", "--like", "qwen2.5-7b", "--layers", "2", "--vocab", "512", "--hidden", "128",
                        "--heads", "4", "--kv-heads", "2", "--intermediate", "256", "--dtype", "f32", "--seed", "1",
                        "--out", model], check=True, stdout=subprocess.DEVNULL)
        n_replicas = 2 if a.router else 1
        serve_ports = [free_port() for _ in range(n_replicas)]
        for p in serve_ports:
            log = open(os.path.join(work, f"serve.{p}.log"), "w")
            procs.append(subprocess.Popen([a.cli, "serve", model, "--port", str(p), "--served-model-name", "m",
                                           "--max-num-seqs", str(a.max_num_seqs), "--max-model-len", "256",
                                           "--kv-cache-memory", "16MiB",
                                           "--max-pending-requests", str(a.connections + 64)],
                                          stdout=log, stderr=subprocess.STDOUT, env=env))
        for p, proc in zip(serve_ports, procs):
            wait_healthy(p, proc)
        port = serve_ports[0]
        if a.router:
            port = free_port()
            log = open(os.path.join(work, "router.log"), "w")
            cmd = [a.cli, "router", "--port", str(port), "--health-interval-ms", "500"]
            for p in serve_ports:
                cmd += ["--backend", f"http://127.0.0.1:{p}"]
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
            wait_healthy(port, procs[-1])

        try:
            os.nice(-10)  # the servers were started above, at normal priority
        except OSError:
            pass
        watch = MetricsWatch(serve_ports)
        watch.start()
        t0 = time.time()
        results = asyncio.run(run_clients(port, a.connections, a.output_len, a.timeout))
        wall = time.time() - t0
        time.sleep(0.2)
        watch.stop = True
        watch.join()
        # After the load: nothing running, every KV block back.
        idle = []
        for p in serve_ports:
            text = get(p, "/metrics")[1]
            idle.append((metric(text, "vllm:num_requests_running"), metric(text, "vllm:kv_cache_usage_perc")))

        ok = [r for r in results if r["ok"]]
        errors = [r["error"] for r in results if not r["ok"]]
        fates = {}
        for r in results:
            fates[r["fate"]] = fates.get(r["fate"], 0) + 1
        ttfts = [r["ttft"] for r in ok if r["ttft"] is not None]
        figures = {
            "mode": "router + 2 replicas" if a.router else "serve",
            "connections": a.connections, "completed_with_done": len(ok), "failed": len(errors),
            "fates": fates,
            "max_num_seqs": a.max_num_seqs, "max_running_per_replica_seen": watch.max_running,
            "max_waiting_seen": watch.max_waiting, "metrics_samples": watch.samples,
            "ttft_p50_s": round(pct(ttfts, 50), 4), "ttft_p99_s": round(pct(ttfts, 99), 4), "wall_s": round(wall, 2),
            "peak_rss_mib": {("router" if a.router and i == len(procs) - 1 else f"serve{i}"): round(peak_rss_kib(pr.pid) / 1024, 1)
                             for i, pr in enumerate(procs)},
            "idle_after": idle,
        }
        print(json.dumps(figures))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(figures, f)
        problems = []
        server_side = {k: v for k, v in fates.items() if k in ("silent", "refused", "cut", "unfinished")}
        client_side = {k: v for k, v in fates.items() if k.startswith("client_")}
        if server_side:
            problems.append(f"the server failed {sum(server_side.values())} of {a.connections} streams {server_side}, "
                            f"e.g. {[r['error'] for r in results if r['fate'] in server_side][:3]}")
        if client_side:
            problems.append(f"the client failed {sum(client_side.values())} of {a.connections} streams on its own side "
                            f"{client_side} (the machine starved the load generator), "
                            f"e.g. {[r['error'] for r in results if r['fate'] in client_side][:3]}")
        if watch.max_running > a.max_num_seqs:
            problems.append(f"/metrics showed {watch.max_running} running > --max-num-seqs {a.max_num_seqs}")
        if a.connections > a.max_num_seqs * n_replicas and watch.max_waiting <= 0:
            problems.append("/metrics never showed a waiting request, though the clients outnumber the slots")
        for running, usage in idle:
            if running != 0 or usage != 0:
                problems.append(f"after the load: {running} running, KV usage {usage} (expected 0 and 0)")
        for proc in procs:
            if proc.poll() is not None:
                problems.append(f"a server exited during the load ({proc.returncode})")
        if problems:
            for p in problems:
                print("FAIL:", p, file=sys.stderr)
            for name in sorted(os.listdir(work)):
                if name.endswith(".log"):
                    print(f"--- {name} (tail)", file=sys.stderr)
                    print(open(os.path.join(work, name)).read()[-3000:], file=sys.stderr)
            return 1
        print("load_streams: OK")
        return 0
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
