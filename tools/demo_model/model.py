#!/usr/bin/python3
"""The demo model in PyTorch: Qwen3ForCausalLM (q/k RMSNorm per head, GQA,
rotate-half RoPE, SwiGLU, tied embeddings), written from the Hugging Face
architecture description, with the same parameter names as an HF checkpoint.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_tables(head_dim, n_pos, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # [head_dim/2]
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv[None, :]                # [n_pos, head_dim/2]
    ang = torch.cat([ang, ang], dim=-1)                                                    # [n_pos, head_dim]
    return ang.cos().float(), ang.sin().float()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.hd, h, bias=False)
        self.q_norm = RMSNorm(self.hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.hd, c["rms_norm_eps"])

    def forward(self, x, cos, sin):  # x [B, T, h]; cos/sin [T, hd]
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.hd)).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.hd)).transpose(1, 2)     # [B, nkv, T, hd]
        v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)                  # [B, nkv, T, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)                               # [B, nh, T, T]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = att @ v                                                                         # [B, nh, T, hd]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Qwen3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Inner(c)
        cos, sin = rope_tables(c["head_dim"], c["max_position_embeddings"], c["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, std)
                if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                    p.data /= math.sqrt(2 * c["num_hidden_layers"])

    def forward(self, ids):  # ids [B, T] -> logits [B, T, vocab]
        T = ids.shape[1]
        x = self.model.embed_tokens(ids)
        cos, sin = self.cos[:T], self.sin[:T]
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return F.linear(self.model.norm(x), self.model.embed_tokens.weight)

    @torch.no_grad()
    def greedy(self, prompt_ids, n_new):
        """-> (generated ids, logits of every step [n_new, vocab]); full recompute, float32."""
        ids = list(prompt_ids)
        out, steps = [], []
        for _ in range(n_new):
            logits = self.forward(torch.tensor([ids]))[0, -1]
            steps.append(logits)
            nxt = int(torch.argmax(logits))  # lowest id on ties
            out.append(nxt)
            ids.append(nxt)
        return out, torch.stack(steps)
