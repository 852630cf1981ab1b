"""Time `ptxgen build specs/qwen3.toml`: cold (empty cache) and warm (every cubin cached).

Reports wall time of the whole command (interpreter start-up included), the start-up alone
(`ptxgen --help`), and cold assembly time per kernel per arch. Usage:
    .venv/bin/python bench/build_speed.py [SPEC] [--repeat N] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default="specs/qwen3.toml")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    ptxgen = [sys.executable, "-m", "ptxgen.cli"]
    with tempfile.TemporaryDirectory() as scratch:
        out = str(Path(scratch) / "out")
        build = [*ptxgen, "build", args.spec, "-o", out, "-q", "--jobs", str(args.jobs)]
        startup = [timed([*ptxgen, "--help"], dict(os.environ)) for _ in range(args.repeat)]
        cold = []
        for attempt in range(args.repeat):
            env = {**os.environ, "PTXGEN_CACHE_DIR": str(Path(scratch) / f"cache{attempt}")}
            cold.append(timed(build, env))
        warm = [timed(build, env) for _ in range(args.repeat)]
        manifest = json.loads((Path(out) / "manifest.json").read_text())
    units = sum(len(k["cubins"]) for k in manifest["kernels"].values())
    result = {
        "spec": args.spec, "kernels": len(manifest["kernels"]), "kernel_x_arch": units, "jobs": args.jobs,
        "startup_s": statistics.median(startup), "cold_s": statistics.median(cold), "warm_s": statistics.median(warm),
    }
    result["warm_beyond_startup_s"] = result["warm_s"] - result["startup_s"]
    result["cold_ms_per_kernel_arch"] = 1000 * (result["cold_s"] - result["warm_s"]) / units
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
