"""Greedy decoding of a GGUF model with ptxgen's kernels, on the GPU or in the PTX interpreter
(`ptxgen generate`).

The kernels come from the model's spec (ptxgen.specgen, in memory), compiled through the cache.
One decode step, token t at position p:

    x = token_embd[t]        dequantised from the file's type on the host (one row of `hidden`
                             values a token) and copied in
    layers                   the persistent decoder's separate_step at p: launches of the separate
                             kinds (fused norm + Q/K/V and gate/up GEMV groups, rope, kv_append,
                             split-KV attention, ...), or with `fused` the persistent decoder itself
    head                     rmsnorm(x, output_norm), the lm_head GEMV, argmax on the device; the
                             4-byte index is read back

The prompt goes through the same decode step token by token (no prefill kernel); its steps skip
the head, but the last. The KV cache (f16) stays where the kernels run. On the device each weight
tensor is copied once, straight from the file's memory map (no host copy); the interpreter gets
host arrays (a copy: it is meant for small models such as the tests' fixture).

Weight types: every matrix (the lm_head included) is multiplied by the GEMV kind of its type
(quants.GEMV_KINDS: Q4_K, Q6_K, Q8_0), a layer's through the decoder's separate step with its
per-layer types (`weight_quants`), or with `fused` the persistent decoder's phase variants for
the same types (it needs a layer's ffn_gate and ffn_up of one type).
"""

from __future__ import annotations

import functools
import json
import time
import zlib
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from .abi import Param
from .dtypes import DTYPES
from .errors import LaunchError, PtxgenError
from .kernels.base import Call
from .kernels.persistent_decoder import WEIGHTS, weight_slot
from .model_config import ModelConfig, matrix_names
from .quants import GEMV_KINDS, quant_type
from .specgen import StepKernels, generated_spec

# The decoder's per-layer array parameters and the GGUF tensor (blk.N.<short>.weight) each holds.
LAYER_TENSORS = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "q_norm": "attn_q_norm", "k_norm": "attn_k_norm",
                 "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output", "w_gate": "ffn_gate",
                 "w_up": "ffn_up", "w_down": "ffn_down"}
INTERPRETER = "PTX interpreter (CPU)"


def step_kernels(config: ModelConfig, max_seq_len: int) -> StepKernels:
    """The step's kernels from the spec `ptxgen spec from-gguf` writes for this model (one error,
    as that command's, for a model it refuses)."""
    return generated_spec(config, f"{config.name} (generated spec)", max_seq_len)[1]


def check_request(config: ModelConfig, max_seq_len: int | None, prompt: list[int], max_new: int,
                  option: str = "--tokens") -> None:
    """Refuse a prompt or a length the model cannot take (cheap: before any weight is loaded).
    `max_seq_len`: the KV cache's positions as --max-seq-len gave them (None: context_length);
    `option`: the option the prompt came from, named in the errors."""
    if not prompt:
        raise PtxgenError(f"{option}: give at least one prompt token")
    for token in prompt:
        if not 0 <= token < config.vocab_size:
            raise PtxgenError(f"{option}: token {token} is outside the vocabulary (0..{config.vocab_size - 1})")
    if max_new < 1:
        raise PtxgenError(f"--max-new: expected at least 1, got {max_new}")
    positions = len(prompt) + max_new - 1  # the last new token is not fed back
    cache = config.cache_positions(max_seq_len)
    if positions > cache:
        source = "--max-seq-len" if max_seq_len else "the model's context_length; --max-seq-len sets it"
        prompted = f"{len(prompt)} prompt token{'s' if len(prompt) > 1 else ''}"
        if len(prompt) > cache:
            raise PtxgenError(f"{option}: {prompted} need {len(prompt)} cache positions; the KV cache holds {cache} "
                              f"({source})")
        new = f"{max_new} new one{'s' if max_new > 1 else ''}"
        raise PtxgenError(f"--max-new {max_new}: {prompted} and {new} need {positions} cache positions; "
                          f"the KV cache holds {cache} ({source})")


# --- where the buffers live ------------------------------------------------------------------------
class HostMemory:
    """Named host arrays; calls run in the PTX interpreter (sanitizer on), one launch after another."""

    device = INTERPRETER

    def __init__(self, compiled_of: Callable):
        self.compiled_of = compiled_of
        self.arrays: dict[str, np.ndarray] = {}

    def allocate(self, buffer: Param) -> None:
        self.arrays[buffer.name] = np.zeros(buffer.shape, DTYPES[buffer.dtype].numpy)

    def write(self, name: str, data: np.ndarray, index: int | None = None) -> None:
        target = self.arrays[name] if index is None else self.arrays[name][index]
        target.reshape(-1).view(np.uint8)[...] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)

    def read(self, name: str) -> np.ndarray:
        return self.arrays[name].copy()

    def run(self, calls: list[Call]) -> None:
        from .runner import run_step

        run_step(calls, self.arrays, self.compiled_of, "emulator")

    def free(self) -> None:
        self.arrays = {}


class DeviceMemory:
    """Named device buffers; calls launched on the session's stream. A call's prepared launch is
    kept while the next step makes the same call (same kernel, buffers and scalars), so a step
    packs anew only the launches whose position changed."""

    def __init__(self, gpu, compiled_of: Callable):
        self.gpu, self.compiled_of = gpu, compiled_of
        self.device = gpu.name
        self.buffers: dict[str, object] = {}  # name -> DeviceBuffer
        self.params: dict[str, Param] = {}  # name -> its dtype and shape
        self.workspaces: dict[tuple[str, str], object] = {}  # (kernel, param) -> DeviceBuffer, zeroed once
        self.launches: dict[tuple, Callable[[], None]] = {}

    def allocate(self, buffer: Param) -> None:
        self.buffers[buffer.name] = self.gpu.alloc(buffer.nbytes({}))
        self.params[buffer.name] = buffer
        self.gpu.zero(self.buffers[buffer.name])

    def slice(self, name: str, index: int | None):
        """A buffer, or its slice `index` along the first axis."""
        buffer = self.buffers[name]
        if index is None:
            return buffer
        size = buffer.nbytes // self.params[name].shape[0]
        return buffer.view(index * size, size)

    def write(self, name: str, data: np.ndarray, index: int | None = None) -> None:
        target = self.slice(name, index)
        if data.nbytes != target.nbytes:
            raise PtxgenError(f"{name}{'' if index is None else f'[{index}]'}: {data.nbytes} bytes for a buffer of "
                              f"{target.nbytes}")
        self.gpu.upload(target, data)

    def read(self, name: str) -> np.ndarray:
        param = self.params[name]
        array = np.empty(param.shape, DTYPES[param.dtype].numpy)
        self.gpu.download(array, self.buffers[name])
        return array

    def free(self) -> None:
        if self.gpu.broken:  # a fault took the context, and everything in it
            return
        self.gpu.synchronize("generate")
        for buffer in [*self.buffers.values(), *self.workspaces.values()]:
            self.gpu.free(buffer, keep=False)
        self.buffers, self.workspaces, self.launches = {}, {}, {}

    def bound(self, call: Call, param: Param):
        """The buffer (or slice) `call` binds to an array parameter, checked to hold it exactly."""
        binding = call.args[param.name]
        name, index = (binding, None) if isinstance(binding, str) else binding
        view = self.slice(name, index)
        if view.nbytes != param.nbytes(call.scalars):
            raise LaunchError(f"{call.kernel.name}: {param.name} ({param.describe()}) cannot be {name}"
                              f"{'' if index is None else f'[{index}]'} ({view.nbytes} bytes)")
        return view

    def launch(self, call: Call) -> Callable[[], None]:
        compiled = self.compiled_of(call.kernel)
        buffers = {}
        for param in compiled.params:
            if not param.is_array:
                continue
            if param.name in call.args:
                buffers[param.name] = self.bound(call, param)
                continue
            key = (compiled.name, param.name)
            if key not in self.workspaces:
                self.workspaces[key] = self.gpu.alloc(param.nbytes(call.scalars))
                self.gpu.zero(self.workspaces[key])
            buffers[param.name] = self.workspaces[key]
        launch = compiled.launch(call.scalars, self.gpu.arch)
        return self.gpu.launcher(self.gpu.kernel(compiled), launch, compiled.args(buffers, call.scalars))

    def run(self, calls: list[Call]) -> None:
        launches = {}
        for call in calls:
            key = (call.kernel.name, tuple(call.args.items()), tuple(call.scalars.items()))
            queue = launches[key] = self.launches.get(key) or launches.get(key) or self.launch(call)
            queue()
        self.launches = launches


# --- the model on a backend --------------------------------------------------------------------------
@dataclass(frozen=True)
class Generation:
    prompt: list[int]
    tokens: list[int]  # the greedy continuation, ending with the stop token where one came
    logits: np.ndarray | None  # f32 [len(tokens), vocab] (row i chose tokens[i]) when kept
    decode_steps: int  # steps that fed a generated token (and made the next): all but the first token
    decode_seconds: float  # their wall-clock time: launches, kernels, the index read back
    stop: str  # why it ended: "eos" (a stop token came) or "max_new"

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_steps / self.decode_seconds if self.decode_steps else None


class Generator:
    """A model's kernels compiled, its weights in place on a backend ("device" or "emulator") and
    an empty KV cache of `max_seq_len` positions (default: the model's context length).

    `model` is a GGUFModel, or anything with its `config`, `tensor_bytes(name)` and
    `dequantize(name, rows)` (e.g. RandomModel). `progress(done, total, tensor)` is called
    after each tensor copied in. `kernels`: the step's kernels where the caller has them already
    (step_kernels: planned once); their cache length is then the cache's."""

    def __init__(self, model, backend: str = "device", max_seq_len: int | None = None, fused: bool = False,
                 progress: Callable[[int, int, str], None] | None = None, kernels: StepKernels | None = None):
        from .kernels import kind_of
        from .pipeline import compiler

        config = model.config
        self.model, self.config, self.fused = model, config, fused
        kernels = kernels or step_kernels(config, config.cache_positions(max_seq_len))
        if fused and kernels.fused_refusal:
            raise PtxgenError(f"--fused: {kernels.fused_refusal}")
        self.max_seq_len = kernels.decoder.max_seq_len
        if backend == "device":
            from .device import session

            gpu = session()
            # The attention split rule sizes its grid for this GPU's SMs (as bench does).
            kernels = replace(kernels, decoder=kernels.decoder.model_copy(update={"sm_count": gpu.sm_count}))
            self.memory = DeviceMemory(gpu, compiler((gpu.arch,)))
        elif backend == "emulator":
            self.memory = HostMemory(compiler(("sm_80",), until="ptx"))
        else:
            raise LaunchError(f"--backend: expected device or emulator, got {backend!r}")
        self.kernels = kernels
        self.decoder = kind_of(kernels.decoder)
        self.device = self.memory.device
        try:
            self._place_weights(progress or (lambda done, total, tensor: None))
        except BaseException:
            self.memory.free()
            raise

    def _buffers(self) -> list[Param]:
        """Every buffer of a step: the decoder's arrays (weights stacked by layer, the KV cache),
        its separate step's temporaries, and the head's."""
        c = self.config
        decoder = [p for p in self.decoder.params() if p.is_array and p.role != "workspace"]
        temporaries, _ = self.decoder.separate_step({"pos": 0})
        head = c.lm_head
        return [*decoder, *temporaries,
                Param("output_norm", "f32", (c.hidden,)), Param("normed", "f32", (c.hidden,)),
                Param("lm_head", "u8", (head.rows, quant_type(head.quant).row_bytes(head.k))),
                Param("logits", "f32", (c.vocab_size,)), Param("token", "u32", (1,))]

    def _place_weights(self, progress) -> None:
        """Allocate every buffer (zeroed: the KV cache starts empty) and copy the weights in, each
        matrix as the file's bytes (a view of its memory map), each norm gain as f32."""
        c = self.config
        for buffer in self._buffers():
            self.memory.allocate(buffer)
        decoder = {p.name for p in self.decoder.params()}
        slots = [(weight_slot(self.decoder.config, param, layer) if param in WEIGHTS else (param, layer),
                  f"blk.{layer}.{short}.weight") for param, short in LAYER_TENSORS.items() for layer in range(c.num_layers)]
        copies = [(param, index, tensor) for (param, index), tensor in slots if param in decoder]
        copies += [("output_norm", None, "output_norm.weight"), ("lm_head", None, c.lm_head.name)]
        if not c.tied_embeddings:  # looked up by row on the host: checked whole here
            self._check_finite("token_embd.weight", self.model.tensor_bytes("token_embd.weight"))
        for done, (buffer, layer, tensor) in enumerate(copies, 1):
            if tensor in c.quants:
                data = self.model.tensor_bytes(tensor)
            else:
                data = self.model.dequantize(tensor).astype(np.float32)
            self._check_finite(tensor, data)
            self.memory.write(buffer, data, layer)
            progress(done, len(copies), tensor)

    def _check_finite(self, tensor: str, data: np.ndarray) -> None:
        """Refuse a NaN or infinite weight (a norm gain, a block scale): the kernels would not pass
        it on faithfully (e.g. x quantised to int8 drops it), so the tokens would mean nothing."""
        quant = quant_type(self.config.quants[tensor]) if tensor in self.config.quants else None
        bad = quant.non_finite(data) if quant else int(np.count_nonzero(~np.isfinite(data)))
        if bad:
            what = "block scales" if quant and quant.block_weights > 1 else "values"
            raise PtxgenError(f"{self.config.name}: tensor {tensor!r} holds {bad} NaN or infinite {what}")

    # --- one step ------------------------------------------------------------------------------
    def layer_calls(self, pos: int) -> list[Call]:
        if self.fused:
            arrays = {p.name: p.name for p in self.decoder.params() if p.is_array and p.role != "workspace"}
            return [Call(self.kernels.decoder, arrays, {"pos": pos})]
        return self.decoder.separate_step({"pos": pos}, self.kernels.prefix)[1]

    def head_calls(self) -> list[Call]:
        k = self.kernels
        return [Call(k.norm, {"x": "x", "gamma": "output_norm", "y": "normed"}, {"rows": 1}),
                Call(k.lm_head, {"y": "logits", "w": "lm_head", "x": "normed"}, {}),
                Call(k.argmax, {"x": "logits", "index": "token"}, {})]

    def step(self, token: int, pos: int, head: bool = True) -> int | None:
        """Feed `token` at position `pos`; with `head`, return the greedy next token."""
        row = self.model.dequantize("token_embd.weight", rows=[token])[0]
        self.memory.write("x", row.astype(np.float32))
        self.memory.run(self.layer_calls(pos) + (self.head_calls() if head else []))
        return int(self.memory.read("token")[0]) if head else None

    def logits(self) -> np.ndarray:
        """The last head's logits, f32 [vocab]."""
        return self.memory.read("logits")

    # --- greedy decoding -----------------------------------------------------------------------
    def generate(self, prompt: list[int], max_new: int, keep_logits: bool = False,
                 stop_tokens: frozenset[int] = frozenset()) -> Generation:
        """Greedy decoding from an empty cache: the prompt token by token, then up to `max_new`
        tokens, each the argmax of the logits before it, ending early after one of `stop_tokens`
        (as llama.cpp ends at an end-of-generation token). Decode steps are timed on the wall clock."""
        prompt = [int(t) for t in prompt]
        check_request(self.config, self.max_seq_len, prompt, max_new)
        for pos, token in enumerate(prompt[:-1]):
            self.step(token, pos, head=False)
        generated = [self.step(prompt[-1], len(prompt) - 1)]
        rows = [self.logits()] if keep_logits else []
        seconds = 0.0
        for pos in range(len(prompt), len(prompt) + max_new - 1):
            if generated[-1] in stop_tokens:
                break
            start = time.perf_counter()
            generated.append(self.step(generated[-1], pos))
            seconds += time.perf_counter() - start
            if keep_logits:
                rows.append(self.logits())
        stop = "eos" if generated[-1] in stop_tokens else "max_new"
        return Generation(prompt, generated, np.stack(rows) if keep_logits else None, len(generated) - 1, seconds, stop)

    def close(self) -> None:
        self.memory.free()


class RandomModel:
    """A ModelConfig's tensors as random quantised weights made on demand, the same for the same
    seed and name (for benchmarks: no file). Matrices N(0, 1/k) (the embedding N(0, 1)), norm
    gains 1 + N(0, 0.1^2). The embedding is made once and kept, for its row lookups.

    With `distinct_layers=False` every layer's matrix of a name and type holds the same values
    (made once, from the first layer's seed, and kept, as are the embedding and the lm_head): a
    decode step's time does not depend on the values, and Qwen3-8B's 36 layers of random Q4_K
    then take seconds to make on a CPU instead of minutes (each layer still gets its own copy
    on the device). `kept`: where the kept values live, keyed by tensor and type (models of one
    shape and seed that differ only in some tensors' types may share it)."""

    def __init__(self, config: ModelConfig, seed: int = 0, distinct_layers: bool = True, kept: dict | None = None):
        self.config, self.seed, self.distinct_layers = config, seed, distinct_layers
        self._matrices = {m.name: m for m in config.matrices()}
        self._kept: dict[tuple[str, str], np.ndarray] = {} if kept is None else kept

    def _rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])

    def _source(self, name: str) -> str:
        """The tensor whose values `name` holds: itself, or with layers alike the first layer's
        matrix of its name and type."""
        if self.distinct_layers or not name.startswith("blk."):
            return name
        tensor, quant = name.split(".", 2)[2], self._matrices[name].quant
        first = next(l for l in range(self.config.num_layers) if self.config.quants[f"blk.{l}.{tensor}"] == quant)
        return f"blk.{first}.{tensor}"

    def tensor_bytes(self, name: str) -> np.ndarray:
        source = self._source(name)
        m = self._matrices[source]
        if (source, m.quant) in self._kept:
            return self._kept[source, m.quant]
        data = quant_type(m.quant).random_weights(self._rng(source), m.rows, m.k,
                                                  1.0 if m.short == "token_embd" else m.k ** -0.5)
        if source == "token_embd.weight" or not self.distinct_layers:
            self._kept[source, m.quant] = data
        return data

    def dequantize(self, name: str, rows=None) -> np.ndarray:
        if name in self._matrices:
            packed = self.tensor_bytes(name)
            quant = quant_type(self._matrices[name].quant)
            return quant.dequantize_f64(packed if rows is None else packed[np.asarray(rows)])
        size = self.config.head_dim if name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")) else self.config.hidden
        return 1.0 + 0.1 * self._rng(name).standard_normal(size)


# --- whole-model decode speed (make bench) -------------------------------------------------------------
QWEN3_8B = dict(name="qwen3-8b", architecture="qwen3", num_layers=36, hidden=4096, intermediate=12288, num_heads=32,
                num_kv_heads=8, head_dim=128, rope_theta=1e6, eps=1e-6, context_length=40960, vocab_size=151936,
                tied_embeddings=False)


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M rule (use_more_bits): the first and last eighth of the layers and every
    third one between them keep attn_v and ffn_down in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m_types(shape: dict) -> dict[str, str]:
    """Weight types as llama.cpp's Q4_K_M file stores them: Q4_K, with output.weight and the
    more_bits layers' attn_v and ffn_down Q6_K."""
    layers = shape["num_layers"]
    types = {name: "q4_k" for name in matrix_names(layers, shape["tied_embeddings"])}
    types.update({f"blk.{l}.{short}.weight": "q6_k" for l in range(layers) if more_bits(l, layers)
                  for short in ("attn_v", "ffn_down")})
    if not shape["tied_embeddings"]:
        types["output.weight"] = "q6_k"
    return types


def decode_speed(generator: Generator, token: int, tokens: int) -> dict[str, float]:
    """Wall-clock tokens/s of `tokens` greedy steps from an empty cache, starting at `token`: with
    the head (final norm, lm_head, argmax, the token read back) and without it (the layers, then
    x read back), both the way a batch-1 decode loop runs them."""
    with_head = generator.generate([token], tokens + 1)
    start = time.perf_counter()
    for pos in range(tokens + 1, 2 * tokens + 1):
        generator.step(token, pos, head=False)
        generator.memory.read("x")
    return {"tokens_per_s": with_head.tokens_per_s, "layers_tokens_per_s": tokens / (time.perf_counter() - start)}


# Issue 12's step: Qwen3-8B at pos 4095 (4096 keys of attention a layer).
STEP_POS = 4095
# The benchmarks' whole-model rows, most wanted first: (fused, lm_head type; None: Q4_K_M's Q6_K).
# Issue 12 names a Q4_K lm_head (151936 x 4096 rows), a Q4_K_M file stores a Q6_K one.
WHOLE_MODEL_PATHS = ((True, None), (True, "q4_k"), (False, None))
STEP_ITERS = 50


def step_speed(generator: Generator, pos: int, iters: int = STEP_ITERS) -> dict:
    """The step at `pos` on the GPU's clock, as bench times a kernel per run (CUDA events around
    each step, its launches queued ahead: device.DeviceSession.time), medians in µs: the layers,
    and the layers with the head (final norm, lm_head, argmax). The cache rows before `pos` hold
    whatever is there (zeros in a fresh Generator): the time does not depend on them."""
    gpu, figures = generator.memory.gpu, {"pos": pos, "host_bound": False}
    for label, calls in (("step_us", generator.layer_calls(pos) + generator.head_calls()),
                         ("layers_us", generator.layer_calls(pos))):
        timing = gpu.time(lambda i, calls=calls: generator.memory.run(calls), iters)
        figures[label] = float(np.median(timing.times))
        figures["host_bound"] |= timing.host_bound
    figures["head_us"] = figures["step_us"] - figures["layers_us"]
    return figures


@functools.lru_cache(maxsize=1)
def alike_weights(shape_json: str, seed: int) -> dict:
    """The values random_model's models of one shape and seed keep, shared between them (the
    fused and the separate path, either lm_head type): made once a process."""
    return {}


def random_model(shape: dict, seed: int, lm_head: str | None = None) -> RandomModel:
    """The benchmark's model of a shape (e.g. QWEN3_8B) with Q4_K_M-like weights (q4_k_m_types),
    every layer alike, or with `lm_head` (a type such as q4_k) for output.weight."""
    quants = q4_k_m_types(shape)
    if lm_head is not None:
        if "output.weight" not in quants or lm_head not in GEMV_KINDS:
            raise PtxgenError(f"whole-model decode: lm_head {lm_head!r}: expected one of {', '.join(GEMV_KINDS)} for a "
                              "model with its own output.weight")
        quants["output.weight"] = lm_head
    return RandomModel(ModelConfig(**shape, quants=quants), seed, distinct_layers=False,
                       kept=alike_weights(json.dumps(shape, sort_keys=True), seed))


def random_model_decode_speed(shape: dict, fused: bool, tokens: int = 32, seed: int = 0, pos: int = STEP_POS,
                              lm_head: str | None = None) -> dict:
    """decode_speed and step_speed at `pos` of a random model of `shape` on this process's GPU (a
    device-worker call for make bench): the separate kernels, or with `fused` the persistent decoder;
    the lm_head Q4_K_M's type (Q6_K), or `lm_head`'s."""
    context = shape["context_length"]
    if not (1 <= tokens and 2 * tokens + 2 <= context and 0 <= pos < context):
        raise PtxgenError(f"whole-model decode: tokens {tokens} and pos {pos} do not fit {shape['name']}'s context of "
                          f"{context} positions (tokens >= 1, 2 * tokens + 2 <= {context}, 0 <= pos < {context})")
    model = random_model(shape, seed, lm_head)
    generator = Generator(model, "device", max_seq_len=max(2 * tokens + 2, pos + 1), fused=fused)
    try:
        return {"model": shape["name"], "layers": "persistent_decoder" if fused else "separate kernels",
                "weights": "Q4_K_M-like layers, all alike", "lm_head": model.config.lm_head.quant.upper(),
                "device": generator.device, "tokens": tokens, **decode_speed(generator, 1, tokens),
                **step_speed(generator, pos)}
    finally:
        generator.close()
