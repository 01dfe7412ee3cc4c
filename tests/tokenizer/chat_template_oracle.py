#!/usr/bin/python3
"""Reference renderer for chat_template_test: Debian's python3-jinja2 configured the
way transformers' _compile_jinja_template does (sandbox, trim_blocks, lstrip_blocks,
loopcontrols, its own tojson / raise_exception / strftime_now). Shares no code with
the C++ interpreter.

usage: chat_template_oracle.py CASES.json  ->  JSON list on stdout, one entry per case:
  {"ok": "<rendered text>"} or {"error": "<ExceptionType>: <message>"}
CASES.json: [{"template": str, "context": {...}, "now": unix seconds or null}, ...]
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_env(now):
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return (datetime.fromtimestamp(now) if now is not None else datetime.now()).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    results = []
    envs = {}
    compiled = {}
    for case in cases:
        try:
            now = case.get("now")
            if now not in envs:
                envs[now] = make_env(now)
            key = (now, case["template"])
            if key not in compiled:
                compiled[key] = envs[now].from_string(case["template"])
            out = compiled[key].render(**case["context"])
            results.append({"ok": out})
        except Exception as e:  # every failure is a result to compare, not a crash
            results.append({"error": f"{type(e).__name__}: {e}"})
    sys.stdout.write(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
