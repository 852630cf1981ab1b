"""Read a GGUF model file: its config from the metadata, its tensors as memory-mapped views.

Nothing is copied on open: gguf-py maps the file, and ``GGUFModel.tensor_bytes`` hands out
numpy views of the mapped bytes (a 5 GB file costs 5 GB of address space, not of memory).
Architectures qwen3 and llama are understood; anything else, an unsupported tensor type or a
tensor the model would not use is refused with a PtxgenError naming it.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import PtxgenError
from .model_config import ARCHITECTURES, LAYER_MATRICES, ModelConfig, matrix_names
from .quants import Q4_K, QuantType, quant_type

_ABSENT = object()
# The ModelConfig field each metadata key (after the architecture's "<arch>.") gives.
CONFIG_KEYS = {"num_layers": "block_count", "hidden": "embedding_length", "intermediate": "feed_forward_length",
               "num_heads": "attention.head_count", "num_kv_heads": "attention.head_count_kv",
               "head_dim": "attention.key_length", "rope_theta": "rope.freq_base",
               "eps": "attention.layer_norm_rms_epsilon", "context_length": "context_length", "vocab_size": "vocab_size"}


def open_gguf_reader(path: Path):
    """gguf-py's reader over a memory map of `path`; PtxgenError for a missing or bad file (a
    header count or length past its end included), a big-endian one, or one whose tensors' data
    are misplaced (outside the file, overlapping, off the file's alignment)."""
    import gguf

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise PtxgenError(f"{path}: cannot read GGUF file: not a regular file")
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            check_header(path, data)
        with np.errstate(over="ignore"):  # a damaged tensor offset wraps: found below, not warned about
            reader = gguf.GGUFReader(path, "r")
    except OSError as error:
        raise PtxgenError(f"{path}: cannot read GGUF file: {error.strerror or error}") from None
    except (ValueError, KeyError, IndexError) as error:
        # gguf-py reads the header, metadata and tensor table as numpy views of the map: a file cut
        # short or damaged shows as numpy's view, reshape or index errors.
        raise PtxgenError(f"{path}: not a readable GGUF file (truncated or damaged?): {error}") from None
    check_tensor_data(path, reader)
    return reader


# Bytes of each fixed-size GGUF value type (gguf.GGUFValueType's numbers); 8 and 9 are string and array.
_VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def check_header(path: Path, data) -> None:
    """Walk a little-endian GGUF v2/v3 header (metadata, tensor table) and refuse any count or
    length the rest of the file cannot hold: gguf-py loops over a damaged array count of 10^12
    building empty views until memory runs out."""
    pos = 4

    def room(nbytes: int, what: str) -> None:
        if nbytes > len(data) - pos:
            raise PtxgenError(f"{path}: not a readable GGUF file ({what} past the file's end)")

    def skip(nbytes: int, what: str) -> int:
        """Step over `nbytes` bytes; the offset they start at."""
        nonlocal pos
        room(nbytes, what)
        pos += nbytes
        return pos - nbytes

    def number(fmt: str, what: str) -> int:
        return struct.unpack_from(fmt, data, skip(struct.calcsize(fmt), what))[0]

    def string(what: str) -> str:
        size = number("<Q", what)
        return data[skip(size, f"{what}: string of {size} bytes"):pos].decode("utf-8", errors="replace")

    def value(kind: int, what: str) -> None:
        if kind == _STRING:
            string(what)
        elif kind == _ARRAY:
            kind, count = number("<I", what), number("<Q", what)
            # a string takes 8 bytes at least (its length)
            room(count * _VALUE_BYTES.get(kind, 8), f"{what}: array of {count} entries")
            if kind in _VALUE_BYTES:
                skip(count * _VALUE_BYTES[kind], what)
            elif kind == _STRING:
                for _ in range(count):
                    string(what)
            else:  # as llama.cpp: no arrays of arrays (gguf-py would recurse a level for each)
                raise PtxgenError(f"{path}: not a readable GGUF file ({what}: an array of value type {kind}, "
                                  "not of numbers, booleans or strings)")
        elif kind in _VALUE_BYTES:
            skip(_VALUE_BYTES[kind], what)
        else:
            raise PtxgenError(f"{path}: not a readable GGUF file ({what}: unknown value type {kind})")

    if len(data) < 8 or data[:4] != b"GGUF":
        raise PtxgenError(f"{path}: not a readable GGUF file (no GGUF magic)")
    version = number("<I", "version")
    if not version & 0xFFFF:  # gguf-py's test: a version written the other way round
        raise PtxgenError(f"{path}: a big-endian GGUF file: not supported (its tensors would be read byte-swapped)")
    if version not in (2, 3):
        raise PtxgenError(f"{path}: not a readable GGUF file (version {version}; versions 2 and 3 are supported)")
    tensors, entries = number("<Q", "tensor count"), number("<Q", "metadata count")
    room(entries * 13, f"{entries} metadata entries")  # key length, type, one byte of value at least
    for _ in range(entries):
        key = f"metadata key {string('metadata key')!r}"
        value(number("<I", key), key)
    room(tensors * 24, f"{tensors} tensors")  # name length, dimension count, type, data offset at least
    for _ in range(tensors):
        name = f"tensor {string('tensor name')!r}"
        dims = number("<I", name)
        skip(dims * 8 + 12, f"{name}: {dims} dimensions")  # then its type and data offset


def check_tensor_data(path, reader) -> None:
    """Each tensor's data lies inside the file's data section, starts on its alignment, and
    overlaps no other tensor's (as llama.cpp's loader requires)."""
    size = len(reader.data) - reader.data_offset
    end, previous = 0, None
    for offset, nbytes, name in sorted((int(t.field.parts[-1][0]), int(t.n_bytes), t.name) for t in reader.tensors):
        if offset % reader.alignment or offset < end or offset + nbytes > size:
            why = (f"not a multiple of the alignment {reader.alignment}" if offset % reader.alignment
                   else f"overlaps tensor {previous!r}" if offset < end
                   else f"runs past the end of the file ({size} bytes of data)")
            raise PtxgenError(f"{path}: tensor {name!r}: data offset {offset} ({nbytes} bytes) {why}: damaged file?")
        end, previous = offset + nbytes, name


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: (rows, k) for a matrix, (k,) for a vector
    quant: QuantType

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1], dtype=np.int64))

    @property
    def k(self) -> int:
        return self.shape[-1]


class GGUFModel:
    """A qwen3 or llama GGUF file: `config` (ModelConfig) and `tensors` (name -> TensorInfo)."""

    def __init__(self, path):
        self.path = Path(path)
        self.reader = open_gguf_reader(self.path)
        self._data = {}
        self.tensors: dict[str, TensorInfo] = {}
        unknown = []  # (tensor, the refusal), every one named in one message
        for tensor in self.reader.tensors:
            try:
                quant = quant_type(int(tensor.tensor_type))
            except PtxgenError as error:
                unknown.append((tensor.name, str(error)))
                continue
            dims = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists fastest first
            self.tensors[tensor.name] = TensorInfo(tensor.name, dims, quant)
            self._data[tensor.name] = tensor.data
        if unknown:
            more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
            names = ", ".join(repr(name) for name, _ in unknown[:3])
            raise PtxgenError(f"{self.path}: tensor{'s' if len(unknown) > 1 else ''} {names}{more}: {unknown[0][1]}")
        self.config = self._read_config()
        self._check_tensors()

    # --- metadata ------------------------------------------------------------------------------
    def metadata(self, key: str, default=_ABSENT):
        """A metadata value: int, float, bool or str, or a list of them; `default` if absent."""
        import gguf

        field = self.reader.fields.get(key)
        if field is None:
            if default is _ABSENT:
                raise PtxgenError(f"{self.path}: metadata key {key!r} is missing")
            return default
        kinds = field.types

        def value(index: int):
            part = field.parts[index]
            if kinds[-1] == gguf.GGUFValueType.STRING:
                return bytes(part).decode("utf-8", errors="replace")
            if part.dtype == np.float32:
                return float(str(part[0]))  # the shortest decimal of the f32: 1e-06, not 9.99999997e-07
            return part.tolist()[0]

        if kinds[0] == gguf.GGUFValueType.ARRAY:
            return [value(index) for index in field.data]
        return value(field.data[0])

    def _number(self, key: str, kind: type, default=_ABSENT):
        value = self.metadata(key, default)
        if isinstance(value, list) and value:
            if any(v != value[0] for v in value):
                raise PtxgenError(f"{self.path}: metadata {key!r} varies by layer ({value}): not supported")
            value = value[0]  # a per-layer array with one value for all layers
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise PtxgenError(f"{self.path}: metadata {key!r} must be {'an integer' if kind is int else 'a number'}, "
                              f"got {value!r}")
        return kind(value)

    def _read_config(self) -> ModelConfig:
        arch = self.metadata("general.architecture")
        if arch not in ARCHITECTURES:
            raise PtxgenError(f"{self.path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")

        def key(name: str) -> str:
            return f"{arch}.{name}"

        def number(field: str, kind: type, default=_ABSENT):
            """The metadata value of ModelConfig's `field` (CONFIG_KEYS)."""
            return self._number(key(CONFIG_KEYS[field]), kind, default)

        hidden = number("hidden", int)
        heads = number("num_heads", int)
        if key("attention.key_length") not in self.reader.fields and heads > 0 and hidden % heads:
            raise PtxgenError(f"{self.path}: metadata {key('embedding_length')!r} = {hidden} is not a multiple of "
                              f"{key('attention.head_count')!r} = {heads}, and {key('attention.key_length')!r} "
                              "(the head size) is absent")
        head_dim = number("head_dim", int, hidden // heads if heads else 0)
        if self._number(key("attention.value_length"), int, head_dim) != head_dim:
            raise PtxgenError(f"{self.path}: {key('attention.value_length')} differs from the key length "
                              f"{head_dim}: not supported")
        if self._number(key("rope.dimension_count"), int, head_dim) != head_dim:
            raise PtxgenError(f"{self.path}: {key('rope.dimension_count')} = "
                              f"{self.metadata(key('rope.dimension_count'))} rotates part of a head "
                              f"(head_dim {head_dim}): not supported")
        for scaling in ("rope.scaling.factor", "rope.scale_linear"):
            if self._number(key(scaling), float, 0.0) not in (0.0, 1.0):
                raise PtxgenError(f"{self.path}: {key(scaling)} = {self.metadata(key(scaling))}: "
                                  "rope scaling is not supported")
        if "rope_freqs.weight" in self.tensors:
            raise PtxgenError(f"{self.path}: tensor 'rope_freqs.weight' (per-frequency rope factors, "
                              "as Llama 3.1 files carry) is not supported")
        # As llama.cpp: the vocabulary is vocab_size, else the tokenizer's token count.
        tokens = self.reader.fields.get("tokenizer.ggml.tokens")
        embedding = self.tensors.get("token_embd.weight")
        vocab = len(tokens.data) if tokens else embedding.shape[0] if embedding else 0
        tied = "output.weight" not in self.tensors
        layers = number("num_layers", int)
        if layers * len(LAYER_MATRICES) > len(self.tensors):
            raise PtxgenError(f"{self.path}: metadata {key('block_count')!r} says {layers} layers, but the file holds "
                              f"{len(self.tensors)} tensors ({len(LAYER_MATRICES)} matrices a layer at least)")
        names = matrix_names(layers, tied) if layers > 0 else []
        missing = [name for name in names if name not in self.tensors]
        if missing:
            raise PtxgenError(f"{self.path}: missing tensor {missing[0]!r}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        # llama.cpp's defaults for absent keys
        values = dict(num_layers=layers, hidden=hidden, intermediate=number("intermediate", int), num_heads=heads,
                      num_kv_heads=number("num_kv_heads", int, heads), head_dim=head_dim,
                      rope_theta=number("rope_theta", float, 10000.0), eps=number("eps", float),
                      context_length=number("context_length", int), vocab_size=number("vocab_size", int, vocab))
        origin = {field: f"metadata {key(short)!r}" for field, short in CONFIG_KEYS.items()
                  if key(short) in self.reader.fields}
        if "head_dim" not in origin:
            origin["head_dim"] = f"{key('embedding_length')} / {key('attention.head_count')}"
        if "vocab_size" not in origin:
            origin["vocab_size"] = "the tokenizer's tokens" if tokens else "token_embd.weight's rows"
        try:
            return ModelConfig(name=str(self.metadata("general.name", "") or self.path.stem), architecture=arch,
                               tied_embeddings=tied, quants={name: self.tensors[name].quant.name for name in names},
                               origin=origin, **values)
        except PtxgenError as error:  # ModelConfig's refusals name the field and its origin, not the file
            raise PtxgenError(f"{self.path}: {error}") from None

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a model of this config reads, with its shape (numpy order)."""
        c = self.config
        shapes = {m.name: (m.rows, m.k) for m in c.matrices()}
        shapes["output_norm.weight"] = (c.hidden,)
        for layer in range(c.num_layers):
            shapes[f"blk.{layer}.attn_norm.weight"] = (c.hidden,)
            shapes[f"blk.{layer}.ffn_norm.weight"] = (c.hidden,)
            if c.qk_norm:
                shapes[f"blk.{layer}.attn_q_norm.weight"] = (c.head_dim,)
                shapes[f"blk.{layer}.attn_k_norm.weight"] = (c.head_dim,)
        return shapes

    def _check_tensors(self) -> None:
        expected = self.expected_shapes()
        for name, shape in expected.items():
            if name not in self.tensors:
                raise PtxgenError(f"{self.path}: missing tensor {name!r} ({self.config.architecture} needs it)")
            found = self.tensors[name].shape
            if found != shape:
                raise PtxgenError(f"{self.path}: tensor {name!r} has shape {list(found)}, expected {list(shape)} "
                                  f"for this {self.config.architecture} model")
        unused = sorted(set(self.tensors) - set(expected))
        if unused:
            raise PtxgenError(f"{self.path}: tensor {unused[0]!r} is not part of a {self.config.architecture} model "
                              f"as ptxgen runs it" + (f" (nor are {len(unused) - 1} more)" if len(unused) > 1 else "")
                              + "; refusing rather than ignoring it")

    # --- tensors -------------------------------------------------------------------------------
    def tensor_bytes(self, name: str) -> np.ndarray:
        """The tensor as u8 [rows, row bytes]: a read-only view of the mapped file, no copy."""
        info = self.info(name)
        return np.asarray(self._data[name]).view(np.uint8).reshape(info.rows, info.quant.row_bytes(info.k))

    def info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise PtxgenError(f"{self.path}: no tensor named {name!r}")
        return self.tensors[name]

    def dequantize(self, name: str, rows=None) -> np.ndarray:
        """Float64 values of a tensor (gguf-py's dequantisation), in its numpy shape; with `rows`
        (indices), only those rows of a matrix, dequantised from their own bytes."""
        info = self.info(name)
        packed = self.tensor_bytes(name)
        if rows is None:
            return info.quant.dequantize_f64(packed).reshape(info.shape)
        return info.quant.dequantize_f64(packed[np.asarray(rows)])


def load_gguf_tensor(path, tensor_name: str, n: int, k: int, quant: QuantType = Q4_K) -> np.ndarray:
    """The `quant` tensor `tensor_name` of a GGUF file as u8 [n, row_bytes(k)] (a copy, in memory).

    GGUF lists dimensions fastest first, so a weight of n rows of k is stored as [k, n].
    Raises PtxgenError naming the file, the tensor and what was expected for a missing or
    unreadable file, a missing tensor, a tensor of another type, or another shape.
    """
    path = Path(path)
    expected_bytes = quant.row_bytes(k)  # also rejects k that is not a multiple of the block
    reader = open_gguf_reader(path)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    if tensor_name not in tensors:
        names = sorted(tensors)
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        raise PtxgenError(f"{path}: no tensor named {tensor_name!r} (tensors: {shown or 'none'})")
    tensor = tensors[tensor_name]
    if tensor.tensor_type.name != quant.ggml_name:
        raise PtxgenError(f"{path}: tensor {tensor_name!r} is {tensor.tensor_type.name}, expected {quant.ggml_name}")
    dims = [int(d) for d in tensor.shape]  # fastest first: [k, n]
    while len(dims) > 2 and dims[-1] == 1:
        dims.pop()
    if dims != [k, n] and not (n == 1 and dims == [k]):
        shown = "[" + ", ".join(str(d) for d in reversed(dims)) + "]"
        raise PtxgenError(
            f"{path}: tensor {tensor_name!r} has shape {shown} (rows, weights per row), "
            f"expected [{n}, {k}] for this kernel"
        )
    data = np.asarray(tensor.data).view(np.uint8).reshape(n, expected_bytes)
    return np.array(data, copy=True)
