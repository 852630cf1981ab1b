"""`ptxgen run` and `ptxgen verify` from the command line, per the I/O contract of KERNELS.md."""

from __future__ import annotations

import io
import os
import stat
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from ptxgen.errors import LaunchError
from ptxgen.npz import load_npz, scalar_of
from ptxgen.verify import relative_l2

from helpers import ROOT, run_cli, run_cli_in_process, spec_kernel, unprivileged

SPEC = ROOT / "specs" / "qwen3.toml"


@pytest.fixture
def norm_inputs(tmp_path):
    rng = np.random.default_rng(7)
    path = tmp_path / "in.npz"
    x = rng.standard_normal((3, 4096)).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(4096)).astype(np.float32)
    np.savez(path, x=x, gamma=gamma)
    return path, x, gamma


def test_run_writes_every_array_parameter(tmp_path, norm_inputs):
    path, x, gamma = norm_inputs
    out = tmp_path / "out.npz"
    result = run_cli("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(path), "--outputs", str(out),
                     "--set", "rows=3", "--backend", "emulator")
    assert result.returncode == 0, result.stderr
    with np.load(out) as saved:
        assert sorted(saved.files) == ["gamma", "x", "y"]
        np.testing.assert_array_equal(saved["x"], x)
        kind = spec_kernel(SPEC, "qwen3_8b_rmsnorm").definition
        reference = kind.reference({"x": x, "gamma": gamma}, {"rows": 3})["y"]
        assert relative_l2(saved["y"].astype(np.float64), reference) < 1e-5


def test_file_names_in_capitals_are_taken_as_written(tmp_path):
    """--outputs OUT.NPZ (as --inputs IN.NPZ already was): written under that very name (numpy's
    savez would have added .npz to a file name, ptxgen writes its bytes), read back by numpy."""
    spec = tmp_path / "NORM.TOML"
    spec.write_text('[[kernels]]\nname = "norm"\nkind = "rmsnorm"\nhidden = 9\n')
    inputs, outputs = tmp_path / "IN.NPZ", tmp_path / "OUT.Npz"
    x = np.arange(18, dtype=np.float32).reshape(2, 9) - 8
    np.savez(inputs, x=x, gamma=np.ones(9, np.float32))
    inputs.with_suffix(".NPZ.npz").rename(inputs)
    result = run_cli_in_process("run", "norm", "--spec", str(spec), "--inputs", str(inputs), "--outputs",
                                str(outputs), "--set", "rows=2", "--backend", "emulator")
    assert result.returncode == 0, result
    assert sorted(path.name for path in tmp_path.iterdir()) == ["IN.NPZ", "NORM.TOML", "OUT.Npz"]
    with np.load(outputs) as saved:
        expected = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(saved["y"], expected, rtol=1e-5)
    result = run_cli_in_process("run", "norm", "--spec", str(spec), "--inputs", str(inputs), "--outputs",
                                str(tmp_path / "out.npy"), "--set", "rows=2")
    assert result.returncode == 2 and "--outputs" in result.stderr and "expected a .npz file name" in result.stderr


def test_scalar_from_npz(tmp_path, norm_inputs):
    _, x, gamma = norm_inputs
    path = tmp_path / "with_rows.npz"
    np.savez(path, x=x[:2], gamma=gamma, rows=np.uint32(2))
    result = run_cli("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(path),
                     "--outputs", str(tmp_path / "o.npz"), "--backend", "emulator")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("arrays, extra, message", [
    ({"x": np.zeros((3, 4096), np.float64), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=3"], "'x'"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=4"], "'x'"),
    ({"x": np.zeros((3, 4096), np.float32)}, ["--set", "rows=3"], "'gamma'"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, [], "'rows' is missing"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=three"], "--set"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=-1"], "rows"),
    # An array the kernel only writes (an earlier run's output file as input) must still fit.
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32), "y": np.zeros((3, 3), np.float32)},
     ["--set", "rows=3"], "input 'y': expected float32[3, 4096]"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32), "rows": np.uint32(3)},
     ["--set", "rows=3"], "--set rows: --inputs"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=3", "--set", "rows=3"],
     "--set rows: given twice"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32), "rows": np.array([3], np.uint32)}, [],
     "input 'rows' is a runtime scalar: expected one integer (a 0-d array), got uint32[1]"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32), "rows": np.ones((2, 2), np.float32)},
     ["--set", "rows=3"], "input 'rows' is a runtime scalar"),
    # --set of an array's name (not a scalar's): named, not reported as the real scalar missing
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "x=3"],
     "'x' is an array parameter, not a runtime scalar (known: rows)"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "row=3"],
     "unknown runtime scalar 'row' (known: rows)"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=3", "--arch", "sm_75"],
     "--arch: expected one of sm_80"),
])
def test_bad_inputs_exit_2_naming_the_parameter(tmp_path, arrays, extra, message):
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    out = tmp_path / "out.npz"
    result = run_cli("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(path), "--outputs", str(out),
                     "--backend", "emulator", *extra)
    assert result.returncode == 2, result
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not out.exists(), "nothing may be written after a refused run"


def test_missing_inputs_file_and_unknown_kernel(tmp_path):
    result = run_cli("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(tmp_path / "none.npz"),
                     "--outputs", str(tmp_path / "o.npz"), "--backend", "emulator")
    assert result.returncode == 2 and "none.npz" in result.stderr
    np.savez(tmp_path / "in.npz", x=np.zeros(1))
    result = run_cli("run", "no_kernel", "--spec", str(SPEC), "--inputs", str(tmp_path / "in.npz"),
                     "--outputs", str(tmp_path / "o.npz"))
    assert result.returncode == 2 and "no_kernel" in result.stderr


def test_verify_one_kernel_table_and_exit_code():
    result = run_cli("verify", str(SPEC), "--kernel", "qwen3_8b_q_norm", "--seed", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "qwen3_8b_q_norm" in result.stdout and "pass" in result.stdout


def test_verify_kernel_repeated_checks_every_named_kernel(tmp_path):
    """`--kernel a --kernel b` verifies both (typer kept only the last: a exited 0 unchecked), each
    once, in the spec's order; an unknown name among them is exit 2 naming it."""
    spec = tmp_path / "three.toml"
    spec.write_text("".join(f'[[kernels]]\nname = "{name}"\nkind = "rmsnorm"\nhidden = {n}\n'
                            for name, n in (("first", 9), ("second", 17), ("third", 33))))
    result = run_cli_in_process("verify", str(spec), "--kernel", "third", "--kernel", "first", "--kernel", "third")
    assert result.returncode == 0, result
    kernels = [line.split()[0] for line in result.stdout.splitlines()[2:]]
    assert kernels == ["first", "first", "third", "third"], result.stdout
    result = run_cli_in_process("verify", str(spec), "--kernel", "first", "--kernel", "fourth")
    assert result.returncode == 2 and "no kernel named 'fourth'" in result.stderr, result


def test_verify_fails_a_kernel_the_sanitizer_stops_and_checks_the_rest(tmp_path, monkeypatch):
    """A sanitizer finding is that kernel's failure (exit 1, the table, the finding below it, the
    checks made before it kept), not an error that ends verify before the next kernels."""
    from ptxgen import verify
    from ptxgen.errors import SanitizerError

    spec = tmp_path / "three.toml"
    spec.write_text("".join(f'[[kernels]]\nname = "{name}"\nkind = "rmsnorm"\nhidden = {n}\n'
                            for name, n in (("first", 9), ("racy", 17), ("last", 33))))
    real = verify.verify_sizes

    def sizes(kernel, *args, **kwargs):
        for index, checks in enumerate(real(kernel, *args, **kwargs)):
            if kernel.name == "racy" and index == 1:
                raise SanitizerError("racy: line 7: a planted race")
            yield checks

    monkeypatch.setattr(verify, "verify_sizes", sizes)
    result = run_cli_in_process("verify", str(spec))
    assert result.returncode == 1, result
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.split()[:1] in (["first"], ["racy"],
                                                                                                ["last"])}
    assert "pass" in rows["first"] and "pass" in rows["last"] and "FAIL (error below)" in result.stdout
    kept = [line.split()[:2] for line in result.stdout.splitlines() if line.endswith("pass")]
    assert ["racy", "rows=1"] in kept, "the size checked before the finding is kept"
    assert "FAIL racy: racy: line 7: a planted race" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == \
        "verify: 2 passed, 1 failed, 0 not checked (too large to interpret) of 3 kernel runs", result.stderr


def test_verify_checks_the_pdl_variant_too(tmp_path):
    """An sm_90 PDL variant is its own PTX (an L2 request for its rows before griddepcontrol.wait
    here): verify checks it beside the portable one, a row each (it checked sm_90a variants only)."""
    spec = tmp_path / "pdl.toml"
    spec.write_text('[target]\narchs = ["sm_80", "sm_90"]\n[[kernels]]\nname = "g"\nkind = "q4k_gemv"\nn = 64\n'
                    'k = 512\npdl = true\nprefetch_rows = true\n')
    result = run_cli_in_process("verify", str(spec))
    assert result.returncode == 0, result
    rows = [line.split()[:2] for line in result.stdout.splitlines() if line.endswith("pass")]
    assert ["g", "y[64]"] in rows and ["g", "(sm_90)"] in rows, result.stdout


VERIFY_SPEC = '[target]\narchs = ["sm_80", "sm_90"]\n' + "".join(
    f'[[kernels]]\nname = "{name}"\nkind = "rmsnorm"\nhidden = {n}\n{extra}'
    for name, n, extra in (("first", 9, ""), ("tight", 17, ""), ("racy", 33, "pdl = true\n")))


def test_verify_json_gives_each_run_its_status_checks_and_worst(tmp_path):
    """--json: each run (a kernel and PTX variant: sm_90's PDL PTX its own, `target` naming it)
    with its status, every check the table shows (same numbers) and the one farthest from its
    bounds; the summary counts; nothing else on stdout."""
    import json

    spec = tmp_path / "three.toml"
    spec.write_text(VERIFY_SPEC)
    result = run_cli_in_process("verify", str(spec), "--json", "--seed", "2")
    assert result.returncode == 0 and result.stderr == "", result
    report = json.loads(result.stdout)
    assert (report["spec"], report["backend"], report["seed"], report["arch"]) == (str(spec), "emulator", 2, None)
    runs = report["runs"]
    assert [(run["kernel"], run["target"], run["status"]) for run in runs] == \
        [("first", None, "pass"), ("tight", None, "pass"), ("racy", None, "pass"), ("racy", "sm_90", "pass")]
    assert report["summary"] == {"passed": 4, "failed": 0, "not_checked": 0, "runs": 4}
    table = run_cli_in_process("verify", str(spec), "--seed", "2")
    rows = [" ".join(line.split()) for line in table.stdout.splitlines()[2:]]
    assert len(rows) == sum(len(run["checks"]) for run in runs), table.stdout
    for run in runs:
        checks = run["checks"]
        assert checks and run["failure"] is None and run["findings"] == [] and run["tool"] is None, run
        title = run["kernel"] + (f" ({run['target']})" if run["target"] else "")
        for check in checks:
            assert check["passed"] and check["failure"] is None, check
            assert check["worst_ratio"] == max(check["error"] / check["tolerance"], check["element_error"]), check
            row = (f"{title} rows={check['scalars']['rows']} y{check['shape']} {check['error']:.2e} "
                   f"{check['tolerance']:.1e} {check['element_error']:.2f} pass")
            assert row in rows, (row, table.stdout)
        assert run["worst"] == max(checks, key=lambda check: check["worst_ratio"]), run
        assert 0 < run["worst"]["worst_ratio"] <= 1, run


def test_verify_json_names_the_failures_and_exits_1(tmp_path, monkeypatch):
    """A check over its tolerance and a run ended by a sanitizer finding: status fail, the failure
    (the finding; the check's reason), the worst check over 1, exit 1 as without --json."""
    import json

    from ptxgen import verify
    from ptxgen.errors import SanitizerError
    from ptxgen.kernels.rmsnorm import Rmsnorm

    spec = tmp_path / "three.toml"
    spec.write_text(VERIFY_SPEC)
    real_sizes, real_tolerance = verify.verify_sizes, Rmsnorm.tolerance

    def sizes(kernel, *args, **kwargs):
        for index, checks in enumerate(real_sizes(kernel, *args, **kwargs)):
            if kernel.name == "racy" and index == 1:
                raise SanitizerError("racy: line 7: a planted race")
            yield checks

    def tolerance(self, param):
        return 1e-12 if self.config.name == "tight" else real_tolerance(self, param)

    monkeypatch.setattr(verify, "verify_sizes", sizes)
    monkeypatch.setattr(Rmsnorm, "tolerance", tolerance)
    result = run_cli_in_process("verify", str(spec), "--json", "--arch", "sm_90")
    assert result.returncode == 1 and result.stderr == "", result
    report = json.loads(result.stdout)
    assert report["summary"] == {"passed": 1, "failed": 2, "not_checked": 0, "runs": 3}, report["summary"]
    first, tight, racy = report["runs"]
    assert [(run["kernel"], run["target"], run["status"]) for run in report["runs"]] == \
        [("first", "sm_90", "pass"), ("tight", "sm_90", "fail"), ("racy", "sm_90", "fail")]
    worst = tight["worst"]
    assert tight["failure"] is None and worst["tolerance"] == 1e-12 and not worst["passed"], tight
    assert worst["worst_ratio"] == worst["error"] / 1e-12 > 1, worst
    assert worst["failure"] == f"rel. L2 error {worst['error']:.3e} > 1.000e-12", worst
    assert racy["failure"] == "racy: line 7: a planted race", racy
    assert [check["scalars"] for check in racy["checks"]] == [{"rows": 1}] and racy["checks"][0]["passed"], racy


def test_verify_json_takes_exact_checks(tmp_path):
    """Checks of tolerance 0 (a runtime value past its limit: rope's pos; argmax's index) are in
    the report with worst_ratio 0, not a ZeroDivisionError's traceback."""
    import json

    spec = tmp_path / "rope.toml"
    spec.write_text('[target]\narchs = ["sm_80"]\n[[kernels]]\nname = "r"\nkind = "rope"\nnum_heads = 1\n'
                    'head_dim = 64\ntheta = 10000.0\n')
    result = run_cli_in_process("verify", str(spec), "--json")
    assert result.returncode == 0 and result.stderr == "", result
    (run,) = json.loads(result.stdout)["runs"]
    exact = [check for check in run["checks"] if check["tolerance"] == 0]
    assert exact and all(check["worst_ratio"] == 0 and check["passed"] for check in exact), run["checks"]
    assert run["status"] == "pass" and 0 < run["worst"]["worst_ratio"] <= 1, run


DEEP_DECODER = """[target]
archs = ["sm_80"]

[[kernels]]
name = "deep"
kind = "persistent_decoder"
hidden = {hidden}
num_heads = 8
num_kv_heads = 2
head_dim = 128
intermediate = {intermediate}
num_layers = 9
max_seq_len = 64
"""


def test_verify_checks_a_decoder_too_large_to_interpret_one_layer_at_a_time(tmp_path):
    """9 layers of 7.6 MB (beyond MAX_VERIFY_WEIGHTS' 64 MB): verify runs one layer in its place
    (Kind.stand_ins), with the teacher-forced gradings a single layer allows (Kind.forced)."""
    spec = tmp_path / "deep.toml"
    spec.write_text(DEEP_DECODER.format(hidden=1024, intermediate=3584))
    result = run_cli("verify", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "one layer standing for its 9 layers like layer 0" in result.stdout.replace("\n", " ")
    assert "teacher-forced" in result.stdout and "skipped" not in result.stdout and "FAIL" not in result.stdout


def test_verify_says_which_kernels_it_cannot_interpret(tmp_path):
    spec = tmp_path / "huge.toml"
    spec.write_text(DEEP_DECODER.format(hidden=8192, intermediate=28672))  # 490 MB a layer
    result = run_cli("verify", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("skipped") == 1 and "too large to interpret" in result.stdout
    # the summary a CI log is read by names it as checked by nothing
    assert result.stderr.strip().splitlines()[-1] == \
        "verify: 0 passed, 0 failed, 1 not checked (too large to interpret) of 1 kernel run", result.stderr



# --- .npz files that lie, break or hold the wrong things: one message each, nothing read past them ---
def npy_member(header: str, payload: bytes = b"") -> bytes:
    """An .npy (format 1.0) with this header dict text, padded as numpy pads it."""
    text = header.encode().ljust(((len(header) + 11 + 63) // 64) * 64 - 11) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + payload


def zip_of(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def npz_error(path) -> str:
    with pytest.raises(LaunchError) as caught:
        load_npz(path, "--inputs")
    message = str(caught.value)
    assert message.startswith(f"--inputs {path}") and len(message) < 300 and "\n" not in message, message
    return message


def test_an_npy_file_is_not_an_archive(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros(3, np.float32))
    assert "expected an .npz archive" in npz_error(tmp_path / "x.npy")


@pytest.mark.parametrize("cut", [0, 10, 100, -30, -1])
def test_a_truncated_archive(tmp_path, cut):
    np.savez(tmp_path / "whole.npz", x=np.arange(1000, dtype=np.float32))
    data = (tmp_path / "whole.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[:cut])
    message = npz_error(tmp_path / "cut.npz")
    assert "not a readable .npz archive" in message or "unreadable" in message or "truncated" in message, message


def test_a_member_that_is_not_an_array(tmp_path):
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(3, np.float32))
    path = zip_of(tmp_path / "in.npz", {"x.npy": buffer.getvalue(), "notes.txt": b"hi"})
    assert "member 'notes.txt' is not an array (.npy)" in npz_error(path)
    path = zip_of(tmp_path / "nested.npz", {"dir/x.npy": b""})
    assert "member 'dir/x.npy' is not an array" in npz_error(path)


def test_a_header_that_declares_terabytes(tmp_path):
    # 10^12 float32 = 4 TB (3.6 TiB) declared over 16 bytes: refused before any allocation
    member = npy_member("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", b"\0" * 16)
    message = npz_error(zip_of(tmp_path / "in.npz", {"x.npy": member}))
    assert "x: declares [1000000000000] float32 (4,000,000,000,000 bytes) but holds" in message, message


def test_an_archive_that_inflates_to_gigabytes_is_refused_before_it_is_read(tmp_path):
    """A compressed member holds the bytes it declares (2 GB of zeros deflate to 2 MB), so the shape
    is checked against the kernel's parameter before the data is inflated: run refuses it at once
    and load_npz's check sees it as a stand-in that takes no memory."""
    path = tmp_path / "inflates.npz"
    count = 1 << 29
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            member.write(npy_member(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({count},), }}"))
            zeros = bytes(1 << 24)
            for _ in range(4 * count // len(zeros)):
                member.write(zeros)
    seen = {}

    def refuse(declared):
        seen.update(declared)
        raise LaunchError("refused")

    with pytest.raises(LaunchError, match="refused"):
        load_npz(path, "--inputs", check=refuse)
    assert seen["x"].shape == (count,) and seen["x"].strides == (0,)
    result = run_cli_in_process("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(path), "--outputs",
                                str(tmp_path / "out.npz"), "--set", "rows=2", "--backend", "emulator")
    assert result.returncode == 2 and "input 'x': expected float32[2, 4096]" in result.stderr, result.stderr
    assert "got float32[536870912]" in result.stderr


def test_members_twice_negative_extents_and_pipes(tmp_path):
    one = io.BytesIO()
    np.save(one, np.zeros(3, np.float32))
    with zipfile.ZipFile(tmp_path / "twice.npz", "w") as archive, pytest.warns(UserWarning, match="Duplicate name"):
        for _ in range(2):
            archive.writestr("x.npy", one.getvalue())
    assert "member 'x.npy' appears twice" in npz_error(tmp_path / "twice.npz")
    negative = npy_member("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", b"\0" * 16)
    assert "x: declares a negative extent: [-4]" in npz_error(zip_of(tmp_path / "neg.npz", {"x.npy": negative}))
    os.mkfifo(tmp_path / "pipe.npz")
    assert "not a regular file" in npz_error(tmp_path / "pipe.npz")


def test_a_0d_array_named_like_an_array_parameter_is_a_shape_error(tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones((1, 4096), np.float32), gamma=np.array(1.0, np.float32))
    result = run_cli_in_process("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(tmp_path / "in.npz"),
                                "--outputs", str(tmp_path / "out.npz"), "--set", "rows=1", "--backend", "emulator")
    assert result.returncode == 2 and "input 'gamma': expected float32[4096]" in result.stderr, result.stderr


def test_object_arrays_and_odd_headers(tmp_path):
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    assert "not a plain number type" in npz_error(tmp_path / "objects.npz")
    bad_version = zip_of(tmp_path / "version.npz", {"x.npy": b"\x93NUMPY\x09\x00"})
    assert "x:" in npz_error(bad_version)
    not_npy = zip_of(tmp_path / "magic.npz", {"x.npy": b"hello, world"})
    assert "x: unreadable" in npz_error(not_npy)


@pytest.mark.parametrize("value, message", [
    (np.float64(np.nan), "must be an integer, got float64 nan"),
    (np.float32(3.9), "must be an integer, got float32 3.9"),
    (np.bool_(True), "must be an integer"),
])
def test_a_runtime_scalar_must_be_an_integer(value, message):
    with pytest.raises(LaunchError, match="rows: a runtime scalar " + message):
        scalar_of(np.asarray(value), "rows")


@pytest.mark.parametrize("value", [np.str_("4"), np.complex64(3 + 0j), np.bytes_(b"4")])
def test_string_and_complex_scalars_are_refused_when_read(tmp_path, value):
    np.savez(tmp_path / "in.npz", rows=np.asarray(value))
    assert "rows: dtype" in npz_error(tmp_path / "in.npz")


def test_a_runtime_scalar_given_in_the_npz_or_by_set(tmp_path):
    x = np.ones((3, 4096), np.float32)
    np.savez(tmp_path / "in.npz", x=x, gamma=np.ones(4096, np.float32), rows=np.float64(3.9))
    common = ["--spec", str(SPEC), "--outputs", str(tmp_path / "out.npz"), "--backend", "emulator"]
    result = run_cli_in_process("run", "qwen3_8b_rmsnorm", "--inputs", str(tmp_path / "in.npz"), *common)
    assert result.returncode == 2 and "rows: a runtime scalar must be an integer, got float64 3.9" in result.stderr
    np.savez(tmp_path / "in.npz", x=x, gamma=np.ones(4096, np.float32))
    result = run_cli_in_process("run", "qwen3_8b_rmsnorm", "--inputs", str(tmp_path / "in.npz"), "--set", "rows=3,4",
                                *common)
    assert result.returncode == 2 and "--set rows: run takes one value, got 2" in result.stderr, result
    assert not (tmp_path / "out.npz").exists()


# --- --outputs: only ever a regular file, replaced whole ----------------------------------------------------
@pytest.fixture
def norm_run(tmp_path, norm_inputs):
    path, _, _ = norm_inputs
    return lambda outputs: run_cli_in_process(
        "run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(path), "--outputs", str(outputs),
        "--set", "rows=3", "--backend", "emulator")


def test_outputs_a_folder_is_refused_and_leaves_no_temporary_file(tmp_path, norm_run):
    folder = tmp_path / "results"
    folder.mkdir()
    before = sorted(os.listdir(tmp_path))
    result = norm_run(folder)
    assert result.returncode == 2 and f"--outputs {folder}: is a folder" in result.stderr, result
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(folder) == []


def test_outputs_a_device_is_refused_and_stays_a_device(norm_run):
    """As root, renaming a temporary file over /dev/null would replace the device node."""
    result = norm_run("/dev/null")
    assert result.returncode == 2 and "--outputs /dev/null: is not a regular file" in result.stderr, result
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_outputs_a_symbolic_link_is_refused(tmp_path, norm_run):
    target = tmp_path / "real.npz"
    target.write_bytes(b"keep")
    link = tmp_path / "link.npz"
    link.symlink_to(target)
    result = norm_run(link)
    assert result.returncode == 2 and "is a symbolic link" in result.stderr, result
    assert target.read_bytes() == b"keep" and link.is_symlink()


def test_outputs_is_written_whole_with_the_umasks_permissions_or_the_replaced_files(tmp_path, norm_run):
    out, old = tmp_path / "out.npz", tmp_path / "old.npz"
    old.write_bytes(b"old")
    old.chmod(0o604)
    mask = os.umask(0o027)
    try:
        assert norm_run(out).returncode == 0 and norm_run(old).returncode == 0
    finally:
        os.umask(mask)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o604
    for path in (out, old):
        with np.load(path) as saved:
            assert saved["y"].shape == (3, 4096)
    assert sorted(os.listdir(tmp_path)) == ["in.npz", "old.npz", "out.npz"], "no temporary file is left"


@pytest.mark.parametrize("args, named", [
    (["verify", str(SPEC), "--seed", "-1"], "--seed"),
    (["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--tensor-tflops", "0"], "--tensor-tflops"),
    (["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--gpu", "h100"], "--gpu"),
    (["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--arch", "garbage"], "--arch"),
    (["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--arch", "sm_"], "--arch"),
    (["verify", str(SPEC), "--arch", "compute_90"], "--arch"),
    (["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--set", "seq_len=4"], "seq_len"),
    (["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--set", "rows=0x"], "--set"),
    (["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--set", "rows=1,2"], "rows"),
    (["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--tensor-tflops", "inf"], "--tensor-tflops: expected a finite"),
    (["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--set", "rows=" + "9" * 5000 + "x"], "--set: expected NAME="),
    (["run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", "in.npz", "--outputs", "o.npz", "--backend", "gpu"],
     "--backend"),
])
def test_bad_option_values_are_usage_errors(args, named):
    result = run_cli_in_process(*args)
    assert result.returncode == 2 and named in result.stderr and result.stdout == "", result
    assert len(result.stderr) < 400, "a message quotes a bounded part of what it was given"


def test_set_takes_decimal_with_leading_zeros_and_python_integers():
    from ptxgen.cli import parse_sets

    assert parse_sets(["rows=02", "pos=0x40,007"]) == {"rows": [2], "pos": [64, 7]}


def test_an_arch_the_spec_has_no_code_for_is_refused(tmp_path):
    """--arch picks the code a GPU of that arch runs; where the spec built nothing it can run (PTX
    for sm_90 on an sm_86), the arch is refused, not quietly replaced by the portable PTX."""
    spec = tmp_path / "hopper.toml"
    spec.write_text('[target]\narchs = ["sm_90"]\n\n[[kernels]]\nname = "norm"\nkind = "rmsnorm"\nhidden = 256\n')
    refused = run_cli_in_process("show", "norm", "--spec", str(spec), "--arch", "sm_86", "--no-model")
    assert refused.returncode == 2 and "norm: nothing runs on sm_86: PTX for sm_90" in refused.stderr, refused
    later = run_cli_in_process("show", "norm", "--spec", str(spec), "--arch", "sm_100", "--no-model")
    assert later.returncode == 0 and "launch (sm_90 PTX)" in later.stdout, later
    with pytest.raises(LaunchError, match="'compute_90' is not an arch"):
        spec_kernel(SPEC, "qwen3_8b_rmsnorm").variant("compute_90")


def test_read_only_outputs_are_refused_not_replaced(tmp_path, norm_run):
    """A read-only --outputs file or build folder is the user's decision to keep it: refused, both
    left as they were (the folder holding them could still be written), by root too (its mode,
    not access(2), which grants root everything)."""
    out = tmp_path / "kept.npz"
    out.write_bytes(b"mine")
    out.chmod(0o444)
    result = norm_run(out)
    assert result.returncode == 2 and "the file is read-only; refusing to replace it" in result.stderr, result
    assert out.read_bytes() == b"mine"
    folder = tmp_path / "build"
    folder.mkdir(mode=0o555)
    spec = tmp_path / "one.toml"
    spec.write_text('[[kernels]]\nname = "norm"\nkind = "rmsnorm"\nhidden = 256\n')
    built = run_cli_in_process("build", str(spec), "-o", str(folder), "--arch", "sm_80")
    assert built.returncode == 2 and "the folder is read-only" in built.stderr, built
    inside = norm_run(folder / "out.npz")
    assert inside.returncode == 2 and f"the folder {folder} is read-only" in inside.stderr, inside
    assert not any(folder.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build", "in.npz", "kept.npz", "one.toml"]


@pytest.mark.parametrize("command", [
    ["validate", "{toml}"], ["spec", "from-hf", "{json}", "--quant", "q4_k"], ["spec", "from-gguf", "{gguf}"],
    ["generate", "{gguf}", "--tokens", "1", "--backend", "emulator"],
    ["run", "qwen3_8b_rmsnorm", "--spec", str(ROOT / "specs" / "qwen3.toml"), "--inputs", "{npz}", "--outputs", "{out}"],
])
def test_an_unreadable_input_is_one_message_naming_it(tmp_path, command):
    """Not click's three-line usage error: ptxgen's own check, one line, exit 2."""
    prefix = unprivileged()
    if prefix is None:
        pytest.skip("running as root without setpriv: file permissions do not bind")
    files = {suffix: tmp_path / f"unreadable.{suffix}" for suffix in ("toml", "json", "gguf", "npz")}
    for path in files.values():
        path.write_bytes(b"x")
        path.chmod(0)
    args = [part.format(**files, out=tmp_path / "out.npz") for part in command]
    result = subprocess.run([*prefix, sys.executable, "-m", "ptxgen.cli", *args], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "unreadable." in lines[0], result.stderr
    assert "Permission denied" in lines[0], lines[0]


def test_a_smaller_grid_only_for_launches_correct_with_any_grid():
    from ptxgen.runner import run

    kernel = spec_kernel(SPEC, "qwen3_8b_rmsnorm")
    inputs = kernel.definition.sample_inputs(np.random.default_rng(0), {"rows": 2})
    with pytest.raises(LaunchError, match="needs a launch correct with any smaller 1-D grid"):
        run(kernel, inputs, {"rows": 2}, grid=1)


def test_output_that_cannot_be_written_is_one_message():
    """Standard output full (/dev/full) or closed: one line on stderr, exit 2, no traceback."""
    command = f"{sys.executable} -m ptxgen.cli list"
    for redirect, message in ((">/dev/full", "error: standard output: cannot write (No space left on device)"),
                              (">&-", "error: standard output is closed; ptxgen prints its results there")):
        if redirect == ">/dev/full" and not os.path.exists("/dev/full"):
            continue
        result = subprocess.run(["bash", "-c", f"{command} {redirect}"], cwd=ROOT, capture_output=True, text=True,
                                timeout=300)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), (redirect, result)


def test_spec_from_gguf_checks_its_output_before_reading_the_model(tmp_path):
    """-o may not name the model itself (even with --force), and an existing spec without --force
    is refused before the model is read: nothing is written, the model is untouched."""
    from fixtures.make_tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "model.toml")  # a GGUF file under a spec's name
    before = model.read_bytes()
    result = run_cli("spec", "from-gguf", str(model), "-o", str(model), "--force")
    assert result.returncode == 2 and f"is the input file {model}; refusing to replace it" in result.stderr, result
    assert model.read_bytes() == before
    existing = tmp_path / "mine.toml"
    existing.write_text("# mine\n")
    result = run_cli("spec", "from-gguf", str(tmp_path / "no_such.gguf"), "-o", str(existing))
    assert result.returncode == 2 and "mine.toml: already exists; refusing to replace it" in result.stderr, result
    assert existing.read_text() == "# mine\n"


def test_show_code_listings_check_their_set_too():
    for code in ("--ptx", "--sass"):
        for value, message in (("seq_len=99999999", "runtime scalar 'seq_len': expected an integer in 0..40960"),
                               ("nope=1", "unknown runtime scalar 'nope'")):
            result = run_cli_in_process("show", "qwen3_8b_decode_attention", "--spec", str(SPEC), code, "--set", value)
            assert result.returncode == 2 and message in result.stderr and result.stdout == "", (code, value, result)


def test_show_json_and_code_listings_are_refused_together():
    for code in ("--ptx", "--sass"):
        result = run_cli_in_process("show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--json", code)
        assert result.returncode == 2 and result.stdout == "", result
        assert f"--json prints the report as JSON, {code} the kernel's code" in result.stderr


# --- a length the kernel reads on the device is no runtime scalar of `run` ----------------------------------
GRAPH_SPEC = ('[target]\narchs = ["sm_80"]\n\n[[kernels]]\nname = "attn"\nkind = "incremental_attention"\nnum_heads = 4\n'
              'num_kv_heads = 1\nhead_dim = 64\nmax_seq_len = 64\nindirect_seq_len = true\n')


@pytest.fixture
def graph_inputs(tmp_path):
    spec = tmp_path / "graph.toml"
    spec.write_text(GRAPH_SPEC)
    kind = spec_kernel(spec, "attn").definition
    inputs = kind.sample_inputs(np.random.default_rng(0), {"seq_len": 64})
    return spec, inputs


@pytest.mark.parametrize("where", ["--set", "--inputs"])
def test_a_length_read_on_the_device_is_refused_as_a_scalar(tmp_path, graph_inputs, where):
    """As the API refuses `seq_len=` for an indirect_seq_len kernel, `run` refuses --set seq_len or a 0-d
    seq_len member: the kernel reads seq_len_ptr[0], so the value given would be silently ignored."""
    spec, inputs = graph_inputs
    path, out = tmp_path / "in.npz", tmp_path / "out.npz"
    scalar = {"seq_len": np.uint32(5)} if where == "--inputs" else {}
    np.savez(path, **inputs, **scalar)
    extra = ["--set", "seq_len=5"] if where == "--set" else []
    result = run_cli_in_process("run", "attn", "--spec", str(spec), "--inputs", str(path), "--outputs", str(out),
                                "--backend", "emulator", *extra)
    assert result.returncode == 2, result
    assert (f"{where} {path}: seq_len" if where == "--inputs" else "--set seq_len") in result.stderr, result.stderr
    assert "'seq_len' is not an argument of this kernel: it reads that value on the device, from seq_len_ptr" \
        in result.stderr, result.stderr
    assert not out.exists()
    np.savez(path, **inputs)  # the length in seq_len_ptr alone runs
    result = run_cli_in_process("run", "attn", "--spec", str(spec), "--inputs", str(path), "--outputs", str(out),
                                "--backend", "emulator")
    assert result.returncode == 0, result.stderr
    with np.load(out) as saved:
        assert np.isfinite(saved["out"]).all()


# --- a workspace in --inputs must be at rest ------------------------------------------------------------------
ARGMAX_SPEC = '[target]\narchs = ["sm_80"]\n\n[[kernels]]\nname = "am"\nkind = "argmax"\nn = 70001\n'


def test_a_workspace_given_not_at_rest_is_refused(tmp_path):
    """argmax's state words (a max key and a CTA counter that every launch leaves at 0) given other
    than at rest made the last CTA miscount and write index 4294967295, past x, with exit 0; an
    earlier run's output file (its state at rest) still runs again."""
    spec = tmp_path / "argmax.toml"
    spec.write_text(ARGMAX_SPEC)
    x = np.random.default_rng(0).standard_normal(70001).astype(np.float32)
    bad, first, second = tmp_path / "bad.npz", tmp_path / "first.npz", tmp_path / "second.npz"
    np.savez(bad, x=x, state=np.full(4, 1000, np.uint32))
    result = run_cli_in_process("run", "am", "--spec", str(spec), "--inputs", str(bad), "--outputs", str(first),
                                "--backend", "emulator")
    assert result.returncode == 2, result
    assert f"--inputs {bad}: workspace 'state' is not at rest: 4 words" in result.stderr, result.stderr
    assert not first.exists()
    np.savez(bad, x=x)
    for inputs, outputs in ((bad, first), (first, second)):
        result = run_cli_in_process("run", "am", "--spec", str(spec), "--inputs", str(inputs), "--outputs",
                                    str(outputs), "--backend", "emulator")
        assert result.returncode == 0, result.stderr
        with np.load(outputs) as saved:
            assert saved["index"][0] == np.argmax(x) and not saved["state"].any()
