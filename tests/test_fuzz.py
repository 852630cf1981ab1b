"""Fuzz the two files a user hands ptxgen, spec files (TOML, YAML) and `run`'s .npz inputs, and the
`--tune` options of show and bench.

Whatever the bytes, the CLI ends with exit 0, 1 or 2 and, on a refusal, a short message naming
the file; never a traceback (an exception escaping ptxgen.cli.main), a hang or a half-written
output. The calls go through the CLI's own entry point in-process (helpers.run_cli_in_process);
a few subprocess runs at the end prove the installed `ptxgen` command behaves the same.

Examples are derandomized so CI is repeatable; PTXGEN_FUZZ_SCALE=10 runs ten times as many
(and hypothesis's database keeps any failure it finds for the next run).
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import string
import struct
import subprocess
import sys
import typing
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings, strategies as st
from hypothesis.control import currently_in_test_context

from ptxgen.errors import PtxgenError
from ptxgen.kernels import KINDS
from ptxgen.pipeline import compile_spec
from ptxgen.spec import load_spec

from helpers import ROOT, SPECS, TUNE_SPEC, run_cli_in_process

SCALE = int(os.environ.get("PTXGEN_FUZZ_SCALE", "1"))
MAX_MESSAGE_LINES = 21  # spec.MAX_ERROR_LINES problems and the "... and N more" line
MAX_LINE = 1200  # path, kernel, field, message and an echo of at most a few hundred characters


def fuzz_settings(examples: int):
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=SCALE == 1,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- the checks every run must pass ------------------------------------------------------------------
def check_validate(path: Path):
    """`ptxgen validate PATH`: 0 with a valid spec, else 2 and a bounded message that names the file.
    Returns the loaded spec or None."""
    result = run_cli_in_process("validate", str(path))
    assert result.returncode in (0, 2), result
    if currently_in_test_context():
        event(f"validate exit {result.returncode}")
    if result.returncode == 0:
        assert result.stdout.startswith(f"{path}: ok"), result
        return load_spec(path)
    message = result.stderr.removeprefix("error: ").rstrip("\n")
    lines = message.splitlines()
    assert result.stderr.startswith("error: ") and lines, result
    assert len(lines) <= MAX_MESSAGE_LINES, f"{len(lines)} lines"
    for line in lines:
        assert line.startswith(str(path)), line[:200]
        assert len(line) <= MAX_LINE, f"a {len(line)}-character line: {line[:200]}..."
    return None


def check_renders(loaded) -> None:
    """A spec that validates renders (PTX of every kernel), or fails with a PtxgenError."""
    try:
        compile_spec(loaded.spec, until="ptx")
    except PtxgenError as error:
        assert str(error).strip()


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    return path


# --- spec documents: near-valid entries (shipped ones with fields changed) and random structures ---------
def shipped_entries() -> list[dict]:
    return [kernel.model_dump(mode="json") for path in SPECS for kernel in load_spec(path).spec.kernels]


ENTRIES = shipped_entries()
FIELDS = sorted({name for kind in KINDS.values() for name in kind.Config.model_fields})
ODD_VALUES = [0, 1, 2, 3, 7, 31, 64, 128, 4096, 65536, -1, 2**31, 2**64, 10**30, 1.0, 0.5, 4096.0, 1e-6, 1e-40,
              1e-50, 3e38, 1e300, math.inf, -math.inf, math.nan, -0.0, "f16", "bf16", "f32", "4096", "1e-6", "",
              "x" * 5000, True, False, None, [], {}, [1, 2], {"block_n": 64}]


def literal_values(field: str) -> list:
    """The allowed values of Literal-typed fields of that name (e.g. head_dim 64 or 128)."""
    found = []
    for kind in KINDS.values():
        info = kind.Config.model_fields.get(field)
        if info is not None:
            for option in typing.get_args(info.annotation) or [info.annotation]:
                if typing.get_origin(option) is typing.Literal:
                    found += list(typing.get_args(option))
    return found


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                    st.text(max_size=12), st.text(string.digits + ".eE-+", max_size=8))
documents = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                         max_leaves=30)


@st.composite
def near_valid_entries(draw) -> dict:
    entry = dict(draw(st.sampled_from(ENTRIES)))
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 1, 1, 2, 3]))):
        field = draw(st.sampled_from(FIELDS + ["kind", "name", "bogus"]))
        choice = draw(st.integers(0, 3))
        if choice == 0:
            entry.pop(field, None)
        elif choice == 1 and literal_values(field):
            entry[field] = draw(st.sampled_from(literal_values(field)))
        else:
            entry[field] = draw(st.one_of(st.sampled_from(ODD_VALUES), st.sampled_from(sorted(KINDS)), scalars))
    return entry


@st.composite
def spec_documents(draw) -> dict:
    document = {"kernels": draw(st.lists(near_valid_entries(), min_size=draw(st.sampled_from([0, 1, 1, 1])), max_size=2,
                                         unique_by=lambda entry: str(entry.get("name"))))}
    if draw(st.integers(0, 3)) == 0:
        document["target"] = {
            "archs": draw(st.lists(st.sampled_from(["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100",
                                                    "sm_120", "sm_75", "", 90]), max_size=3)),
            "ptx_version": draw(st.sampled_from(["7.0", "7.8", "8.0", "8.8", "9.0", "9.5", "9.9", "7.80", "07.8",
                                                 "\u00b2.\u00b3", "8", 8.0, 7.8, None])),
        }
    if draw(st.integers(0, 5)) == 0:
        document[draw(st.sampled_from(["target", "kernels", "extra"]))] = draw(documents)
    return document


def toml_value(value) -> str:
    """A TOML inline value (None, which TOML lacks, is written as an empty inline table)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, (int, str)):
        return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    items = value.items() if isinstance(value, dict) else []
    return "{" + ", ".join(f"{toml_value(str(key))} = {toml_value(item)}" for key, item in items) + "}"


def toml_text(document: dict) -> str:
    return "".join(f"{toml_value(str(key))} = {toml_value(value)}\n" for key, value in document.items())


@fuzz_settings(250)
@given(document=st.one_of(spec_documents(), documents), as_yaml=st.booleans())
def test_spec_documents(tmp_path_factory, document, as_yaml):
    tmp_path = tmp_path_factory.mktemp("spec")
    if as_yaml:
        path = write(tmp_path, "fuzz.yaml", yaml.safe_dump(document, allow_unicode=True))
    else:
        if not isinstance(document, dict):
            document = {"kernels": document}
        path = write(tmp_path, "fuzz.toml", toml_text(document))
    loaded = check_validate(path)
    if loaded is not None:
        check_renders(loaded)


# --- spec text: shipped specs with their bytes changed, random bytes, YAML's own hazards ------------------
SHIPPED = [(path.suffix, path.read_bytes()) for path in SPECS]


@st.composite
def mutated_specs(draw) -> tuple[str, bytes]:
    suffix, text = draw(st.sampled_from(SHIPPED))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        end = min(len(text), at + draw(st.integers(0, 40)))
        insert = draw(st.one_of(st.binary(max_size=8), st.sampled_from(
            [b"", b"1e-50", b"1e300", b"inf", b"nan", b"-1", b"4096.0", b'"4096"', b"true", b"[", b"{", b"&a", b"*a",
             b"!!float", b"\n", b"=", b":", b"0x10", b"010", b"1_000", b"\xff", b"\xb2.\xb3"])))
        text = text[:at] + insert + text[end:]
    return suffix, text


@fuzz_settings(200)
@given(case=st.one_of(mutated_specs(), st.tuples(st.sampled_from([".toml", ".yaml", ".yml"]), st.binary(max_size=400))))
def test_spec_bytes(tmp_path_factory, case):
    suffix, data = case
    loaded = check_validate(write(tmp_path_factory.mktemp("spec"), f"fuzz{suffix}", data))
    if loaded is not None:
        check_renders(loaded)


@st.composite
def yaml_hazards(draw) -> str:
    """Aliases that multiply (billion laughs), anchors that contain themselves, deep nesting,
    explicit tags, duplicate and merge keys, numbers YAML 1.1 and 1.2 read differently."""
    kind = draw(st.integers(0, 4))
    if kind == 0:
        width, depth = draw(st.integers(1, 12)), draw(st.integers(1, 12))
        lines = ["l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
        lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, depth)]
        return "\n".join(lines + [f"kernels: [*l{depth - 1}]"]) + "\n"
    if kind == 1:
        depth = draw(st.integers(1, 3000))
        opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}"), ("- ", "")]))
        if opener == "- ":
            return "kernels:\n" + "".join("  " * i + "- \n" for i in range(depth)) + "  " * depth + "1\n"
        return "kernels: " + opener * depth + "1" + closer * depth + "\n"
    if kind == 2:
        return draw(st.sampled_from(["kernels: &a [*a]\n", "kernels: &a {x: *a}\n", "a: &a [b, *a]\nkernels: *a\n"]))
    value = draw(st.sampled_from(["!!float abc", "!!int abc", "!!timestamp x", "!!timestamp 2001-01-01", "!!binary AAAA",
                                  "!!set {a: 1}", "!!omap [a: 1]", "!!python/object:os.system x", "!!str 1", "1e-6",
                                  "1E6", ".inf", "-.nan", "0x1000", "0o17", "010", "1:30", "yes", "~", "", "1_000",
                                  "'4096'", "4096.0", "1" * 5000, "[1, 2]", "{b: 1}", "*undefined"]))
    field = draw(st.sampled_from(["hidden", "eps", "name", "kind", "dtype", "causal"]))
    base = "kernels:\n  - &k {name: a, kind: rmsnorm, hidden: 64}\n"
    extra = draw(st.sampled_from(["", "  - {<<: *k, name: b}\n", "  - {<<: *k, name: b, name: c}\n"]))
    return base + extra + f"  - {{name: z, kind: rmsnorm, hidden: 64, {field}: {value}}}\n"


@fuzz_settings(150)
@given(text=yaml_hazards())
def test_yaml_hazards(tmp_path_factory, text):
    loaded = check_validate(write(tmp_path_factory.mktemp("spec"), "fuzz.yaml", text))
    if loaded is not None:
        check_renders(loaded)


def test_huge_values_and_files(tmp_path):
    cases = {
        "digits.toml": '[[kernels]]\nname = "a"\nkind = "rmsnorm"\nhidden = ' + "1" * 5000 + "\n",
        "name.toml": '[[kernels]]\nname = "' + "a" * 200_000 + '"\nkind = "rmsnorm"\nhidden = 64\n',
        "kind.yaml": "kernels:\n  - {name: a, kind: " + "k" * 200_000 + ", hidden: 64}\n",
        "many.toml": '[[kernels]]\nname = "a"\nkind = "rmsnorm"\nhidden = "x"\n' * 3000,
        "tables.toml": "[" + ".".join(["a"] * 3000) + "]\n",
        "inline.toml": "kernels = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n",
        "big.toml": "# " + "x" * (1 << 20) + "\n",
    }
    for name, text in cases.items():
        assert check_validate(write(tmp_path, name, text)) is None, name


# --- .npz inputs to `ptxgen run` ----------------------------------------------------------------------------
RUN_SPEC = """[target]
archs = ["sm_80"]
[[kernels]]
name = "norm"
kind = "rmsnorm"
hidden = 64
[[kernels]]
name = "rot"
kind = "rope"
num_heads = 2
head_dim = 8
[[kernels]]
name = "append"
kind = "kv_append"
num_kv_heads = 1
head_dim = 8
max_seq_len = 4
"""
KERNEL_PARAMS = {"norm": ["x", "gamma", "y", "rows"], "rot": ["x", "pos"],
                 "append": ["k", "v", "k_cache", "v_cache", "pos"]}
GOOD_SHAPES = [(), (2, 64), (64,), (2, 8), (1, 8), (1, 4, 8), (0, 64), (3, 64)]
DTYPES = ["f4", "f8", "f2", "i4", "u4", "i8", "u8", "u1", "i1", "?", "c8", "U3", "S2", "V4", "O"]
# An .npy member whose header declares 10^12 f32 (4 TB) over a few bytes of data.
HUGE_HEADER = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"
HUGE_HEADER = HUGE_HEADER.ljust(64 * 2 - 11) + b"\n"
LYING_NPY = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(HUGE_HEADER)) + HUGE_HEADER + b"\x00" * 16


def fitting_arrays(kernel: str, rows: int, pos: int) -> dict[str, np.ndarray]:
    """Inputs of the right names, dtypes and shapes (the run then reaches the interpreter)."""
    rng = np.random.default_rng(rows * 7 + pos)
    if kernel == "norm":
        return {"x": rng.standard_normal((rows, 64), np.float32), "gamma": rng.standard_normal(64, np.float32),
                "rows": np.uint32(rows)}
    if kernel == "rot":
        return {"x": rng.standard_normal((2, 8), np.float32), "pos": np.int64(pos)}
    return {"k": rng.standard_normal((1, 8), np.float32), "v": rng.standard_normal((1, 8), np.float32),
            "k_cache": np.zeros((1, 4, 8), np.float16), "v_cache": np.zeros((1, 4, 8), np.float16), "pos": np.uint8(pos)}


COMPRESSIONS = [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_LZMA, zipfile.ZIP_BZIP2]


def npz_archive(arrays: dict[str, np.ndarray], compression: int = zipfile.ZIP_STORED) -> bytes:
    """What np.savez writes (ZIP_STORED) or np.savez_compressed (ZIP_DEFLATED), in any method zipfile writes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, array in arrays.items():
            npy = io.BytesIO()
            np.save(npy, array)
            archive.writestr(f"{name}.npy", npy.getvalue())
    return buffer.getvalue()


def patch_member(data: bytes, member: str, method: int | None = None, flags: int = 0) -> bytes:
    """The archive with a member's compression method replaced and flag bits set, in both its local
    header and its central directory record (zipfile reads the one, checks the other)."""
    data = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        local = archive.getinfo(member).header_offset
    records = [local]  # a local header: flags at +6, method at +8
    at = data.find(b"PK\x01\x02")
    while at >= 0:  # a central directory record: flags at +8, method at +10, its name at +46
        if data[at + 46:at + 46 + struct.unpack_from("<H", data, at + 28)[0]] == member.encode():
            records.append(at + 2)
        at = data.find(b"PK\x01\x02", at + 4)
    for at in records:
        struct.pack_into("<H", data, at + 6, struct.unpack_from("<H", data, at + 6)[0] | flags)
        if method is not None:
            struct.pack_into("<H", data, at + 8, method)
    return bytes(data)


@st.composite
def npz_bytes(draw, kernel: str) -> bytes:
    names = KERNEL_PARAMS[kernel]
    arrays = fitting_arrays(kernel, draw(st.integers(0, 3)), draw(st.integers(0, 5)))
    if draw(st.booleans()):
        arrays = {name: arrays[name] for name in draw(st.lists(st.sampled_from(sorted(arrays)), unique=True))}
    for name in draw(st.lists(st.sampled_from(names + ["junk", "y"]), max_size=draw(st.sampled_from([0, 0, 1, 3])),
                              unique=True)):
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = draw(st.one_of(st.sampled_from(GOOD_SHAPES), st.lists(st.integers(0, 9), max_size=3).map(tuple)))
        count = math.prod(shape)
        if dtype.kind in "fc":
            values = draw(st.lists(st.sampled_from([0.0, 1.0, -2.5, 3.9, 1e30, math.inf, math.nan]), min_size=count,
                                   max_size=count))
        elif dtype.kind in "iub":
            values = np.array(draw(st.lists(st.integers(0, 5) | st.sampled_from([np.iinfo(np.int64).max, -1, 2**32]),
                                            min_size=count, max_size=count)), np.int64)
        else:
            values = np.zeros(count, dtype)
        with np.errstate(all="ignore"):
            arrays[name] = np.asarray(values).astype(dtype, casting="unsafe").reshape(shape)
    data = npz_archive(arrays, draw(st.sampled_from(COMPRESSIONS)))
    damage = draw(st.integers(0, 8))
    if damage == 1 and data:  # truncated
        data = data[:draw(st.integers(0, len(data) - 1))]
    elif damage == 2 and data:  # flipped bytes
        data = bytearray(data)
        for at in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=4)):
            data[at] ^= draw(st.integers(1, 255))
        data = bytes(data)
    elif damage == 3:  # a member that is not an .npy, or an .npy whose header lies about its size
        member = draw(st.sampled_from(["notes.txt", "dir/x.npy", "x.npy"]))
        content = draw(st.sampled_from([b"hello", LYING_NPY, b"\x93NUMPY\x09\x00", b"\x93NUMPY\x01\x00\xff\xff"]))
        buffer = io.BytesIO(data)
        with warnings.catch_warnings(), zipfile.ZipFile(buffer, "a") as archive:
            warnings.simplefilter("ignore")  # a second member of the same name is one of the cases
            archive.writestr(member, content)
        data = buffer.getvalue()
    elif damage == 4:
        data = draw(st.binary(max_size=300))
    elif damage == 5 and arrays:  # another compression method (9: deflate64, which zipfile lacks), or flags:
        # encrypted, compressed patched data, strong encryption
        member = draw(st.sampled_from(sorted(arrays)))
        method = draw(st.sampled_from([None, 0, 8, 9, 12, 14, 99, 0xFFFF]))
        data = patch_member(data, f"{member}.npy", method, draw(st.sampled_from([0, 0x1, 0x20, 0x40])))
    return data


@pytest.fixture(scope="module")
def run_spec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "small.toml"
    path.write_text(RUN_SPEC)
    return path


@fuzz_settings(150)
@given(data=st.data(), kernel=st.sampled_from(sorted(KERNEL_PARAMS)))
def test_run_npz_inputs(run_spec, tmp_path_factory, data, kernel):
    scalar = KERNEL_PARAMS[kernel][-1]
    sets = data.draw(st.sampled_from([[], [], [], [f"{scalar}=1"], [f"{scalar}=2"], [f"{scalar}=3,4"],
                                      [f"{scalar}=-1"], [f"{scalar}=99999999999"], [f"{scalar}=x"], ["=1"],
                                      ["rows=2", "pos=1"]]))
    folder = tmp_path_factory.mktemp("npz")
    inputs = write(folder, "in.npz", data.draw(npz_bytes(kernel)))
    outputs = folder / "out.npz"
    args = ["run", kernel, "--spec", str(run_spec), "--inputs", str(inputs), "--outputs", str(outputs),
            "--backend", "emulator", *itertools.chain.from_iterable(("--set", one) for one in sets)]
    result = run_cli_in_process(*args)
    assert result.returncode in (0, 2), result
    event(f"run exit {result.returncode}")
    if result.returncode == 2:
        assert result.stderr.startswith("error: ") and len(result.stderr) < 2000, result
        assert not outputs.exists(), "a refused run wrote its outputs"
        assert sorted(p.name for p in folder.iterdir()) == ["in.npz"], "a refused run left a file behind"
    else:
        with np.load(outputs) as written:
            assert set(KERNEL_PARAMS[kernel]) - {"rows", "pos"} <= set(written.files)


def flip_member_data(data: bytes, member: str, at: int) -> bytes:
    """The archive with 4 bytes inverted `at` bytes into a member's (compressed) data."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        local = archive.getinfo(member).header_offset
    start = local + 30 + sum(struct.unpack_from("<HH", data, local + 26)) + at
    return data[:start] + bytes(b ^ 0xFF for b in data[start:start + 4]) + data[start + 4:]


NORM_INPUTS = fitting_arrays("norm", 2, 0)
# Corrupt compressed data, a compression method zipfile lacks (9: deflate64), an encrypted member:
# all but bzip2's (an OSError) once escaped as tracebacks (zlib.error, LZMAError,
# NotImplementedError, RuntimeError).
DAMAGED_ARCHIVES = {
    "corrupt deflate": (flip_member_data(npz_archive(NORM_INPUTS, zipfile.ZIP_DEFLATED), "x.npy", 0), "unreadable"),
    "corrupt lzma": (flip_member_data(npz_archive(NORM_INPUTS, zipfile.ZIP_LZMA), "x.npy", 9), "unreadable"),
    "corrupt bzip2": (flip_member_data(npz_archive(NORM_INPUTS, zipfile.ZIP_BZIP2), "x.npy", 0), "unreadable"),
    "unsupported method": (patch_member(npz_archive(NORM_INPUTS), "x.npy", method=9), "compression method"),
    "encrypted": (patch_member(npz_archive(NORM_INPUTS), "x.npy", flags=0x1), "encrypted"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_ARCHIVES))
def test_run_refuses_damaged_archive_members(run_spec, tmp_path, case):
    data, reason = DAMAGED_ARCHIVES[case]
    inputs = write(tmp_path, "in.npz", data)
    outputs = tmp_path / "out.npz"
    result = run_cli_in_process("run", "norm", "--spec", str(run_spec), "--inputs", str(inputs),
                                "--outputs", str(outputs), "--backend", "emulator", "--set", "rows=2")
    assert result.returncode == 2, result
    assert result.stderr.startswith(f"error: --inputs {inputs}: x: ") and reason in result.stderr, result
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz"]


# --- `--tune` options: fields and values as a user might mistype them ----------------------------------------
TUNE_KNOBS = ["unroll", "rows_per_warp", "split_k", "warps", "schedule", "l1_no_allocate", "l2_prefetch", "pdl",
              "prefetch_rows"]
TUNE_FIELDS = TUNE_KNOBS * 3 + ["k", "n", "name", "kind", "sm90a", "sm90a.stages", "unroll.x", "", "=", " unroll",
                                "Unroll", "rows-per-warp"]
TUNE_VALUES = st.one_of(st.integers(1, 4).map(str), st.sampled_from(["true", "false", "none", "static", "queue"]),
                        st.integers(-3, 70).map(str), st.sampled_from(
                            ["0x10", "08", "1e3", "2.0", "-0", "", " ", "nan", "inf", "[1]", "1_0", "\u00b2", "\x00"]),
                        st.text(max_size=6))


@fuzz_settings(100)
@given(options=st.lists(st.tuples(st.sampled_from(TUNE_FIELDS), st.lists(TUNE_VALUES, min_size=1, max_size=3)),
                        min_size=1, max_size=2))
def test_show_tune_options(tmp_path_factory, options):
    """show --tune (the same parsing and variants as bench --tune, priced without a GPU): exit 0
    with a table, or 2 with one short message; never a traceback."""
    spec = write(tmp_path_factory.mktemp("tune"), "tune.toml", TUNE_SPEC)
    args = list(itertools.chain.from_iterable(("--tune", f"{field}={','.join(values)}") for field, values in options))
    result = run_cli_in_process("show", "small_gemv", "--spec", str(spec), "--no-model", *args)
    assert result.returncode in (0, 2), result
    event(f"show --tune exit {result.returncode}")
    if result.returncode == 2:
        assert result.stderr.startswith("error: ") and len(result.stderr) < 2000, result
    else:
        assert "show --tune small_gemv" in result.stdout, result


# --- the real entry point, in a few subprocesses -------------------------------------------------------------
def test_the_installed_command_refuses_hostile_files_quickly(tmp_path):
    command = Path(sys.executable).with_name("ptxgen")
    entry = [str(command)] if command.exists() else [sys.executable, "-m", "ptxgen.cli"]
    bomb = write(tmp_path, "bomb.yaml", yaml_bomb())
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")
    deep = write(tmp_path, "deep.toml", "a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    broken = write(tmp_path, "in.npz", b"PK\x03\x04" + b"\x00" * 40)
    corrupt = write(tmp_path, "deflate.npz", DAMAGED_ARCHIVES["corrupt deflate"][0])
    small = write(tmp_path, "small.toml", RUN_SPEC)
    runs = [["validate", str(bomb)], ["validate", str(zero)], ["validate", "/dev/zero"], ["validate", str(deep)],
            ["run", "qwen3_8b_rmsnorm", "--spec", str(ROOT / "specs" / "qwen3.toml"), "--inputs", str(broken),
             "--outputs", str(tmp_path / "out.npz"), "--backend", "emulator"],
            ["run", "norm", "--spec", str(small), "--inputs", str(corrupt), "--outputs", str(tmp_path / "out.npz"),
             "--backend", "emulator", "--set", "rows=2"]]
    for args in runs:
        result = subprocess.run(entry + args, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert result.returncode == 2, (args, result.stderr[-2000:])
        assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert len(result.stderr) < 1000, result.stderr[:1000]
    assert not (tmp_path / "out.npz").exists()


def yaml_bomb() -> str:
    """The classic: nine levels of nine aliases each, 9^9 = 387 million strings once expanded."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    return "\n".join(lines + ["kernels: [*a8]"]) + "\n"
