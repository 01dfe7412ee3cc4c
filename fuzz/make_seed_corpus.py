#!/usr/bin/python3
"""Writes the seed corpus for fuzz_safetensors_header: small valid files
(valid-*) and broken ones (invalid-*). Crashers found by fuzzing are added
by hand as crash-* (they must simply not crash)."""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors_header")


def image(header, data=b"", pad=True):
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def tensors(*specs):
    """specs: (name, dtype, shape, nbytes) laid out back to back."""
    header, offset = {}, 0
    for name, dtype, shape, nbytes in specs:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    return header, bytes(range(256)) * (offset // 256) + bytes(range(offset % 256))


def write(name, blob):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(blob)


os.makedirs(OUT, exist_ok=True)
h, d = tensors(("a", "F32", [2, 3], 24), ("b", "BF16", [4], 8), ("c", "F16", [2, 2], 8))
write("valid-three-tensors", image(h, d))
h2 = dict(h)
h2["__metadata__"] = {"format": "pt"}
write("valid-metadata", image(h2, d))
h, d = tensors(("model.embed_tokens.weight", "BF16", [8, 4], 64), ("scalar", "F32", [], 4),
               ("empty", "F32", [0, 4], 0))
write("valid-scalar-and-empty", image(h, d))

h, d = tensors(("a", "F32", [2, 3], 24), ("b", "BF16", [4], 8))
full = image(h, d)
write("invalid-truncated", full[:-5])
write("invalid-short", full[:5])
write("invalid-header-length", b"\xff" * 8 + full[8:])
write("invalid-json", full[:12] + b"\x00" + full[13:])
write("invalid-array", image([1, 2, 3]))
write("invalid-unknown-dtype", image({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8))
write("invalid-i64", image({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8))
write("invalid-negative-shape", image({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8))
write("invalid-offsets", image({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8))
write("invalid-byte-count", image({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8))
write("invalid-overlap", image({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12))
write("invalid-huge-shape", image({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16],
                                         "data_offsets": [0, 8]}}, b"\0" * 8))
write("invalid-duplicate", image(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                 b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', b"\0" * 8))
