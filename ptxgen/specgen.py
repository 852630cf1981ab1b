"""A spec (TOML text) with every kernel a model needs for decode and prefill, named after it:
the kernels ``ptxgen generate`` launches, and prefill attention.

The kernels: the whole decoder as one ``persistent_decoder``; the same layers as separate
kernels, the decoder's own ``separate_step`` (fused RMSNorm + GEMV groups for q/k/v and
gate/up, one a type in a layer, Qwen3's ``per_head_rmsnorm``, ``rope``, ``kv_append``,
``incremental_attention``, a GEMV of o and of down per type and shape, ``residual_add``,
``swiglu``), each kernel once; the head (``rmsnorm``, the lm_head's GEMV, ``argmax`` for greedy
sampling); ``flash_attention`` for prefill. The token embedding is a row lookup, not a kernel.
generate takes its kernels from this spec (generated_spec), so the two cannot part. The fused
decoder takes each layer's types; it is left out (a comment says why) where its one launch
cannot take the model (e.g. ffn_gate and ffn_up of different types in a layer), whose layers
generate runs as the separate kernels; a model whose layers have no plan at all (the
decoder's config refuses its shapes or cache length) gets no spec, as generate refuses it.

Matrices of other types than Q4_K use the kinds of their type (``q6k_gemv``,
``fused_rmsnorm_q8_0_gemv_group``, ...); a llama file's rope says ``style = "interleaved"``
(and its decoder ``rope_style``, ``qk_norm = false``); a decoder whose projections are not all
Q4_K lists their types per layer in ``weight_quants``.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from .artifacts import write_file
from .errors import PtxgenError, SpecError
from .kernels import config_from_json, kind_of, takes_pdl
from .model_config import ModelConfig, from_hf_config
from .quants import GEMV_KINDS
from .spec import check_against_archs, validate
from .specfile import tomllib

# The persistent decoder's parameter for each layer matrix.
DECODER_WEIGHTS = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo", "ffn_gate": "w_gate",
                   "ffn_up": "w_up", "ffn_down": "w_down"}
KV_DTYPE = "f16"  # the cache type of today's decode kinds (KERNELS.md default)


def model_prefix(name: str) -> str:
    """A kernel-name prefix from a model name: "Qwen3 8B" -> "qwen3_8b"."""
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:24].rstrip("_")
    return slug if slug and not slug[0].isdigit() else f"model_{slug}".rstrip("_")


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def _comment(text: str) -> str:
    return "# " + re.sub(r"[^\x20-\x7e]", "?", text)


def check_gemv_types(config: ModelConfig) -> None:
    """Every matrix the decode step multiplies must have a GEMV kind for its type."""
    for matrix in config.matrices():
        if matrix.name == "token_embd.weight" and not config.tied_embeddings:
            continue  # looked up by row on the host: any type gguf-py dequantises
        if matrix.quant not in GEMV_KINDS:
            raise PtxgenError(f"{config.name}: tensor {matrix.name!r} is {matrix.quant.upper()}; there is no GEMV "
                              f"kernel of that type (supported: {', '.join(q.upper() for q in GEMV_KINDS)})")


def decoder_kernel(config: ModelConfig, prefix: str, max_seq_len: int) -> dict:
    c = config
    entry = {"name": f"{prefix}_decoder", "kind": "persistent_decoder", "hidden": c.hidden,
             "num_heads": c.num_heads, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
             "intermediate": c.intermediate, "num_layers": c.num_layers, "max_seq_len": max_seq_len,
             "eps": c.eps, "rope_theta": c.rope_theta, "kv_dtype": KV_DTYPE}
    if c.rope_style != "rotate_half":
        entry["rope_style"] = c.rope_style
    if not c.qk_norm:
        entry["qk_norm"] = False
    quants = {weight: tuple(c.quants[f"blk.{layer}.{short}.weight"] for layer in range(c.num_layers))
              for short, weight in DECODER_WEIGHTS.items()}
    mixed = {weight: types for weight, types in quants.items() if set(types) != {"q4_k"}}
    if mixed:
        entry["weight_quants"] = mixed
    return entry


@dataclass(frozen=True)
class StepKernels:
    """The configs of the kernels a decode step launches (`ptxgen generate`), as the model's spec
    lists them."""

    decoder: object  # persistent_decoder: the layers as one launch, or separate_step(..., prefix)'s
    prefix: str  # the spec's kernel-name prefix, so the separate step's
    norm: object  # rmsnorm over hidden (the final norm)
    lm_head: object  # the lm_head's GEMV
    argmax: object

    @property
    def fused_refusal(self) -> str | None:
        """Why the layers cannot be one persistent_decoder launch a token (None: they can)."""
        return kind_of(self.decoder).unbuildable()


def spec_text(config: ModelConfig, source: str, max_seq_len: int | None = None, prefix: str | None = None) -> str:
    """The spec of every kernel `config` needs, as TOML; `source` names where the config came from."""
    return generated_spec(config, source, max_seq_len, prefix)[0]


def generated_spec(config: ModelConfig, source: str, max_seq_len: int | None = None,
                   prefix: str | None = None) -> tuple[str, StepKernels]:
    """spec_text's TOML and the decode step's kernels it lists, validated as a spec file would be
    (refused: generation_refused). The layers' separate kernels are the decoder's separate_step's,
    so `ptxgen generate` runs what the spec lists whichever way it runs the layers."""
    c = config
    prefix = model_prefix(c.name) if prefix is None else prefix
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,31}", prefix):
        raise PtxgenError(f"kernel name prefix must be an identifier of at most 32 characters, got {prefix!r}")
    max_seq_len = c.cache_positions(max_seq_len)
    check_gemv_types(c)
    decoder = decoder_kernel(c, prefix, max_seq_len)
    with generation_refused(c, source, max_seq_len):  # the layers' plan, whether or not one launch can run it
        decoder_config = validate(Path(c.name), {"kernels": [decoder]}).kernels[0]
    head = c.lm_head
    norm = {"name": f"{prefix}_rmsnorm", "kind": "rmsnorm", "hidden": c.hidden, "eps": c.eps}
    lm_head = {"name": f"{prefix}_lm_head", "kind": GEMV_KINDS[head.quant], "n": head.rows, "k": head.k}
    argmax = {"name": f"{prefix}_argmax", "kind": "argmax", "n": c.vocab_size}
    # Two m16 tiles a warp share each K/V fragment (half the ldmatrix per MMA): 320/372 TFLOP/s at
    # 4k/8k keys against 292/323 on an H100 at head_dim 128; 4 warps load rows of up to 128.
    wide = c.head_dim <= 128
    prefill = {"name": f"{prefix}_prefill_attention", "kind": "flash_attention", "num_heads": c.num_heads,
               "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim, "dtype": "f16", "out_dtype": "f16",
               "causal": True, **({"block_m": 128, "warp_rows": 32} if wide else {})}
    sections = [
        optional_section("Whole decoder layers for one token, one launch", "Whole decoder layers in one launch",
                         decoder),
        ("The layers as separate kernels, in launch order (ptxgen generate --separate, and by default where the "
         "one launch is left out)", kind_of(decoder_config).separate_kernels(prefix)),
        ("The head: final RMSNorm, the lm_head GEMV, greedy argmax (the index of the largest logit)",
         [norm, lm_head, argmax]),
        optional_section("Prefill attention (causal)"
                         + (", 128-row CTAs of 32-row warps: faster from 4k keys on an H100" if wide else ""),
                         "Prefill attention", prefill),
    ]
    types = sorted({q.upper() for q in c.quants.values()})
    lines = [
        _comment(f"{c.name}: {c.architecture}, {c.num_layers} layers, hidden {c.hidden}, {c.num_heads} query heads "
                 f"on {c.num_kv_heads} KV heads, head_dim {c.head_dim}, intermediate {c.intermediate}, vocab {c.vocab_size},"),
        _comment(f"eps {c.eps:g}, rope theta {c.rope_theta:g} ({c.rope_style}), context {c.context_length}; "
                 f"weights {', '.join(types)}{', lm_head tied to token_embd' if c.tied_embeddings else ''}."),
        _comment(f"Generated by ptxgen from {source}. The decode kernels take pdl = true: on sm_90 each starts "
                 "while the previous one ends."),
    ]
    for title, kernels in sections:
        lines += ["", _comment(f"--- {title}")]
        for kernel in kernels:
            if takes_pdl(kernel["kind"]):
                kernel = {**kernel, "pdl": True}
            lines += ["", "[[kernels]]"] + [f"{key} = {toml_value(value)}" for key, value in kernel.items()]
    text = "\n".join(lines) + "\n"
    with generation_refused(c, source, max_seq_len):
        spec = validate(Path(c.name), tomllib.loads(text))
        check_against_archs(Path(c.name), spec)
    return text, StepKernels(decoder_config, prefix, *(spec.kernel(k["name"]) for k in (norm, lm_head, argmax)))


def optional_section(title: str, short: str, kernel: dict) -> tuple[str, list[dict]]:
    """A section of one kernel the model's shapes may rule out (the persistent decoder, prefill
    attention: decode runs without them): left out, with the reason, where its kind refuses them."""
    try:
        refusal = kind_of(config_from_json(kernel)).unbuildable()
    except ValidationError as error:
        refusal = f"{kernel['kind']} {config_problem(error)}"
    return (f"{short}: none ({refusal})", []) if refusal else (title, [kernel])


def config_problem(error: ValidationError) -> str:
    """The first thing a kind refuses in a config, as "field: why (got value)"."""
    problem = error.errors(include_url=False)[0]
    field = ".".join(str(part) for part in problem["loc"][1:])
    got = f" (got {problem['input']!r})" if field else ""
    return f"{field + ': ' if field else ''}{problem['msg'].removeprefix('Value error, ')}{got}"


@contextmanager
def generation_refused(config: ModelConfig, source: str, max_seq_len: int):
    """A SpecError of the generated spec as one message, and nothing written: a model whose shapes
    a kind refuses gets the kernel, the field and the value, and a refused max_seq_len where it
    came from (--max-seq-len, or the model's context length)."""
    model = config.name
    try:
        yield
    except SpecError as error:
        first = str(error).splitlines()[0].removeprefix(model + ": ")
        if "max_seq_len" in first and max_seq_len == config.context_length:
            raise SpecError(f"{source}: no spec for this model: {config.named('context_length')} = {max_seq_len} is "
                            f"past what the kernels take ({first}); pass a smaller --max-seq-len") from None
        hint = f" (--max-seq-len {max_seq_len})" if "max_seq_len" in first else ""
        raise SpecError(f"{model}: no spec for this model{hint}: {first}") from None


def spec_from_gguf(path, max_seq_len: int | None = None, prefix: str | None = None) -> str:
    """The spec text for a GGUF model file."""
    from .gguf_model import GGUFModel

    return spec_text(GGUFModel(path).config, Path(path).name, max_seq_len, prefix)


def spec_from_hf_config(path, quant: str, max_seq_len: int | None = None, prefix: str | None = None) -> str:
    """The spec text for a Hugging Face config.json, every matrix of type `quant` ("q4_k", ...)."""
    if quant.lower() not in GEMV_KINDS:
        raise PtxgenError(f"--quant: expected one of {', '.join(GEMV_KINDS)} (a type with a GEMV kernel), got {quant!r}")
    return spec_text(from_hf_config(path, quant), f"{Path(path).name} with {quant} weights", max_seq_len, prefix)


def write_spec(text: str, path, overwrite: bool = False) -> None:
    """Write a spec file whole (atomic rename); an existing file only with `overwrite`."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise PtxgenError(f"{path}: already exists; refusing to replace it (ask for overwrite, e.g. --force)")
    write_file(path, text.encode(), "spec")
