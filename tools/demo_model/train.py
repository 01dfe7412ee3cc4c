#!/usr/bin/python3
"""Trains the shardlm demo model (see models/shardlm-demo/README.md).

  nice -n 10 /usr/bin/python3 tools/demo_model/train.py --steps N --out models/shardlm-demo

Steps (all seeded, single-threaded, CPU):
  1. corpus: the King James Bible from Debian's bible-kjv (tools/demo_model/corpus.py),
     one chapter per document; every 25th chapter is held out as the test split.
  2. tokenizer: byte-level BPE (tools/demo_model/bpe.py) trained on the train split.
  3. model: Qwen3ForCausalLM, trained on random 512-token windows of the train split
     plus ChatML samples built from the train verses ("What does John 3:16 say?" ->
     the verse), AdamW, warmup + cosine decay over --steps.
  4. export: model.safetensors (BF16), config.json, tokenizer files, loss curve,
     held-out perplexity vs a unigram model, golden greedy tokens/logits.
--deadline HH:MM (UTC) stops early at that time (the checkpoint written then is the
result; the README says how many steps were run).
"""
import argparse
import datetime
import json
import math
import os
import random
import shutil
import struct
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one thread: the machine is shared
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402
from model import Qwen3  # noqa: E402

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 4096,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "bos_token_id": None,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
}
# The two trained sizes share CONFIG's tokenizer, vocabulary and context, so "small" can be
# "base"'s speculative draft. Heads: 12 Q / 4 KV (small) and 8 Q / 4 KV (base) give
# even and uneven tensor-parallel splits.
SIZES = {
    "small": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
              "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 16},
    "base": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 10,
             "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32},
}
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


def chat_sample(ref, text):
    return (SYSTEM + f"<|im_start|>user\nWhat does {ref} say?<|im_end|>\n"
            f"<|im_start|>assistant\n{text}<|im_end|>\n<|endoftext|>")


def bf16_bytes(t):
    """float32 tensor -> BF16 bytes, round to nearest even."""
    a = t.detach().float().contiguous().numpy().view(np.uint32).astype(np.uint64)
    a = (a + 0x7FFF + ((a >> 16) & 1)) >> 16
    return a.astype(np.uint16).tobytes()


def save_safetensors(model, path):
    tensors = {k: v for k, v in model.state_dict().items()}
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = bf16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def bf16_round_(model):
    """Rounds the weights to BF16 in place, so the PyTorch forward sees the stored weights."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


@torch.no_grad()
def eval_nll(model, ids, T):
    """Mean NLL (nats/token) over ids in non-overlapping windows of T tokens (every token but the first of each window)."""
    model.eval()
    total, n = 0.0, 0
    for s in range(0, len(ids) - 1, T):
        w = ids[s : s + T + 1]
        if len(w) < 2:
            break
        x = torch.tensor([w[:-1]])
        y = torch.tensor([w[1:]])
        total += F.cross_entropy(model(x)[0], y[0], reduction="sum").item()
        n += len(w) - 1
    model.train()
    return total / n


def unigram_nll(train_ids, test_ids, vocab):
    """Held-out NLL of a unigram model with add-one smoothing, same tokenizer."""
    c = np.bincount(np.asarray(train_ids), minlength=vocab).astype(np.float64) + 1.0
    p = c / c.sum()
    return float(-np.log(p[np.asarray(test_ids)]).mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/shardlm-demo")
    ap.add_argument("--work", default="/tmp/shardlm-demo-train")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--deadline", default=None,
                    help="HH:MM UTC: the schedule runs on max(step/steps, time/time-to-deadline) and stops at the deadline")
    ap.add_argument("--probe", type=int, default=0, help="time this many steps and exit")
    ap.add_argument("--size", choices=sorted(SIZES), default="small",
                    help="small: models/shardlm-demo-draft (1.4 M parameters); base: models/shardlm-demo (8.9 M)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the recipe's runs used the number given in their README)")
    ap.add_argument("--export-checkpoint", default=None,
                    help="skip training: export WORK/ckpt.pt (and the curve of WORK/log.jsonl) to --out")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    if not args.export_checkpoint and not args.probe and os.path.exists(os.path.join(args.work, "log.jsonl")):
        os.remove(os.path.join(args.work, "log.jsonl"))
    deadline = None
    if args.deadline:
        hh, mm = map(int, args.deadline.split(":"))
        now = datetime.datetime.now(datetime.timezone.utc)
        deadline = now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()

    chapters = corpus.chapters()
    train_ch = [c for i, c in enumerate(chapters) if i % 25 != 12]
    test_ch = [c for i, c in enumerate(chapters) if i % 25 == 12]
    train_text = "".join(corpus.chapter_text(c) for c in train_ch)
    test_text = "".join(corpus.chapter_text(c) for c in test_ch)
    with open(os.path.join(args.work, "test.txt"), "w", encoding="utf-8") as f:
        f.write(test_text)

    t0 = time.time()
    cache = os.path.join(args.work, f"bpe-{CONFIG['vocab_size']}.json")
    if os.path.exists(cache):  # the trainer is deterministic: reuse its result
        with open(cache) as f:
            tokens, merges = json.load(f)
        merges = [tuple(m) for m in merges]
    else:
        tokens, merges = bpe.train(train_text, CONFIG["vocab_size"])
        with open(cache, "w") as f:
            json.dump([tokens, merges], f)
    enc = bpe.Encoder(tokens, merges)
    assert enc.n_vocab == CONFIG["vocab_size"], enc.n_vocab
    print(f"tokenizer: {enc.n_vocab} tokens, {len(merges)} merges in {time.time() - t0:.0f} s", flush=True)
    write_json(os.path.join(args.out, "tokenizer.json"), bpe.tokenizer_json(tokens, merges))
    write_json(os.path.join(args.out, "tokenizer_config.json"),
               bpe.tokenizer_config_json(len(tokens), CONFIG["max_position_embeddings"]))
    eos = enc.special["<|im_end|>"]
    eot = enc.special["<|endoftext|>"]
    cfg = dict(CONFIG, **SIZES[args.size], eos_token_id=eos)
    write_json(os.path.join(args.out, "config.json"), cfg)
    write_json(os.path.join(args.out, "generation_config.json"),
               {"bos_token_id": None, "eos_token_id": [eos, eot], "pad_token_id": eot,
                "do_sample": True, "temperature": 0.8, "top_p": 0.95, "top_k": 40,
                "transformers_version": "4.51.0"})

    plain = []
    for c in train_ch:
        plain += enc.encode(corpus.chapter_text(c)) + [eot]
    chat = []
    for c in train_ch:
        for ref, verse in corpus.verses(c):
            chat += enc.encode(chat_sample(ref, verse))
    test_ids = enc.encode(test_text)
    print(f"train: {len(plain)} plain + {len(chat)} chat tokens; test: {len(test_ids)} tokens", flush=True)
    plain_t = torch.tensor(plain)
    chat_t = torch.tensor(chat)

    model = Qwen3(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters", flush=True)
    if args.export_checkpoint:
        ck = torch.load(args.export_checkpoint)
        model.load_state_dict(ck["model"])
        with open(os.path.join(args.work, "log.jsonl")) as f:
            log = [json.loads(line) for line in f]
        log = [r for r in log if r["step"] <= ck["step"]]
        export(model, enc, cfg, args, log, ck["step"], plain, test_ids, n_params, log[-1]["seconds"] if log else 0)
        return
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    warmup = max(1, min(args.steps // 20, 50))
    log = []
    T, B = args.seq, args.batch
    t_start = time.time()
    step = 0
    for step in range(1, args.steps + 1):
        progress = step / args.steps
        if deadline is not None:
            progress = max(progress, (time.time() - t_start) / (deadline - t_start))
        progress = min(progress, 1.0)
        lr = args.lr * (step / warmup if step <= warmup else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        n_chat = B // 4
        xs = []
        for b in range(B):
            src = chat_t if b < n_chat else plain_t
            s = int(torch.randint(0, len(src) - T - 1, (1,), generator=gen))
            xs.append(src[s : s + T + 1])
        batch = torch.stack(xs)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.time() - t_start
        rec = {"step": step, "loss": loss.item(), "lr": lr, "seconds": elapsed, "progress": progress}
        if args.probe and step >= args.probe:
            print(f"probe: {elapsed / step:.2f} s/step ({B * T * step / elapsed:.0f} tokens/s)")
            return
        stop = progress >= 1.0 and step < args.steps
        if step % args.eval_every == 0 or step == args.steps or stop:
            rec["test_loss"] = eval_nll(model, test_ids[:8192], 512)
            torch.save({"model": model.state_dict(), "step": step}, os.path.join(args.work, "ckpt.pt"))
            print(f"step {step} loss {loss.item():.3f} test {rec['test_loss']:.3f} lr {lr:.2e} {elapsed:.0f} s", flush=True)
        log.append(rec)
        with open(os.path.join(args.work, "log.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
        if stop:
            print(f"deadline reached at step {step}", flush=True)
            break
    export(model, enc, cfg, args, log, step, plain, test_ids, n_params, time.time() - t_start)


def export(model, enc, cfg, args, log, step, train_ids, test_ids, n_params, seconds):
    bf16_round_(model)
    save_safetensors(model, os.path.join(args.out, "model.safetensors"))
    nll = eval_nll(model, test_ids, 512)
    uni = unigram_nll(train_ids, test_ids, cfg["vocab_size"])
    metrics = {"steps": step, "planned_steps": args.steps, "train_seconds": round(seconds),
               "parameters": n_params, "seed": args.seed, "batch": args.batch, "seq": args.seq,
               "test_tokens": len(test_ids), "test_nll": nll, "test_perplexity": math.exp(nll),
               "unigram_test_nll": uni, "unigram_test_perplexity": math.exp(uni),
               "final_train_loss": log[-1]["loss"] if log else None}
    write_json(os.path.join(args.out, "metrics.json"), metrics)
    shutil.copyfile(os.path.join(args.work, "test.txt"), os.path.join(args.out, "heldout.txt"))
    print(json.dumps(metrics, indent=2), flush=True)
    golden(model, enc, args.out)
    plot(log, os.path.join(args.out, "loss.png"))


def golden(model, enc, out):
    """Greedy tokens and logits of the PyTorch forward (BF16 weights, f32), for tests/model."""
    cases = []
    for prompt in ["Once upon a time", "In the beginning God created",
                   SYSTEM + "<|im_start|>user\nWhat does John 3:16 say?<|im_end|>\n<|im_start|>assistant\n"]:
        ids = enc.encode(prompt)
        gen, logits = model.greedy(ids, 24)
        top2 = logits.topk(2, dim=-1).values
        cases.append({"prompt": prompt, "prompt_token_ids": ids, "token_ids": gen, "text": enc.decode(gen),
                      "margins": (top2[:, 0] - top2[:, 1]).tolist(),
                      "first_step_logits": [round(v, 5) for v in logits[0].tolist()]})
    write_json(os.path.join(out, "golden.json"), {"max_tokens": 24, "cases": cases})


def plot(log, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [r["step"] for r in log]
    loss = [r["loss"] for r in log]
    k = 20
    smooth = [sum(loss[max(0, i - k + 1) : i + 1]) / len(loss[max(0, i - k + 1) : i + 1]) for i in range(len(loss))]
    ev = [(r["step"], r["test_loss"]) for r in log if "test_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, loss, color="#bbbbbb", linewidth=0.6, label="train loss (batch)")
    ax.plot(steps, smooth, color="#1f77b4", label=f"train loss ({k}-step mean)")
    if ev:
        ax.plot([e[0] for e in ev], [e[1] for e in ev], "o-", color="#d62728", label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("shardlm-demo training")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
