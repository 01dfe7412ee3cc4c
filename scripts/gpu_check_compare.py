#!/usr/bin/env python3
"""Float comparisons for scripts/gpu-check.sh (the bare device image has
python3, not always numpy). Logit files: f32 little-endian [vocab], as
`shardlm generate --dump-logits` writes them.

  logits CPU DEV TOL      max |cpu - dev| <= TOL x max |cpu|
  tie CPU_FILE A B TOL    tokens A and B are within TOL x max |cpu| of the top
                          logit (a near-tie: the GPU's bf16 rounding may pick either)
Prints one line; exits 1 when the check fails, 2 on bad input.
"""
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if not data or len(data) % 4:
        sys.exit(f"{path}: {len(data)} bytes, not a list of f32 logits")
    return struct.unpack(f"<{len(data) // 4}f", data)


def main(argv):
    if len(argv) == 5 and argv[1] == "logits":
        cpu, dev, tol = read(argv[2]), read(argv[3]), float(argv[4])
        if len(cpu) != len(dev):
            print(f"vocab {len(cpu)} on the CPU, {len(dev)} on the device")
            return 1
        scale = max(abs(x) for x in cpu) or 1.0
        worst = max(range(len(cpu)), key=lambda i: abs(cpu[i] - dev[i]))
        rel = abs(cpu[worst] - dev[worst]) / scale
        line = f"logits within {100 * rel:.2f}% of max |logit| (token {worst}: {cpu[worst]:.4f} vs {dev[worst]:.4f})"
        print(line if rel <= tol else line + f": over {100 * tol:.1f}%")
        return 0 if rel <= tol else 1
    if len(argv) == 6 and argv[1] == "tie":
        cpu, tol = read(argv[2]), float(argv[5])
        try:
            a, b = int(argv[3]), int(argv[4])
        except ValueError:
            print(f"token ids '{argv[3]}', '{argv[4]}' are not numbers (one run ended early)")
            return 1
        if not (0 <= a < len(cpu) and 0 <= b < len(cpu)):
            print(f"token {a} or {b} outside the vocabulary of {len(cpu)}")
            return 1
        scale = max(abs(x) for x in cpu) or 1.0
        top = max(cpu)
        gap = max(top - cpu[a], top - cpu[b]) / scale
        print(f"tokens {a} and {b} are {100 * gap:.3f}% of max |logit| below the top")
        return 0 if gap <= tol else 1
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
