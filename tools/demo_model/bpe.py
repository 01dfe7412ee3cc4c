#!/usr/bin/python3
"""Byte-level BPE for the demo model: a trainer and the encoder that defines it.

The pre-tokenizer is the Qwen2 split regex (a Split step followed by
ByteLevel without its own regex), which shardlm's tokenizer implements.
Python's re has no \\p{..}; for the corpus (ASCII English) the translation
\\p{L} -> [^\\W\\d_], \\p{N} -> \\d is exact. train() refuses text with
non-ASCII characters, so the translation is never relied on where it could
differ.

Training: count the pre-tokens, start from the 256 byte symbols, and merge
the most frequent adjacent pair (ties: the smallest pair in string order)
until the vocabulary has the requested size. Pair counts are updated
incrementally: only the words that contain the merged pair are re-counted.
Encoding applies the merges by rank (lowest first, leftmost on ties), as the
Hugging Face BPE model does.
"""
import collections
import json
import re

QWEN2_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_REGEX_PY = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def bytes_to_unicode():
    """GPT-2's map: printable bytes stand for themselves, the rest for 256, 257, ..."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, {b: chr(c) for b, c in zip(bs, cs)}


BYTE_ORDER, B2U = bytes_to_unicode()
U2B = {u: b for b, u in B2U.items()}
_PRETOKENIZE = re.compile(QWEN2_REGEX_PY)


def pretokenize(text):
    return [ "".join(B2U[b] for b in piece.encode("utf-8")) for piece in _PRETOKENIZE.findall(text)]


def train(text, vocab_size):
    """-> (tokens: list[str] in id order, merges: list[(a, b)]), specials excluded."""
    bad = sorted({c for c in text if ord(c) > 127})
    if bad:
        raise ValueError(f"training text has non-ASCII characters {bad[:10]}: the regex translation is exact only for ASCII")
    n_merges = vocab_size - len(SPECIAL_TOKENS) - 256
    if n_merges < 0:
        raise ValueError(f"vocab_size {vocab_size} is below 256 bytes + {len(SPECIAL_TOKENS)} specials")
    counts = collections.Counter(pretokenize(text))
    words = [list(w) for w in counts]          # word index -> symbols
    freq = [counts[w] for w in counts]         # word index -> count
    pairs = collections.Counter()              # (a, b) -> weighted count
    where = collections.defaultdict(set)       # (a, b) -> word indices holding it
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freq[i]
            where[(a, b)].add(i)
    tokens = [B2U[b] for b in BYTE_ORDER]
    known = set(tokens)
    merges = []
    while len(merges) < n_merges and pairs:
        best_count = max(pairs.values())
        if best_count <= 0:
            break
        best = min(p for p, c in pairs.items() if c == best_count)
        a, b = best
        merges.append(best)
        if a + b not in known:
            known.add(a + b)
            tokens.append(a + b)
        for i in list(where[best]):
            w = words[i]
            for x, y in zip(w, w[1:]):
                pairs[(x, y)] -= freq[i]
                if pairs[(x, y)] == 0:
                    del pairs[(x, y)]
                where[(x, y)].discard(i)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for x, y in zip(out, out[1:]):
                pairs[(x, y)] += freq[i]
                where[(x, y)].add(i)
        where.pop(best, None)
    return tokens, merges


class Encoder:
    def __init__(self, tokens, merges):
        self.vocab = {t: i for i, t in enumerate(tokens)}
        n = len(tokens)
        self.special = {s: n + k for k, s in enumerate(SPECIAL_TOKENS)}
        self.id_to_token = tokens + SPECIAL_TOKENS
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.cache = {}
        self.split_special = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")

    @classmethod
    def from_tokenizer_json(cls, path):
        with open(path, encoding="utf-8") as f:
            t = json.load(f)
        vocab = t["model"]["vocab"]
        tokens = [None] * len(vocab)
        for s, i in vocab.items():
            tokens[i] = s
        merges = [tuple(m.split(" ")) for m in t["model"]["merges"]]
        return cls(tokens, merges)

    @property
    def n_vocab(self):
        return len(self.id_to_token)

    def bpe(self, word):
        got = self.cache.get(word)
        if got is not None:
            return got
        parts = list(word)
        while len(parts) > 1:
            rank, i = min((self.ranks.get((parts[k], parts[k + 1]), 1 << 30), k) for k in range(len(parts) - 1))
            if rank == 1 << 30:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        ids = [self.vocab[p] for p in parts]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        ids = []
        for chunk in self.split_special.split(text):
            if chunk in self.special:
                ids.append(self.special[chunk])
            elif chunk:
                for piece in pretokenize(chunk):
                    ids.extend(self.bpe(piece))
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            s = self.id_to_token[i]
            out += s.encode("utf-8") if s in self.special else bytes(U2B[c] for c in s)
        return out.decode("utf-8", errors="replace")


def tokenizer_json(tokens, merges):
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    n = len(tokens)
    added = [{"id": n + k, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for k, s in enumerate(SPECIAL_TOKENS)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [a + " " + b for a, b in merges]},
    }


def tokenizer_config_json(n_tokens, model_max_length):
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(n_tokens + k): {"content": s, "lstrip": False, "normalized": False,
                                                     "rstrip": False, "single_word": False, "special": True}
                                 for k, s in enumerate(SPECIAL_TOKENS)},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
