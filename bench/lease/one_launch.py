"""One launch of a spec's kernel on the GPU, on its kind's sample inputs at the given runtime
scalars, for Nsight Compute to profile alone (`ptxgen bench` first checks a kernel at its kind's
verify sizes, so `ncu -c 1` on a bench would catch one of those launches instead):

    ncu --section SpeedOfLight -k regex:'^prefill_sm90a$' -c 1 \
        python3 bench/lease/one_launch.py bench/lease/prefill_sm90a.toml prefill_sm90a seq_len=4096
"""

from __future__ import annotations

import sys

import numpy as np

from ptxgen.cli import compile_one
from ptxgen.device import driver
from ptxgen.errors import PtxgenError, exit_from
from ptxgen.runner import run
from ptxgen.spec import load_spec

USAGE = "usage: one_launch.py SPEC KERNEL [NAME=VALUE ...]"


def main(argv: list[str], backend: str = "device") -> int:
    if len(argv) < 2:
        raise PtxgenError(USAGE)
    spec_path, name, *assignments = argv
    try:
        scalars = {key: int(value) for key, value in (pair.split("=", 1) for pair in assignments)}
    except ValueError:
        raise PtxgenError(f"runtime scalars: expected NAME=INTEGER, got {' '.join(assignments)!r} ({USAGE})") from None
    spec = load_spec(spec_path)
    compiled = compile_one(spec, spec.spec.kernel(name))
    if backend == "device":
        driver(instead="one_launch.py launches on a GPU, for Nsight Compute")
    inputs = compiled.definition.sample_inputs(np.random.default_rng(0), scalars)
    run(compiled, inputs, scalars, backend=backend)
    print(f"{name} {scalars}: one launch ({backend})")
    return 0


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
