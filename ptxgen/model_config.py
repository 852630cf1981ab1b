"""A decoder-only model's shapes and weight types, from a GGUF file (``ptxgen.gguf_model``) or a
Hugging Face ``config.json`` (``from_hf_config``): what the spec generator and references need."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PtxgenError
from .quants import quant_type

# llama.cpp's rope type per architecture (llama_model_rope_type), named as the rope kind's `style`:
# "rotate_half" (llama.cpp's "neox") rotates pairs (i, i + head_dim/2), "interleaved" (llama.cpp's
# "normal", GPT-J style) pairs (2i, 2i + 1). GGUF conversion permutes llama's Q/K rows for the
# interleaved form; Qwen keeps HF's order.
ROPE_STYLES = {"qwen3": "rotate_half", "llama": "interleaved"}
ARCHITECTURES = tuple(ROPE_STYLES)

# The weight matrices of one layer, GGUF names without "blk.N." and ".weight".
LAYER_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def matrix_names(num_layers: int, tied_embeddings: bool) -> list[str]:
    """GGUF names of a model's weight matrices: embedding, each layer's projections, lm_head."""
    names = ["token_embd.weight"]
    names += [f"blk.{layer}.{short}.weight" for layer in range(num_layers) for short in LAYER_MATRICES]
    return names if tied_embeddings else names + ["output.weight"]


@dataclass(frozen=True)
class Matrix:
    """One weight matrix: `rows` x `k` weights of type `quant` (a ptxgen.quants name)."""

    name: str  # GGUF tensor name, e.g. "blk.3.ffn_down.weight"
    rows: int
    k: int
    quant: str

    @property
    def short(self) -> str:
        """The name without layer and suffix: "ffn_down", "output", "token_embd"."""
        return self.name.removesuffix(".weight").rsplit(".", 1)[-1]


@dataclass(frozen=True)
class ModelConfig:
    name: str
    architecture: str  # one of ARCHITECTURES
    num_layers: int
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    eps: float
    context_length: int
    vocab_size: int
    tied_embeddings: bool  # no output.weight: the lm_head is token_embd
    # Type (a ptxgen.quants name) of every matrix of matrix_names(), by GGUF tensor name.
    quants: dict[str, str]
    # Where a field's value came from (e.g. "metadata 'qwen3.block_count'"), for the refusals.
    origin: dict[str, str] = field(default_factory=dict, compare=False)

    def named(self, name: str) -> str:
        """A field's name and where its value came from: "context_length (metadata 'qwen3.context_length')"."""
        return f"{name} ({self.origin[name]})" if name in self.origin else name

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise PtxgenError(f"{self.name}: architecture {self.architecture!r} is not supported "
                              f"(supported: {', '.join(ARCHITECTURES)})")
        for name in ("num_layers", "hidden", "intermediate", "num_heads", "num_kv_heads", "head_dim",
                     "context_length", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PtxgenError(f"{self.name}: {self.named(name)} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise PtxgenError(f"{self.name}: {self.named('num_kv_heads')} = {self.num_kv_heads} must divide "
                              f"{self.named('num_heads')} = {self.num_heads}")
        if self.head_dim % 2:
            raise PtxgenError(f"{self.name}: {self.named('head_dim')} must be even for rope, got {self.head_dim}")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 1):
            raise PtxgenError(f"{self.name}: {self.named('rope_theta')} must be a finite number above 1, "
                              f"got {self.rope_theta}")
        if not 0 < self.eps < 1:
            raise PtxgenError(f"{self.name}: {self.named('eps')} must be in (0, 1), got {self.eps}")
        expected = matrix_names(self.num_layers, self.tied_embeddings)
        if set(self.quants) != set(expected):
            missing = sorted(set(expected) - set(self.quants))
            extra = sorted(set(self.quants) - set(expected))
            raise PtxgenError(f"{self.name}: weight types must cover exactly the model's matrices "
                              f"(missing: {missing or 'none'}; unexpected: {extra or 'none'})")
        for name in expected:
            quant_type(self.quants[name])  # rejects an unknown type name

    def cache_positions(self, max_seq_len: int | None) -> int:
        """The KV cache's positions: `max_seq_len` (--max-seq-len), else the context length. Refused
        above the context length: the model was never trained at those positions, and ptxgen
        applies no rope scaling (YaRN, linear) to stretch it."""
        if max_seq_len is None:
            return self.context_length
        if max_seq_len < 1:
            raise PtxgenError(f"--max-seq-len: expected at least 1, got {max_seq_len}")
        if max_seq_len > self.context_length:
            raise PtxgenError(f"--max-seq-len {max_seq_len}: above the model's {self.named('context_length')} "
                              f"= {self.context_length} (positions it was never trained at; rope scaling is not "
                              "supported)")
        return max_seq_len

    @property
    def rope_style(self) -> str:
        return ROPE_STYLES[self.architecture]

    @property
    def qk_norm(self) -> bool:
        """Qwen3 RMS-normalises each query and key head before rope; llama does not."""
        return self.architecture == "qwen3"

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def shape_of(self, short: str) -> tuple[int, int]:
        """(rows, k) of a matrix by its short name ("attn_q", ..., "token_embd", "output")."""
        h, i = self.hidden, self.intermediate
        return {"attn_q": (self.q_dim, h), "attn_k": (self.kv_dim, h), "attn_v": (self.kv_dim, h),
                "attn_output": (h, self.q_dim), "ffn_gate": (i, h), "ffn_up": (i, h), "ffn_down": (h, i),
                "token_embd": (self.vocab_size, h), "output": (self.vocab_size, h)}[short]

    def matrices(self) -> list[Matrix]:
        """Every weight matrix of the model, in matrix_names() order."""
        found = []
        for name in matrix_names(self.num_layers, self.tied_embeddings):
            short = name.removesuffix(".weight").rsplit(".", 1)[-1]
            found.append(Matrix(name, *self.shape_of(short), self.quants[name]))
        return found

    @property
    def lm_head(self) -> Matrix:
        """The matrix logits come from: output.weight, or token_embd when tied."""
        return self.matrices()[-1 if not self.tied_embeddings else 0]


def from_hf_config(path, quant: str) -> ModelConfig:
    """A Hugging Face config.json (model_type qwen3 or llama) with every matrix of type `quant`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise PtxgenError(f"{path}: cannot read config: {error.strerror or error}") from None
    except ValueError as error:  # bad UTF-8 or JSON, or an integer of more digits than Python converts
        raise PtxgenError(f"{path}: not a JSON config: {error}") from None
    if not isinstance(data, dict):
        raise PtxgenError(f"{path}: expected a JSON object, got {type(data).__name__}")
    quant = quant_type(quant).name

    def value_of(key: str):
        """data[key]; "rope_parameters.rope_theta" is data["rope_parameters"]["rope_theta"]."""
        table, _, inner = key.rpartition(".")
        return (data[table] if table else data).get(inner)

    def get(key: str, kind: type, default=None):
        value = value_of(key)
        value = default if value is None else value
        if value is None:
            raise PtxgenError(f"{path}: missing {key!r}")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            # float() raises on an integer past the float range: take it as infinite, refused as such
            value = float(value) if abs(value) <= sys.float_info.max else math.inf if value > 0 else -math.inf
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            expected = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}[kind]
            raise PtxgenError(f"{path}: {key!r} must be {expected}, got {value!r}")
        return value

    architecture = get("model_type", str)
    if architecture not in ARCHITECTURES:
        raise PtxgenError(f"{path}: model_type {architecture!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    rope = data.get("rope_parameters")
    if rope is not None and not isinstance(rope, dict):
        raise PtxgenError(f"{path}: 'rope_parameters' must be an object, got {rope!r}")
    rope = rope or {}
    # transformers >= 5 keeps rope_theta in rope_parameters; older configs at the top
    theta = "rope_parameters.rope_theta" if rope.get("rope_theta") is not None else "rope_theta"
    def scaled(table) -> bool:  # a table naming rope_type (or type) "default" is plain rope
        return bool(table) and (table.get("rope_type", table.get("type", "default")) != "default"
                                if isinstance(table, dict) else True)

    scaling = next((table for table in (data.get("rope_scaling"), rope) if scaled(table)), None)
    if scaling:
        raise PtxgenError(f"{path}: rope scaling {scaling!r} is not supported (plain rope only)")
    heads = get("num_attention_heads", int)
    hidden = get("hidden_size", int)
    layers = get("num_hidden_layers", int)
    tied = get("tie_word_embeddings", bool, False)
    keys = {"num_layers": "num_hidden_layers", "hidden": "hidden_size", "intermediate": "intermediate_size",
            "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
            "rope_theta": theta, "eps": "rms_norm_eps", "context_length": "max_position_embeddings",
            "vocab_size": "vocab_size"}
    origin = {name: f"{path.name}'s {key!r}" if value_of(key) is not None else f"default of {path.name}'s {key!r}"
              for name, key in keys.items()}
    return ModelConfig(
        origin=origin,
        name=str(data.get("_name_or_path") or path.resolve().parent.name),
        architecture=architecture,
        num_layers=layers,
        hidden=hidden,
        intermediate=get("intermediate_size", int),
        num_heads=heads,
        num_kv_heads=get("num_key_value_heads", int, heads),
        head_dim=get("head_dim", int, hidden // heads if heads and hidden % heads == 0 else None),
        rope_theta=get(theta, float, 10000.0),
        eps=get("rms_norm_eps", float, 1e-6),
        context_length=get("max_position_embeddings", int),
        vocab_size=get("vocab_size", int),
        tied_embeddings=tied,
        quants={name: quant for name in matrix_names(layers, tied)},
    )
