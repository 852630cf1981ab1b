"""bench/lease: the prepared call for a lent GPU. Its specs load and assemble without spills (a
stale field or a spilling variant would cost the lease itself), and its script parses."""

from __future__ import annotations

import subprocess

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
