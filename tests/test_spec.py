"""Spec files: good specs load, every bad field is one clear line, never a traceback."""

from __future__ import annotations

import os
import time

import pytest

from ptxgen.assemble import assemble_nvjitlink, nvjitlink_version
from ptxgen.errors import AssemblerError, SpecError
from ptxgen.kernels import KINDS
from ptxgen.kernels.base import KernelConfig
from ptxgen.pipeline import compile_spec
from ptxgen.spec import load_spec, ptx_isa_versions
from ptxgen.quote import MAX_QUOTE
from ptxgen.specfile import MAX_BYTES, MAX_DEPTH

from helpers import SPECS, make_config, run_cli


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_shipped_specs_load(path):
    spec = load_spec(path).spec
    assert spec.kernels, f"{path} has no kernels"
    assert len({k.name for k in spec.kernels}) == len(spec.kernels)


def write(tmp_path, text: str, suffix: str = ".toml"):
    path = tmp_path / f"spec{suffix}"
    path.write_text(text)
    return path


def error_of(tmp_path, text: str, suffix: str = ".toml") -> str:
    with pytest.raises(SpecError) as caught:
        load_spec(write(tmp_path, text, suffix))
    return str(caught.value)


@pytest.mark.parametrize(
    "entry, field, given",
    [
        ('kind = "rmsnorm"\nhidden = 0', "hidden", "0"),
        ('kind = "rmsnorm"\nhidden = 4096\ndtype = "f64"', "dtype", "'f64'"),
        ('kind = "rmsnorm"\nhidden = 4096\neps = -1.0', "eps", "-1.0"),
        ('kind = "rmsnorm"\nhidden = 4096\nwarps = 4', "warps", "4"),
        ('kind = "rmsnorm"\nhidden = "big"', "hidden", "'big'"),
        ('kind = "rmsnorm"', "hidden", ""),
        ('kind = "per_head_rmsnorm"\nnum_heads = 0\nhead_dim = 128', "num_heads", "0"),
        ('kind = "rmsnorm"\nhidden = 1000000', "hidden", ""),
        ('kind = "no_such_kind"\nhidden = 1', "kind", "no_such_kind"),
    ],
)
def test_bad_field_names_file_kernel_field(tmp_path, entry, field, given):
    message = error_of(tmp_path, f'[[kernels]]\nname = "bad_one"\n{entry}\n')
    assert len(message.splitlines()) == 1, message
    assert "spec.toml" in message and "'bad_one'" in message and field in message, message
    assert given in message, message


def test_an_unknown_or_missing_kind_names_every_kind(tmp_path):
    """pydantic's message clipped its list of kinds before rmsnorm (the kind a typo "rmsnrm" meant)
    and echoed the whole entry; a kind written as a number was quoted as a string."""
    message = error_of(tmp_path, '[[kernels]]\nname = "n1"\nkind = "rmsnrm"\nhidden = 256\n')
    assert message == (f"{tmp_path / 'spec.toml'}: kernel 'n1' (kernels[0]): kind: expected one of "
                       f"{', '.join(KINDS)} (got 'rmsnrm')"), message
    assert "rmsnorm, rope, swiglu (got" in message
    assert error_of(tmp_path, '[[kernels]]\nname = "n1"\nkind = 3\n').endswith("kind: expected one of "
                                                                                f"{', '.join(KINDS)} (got 3)")
    assert error_of(tmp_path, '[[kernels]]\nname = "n1"\nhidden = 256\n') == (
        f"{tmp_path / 'spec.toml'}: kernel 'n1' (kernels[0]): kind: Field required")


def test_unknown_top_level_and_target_fields(tmp_path):
    message = error_of(tmp_path, '[target]\narchs = ["sm_70"]\n[[kernels]]\nname="a"\nkind="rmsnorm"\nhidden=8\n')
    assert "target.archs" in message and "sm_70" in message
    message = error_of(tmp_path, 'colour = 1\n[[kernels]]\nname="a"\nkind="rmsnorm"\nhidden=8\n')
    assert "colour" in message


def test_duplicate_names_and_bad_identifiers(tmp_path):
    twice = '[[kernels]]\nname="a"\nkind="rmsnorm"\nhidden=8\n' * 2
    assert "used twice" in error_of(tmp_path, twice)
    message = error_of(tmp_path, '[[kernels]]\nname="has space"\nkind="rmsnorm"\nhidden=8\n')
    assert "name" in message and "has space" in message


def test_names_must_be_ptx_identifiers_and_their_header_blocks_must_not_collide(tmp_path):
    """PTX takes "_" only before another character; the C header upper-cases names for macros and
    suffixes an arch-specific variant's launch functions with its target."""
    kernel = '[[kernels]]\nname="{}"\nkind="rmsnorm"\nhidden=8\n{}'
    assert "kernel '_' (kernels[0]): name: String should match pattern" in error_of(tmp_path, kernel.format("_", ""))
    assert load_spec(write(tmp_path, kernel.format("_1", "")))
    message = error_of(tmp_path, kernel.format("norm", "") + kernel.format("NORM", ""))
    assert "kernels[1].name: 'NORM' and 'norm' would both define NORM_COOPERATIVE in the C header" in message
    hopper = '[target]\narchs=["sm_80", "sm_90"]\n' + kernel.format("a", "pdl=true\n") + kernel.format("a_sm_90", "")
    assert "'a_sm_90' and 'a' would both define A_SM_90_COOPERATIVE" in error_of(tmp_path, hopper)
    portable = '[target]\narchs=["sm_80", "sm_86"]\n' + kernel.format("a", "pdl=true\n") + kernel.format("a_sm_90", "")
    assert load_spec(write(tmp_path, portable)), "no sm_90 variant of a: no collision"


def test_entry_may_not_share_a_parameter_name(tmp_path):
    """Refused where its PTX is rendered (render.check_entry_name, the one check of a name against
    the PTX: a parameter is declared there), before anything is written, naming the file."""
    from helpers import CliResult, run_cli_in_process

    path = write(tmp_path, '[[kernels]]\nname="gamma"\nkind="rmsnorm"\nhidden=8\n')
    assert run_cli_in_process("validate", str(path)) == CliResult(2, "", (
        f"error: {path}: kernel 'gamma': the rmsnorm kind's PTX uses 'gamma' for a name of its own (a parameter, a "
        "label, a variable or a PTX keyword); choose another kernel name\n"))


def test_shared_memory_an_arch_lacks_is_one_line_for_every_arch_alike(tmp_path):
    path = write(tmp_path, '[target]\narchs = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_120"]\n\n[[kernels]]\n'
                           'name = "t"\nkind = "q4k_gemv"\nn = 64\nk = 16384\nwarps = 32\nrows_per_warp = 32\n'
                           'schedule = "static"\n')
    with pytest.raises(SpecError) as error:
        load_spec(path)
    assert str(error.value) == (f"{path}: kernel 't' (kernels[0]): needs 155652 bytes of shared memory, sm_86, sm_89 "
                                "and sm_120 allow 101376")


def test_ptx_version_too_old_for_arch(tmp_path):
    message = error_of(tmp_path, '[target]\narchs=["sm_90"]\nptx_version="7.0"\n'
                                 '[[kernels]]\nname="a"\nkind="rmsnorm"\nhidden=8\n')
    assert "ptx_version" in message and "7.8" in message


def test_yaml_and_toml_share_one_schema(tmp_path):
    toml = load_spec(write(tmp_path, '[[kernels]]\nname="a"\nkind="rmsnorm"\nhidden=8\ndtype="bf16"\n')).spec
    yaml = load_spec(write(tmp_path, "kernels:\n  - {name: a, kind: rmsnorm, hidden: 8, dtype: bf16}\n", ".yaml")).spec
    assert toml == yaml


def test_syntax_errors_and_unknown_suffix(tmp_path):
    assert "not a valid TOML" in error_of(tmp_path, "[[kernels]\n")
    assert "not a valid YAML" in error_of(tmp_path, "kernels: [\n", ".yaml")
    assert "expected a .toml" in error_of(tmp_path, "x", ".json")
    assert "cannot read" in str(pytest.raises(SpecError, load_spec, tmp_path / "missing.toml").value)


def test_cli_exit_2_without_traceback(tmp_path):
    path = write(tmp_path, '[[kernels]]\nname="bad_one"\nkind="rmsnorm"\nhidden=0\n')
    for command in (["validate", str(path)], ["build", str(path), "-o", str(tmp_path / "out")]):
        result = run_cli(*command)
        assert result.returncode == 2, result
        assert "Traceback" not in result.stderr and "hidden" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists(), "a failed build must write nothing"


@pytest.mark.parametrize("name, kind, fields", [
    ("ret", "rmsnorm", "hidden = 64"),                  # a PTX keyword
    ("DONE", "argmax", "n = 100"),                      # a label of the kind's template
])
def test_validate_refuses_what_build_refuses_as_it_renders(tmp_path, name, kind, fields):
    """validate said "ok" for a kernel named like a name in its PTX, which build then refused: one
    line naming the file and the kernel, exit 2."""
    path = write(tmp_path, f'[target]\narchs = ["sm_80"]\n\n[[kernels]]\nname = "{name}"\nkind = "{kind}"\n{fields}\n')
    result = run_cli("validate", str(path))
    assert result.returncode == 2, result
    assert result.stderr == (f"error: {path}: kernel {name!r}: the {kind} kind's PTX uses {name!r} for a name of its "
                             "own (a parameter, a label, a variable or a PTX keyword); choose another kernel name\n"), \
        result.stderr


# --- files that must not be read (whole) -------------------------------------------------------------
def test_devices_pipes_folders_and_huge_files_are_refused_before_reading(tmp_path):
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    huge = write(tmp_path, "# " + "x" * MAX_BYTES + "\n")
    for path, expected in [(zero, "not a regular file"), (fifo, "not a regular file"), (folder, "is a folder"),
                           (huge, f"at most {MAX_BYTES:,} bytes"), (tmp_path / "/dev/zero", "expected a .toml")]:
        started = time.monotonic()
        message = str(pytest.raises(SpecError, load_spec, path).value)
        assert message.startswith(str(path)) and expected in message, message
        assert time.monotonic() - started < 5, f"{path} took {time.monotonic() - started:.1f} s"


# --- YAML: bounded aliases, no duplicate keys, YAML 1.2 numbers ----------------------------------------------
def billion_laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines + [f"kernels: [*a{levels - 1}]"]) + "\n"


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    text = billion_laughs()
    assert len(text) < 600  # 9^9 = 387 million strings once expanded
    started = time.monotonic()
    message = error_of(tmp_path, text, ".yaml")
    assert time.monotonic() - started < 2 and "expands to more than 100,000 values" in message, message
    assert len(message) < 200, message
    assert "refers to a node that contains it" in error_of(tmp_path, "kernels: &a [*a]\n", ".yaml")


def test_yaml_merge_keys_and_anchors_within_kernels(tmp_path):
    text = "kernels:\n  - &base {name: a, kind: rmsnorm, hidden: 64}\n  - {<<: *base, name: b, hidden: 128}\n"
    kernels = load_spec(write(tmp_path, text, ".yaml")).spec.kernels
    assert [(k.name, k.hidden) for k in kernels] == [("a", 64), ("b", 128)]


@pytest.mark.parametrize("text", [
    "kernels:\n  - {name: a, kind: rmsnorm, hidden: 8, hidden: 9}\n",
    "kernels: []\nkernels:\n  - {name: a, kind: rmsnorm, hidden: 8}\n",
    "kernels:\n  - name: a\n    kind: rmsnorm\n    name: b\n    hidden: 8\n",
])
def test_yaml_duplicate_keys_are_refused_as_in_toml(tmp_path, text):
    message = error_of(tmp_path, text, ".yaml")
    assert "duplicate key" in message and len(message.splitlines()) == 1, message
    assert "Cannot overwrite a value" in error_of(tmp_path, '[[kernels]]\nname="a"\nname="b"\nkind="rmsnorm"\nhidden=8\n')


@pytest.mark.parametrize("written, value", [("1e-6", 1e-6), ("1E-6", 1e-6), ("1.0e-6", 1e-6), ("5e-7", 5e-7)])
def test_yaml_reads_numbers_as_yaml_1_2_does(tmp_path, written, value):
    spec = load_spec(write(tmp_path, f"kernels:\n  - {{name: a, kind: rmsnorm, hidden: 8, eps: {written}}}\n", ".yaml"))
    assert spec.spec.kernels[0].eps == value and isinstance(spec.spec.kernels[0].eps, float)


@pytest.mark.parametrize("written, outcome", [
    ("0x40", 64), ("0o100", 64), ("064", 64), ("+64", 64),  # YAML 1.1 read 064 as octal (52)
    ("1_000", "Input should be a valid integer"), ("1:04", "Input should be a valid integer"),  # 1.1: 1000, 64
    ("'64'", "Input should be a valid integer"), ("64.0", "Input should be a valid integer"),
    ("yes", "Input should be a valid integer"), ("!!float abc", "not a valid YAML"),
    ("!!timestamp 2001-01-01", "not a valid YAML"), ("1" * 5000, "not a valid YAML"),
])
def test_yaml_integers(tmp_path, written, outcome):
    path = write(tmp_path, f"kernels:\n  - {{name: a, kind: rmsnorm, hidden: {written}}}\n", ".yaml")
    if isinstance(outcome, int):
        assert load_spec(path).spec.kernels[0].hidden == outcome
    else:
        message = str(pytest.raises(SpecError, load_spec, path).value)
        assert outcome in message and len(message) < 600, message


def test_booleans_are_true_and_false_only(tmp_path):
    entry = "{name: a, kind: incremental_attention, num_heads: 2, num_kv_heads: 1, head_dim: 128, max_seq_len: 64"
    spec = load_spec(write(tmp_path, f"kernels:\n  - {entry}, indirect_seq_len: true}}\n", ".yaml"))
    assert spec.spec.kernels[0].indirect_seq_len is True
    for word in ("yes", "on", "1"):
        message = error_of(tmp_path, f"kernels:\n  - {entry}, indirect_seq_len: {word}}}\n", ".yaml")
        assert "indirect_seq_len" in message and "valid boolean" in message, message


# --- nesting, sizes, echoes ------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix, text", [
    (".toml", "a = " + "[" * 5000 + "]" * 5000 + "\n"),
    (".toml", "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n"),
    (".toml", "[" + ".".join(["a"] * 3000) + "]\n"),
    (".toml", "a = " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n"),
    (".yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n"),
    (".yaml", "a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\n"),
    (".yaml", "kernels:\n" + "".join("  " * i + "- \n" for i in range(300)) + "  " * 300 + "1\n"),
])
def test_deep_nesting_is_one_message(tmp_path, suffix, text):
    message = error_of(tmp_path, text, suffix)
    assert message == f"{tmp_path / ('spec' + suffix)}: nested more than {MAX_DEPTH} levels deep; a spec needs at most 4"


def test_errors_echo_a_bounded_part_of_the_input(tmp_path):
    long_kind = error_of(tmp_path, f'[[kernels]]\nname = "a"\nkind = "{"k" * 200_000}"\nhidden = 8\n')
    long_name = error_of(tmp_path, f'[[kernels]]\nname = "{"n" * 200_000}"\nkind = "rmsnorm"\nhidden = [{"1," * 50_000}]\n')
    many = error_of(tmp_path, '[[kernels]]\nname = "a"\nkind = "rmsnorm"\nhidden = "x"\n' * 500)
    newline_key = error_of(tmp_path, '[[kernels]]\nname = "a"\nkind = "rmsnorm"\nhidden = 8\n"x\\ny" = 1\n')
    for message in (long_kind, long_name, many, newline_key):
        assert all(len(line) < 200 + 3 * MAX_QUOTE for line in message.splitlines()), message[:2000]
    assert len(many.splitlines()) == 21 and many.endswith("... and 480 more problems"), many[-300:]
    assert len(newline_key.splitlines()) == 1 and "'x\\ny'" in newline_key, newline_key


# --- strict types ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry, field, expected", [
    ('kind = "rmsnorm"\nhidden = true', "hidden", "valid integer (got True)"),
    ('kind = "rmsnorm"\nhidden = "4096"', "hidden", "valid integer (got '4096')"),
    ('kind = "rmsnorm"\nhidden = 4096.0', "hidden", "valid integer (got 4096.0)"),
    ('kind = "rmsnorm"\nhidden = 4096\neps = "1e-6"', "eps", "valid number (got '1e-6')"),
    ('kind = "rmsnorm"\nhidden = 4096\neps = true', "eps", "valid number (got True)"),
    ('kind = "rmsnorm"\nhidden = 4096\ndtype = 16', "dtype", "'f32', 'f16' or 'bf16'"),
    ('kind = "flash_attention"\nnum_heads = 8\nnum_kv_heads = 8\nhead_dim = 64\ncausal = 1', "causal", "boolean"),
    ('kind = "flash_attention"\nnum_heads = 8\nnum_kv_heads = 8\nhead_dim = 64\nsm90a = {consumers = "2"}',
     "sm90a.consumers", "valid integer"),
    ('kind = "flash_attention"\nnum_heads = 8\nnum_kv_heads = 8\nhead_dim = 64\nsm90a = {overlap = "yes"}',
     "sm90a.overlap", "valid boolean"),
])
def test_values_are_taken_strictly(tmp_path, entry, field, expected):
    message = error_of(tmp_path, f'[[kernels]]\nname = "strict_one"\n{entry}\n')
    assert len(message.splitlines()) == 1 and f"'strict_one' (kernels[0]): {field}: " in message, message
    assert expected in message, message


def test_integers_are_fine_for_float_fields(tmp_path):
    kernel = load_spec(write(tmp_path, '[[kernels]]\nname = "r"\nkind = "rope"\nnum_heads = 2\nhead_dim = 8\n'
                                       'theta = 10000\n')).spec.kernels[0]
    assert kernel.theta == 10000.0 and isinstance(kernel.theta, float)


def test_archs_must_be_a_list(tmp_path):
    message = error_of(tmp_path, '[target]\narchs = "sm_80"\n[[kernels]]\nname="a"\nkind="rmsnorm"\nhidden=8\n')
    assert "target.archs: expected a list (got 'sm_80')" in message, message


# --- floats that become f32 --------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("eps", "1e-50"), ("eps", "1e-40"), ("eps", "nan"),
    ("scale", "inf"), ("scale", "1e300"), ("scale", "1e-50"), ("scale", "3.5e38"), ("scale", "nan"),
])
def test_floats_must_be_finite_normal_f32(tmp_path, field, value):
    if field == "eps":
        entry = f'kind = "rmsnorm"\nhidden = 64\neps = {value}'
    else:
        entry = f'kind = "incremental_attention"\nnum_heads = 2\nnum_kv_heads = 1\nhead_dim = 128\nmax_seq_len = 64\n' \
                f'scale = {value}'
    message = error_of(tmp_path, f'[[kernels]]\nname = "f"\n{entry}\n')
    assert len(message.splitlines()) == 1 and f"(kernels[0]): {field}: " in message, message


def test_the_smallest_and_largest_normal_f32_are_accepted():
    class Probe(KernelConfig):  # a float field with no bounds of its own: KernelConfig.normal_f32's
        value: float

    for value in (1.1754943508222875e-38, 3.4028234663852886e+38):
        assert Probe(name="f", value=value).value == value


def test_a_constant_derived_past_f32_is_a_build_error_naming_the_kernel():
    # scale * log2(e), the PTX's immediate, past f32 (a scale validation now refuses: set unvalidated).
    config = make_config("incremental_attention", "big_scale", num_heads=2, num_kv_heads=1, head_dim=128,
                         max_seq_len=64).model_copy(update={"scale": 3e38})
    spec = load_spec(SPECS[0]).spec.model_copy(update={"kernels": (config,)})
    message = str(pytest.raises(SpecError, compile_spec, spec, until="ptx").value)
    assert message.startswith("kernel 'big_scale': a constant of its PTX") and "not a finite f32" in message


# --- ptx_version: what validate passes, build assembles --------------------------------------------------
def spec_with_version(tmp_path, version: str, archs: str = '["sm_80"]'):
    return write(tmp_path, f'[target]\narchs = {archs}\nptx_version = {version}\n'
                           '[[kernels]]\nname = "a"\nkind = "rmsnorm"\nhidden = 64\n')


@pytest.mark.parametrize("version", ['"\u00b2.\u00b3"', '"7.80"', '"07.8"', '"7.9"', '"8.9"', '"6.4"', '"10.0"',
                                     '"8"', '"8.0.0"', '" 8.0"', '"9.9"', "8.0", "8"])
def test_ptx_versions_that_are_no_isa_version_are_refused(tmp_path, version):
    message = str(pytest.raises(SpecError, load_spec, spec_with_version(tmp_path, version)).value)
    assert "target.ptx_version: expected a quoted PTX ISA version from 7.0 to" in message, message
    assert len(message.splitlines()) == 1


def test_ptx_version_below_what_the_archs_need_is_refused(tmp_path):
    message = str(pytest.raises(SpecError, load_spec, spec_with_version(tmp_path, '"7.4"', '["sm_90"]')).value)
    assert "needs at least 7.8" in message, message


def test_every_ptx_version_validate_accepts_assembles(tmp_path):
    """validate and build agree: the oldest and newest versions validate passes assemble, and the
    version after the newest is refused by nvJitLink itself (so the bound is not too tight)."""
    versions = ptx_isa_versions()
    for version in (versions[0], versions[-1]):
        text = f"{version[0]}.{version[1]}"
        spec = load_spec(spec_with_version(tmp_path, f'"{text}"')).spec
        kernel = compile_spec(spec).kernels[0]
        assert f".version {text}\n" in kernel.portable.ptx and kernel.binaries["sm_80"].cubin[:4] == b"\x7fELF"
    major, minor = versions[-1]
    if minor < 9:
        after = f".version {major}.{minor + 1}\n.target sm_80\n.address_size 64\n.visible .entry k()\n{{\n\tret;\n}}\n"
        with pytest.raises(AssemblerError, match="Unsupported .version"):
            assemble_nvjitlink(after, "sm_80", {})
    assert nvjitlink_version().startswith("13.")


def test_a_deprecation_in_ptxgen_fails_the_test_and_elsewhere_does_not():
    """pyproject's filterwarnings: ptxgen must move off an API before it changes under it."""
    import warnings

    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit("old API", DeprecationWarning, "ops.py", 1, module="ptxgen.interp.ops")
    with warnings.catch_warnings(record=True) as caught:  # the filters pytest set, recording
        warnings.warn_explicit("old API", DeprecationWarning, "x.py", 1, module="numpy.something")
    assert len(caught) == 1
