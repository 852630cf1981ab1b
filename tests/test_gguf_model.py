"""GGUF model files: the tiny fixture's bytes, its config read back, memory-mapped tensors, and one
clear error for each thing ptxgen cannot run."""

import hashlib
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest
from fixtures.make_tiny_gguf import rewrite_gguf, tiny_config, write_tiny_gguf

from ptxgen.errors import PtxgenError
from ptxgen.gguf_model import GGUFModel
from ptxgen.quants import QUANT_TYPES

V = gguf.GGUFValueType


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "qwen3.gguf")


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fixture_bytes_are_deterministic(tmp_path, qwen3):
    again = write_tiny_gguf(tmp_path / "again.gguf")
    assert digest(again) == digest(qwen3)
    assert digest(write_tiny_gguf(tmp_path / "seed1.gguf", seed=1)) != digest(qwen3)


@pytest.mark.parametrize("arch, tied, quant", [("qwen3", False, None), ("llama", False, None),
                                               ("qwen3", True, None), ("llama", True, "q8_0")])
def test_config_read_back(tmp_path, arch, tied, quant):
    model = GGUFModel(write_tiny_gguf(tmp_path / "m.gguf", arch, tied=tied, quant=quant))
    assert model.config == tiny_config(arch, tied, quant)
    c = model.config
    assert c.q_dim == 512 != c.hidden, "head_dim comes from key_length, not hidden / heads"
    assert c.rope_style == {"qwen3": "rotate_half", "llama": "interleaved"}[arch]
    assert c.qk_norm == (arch == "qwen3")
    assert c.lm_head.name == ("token_embd.weight" if tied else "output.weight")
    types = {t.quant.name for t in model.tensors.values()}
    assert types == ({quant or "q4_k", "f32"} if quant else {"q4_k", "q6_k", "q8_0", "f32"})


def test_tensors_are_views_of_the_mapped_file(qwen3):
    model = GGUFModel(qwen3)
    for name, info in model.tensors.items():
        view = model.tensor_bytes(name)
        assert view.dtype == np.uint8 and view.shape == (info.rows, info.quant.row_bytes(info.k))
        assert np.shares_memory(view, model.reader.data), f"{name} was copied"
        assert not view.flags.writeable
    w = model.tensor_bytes("blk.0.attn_v.weight")
    assert model.tensors["blk.0.attn_v.weight"].shape == (256, 256) and w.shape == (256, 256 // 256 * 210)
    reader_tensor = next(t for t in gguf.GGUFReader(qwen3).tensors if t.name == "blk.0.attn_v.weight")
    np.testing.assert_array_equal(model.dequantize("blk.0.attn_v.weight"),
                                  gguf.quants.dequantize(reader_tensor.data, reader_tensor.tensor_type))
    rows = model.dequantize("token_embd.weight", rows=[7, 3])
    np.testing.assert_array_equal(rows, model.dequantize("token_embd.weight")[[7, 3]])
    assert model.dequantize("output_norm.weight").shape == (256,)


def test_metadata_values(qwen3):
    model = GGUFModel(qwen3)
    assert model.metadata("tokenizer.ggml.model") == "gpt2"
    assert model.metadata("qwen3.attention.layer_norm_rms_epsilon") == 1e-6  # the f32's shortest decimal
    assert len(model.metadata("tokenizer.ggml.tokens")) == 1000
    assert model.metadata("no.such.key", None) is None
    with pytest.raises(PtxgenError, match="metadata key 'no.such.key' is missing"):
        model.metadata("no.such.key")


# --- files ptxgen refuses ----------------------------------------------------------------------
BAD_FILES = [
    (dict(arch="gpt2"), r"architecture 'gpt2' is not supported \(supported: qwen3, llama\)"),
    (dict(drop_tensors=["blk.1.ffn_up.weight"]), r"missing tensor 'blk\.1\.ffn_up\.weight'"),
    (dict(drop_tensors=["blk.0.attn_k_norm.weight"]), r"missing tensor 'blk\.0\.attn_k_norm\.weight' \(qwen3 needs it\)"),
    (dict(drop_fields=["qwen3.block_count"]), r"metadata key 'qwen3\.block_count' is missing"),
    (dict(drop_fields=["qwen3.embedding_length"], set_fields=[("qwen3.embedding_length", "256", V.STRING)]),
     r"metadata 'qwen3\.embedding_length' must be an integer, got '256'"),
    (dict(drop_fields=["qwen3.attention.head_count_kv"],
          set_fields=[("qwen3.attention.head_count_kv", [2, 1], V.ARRAY)]), r"head_count_kv' varies by layer"),
    (dict(set_fields=[("qwen3.rope.scaling.factor", 4.0, V.FLOAT32)]), "rope scaling is not supported"),
    (dict(drop_fields=["qwen3.rope.dimension_count"], set_fields=[("qwen3.rope.dimension_count", 64, V.UINT32)]),
     "rotates part of a head"),
    (dict(add_tensors=[("rope_freqs.weight", np.ones(64, np.float32), None)]), "'rope_freqs.weight'"),
    (dict(add_tensors=[("blk.0.attn_q.bias", np.ones(512, np.float32), None)]),
     r"tensor 'blk\.0\.attn_q\.bias' is not part of a qwen3 model .*refusing rather than ignoring it"),
    (dict(drop_tensors=["blk.0.ffn_gate.weight"],
          add_tensors=[("blk.0.ffn_gate.weight", np.zeros((512, 256 // 256 * 176), np.uint8),
                        gguf.GGMLQuantizationType.Q5_K)]),
     r"tensor 'blk\.0\.ffn_gate\.weight': unsupported tensor type Q5_K"),
    (dict(drop_tensors=["blk.0.ffn_gate.weight", "blk.1.ffn_up.weight"],  # every such tensor named in one message
          add_tensors=[(name, np.zeros((512, 176), np.uint8), gguf.GGMLQuantizationType.Q5_K)
                       for name in ("blk.0.ffn_gate.weight", "blk.1.ffn_up.weight")]),
     r"tensors 'blk\.0\.ffn_gate\.weight', 'blk\.1\.ffn_up\.weight': unsupported tensor type Q5_K"),
    (dict(drop_tensors=["blk.1.attn_norm.weight"], add_tensors=[("blk.1.attn_norm.weight", np.ones(128, np.float32), None)]),
     r"tensor 'blk\.1\.attn_norm\.weight' has shape \[128\], expected \[256\]"),
    (dict(drop_tensors=["output.weight"],
          add_tensors=[("output.weight", QUANT_TYPES["q6_k"].random_weights(np.random.default_rng(0), 999, 256),
                        gguf.GGMLQuantizationType.Q6_K)]),
     r"tensor 'output\.weight' has shape \[999, 256\], expected \[1000, 256\]"),
    # metadata refusals name the key, before any work that scales with it
    (dict(drop_fields=["qwen3.block_count"], set_fields=[("qwen3.block_count", 4_000_000_000, V.UINT32)]),
     r"metadata 'qwen3\.block_count' says 4000000000 layers, but the file holds \d+ tensors"),
    (dict(drop_fields=["qwen3.attention.head_count_kv"], set_fields=[("qwen3.attention.head_count_kv", -2, V.INT32)]),
     r"num_kv_heads \(metadata 'qwen3\.attention\.head_count_kv'\) must be a positive integer, got -2"),
    (dict(drop_fields=["qwen3.attention.layer_norm_rms_epsilon"],
          set_fields=[("qwen3.attention.layer_norm_rms_epsilon", float("nan"), V.FLOAT32)]),
     r"eps \(metadata 'qwen3\.attention\.layer_norm_rms_epsilon'\) must be in \(0, 1\), got nan"),
    (dict(drop_fields=[f"qwen3.{key}" for key in ("attention.head_count", "attention.head_count_kv",
                                                   "attention.key_length", "attention.value_length",
                                                   "rope.dimension_count")],
          set_fields=[("qwen3.attention.head_count", 5, V.UINT32), ("qwen3.attention.head_count_kv", 5, V.UINT32)]),
     r"metadata 'qwen3\.embedding_length' = 256 is not a multiple of 'qwen3\.attention\.head_count' = 5, and "
     r"'qwen3\.attention\.key_length' \(the head size\) is absent"),
    (dict(big_endian=True), r"a big-endian GGUF file: not supported"),
]


@pytest.mark.parametrize("edits, message", BAD_FILES)
def test_unsupported_files_are_refused_by_name(tmp_path, qwen3, edits, message):
    bad = rewrite_gguf(qwen3, tmp_path / "bad.gguf", **edits)
    with pytest.raises(PtxgenError, match=message) as error:
        GGUFModel(bad)
    assert str(bad) in str(error.value)


@pytest.mark.parametrize("offset, why", [
    (lambda offset: offset + 32, r"overlaps tensor 'blk\.1\.ffn_norm\.weight'"),
    (lambda offset: offset + 1, r"not a multiple of the alignment 32"),
    (lambda offset: 2**64 - 32, r"runs past the end of the file"),
])
def test_tensor_data_offsets_are_checked(tmp_path, qwen3, offset, why, recwarn):
    """A damaged tensor table (data offsets that overlap, are misaligned or wrap past 2^64) is
    refused by name, as llama.cpp's loader does, not read from the wrong bytes."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(qwen3.read_bytes())
    reader = gguf.GGUFReader(bad, "r+")
    tensor = next(t for t in reader.tensors if t.name == "blk.1.ffn_norm.weight")
    tensor.field.parts[-1][0] = offset(int(tensor.field.parts[-1][0]))
    reader.data.flush()
    del reader
    with pytest.raises(PtxgenError, match=r"bad\.gguf: tensor '[^']+': data offset \d+ \(\d+ bytes\) (" + why + ")"):
        GGUFModel(bad)
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)], "no numpy overflow warning"


def test_unreadable_files(tmp_path):
    with pytest.raises(PtxgenError, match=r"\.gguf: cannot read GGUF file: File name too long"):
        GGUFModel(tmp_path / ("a" * 300 + ".gguf"))
    with pytest.raises(PtxgenError, match=r"missing\.gguf: cannot read GGUF file"):
        GGUFModel(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF but not really" * 8)
    with pytest.raises(PtxgenError, match=r"junk\.gguf: not a readable GGUF file"):
        GGUFModel(junk)


def damaged(src, dst, key: str, part: int, fmt: str, value: int):
    """A copy of GGUF `src` with part `part` of metadata `key` (or of tensor `key`'s table entry)
    overwritten by `value` packed as `fmt`."""
    reader = gguf.GGUFReader(src)
    field = reader.fields.get(key) or next(t.field for t in reader.tensors if t.name == key)
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, field.offset + sum(int(p.nbytes) for p in field.parts[:part]), value)
    dst.write_bytes(data)
    return dst


@pytest.mark.parametrize("key, part, fmt, value, message", [
    ("GGUF.kv_count", 0, "<Q", 2**40, r"1099511627776 metadata entries past the file's end"),
    ("GGUF.tensor_count", 0, "<Q", 10**9, r"1000000000 tensors past the file's end"),
    ("general.name", 0, "<Q", 2**62, r"metadata key: string of 4611686018427387904 bytes past the file's end"),
    ("general.name", 3, "<Q", 2**62, r"metadata key 'general\.name': string of 4611686018427387904 bytes past"),
    ("tokenizer.ggml.tokens", 4, "<Q", 2**63, r"metadata key 'tokenizer\.ggml\.tokens': array of "
                                               r"9223372036854775808 entries past the file's end"),
    ("general.name", 2, "<I", 99, r"metadata key 'general\.name': unknown value type 99"),
    ("tokenizer.ggml.token_type", 3, "<I", 9, r"metadata key 'tokenizer\.ggml\.token_type': an array of value type 9, "
                                              r"not of numbers, booleans or strings"),
    ("blk.0.attn_q.weight", 2, "<I", 2**31, r"tensor 'blk\.0\.attn_q\.weight': 2147483648 dimensions past the "
                                            r"file's end"),
])
def test_header_counts_past_the_end_are_refused_by_name(tmp_path, qwen3, key, part, fmt, value, message):
    """Every count and length of the header is checked against the bytes left, before gguf-py reads it."""
    bad = damaged(qwen3, tmp_path / "bad.gguf", key, part, fmt, value)
    with pytest.raises(PtxgenError, match=rf"bad\.gguf: not a readable GGUF file \({message}"):
        GGUFModel(bad)


@pytest.mark.parametrize("command", [
    ["spec", "from-gguf", "{gguf}"],
    ["generate", "{gguf}", "--tokens", "1", "--backend", "emulator"],
    ["run", "proj", "--spec", "{dir}/spec.toml", "--inputs", "{dir}/in.npz", "--outputs", "{dir}/out.npz",
     "--backend", "emulator", "--gguf", "{gguf}", "--tensor", "blk.0.attn_q.weight"],
])
def test_a_damaged_array_count_fails_fast(tmp_path, qwen3, command):
    """gguf-py builds an empty view for each entry of an array count past the file's end: with
    2^40 entries it segfaulted at 4 GiB after 24 s. Every command that opens a GGUF file refuses
    it at once instead, in a subprocess held to 4 GiB of address space and 60 s."""
    import resource

    bad = damaged(qwen3, tmp_path / "bad.gguf", "tokenizer.ggml.token_type", 4, "<Q", 2**40)
    (tmp_path / "spec.toml").write_text('[[kernels]]\nname = "proj"\nkind = "q4k_gemv"\nn = 512\nk = 256\n')
    np.savez(tmp_path / "in.npz", x=np.zeros(256, np.float32))
    args = [arg.format(gguf=bad, dir=tmp_path) for arg in command]

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    result = subprocess.run([sys.executable, "-m", "ptxgen.cli", *args], capture_output=True, text=True,
                            timeout=60, preexec_fn=limit_memory)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr == (f"error: {bad}: not a readable GGUF file (metadata key 'tokenizer.ggml.token_type': "
                             "array of 1099511627776 entries past the file's end)\n")
    assert not (tmp_path / "out.npz").exists()
