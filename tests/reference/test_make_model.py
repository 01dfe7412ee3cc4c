#!/usr/bin/python3
"""Checks `shardlm make-model` output with code independent of shardlm:
headers parsed with struct+json, the tensor inventory derived here from
config.json, shard index consistency, determinism per seed, tokenizer files
(structure + a tiny Python byte-level BPE round trip), and usage errors."""
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bpe import ByteLevelBPE  # noqa: E402

FAILURES = []
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL:", msg)


def make(cli, out, *args, expect_rc=0):
    r = subprocess.run([cli, "make-model", "--out", out, *args], capture_output=True, text=True)
    check(r.returncode == expect_rc, f"make-model {args}: exit {r.returncode}, expected {expect_rc}\n{r.stdout}{r.stderr}")
    return r


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
    size = os.path.getsize(path)
    check(n % 8 == 0, f"{path}: header length {n} not a multiple of 8")
    check(raw.rstrip(b" ") == raw.rstrip(b" ").rstrip() and raw.decode().rstrip(" ").endswith("}"), f"{path}: header padding is not spaces")
    header = json.loads(raw)
    check(header.get("__metadata__") == {"format": "pt"}, f"{path}: __metadata__ is {header.get('__metadata__')}")
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in tensors.items())
    pos = 0
    for b, e, k in spans:
        check(b == pos, f"{path}: tensor {k} starts at {b}, expected {pos} (no gaps)")
        numel = 1
        for d in tensors[k]["shape"]:
            numel *= d
        check(e - b == numel * DTYPE_BYTES[tensors[k]["dtype"]], f"{path}: tensor {k} byte count")
        pos = e
    check(8 + n + pos == size, f"{path}: file size {size} != 8 + {n} + {pos}")
    # Header keys in data order, as the safetensors library writes them.
    order = [k for k in json.loads(raw, object_pairs_hook=lambda p: [x[0] for x in p]) if k != "__metadata__"]
    check(order == [k for _, _, k in spans], f"{path}: header entries are not in data order")
    return tensors


def add_tensor(path, name, n):
    """Rewrites a safetensors file with one more F32 tensor [n] of zeros at the end of its data."""
    with open(path, "rb") as f:
        data = f.read()
    (hn,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + hn])
    body = data[8 + hn :]
    header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [len(body), len(body) + 4 * n]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + body + bytes(4 * n))


def expected_inventory(c):
    h, v = c["hidden_size"], c["vocab_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or h // nh
    inter = c["intermediate_size"]
    arch = c["architectures"][0]
    t = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    if not c.get("tie_word_embeddings"):
        t["lm_head.weight"] = [v, h]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = [h]
        t[p + "post_attention_layernorm.weight"] = [h]
        t[p + "self_attn.q_proj.weight"] = [nh * hd, h]
        t[p + "self_attn.k_proj.weight"] = [nkv * hd, h]
        t[p + "self_attn.v_proj.weight"] = [nkv * hd, h]
        t[p + "self_attn.o_proj.weight"] = [h, nh * hd]
        if arch == "Qwen2ForCausalLM":
            t[p + "self_attn.q_proj.bias"] = [nh * hd]
            t[p + "self_attn.k_proj.bias"] = [nkv * hd]
            t[p + "self_attn.v_proj.bias"] = [nkv * hd]
        if arch == "Qwen3ForCausalLM":
            t[p + "self_attn.q_norm.weight"] = [hd]
            t[p + "self_attn.k_norm.weight"] = [hd]
        t[p + "mlp.gate_proj.weight"] = [inter, h]
        t[p + "mlp.up_proj.weight"] = [inter, h]
        t[p + "mlp.down_proj.weight"] = [h, inter]
    return t


def all_tensors(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return read_header(os.path.join(d, "model.safetensors")), None
    with open(idx) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    tensors, total = {}, 0
    for fname in files:
        for k, v in read_header(os.path.join(d, fname)).items():
            check(k not in tensors, f"{k} stored in two shards")
            check(index["weight_map"].get(k) == fname, f"index maps {k} to {index['weight_map'].get(k)}, found in {fname}")
            tensors[k] = v
            total += v["data_offsets"][1] - v["data_offsets"][0]
    check(set(index["weight_map"]) == set(tensors), "index weight_map and shard contents differ")
    check(index["metadata"]["total_size"] == total, f"index total_size {index['metadata']['total_size']} != {total}")
    return tensors, files


def digest(d):
    h = hashlib.sha256()
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            h.update(name.encode() + f.read())
    return h.hexdigest()


def check_model(d, dtype, like_arch):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    check(c["architectures"] == [like_arch], f"{d}: architectures {c['architectures']}")
    tensors, _ = all_tensors(d)
    want = expected_inventory(c)
    check(set(tensors) == set(want), f"{d}: tensors differ: missing {set(want) - set(tensors)}, extra {set(tensors) - set(want)}")
    for k, shape in want.items():
        if k in tensors:
            check(tensors[k]["shape"] == shape, f"{d}: {k} shape {tensors[k]['shape']} != {shape}")
            check(tensors[k]["dtype"] == dtype, f"{d}: {k} dtype {tensors[k]['dtype']} != {dtype}")
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    w = a.work
    os.makedirs(w, exist_ok=True)

    # Inventory, dtypes and config for each family.
    make(a.cli, f"{w}/q2", "--like", "qwen2.5-0.5b", "--layers", "2", "--vocab", "400", "--dtype", "bf16")
    check_model(f"{w}/q2", "BF16", "Qwen2ForCausalLM")
    make(a.cli, f"{w}/q3", "--like", "qwen3-0.6b", "--layers", "3", "--vocab", "300", "--dtype", "f16", "--no-tie",
         "--hidden", "256", "--intermediate", "512", "--heads", "4", "--kv-heads", "2", "--head-dim", "64")
    c = check_model(f"{w}/q3", "F16", "Qwen3ForCausalLM")
    check(c["head_dim"] == 64 and c["num_hidden_layers"] == 3 and not c["tie_word_embeddings"], f"q3 config {c}")
    make(a.cli, f"{w}/ll", "--like", "llama-3.1-8b", "--layers", "1", "--vocab", "300", "--dtype", "f32",
         "--hidden", "256", "--intermediate", "512", "--heads", "8", "--kv-heads", "2", "--shards", "3")
    c = check_model(f"{w}/ll", "F32", "LlamaForCausalLM")
    check(c["rope_scaling"]["rope_type"] == "llama3", "llama rope_scaling kept")
    _, files = all_tensors(f"{w}/ll")
    check(files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)], f"shard files {files}")
    check(not os.path.exists(f"{w}/ll/model.safetensors"), "no stray model.safetensors next to shards")

    # Determinism per seed.
    make(a.cli, f"{w}/s1", "--like", "qwen2.5-0.5b", "--layers", "1", "--vocab", "300", "--seed", "11")
    make(a.cli, f"{w}/s1b", "--like", "qwen2.5-0.5b", "--layers", "1", "--vocab", "300", "--seed", "11")
    make(a.cli, f"{w}/s2", "--like", "qwen2.5-0.5b", "--layers", "1", "--vocab", "300", "--seed", "12")
    check(digest(f"{w}/s1") == digest(f"{w}/s1b"), "same seed gives different bytes")
    check(digest(f"{w}/s1") != digest(f"{w}/s2"), "different seeds give identical bytes")

    # Tokenizer: structure, eos wiring, BPE round trip.
    d = f"{w}/q2"
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    with open(f"{d}/generation_config.json") as f:
        gen = json.load(f)
    with open(f"{d}/tokenizer_config.json") as f:
        tcfg = json.load(f)
    tok = ByteLevelBPE(f"{d}/tokenizer.json")
    n_tok = len(tok.vocab) + len(tok.special)
    check(n_tok <= cfg["vocab_size"], f"tokenizer has {n_tok} ids > model vocab {cfg['vocab_size']}")
    check(sorted(tok.vocab.values()) == list(range(len(tok.vocab))), "model.vocab ids are not 0..n-1")
    check(sorted(tok.special.values()) == list(range(len(tok.vocab), n_tok)), "special tokens are not at the end")
    im_end = tok.special.get("<|im_end|>")
    eot = tok.special.get("<|endoftext|>")
    check(cfg["eos_token_id"] == im_end, f"config eos {cfg['eos_token_id']} != <|im_end|> {im_end}")
    check(gen["eos_token_id"] == [im_end, eot], f"generation_config eos {gen['eos_token_id']}")
    check(tcfg["eos_token"] == "<|im_end|>" and "<|im_start|>" in tcfg["chat_template"], "tokenizer_config eos/template")
    check(tok.json["normalizer"]["type"] == "NFC" and tok.json["decoder"]["type"] == "ByteLevel", "normalizer/decoder")
    check(all(tok.id_to_token[i] for i in range(256)), "256 byte tokens first")
    text = "<|im_start|>user\nThe model predicts the next token: def forward(self, x):\n    return x + 42 café!<|im_end|>"
    ids = tok.encode(text)
    check(tok.decode(ids) == text, f"BPE round trip: {tok.decode(ids)!r}")
    check(len(ids) < len(text.encode()) * 0.6, f"merges barely used: {len(ids)} ids for {len(text.encode())} bytes")
    check(ids[0] == tok.special["<|im_start|>"] and ids[-1] == im_end, "special tokens encode to their ids")
    # shardlm's own tokenizer (tokenizer layer) agrees with this independent BPE.
    texts = [text, "Hello world, this is a test of 12345 numbers.\n\n  Indented   spaces\tand tabs!",
             "for (int i = 0; i < n; ++i) { sum += w[i] * x[i]; }", "naïve café — déjà vu 😀 日本語"]
    has_tokenize = " tokenize" in subprocess.run([a.cli, "--help"], capture_output=True, text=True).stdout
    if not has_tokenize:
        print("NOTE: this build has no `shardlm tokenize` (tokenizer layer): tokenizer.json checked with the Python BPE only")
    for t in texts if has_tokenize else []:
        r = subprocess.run([a.cli, "tokenize", d, "--text", t, "--json"], capture_output=True, text=True)
        check(r.returncode == 0, f"shardlm tokenize exited {r.returncode}: {r.stderr}")
        if r.returncode == 0:
            theirs = json.loads(r.stdout)["ids"]
            mine = tok.encode(t)
            check(theirs == mine, f"shardlm tokenize {t!r}:\n  shardlm {theirs}\n  python  {mine}")
            r = subprocess.run([a.cli, "detokenize", d, "--ids", ",".join(map(str, theirs)), "--json"],
                               capture_output=True, text=True)
            check(r.returncode == 0 and json.loads(r.stdout)["text"] == t, f"shardlm detokenize round trip of {t!r}: {r.stdout}{r.stderr}")

    # The smallest vocab: no merges at all, still a working tokenizer.
    make(a.cli, f"{w}/tiny", "--like", "qwen2.5-0.5b", "--layers", "1", "--vocab", "259")
    tiny = ByteLevelBPE(f"{w}/tiny/tokenizer.json")
    check(len(tiny.ranks) == 0 and tiny.decode(tiny.encode("hello")) == "hello", "vocab 259 tokenizer")

    # A multimodal Gemma 3 checkpoint: the language model under language_model.,
    # a vision tower beside it that verify does not count as unexpected; the
    # same tensor in a text-only Gemma 3 checkpoint is.
    for like, accepted in (("gemma-3-4b", True), ("gemma-3-1b", False)):
        d = f"{w}/{like}"
        make(a.cli, d, "--like", like, "--layers", "2", "--vocab", "512", "--hidden", "64", "--heads", "2",
             "--kv-heads", "1", "--head-dim", "32", "--intermediate", "128")
        add_tensor(f"{d}/model.safetensors", "vision_tower.vision_model.post_layernorm.weight", 16)
        r = subprocess.run([a.cli, "verify", d], capture_output=True, text=True)
        if accepted:
            check(r.returncode == 0, f"verify {like} with a vision tower: exit {r.returncode}\n{r.stdout}{r.stderr}")
        else:
            check(r.returncode != 0 and "vision_tower.vision_model.post_layernorm.weight" in r.stdout + r.stderr,
                  f"verify {like}: the stray tensor is not reported\n{r.stdout}{r.stderr}")

    # Usage errors name the option.
    for args, needle in [
        (["--like", "qwen2.5-0.5b", "--vocab", "100"], "--vocab"),
        (["--like", "qwen2.5-0.5b", "--heads", "7", "--kv-heads", "2"], "--kv-heads"),
        (["--like", "qwen2.5-0.5b", "--dtype", "int8"], "--dtype"),
        (["--like", "gpt-5"], "qwen2.5-7b"),
        (["--like", "qwen2.5-0.5b", "--experts", "4"], "--experts"),
        (["--like", "qwen3-30b-a3b", "--layers", "1", "--experts", "4", "--experts-per-token", "5"], "--experts-per-token"),
        (["--like", "mixtral-8x7b", "--layers", "1", "--decoder-sparse-step", "2"], "Qwen3-MoE"),
        (["--like", "qwen3-30b-a3b", "--layers", "2", "--mlp-only-layers", "5"], "--mlp-only-layers"),
        (["--like", "qwen2.5-0.5b", "--layers", "1", "--shards", "99"], "shards"),
        (["--like", "qwen2.5-0.5b", "--layers", "1", "--sliding-window", "8"], "--sliding-window"),
    ]:
        r = make(a.cli, f"{w}/bad", *args, expect_rc=1)
        check(needle in r.stderr, f"make-model {args}: error does not mention {needle!r}: {r.stderr}")

    print(f"{len(FAILURES)} failure(s)")
    if not FAILURES and not os.environ.get("SHARDLM_KEEP_WORK"):
        shutil.rmtree(w)  # 180 MB of checkpoints; a failing run keeps them
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
