"""bench/lease: the prepared call for a lent GPU. Its specs load and assemble without spills (a
stale field or a spilling variant would cost the lease itself), and its script parses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ptxgen.pipeline import compile_spec
from ptxgen.spec import load_spec

from helpers import ROOT

LEASE = ROOT / "bench" / "lease"


@pytest.mark.parametrize("spec", sorted(path.name for path in LEASE.glob("*.toml")))
def test_each_lease_spec_builds_without_spills(spec):
    loaded = load_spec(LEASE / spec)
    for kernel in compile_spec(loaded.spec).kernels:
        for arch, binary in kernel.binaries.items():
            res = binary.resources
            assert res["spill_stores"] == res["spill_loads"] == res["local_bytes"] == 0, f"{kernel.name} {arch}: {res}"


def test_the_lease_script_parses_and_names_every_spec():
    script = (LEASE / "run.sh").read_text()
    subprocess.run(["bash", "-n", str(LEASE / "run.sh")], check=True)
    for spec in LEASE.glob("*.toml"):
        assert spec.stem in script, f"bench/lease/run.sh never benches {spec.name}"


def test_the_profile_script_names_kernels_its_specs_hold():
    """bench/lease/profile.sh (Nsight Compute, the lease's second call) parses, and every kernel it
    profiles is in the spec it names: a stale name would cost a lent GPU's minutes."""
    subprocess.run(["bash", "-n", str(LEASE / "profile.sh")], check=True)
    calls = [line.split()[1:3] for line in (LEASE / "profile.sh").read_text().splitlines()
             if line.startswith("profile bench/")]
    assert len(calls) == 4
    for spec, name in calls:
        load_spec(ROOT / spec).spec.kernel(name)


def test_one_launch_runs_a_spec_kernel_once(capsys):
    """bench/lease/one_launch.py: one launch on the kind's sample inputs at the given scalars (here
    in the emulator; on the lease, the device under ncu)."""
    sys.path.insert(0, str(LEASE))
    import one_launch

    assert one_launch.main([str(LEASE / "prefill.toml"), "prefill_mma", "seq_len=17"], backend="emulator") == 0
    assert capsys.readouterr().out == "prefill_mma {'seq_len': 17}: one launch (emulator)\n"
