"""A tiny independent byte-level BPE (GPT-2 / Qwen2 style) over a tokenizer.json.

Enough to check the synthetic tokenizer: encode ASCII/Latin text (the Qwen2
pre-tokenizer regex with \\p{L} -> [^\\W\\d_] and \\p{N} -> \\d, which Python's
re lacks), decode ids back to text. Special tokens are matched first.
"""
import json
import re


# The Qwen2 pre-tokenizer, and the same for Python's re (no \p{..}):
# \p{L} -> [^\W\d_], \p{N} -> \d, "not letter/digit" -> (?:[^\w]|_).
QWEN2_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_REGEX_PY = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class ByteLevelBPE:
    def __init__(self, tokenizer_json_path):
        with open(tokenizer_json_path, encoding="utf-8") as f:
            t = json.load(f)
        self.json = t
        self.vocab = dict(t["model"]["vocab"])
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in t["model"]["merges"]]
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.special = {a["content"]: a["id"] for a in t["added_tokens"]}
        self.id_to_token = {i: s for s, i in self.vocab.items()}
        self.id_to_token.update({i: s for s, i in self.special.items()})
        pattern = None
        for p in t["pre_tokenizer"]["pretokenizers"]:
            if p["type"] == "Split":
                pattern = p["pattern"]["Regex"]
        if pattern != QWEN2_REGEX:
            raise ValueError(f"pre-tokenizer regex is not Qwen2's: {pattern!r}")
        self.regex = re.compile(QWEN2_REGEX_PY)
        self.b2u = bytes_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}

    def bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            best = min(((self.ranks.get((parts[i], parts[i + 1]), 1 << 30), i) for i in range(len(parts) - 1)))
            if best[0] == 1 << 30:
                break
            i = best[1]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return parts

    def encode(self, text):
        ids = []
        if self.special:
            chunks = re.split("(" + "|".join(re.escape(s) for s in self.special) + ")", text)
        else:
            chunks = [text]
        for chunk in chunks:
            if chunk in self.special:
                ids.append(self.special[chunk])
                continue
            for piece in self.regex.findall(chunk):
                mapped = "".join(self.b2u[b] for b in piece.encode("utf-8"))
                ids.extend(self.vocab[p] for p in self.bpe(mapped))
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            s = self.id_to_token[i]
            if s in self.special:
                out += s.encode("utf-8")
            else:
                out += bytes(self.u2b[c] for c in s)
        return out.decode("utf-8", errors="replace")
