"""Spec files: good specs load, every bad field is one clear line, never a traceback."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ptxgen.errors import SpecError
from ptxgen.kernels import KINDS
from ptxgen.spec import load_spec

from helpers import SPECS, run_cli


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


def test_entry_may_not_share_a_parameter_name(tmp_path):
    message = error_of(tmp_path, '[[kernels]]\nname="gamma"\nkind="rmsnorm"\nhidden=8\n')
    assert "kernels[0].name" in message and "'gamma'" in message and "x, gamma, y, rows" in message


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


# --- hypothesis: throw malformed specs at the loader: SpecError or a valid spec, nothing else ---
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=True),
                    st.text(string.printable, max_size=8))
field_names = st.sampled_from(["name", "kind", "hidden", "dtype", "eps", "num_heads", "head_dim", "k", "n",
                               "num_kv_heads", "max_seq_len", "archs", "bogus"])
entries = st.dictionaries(field_names, st.one_of(scalars, st.sampled_from(sorted(KINDS)),
                                                 st.lists(scalars, max_size=3)), max_size=6)
documents = st.one_of(
    st.dictionaries(st.sampled_from(["kernels", "target", "x"]),
                    st.one_of(scalars, st.lists(entries, max_size=3), entries), max_size=3),
    st.lists(scalars, max_size=2), scalars)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=documents)
def test_malformed_specs_never_crash(tmp_path, document):
    import yaml

    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(document))
    try:
        load_spec(path)
    except SpecError as error:
        assert str(error).strip(), "empty error message"
        assert all(line.startswith(str(path)) for line in str(error).splitlines()), str(error)
