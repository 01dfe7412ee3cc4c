#!/usr/bin/python3
"""The longer hostile-input campaign of issue 21, against a real `shardlm serve`.

  bench/hostile_campaign.py --cli build/src/cli/shardlm [--rounds 2] [--rss-growth-mib 32]

CI runs the fast suite (tests/server/hostile_input_test.cpp and friends);
this runs each class of attack on a live server process, several rounds,
and after every case checks what the issue's "done when" asks:
  - the server is alive and answers a normal request correctly;
  - the case's work has stopped once its client left: vllm:num_requests_running
    is back to 0 (the time it took is printed; over 1 s is a failure);
  - the server's RSS, after the last round, is within --rss-growth-mib of
    its baseline after the first round (warm-up: caches, thread stacks).
Prints a table; exits 1 when a check fails. Needs only Python's standard
library. Timing figures are printed, never compared with another machine's.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
from load_streams import free_port, get, metric, wait_healthy  # noqa: E402
from soak import rss_kib  # noqa: E402


def raw(port, data, *, half_close=False, read=True, timeout=30.0, leave_after=None):
    """Sends bytes on a new connection; returns what came back until close (or `leave_after` s)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before we finished: read the answer
        if half_close:
            s.shutdown(socket.SHUT_WR)
        if leave_after is not None:
            time.sleep(leave_after)
            return b""
        out = b""
        while read:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def request(path, body, *, content_type="application/json", extra=""):
    body = body if isinstance(body, bytes) else body.encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nConnection: close\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def chat(**fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    body.update(fields)
    return json.dumps(body)


def status_of(answer):
    """The final status of a raw answer (after any 1xx), or 0."""
    for line in answer.split(b"\r\n"):
        if line.startswith(b"HTTP/1.1 ") and not line.startswith(b"HTTP/1.1 1"):
            return int(line[9:12])
    return 0


def expect(status):
    def check(answer):
        got = status_of(answer)
        return got == status, f"status {got}, expected {status}"
    return check


def cases():
    deep = "[" * 100_000 + "]" * 100_000
    many_keys = "{" + ",".join(f'"k{i}":{i}' for i in range(80_000)) + "}"
    yield "crash: JSON 100k deep in max_tokens", request("/v1/chat/completions", chat()[:-1] + f',"x":{deep}}}'), expect(400)
    yield "crash: JSON 100k deep in a json_schema", request(
        "/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": "S"}})
        .replace('"S"', deep)), expect(400)
    yield "crash: regex of 50k nested groups", request("/v1/chat/completions", chat(guided_regex="(" * 50_000 + ")" * 50_000)), expect(400)
    yield "crash: regex a then 100k stars", request("/v1/chat/completions", chat(guided_regex="a" + "*" * 100_000)), expect(400)
    yield "crash: /tokenize body 100k deep", request("/tokenize", deep), expect(400)
    yield "work: 80k distinct keys", request("/v1/chat/completions", chat()[:-1] + f',"chat_template_kwargs":{many_keys}}}'), expect(400)
    yield "work: logit_bias of 500k entries", request(
        "/v1/chat/completions", chat()[:-1] + ',"logit_bias":{' + ",".join(f'"{i}":1' for i in range(500_000)) + "}}"), expect(400)
    yield "work: exploding regex, client leaves", ("leave", request("/v1/chat/completions", chat(guided_regex="^(.{1,50}){30,80}$"))), None
    yield "work: long decode, client leaves", ("leave", request("/v1/chat/completions", chat(max_tokens=400, ignore_eos=True))), None
    yield "memory: chunked body", (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                   + b"100000\r\n" + b"x" * (1 << 20)), expect(411)
    yield "memory: Content-Length 100 MiB", (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                             b"Content-Length: 104857600\r\n\r\n" + b"x" * (1 << 20)), expect(413)
    yield "memory: 8 MiB header line", b"GET /health HTTP/1.1\r\nX: " + b"a" * (8 << 20) + b"\r\n\r\n", expect(431)
    yield "wrong: 1e400", request("/v1/chat/completions", chat()[:-1] + ',"temperature":1e400}'), expect(400)
    yield "wrong: content part type 7", request("/v1/chat/completions", json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": [{"type": 7}]}]})), expect(400)
    yield "wrong: tools[0].type 7", request("/v1/chat/completions", chat(tools=[{"type": 7}])), expect(400)
    yield "wrong: add_special_tokens yes", request("/tokenize", json.dumps({"prompt": "a", "add_special_tokens": "yes"})), expect(400)
    yield "wrong: application/jsonp", request("/v1/chat/completions", chat(), content_type="application/jsonp"), expect(415)
    yield "conn: pipelined x3", b"".join(
        request("/v1/chat/completions", chat()).replace(b"Connection: close\r\n", b"") for _ in range(2)) + request(
        "/v1/chat/completions", chat()), lambda a: (a.count(b"HTTP/1.1 200") == 3, f"{a.count(b'HTTP/1.1 200')} of 3 answered")
    yield "conn: half-closed client", ("half", request("/v1/chat/completions", chat())), expect(200)
    yield "conn: 64 slow heads, then a normal request", ("slow", None), None
    yield "conn: 24 trickled 1 MiB bodies, then normal", ("slowbody", None), None


def run_case(port, name, data, check):
    if isinstance(data, tuple) and data[0] == "leave":
        raw(port, data[1], leave_after=0.3)
        return True, "client left after 0.3 s"
    if isinstance(data, tuple) and data[0] == "half":
        answer = raw(port, data[1], half_close=True)
        return check(answer)
    if isinstance(data, tuple) and data[0] == "slow":
        socks = []
        for _ in range(64):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        t0 = time.time()
        status = status_of(raw(port, request("/v1/chat/completions", chat())))
        took = time.time() - t0
        for s in socks:
            s.close()
        return status == 200, f"normal request {status} in {took:.2f} s beside 64 slow heads"
    if isinstance(data, tuple) and data[0] == "slowbody":
        # Three times --threads-http: each stops 100 bytes short of its body.
        body = chat().encode() + b" " * (1 << 20)
        whole = request("/v1/chat/completions", body)
        socks = []
        for _ in range(24):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(whole[:-100])
            socks.append(s)
        t0 = time.time()
        status = status_of(raw(port, request("/v1/chat/completions", chat())))
        took = time.time() - t0
        finished = 0
        for s in socks[:4]:  # a few finish their bodies and are answered
            s.sendall(whole[-100:])
            s.settimeout(30)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
            finished += status_of(answer) == 200
        for s in socks:
            s.close()
        return status == 200 and finished == 4, (f"normal request {status} in {took:.2f} s beside 24 trickled bodies; "
                                                f"{finished} of 4 finished bodies answered 200")
    return check(raw(port, data))


def healthy(port):
    status = status_of(raw(port, request("/v1/chat/completions", chat(max_tokens=2))))
    return status == 200


def work_stopped(port, limit_s=1.0):
    t0 = time.time()
    while True:
        running = metric(get(port, "/metrics")[1], "vllm:num_requests_running")
        if not running:
            return time.time() - t0
        if time.time() - t0 > limit_s * 10:
            return None
        time.sleep(0.02)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rss-growth-mib", type=float, default=32.0)
    a = ap.parse_args()
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    work = tempfile.mkdtemp(prefix="hostile.")
    model = os.path.join(work, "model")
    subprocess.run([a.cli, "make-model", "--like", "qwen2.5-7b", "--layers", "2", "--vocab", "512", "--hidden", "128",
                    "--heads", "4", "--kv-heads", "2", "--intermediate", "256", "--dtype", "f32", "--seed", "2",
                    "--out", model], check=True, stdout=subprocess.DEVNULL, env=env)
    port = free_port()
    log = open(os.path.join(work, "serve.log"), "w")
    proc = subprocess.Popen([a.cli, "serve", model, "--port", str(port), "--served-model-name", "m",
                             "--max-num-seqs", "8", "--max-model-len", "512", "--kv-cache-memory", "4MiB",
                             "--threads-http", "8"], stdout=log, stderr=subprocess.STDOUT, env=env)
    failures = 0
    try:
        wait_healthy(port, proc, deadline_s=120)
        baseline = None
        print(f"{'case':48} {'result':6} {'stop s':>7} {'RSS MiB':>8}  detail")
        for round_no in range(a.rounds):
            for name, data, check in cases():
                ok, detail = run_case(port, name, data, check)
                alive = proc.poll() is None
                stopped = work_stopped(port) if alive else None
                if alive and not healthy(port):
                    ok, detail = False, "the server no longer answers a normal request"
                if not alive:
                    ok, detail = False, f"the server died (exit {proc.returncode})"
                elif stopped is None or stopped > 1.0:
                    ok, detail = False, f"work still running {stopped} s after the client left; {detail}"
                rss = rss_kib(proc.pid) / 1024 if alive else -1
                failures += 0 if ok else 1
                print(f"{name[:48]:48} {'ok' if ok else 'FAIL':6} {stopped if stopped is not None else -1:7.2f} "
                      f"{rss:8.1f}  {detail}", flush=True)
                if not alive:
                    return 1
            rss = rss_kib(proc.pid) / 1024
            if round_no == 0:
                baseline = rss
            print(f"-- round {round_no + 1}: RSS {rss:.1f} MiB (baseline after round 1: {baseline:.1f} MiB)")
        growth = rss_kib(proc.pid) / 1024 - baseline
        if growth > a.rss_growth_mib:
            failures += 1
            print(f"FAIL: RSS grew {growth:.1f} MiB over the rounds after the first (allowed {a.rss_growth_mib})")
        else:
            print(f"RSS back to its baseline: {growth:+.1f} MiB after {a.rounds - 1} more rounds")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
