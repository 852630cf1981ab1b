"""The float64 reference of a whole qwen3 / llama model from a GGUF file: every token a decode step.

One step, for token t at position p (the KV cache holds positions 0..p-1)::

    x = token_embd[t]                                   (dequantised from the file's type)
    per layer:  a = rmsnorm(x, attn_norm)
                q, k, v = Wq a, Wk a, Wv a              (per head: q [heads, d], k, v [kv_heads, d])
                qwen3: q, k = rmsnorm per head (attn_q_norm, attn_k_norm)
                q, k = rope(q, p), rope(k, p)           (the file's convention: rotate_half or interleaved)
                cache k, v at p; o_h = softmax(K_g q_h / sqrt(d)) V_g over positions 0..p
                x = x + Wo o;  m = rmsnorm(x, ffn_norm);  x = x + Wdown(silu(Wgate m) * Wup m)
    logits = lm_head(rmsnorm(x, output_norm))           (output.weight, or token_embd when tied)

Weights are gguf-py's dequantisation widened to float64 (ptxgen.quants.dequantize_f64), kept
once dequantised: 8 bytes a weight, meant for small models and layer-sized checks.

`quantize_activations` multiplies each matrix by the vector the GEMV kernels multiply it by
(ptxgen.kernels.families.quant_gemv): the f32 input quantised to int8 per 32 values with an f32
scale (`dequantize_x`); after a norm, x * gamma quantised and the RMS factor applied to the product,
as the fused norm + GEMV kinds do (`normed_activations`); the final norm is a plain rmsnorm whose
f32 output the lm_head GEMV quantises. Everything else stays float64. That is the model `ptxgen
generate` computes up to f32 rounding; without it, the model as written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import from_float, to_float64
from .errors import PtxgenError
from .gguf_model import GGUFModel
from .kernels.families.quant_gemv import dequantize_x
from .kernels.fused_rmsnorm_q4k_gemv import normed_activations
from .kernels.incremental_attention import attention_reference
from .kernels.rmsnorm import rms_normalize
from .kernels.rope import rotate
from .kernels.swiglu import silu_mul


@dataclass(frozen=True)
class Generation:
    prompt: list[int]
    tokens: list[int]  # the greedy continuation
    logits: np.ndarray  # float64 [len(tokens), vocab]: row i chose tokens[i]


class ReferenceModel:
    """Decode steps over a KV cache. `kv_dtype` ("f32", "f16", "bf16") rounds each cached k and v
    row through that type, as a kernel storing its cache in it does; None keeps float64.
    `quantize_activations`: multiply every matrix by the kernels' int8 activations (module doc)."""

    def __init__(self, model: GGUFModel, kv_dtype: str | None = None, quantize_activations: bool = False):
        self.model = model
        self.config = model.config
        self.kv_dtype = kv_dtype
        self.quantize_activations = quantize_activations
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

    def project(self, name: str, v: np.ndarray) -> np.ndarray:
        """Matrix `name` times v (quantised as the GEMV kernels quantise their f32 input, if asked)."""
        return self.weight(name) @ (dequantize_x(v.astype(np.float32)) if self.quantize_activations else v)

    def normed(self, x: np.ndarray, gain: str) -> np.ndarray:
        """rmsnorm(x, gain) as a matrix's input: the fused norm + GEMV kinds' int8 vector, if asked."""
        if self.quantize_activations:
            return normed_activations({"x": x.astype(np.float32), "gamma": self.weight(gain).astype(np.float32)},
                                      self.config.eps)
        return rms_normalize(x, self.weight(gain), self.config.eps)

    def _cached(self, rows: np.ndarray) -> np.ndarray:
        return rows if self.kv_dtype is None else to_float64(from_float(rows, self.kv_dtype), self.kv_dtype)

    def layer(self, index: int, x: np.ndarray, pos: int, forced: dict[str, np.ndarray] | None = None,
              trace: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """One decoder layer on the hidden state x [hidden] at position pos (appends to its cache).

        `forced` ("teacher forcing", as persistent_decoder's decoder_reference(stored=...)) puts
        a kernel's own values in place of this model's: "k", "v" the rows cached at pos
        [kv_heads, head_dim], "attn" the output projection's input [q_dim], "mlp" the down
        projection's input [intermediate]. A value that sits next to a rounding boundary (of the
        cache type, or of the int8 activations) may round either way in f32 and float64, and the
        one-step difference then flows into everything after it; forced, only the arithmetic between
        those points is compared. `trace`, a dict, receives this model's own values of the same
        names (k and v before rounding to the cache type)."""
        c = self.config
        forced = forced or {}
        trace = {} if trace is None else trace

        def w(short: str) -> str:
            return f"blk.{index}.{short}.weight"

        a = self.normed(x, w("attn_norm"))
        q = (self.weight(w("attn_q")) @ a).reshape(c.num_heads, c.head_dim)
        k = (self.weight(w("attn_k")) @ a).reshape(c.num_kv_heads, c.head_dim)
        v = (self.weight(w("attn_v")) @ a).reshape(c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q = rms_normalize(q, self.weight(w("attn_q_norm")), c.eps)
            k = rms_normalize(k, self.weight(w("attn_k_norm")), c.eps)
        q = rotate(q, pos, c.rope_theta, c.rope_style)
        k = rotate(k, pos, c.rope_theta, c.rope_style)
        trace["k"], trace["v"] = k, v
        self.keys[index].append(forced.get("k", self._cached(k)))
        self.values[index].append(forced.get("v", self._cached(v)))
        keys, values = np.stack(self.keys[index], axis=1), np.stack(self.values[index], axis=1)
        trace["attn"] = attention_reference(q, keys, values, pos + 1, c.head_dim ** -0.5).reshape(-1)
        x = x + self.project(w("attn_output"), forced.get("attn", trace["attn"]))
        m = self.normed(x, w("ffn_norm"))
        trace["mlp"] = silu_mul(self.weight(w("ffn_gate")) @ m, self.weight(w("ffn_up")) @ m)
        return x + self.project(w("ffn_down"), forced.get("mlp", trace["mlp"]))

    def step(self, token: int) -> np.ndarray:
        """Feed one token at the next position; return the logits float64 [vocab]."""
        c = self.config
        if not 0 <= token < c.vocab_size:
            raise PtxgenError(f"token {token} is outside the vocabulary (0..{c.vocab_size - 1})")
        x = self.embed(token)
        for index in range(c.num_layers):
            x = self.layer(index, x, self.position)
        self.position += 1
        return self.head(x)

    def head(self, x: np.ndarray) -> np.ndarray:
        """The logits of the last layer's output x: lm_head(rmsnorm(x, output_norm))."""
        return self.project(self.config.lm_head.name, rms_normalize(x, self.weight("output_norm.weight"), self.config.eps))

    def run(self, tokens) -> np.ndarray:
        """Feed tokens one by one; the logits after each, float64 [len(tokens), vocab]."""
        return np.stack([self.step(int(t)) for t in tokens]) if len(tokens) else np.zeros((0, self.config.vocab_size))


def generate(model: GGUFModel, tokens, max_new: int, kv_dtype: str | None = None,
             quantize_activations: bool = False) -> Generation:
    """Greedy decoding: feed the prompt token by token, then `max_new` tokens, each the argmax
    of the logits before it (the first from the prompt's last step)."""
    prompt = [int(t) for t in tokens]
    if not prompt:
        raise PtxgenError("generate needs at least one prompt token")
    if max_new < 0:
        raise PtxgenError(f"max_new must be >= 0, got {max_new}")
    reference = ReferenceModel(model, kv_dtype, quantize_activations)
    logits = reference.run(prompt)[-1]
    generated, steps = [], []
    for _ in range(max_new):
        steps.append(logits)
        generated.append(int(np.argmax(logits)))
        if len(generated) < max_new:
            logits = reference.step(generated[-1])
    return Generation(prompt, generated, np.array(steps).reshape(len(steps), model.config.vocab_size))
