"""The float64 reference of a whole qwen3 / llama model from a GGUF file: every token a decode step.

One step, for token t at position p (the KV cache holds positions 0..p-1)::

    x = token_embd[t]                                   (dequantised from the file's type)
    per layer:  a = rmsnorm(x, attn_norm)
                q, k, v = Wq a, Wk a, Wv a              (per head: q [heads, d], k, v [kv_heads, d])
                qwen3: q, k = rmsnorm per head (attn_q_norm, attn_k_norm)
                q, k = rope(q, p), rope(k, p)           (the file's convention: neox or interleaved)
                cache k, v at p; o_h = softmax(K_g q_h / sqrt(d)) V_g over positions 0..p
                x = x + Wo o;  m = rmsnorm(x, ffn_norm);  x = x + Wdown(silu(Wgate m) * Wup m)
    logits = lm_head(rmsnorm(x, output_norm))           (output.weight, or token_embd when tied)

Weights are gguf-py's dequantisation widened to float64 (ptxgen.quants.dequantize_f64), kept
once dequantised: 8 bytes a weight, meant for small models and layer-sized checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import from_float, to_float64
from .errors import PtxgenError
from .gguf_model import GGUFModel
from .kernels.incremental_attention import attention_reference
from .kernels.rmsnorm import rms_normalize
from .kernels.rope import inv_freq, rotate_half
from .kernels.swiglu import silu_mul


def rope(x: np.ndarray, pos: int, theta: float, style: str) -> np.ndarray:
    """Rotate the last axis (head_dim) of x at position pos, pair i by angle pos * theta^(-2i/d):
    "neox" pairs (i, i + d/2), "interleaved" pairs (2i, 2i + 1)."""
    if style == "neox":
        return rotate_half(x, pos, theta)
    angle = pos * inv_freq(theta, x.shape[-1])
    cos, sin = np.cos(angle), np.sin(angle)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty(x.shape)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out


@dataclass(frozen=True)
class Generation:
    prompt: list[int]
    tokens: list[int]  # the greedy continuation
    logits: np.ndarray  # float64 [len(tokens), vocab]: row i chose tokens[i]


class ReferenceModel:
    """Decode steps over a KV cache. `kv_dtype` ("f32", "f16", "bf16") rounds each cached k and v
    row through that type, as a kernel storing its cache in it does; None keeps float64."""

    def __init__(self, model: GGUFModel, kv_dtype: str | None = None):
        self.model = model
        self.config = model.config
        self.kv_dtype = kv_dtype
        self.reset()

        self._weights: dict[str, np.ndarray] = {}

    def reset(self) -> None:
        """Empty the KV cache: the next token is at position 0."""
        self.position = 0
        self.keys: list[list[np.ndarray]] = [[] for _ in range(self.config.num_layers)]  # [layer][pos] [kv_heads, d]
        self.values: list[list[np.ndarray]] = [[] for _ in range(self.config.num_layers)]

    def weight(self, name: str) -> np.ndarray:
        """A tensor of the file as float64, dequantised once."""
        if name not in self._weights:
            self._weights[name] = self.model.dequantize(name)
        return self._weights[name]

    def embed(self, token: int) -> np.ndarray:
        """The token's embedding row, dequantised from its own bytes of token_embd."""
        return self.model.dequantize("token_embd.weight", rows=[token])[0]

    def _cached(self, rows: np.ndarray) -> np.ndarray:
        return rows if self.kv_dtype is None else to_float64(from_float(rows, self.kv_dtype), self.kv_dtype)

    def layer(self, index: int, x: np.ndarray, pos: int) -> np.ndarray:
        """One decoder layer on the hidden state x [hidden] at position pos (appends to its cache)."""
        c = self.config

        def w(short: str) -> np.ndarray:
            return self.weight(f"blk.{index}.{short}.weight")

        a = rms_normalize(x, w("attn_norm"), c.eps)
        q = (w("attn_q") @ a).reshape(c.num_heads, c.head_dim)
        k = (w("attn_k") @ a).reshape(c.num_kv_heads, c.head_dim)
        v = (w("attn_v") @ a).reshape(c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q = rms_normalize(q, w("attn_q_norm"), c.eps)
            k = rms_normalize(k, w("attn_k_norm"), c.eps)
        q = rope(q, pos, c.rope_theta, c.rope_style)
        k = rope(k, pos, c.rope_theta, c.rope_style)
        self.keys[index].append(self._cached(k))
        self.values[index].append(self._cached(v))
        keys, values = np.stack(self.keys[index], axis=1), np.stack(self.values[index], axis=1)
        o = attention_reference(q, keys, values, pos + 1, c.head_dim ** -0.5)
        x = x + w("attn_output") @ o.reshape(-1)
        m = rms_normalize(x, w("ffn_norm"), c.eps)
        return x + w("ffn_down") @ silu_mul(w("ffn_gate") @ m, w("ffn_up") @ m)

    def step(self, token: int) -> np.ndarray:
        """Feed one token at the next position; return the logits float64 [vocab]."""
        c = self.config
        if not 0 <= token < c.vocab_size:
            raise PtxgenError(f"token {token} is outside the vocabulary (0..{c.vocab_size - 1})")
        x = self.embed(token)
        for index in range(c.num_layers):
            x = self.layer(index, x, self.position)
        self.position += 1
        x = rms_normalize(x, self.weight("output_norm.weight"), c.eps)
        return self.weight(c.lm_head.name) @ x

    def run(self, tokens) -> np.ndarray:
        """Feed tokens one by one; the logits after each, float64 [len(tokens), vocab]."""
        return np.stack([self.step(int(t)) for t in tokens]) if len(tokens) else np.zeros((0, self.config.vocab_size))


def generate(model: GGUFModel, tokens, max_new: int, kv_dtype: str | None = None) -> Generation:
    """Greedy decoding: feed the prompt token by token, then `max_new` tokens, each the argmax
    of the logits before it (the first from the prompt's last step)."""
    prompt = [int(t) for t in tokens]
    if not prompt:
        raise PtxgenError("generate needs at least one prompt token")
    if max_new < 0:
        raise PtxgenError(f"max_new must be >= 0, got {max_new}")
    reference = ReferenceModel(model, kv_dtype)
    logits = reference.run(prompt)[-1]
    generated, steps = [], []
    for _ in range(max_new):
        steps.append(logits)
        generated.append(int(np.argmax(logits)))
        if len(generated) < max_new:
            logits = reference.step(generated[-1])
    return Generation(prompt, generated, np.array(steps).reshape(len(steps), model.config.vocab_size))
