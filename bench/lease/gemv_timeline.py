"""Where a quantised GEMV launch's time goes: a spec's q4k_gemv (or another kind of the family) with
`timeline = true` (q4k_gemv's TIMELINE: thread 0 of each CTA stamps %globaltimer as it starts,
after its PDL wait and once x is staged, lane 0 of each warp as the warp ends), launched alone
(after one to warm up) and as the last of ten queued back to back, as bench's batched figures run
them (a PDL launch overlaps the one before); prints for each: the launch's span over its CTAs, how
far apart they started, the longest PDL wait, the staging of x, a CTA's rows (staged to its last
warp's end), how far apart a CTA's warps end, and the grid's tail (its last CTA's end after the
median CTA's). Why: on the H200 of 2026-11-28 the default GEMVs cost 2.96 us a launch beyond
their bytes at 3911 GB/s (batched; 6.12 us per run), and issue 12's 80% of copy bandwidth at
12288 x 4096 leaves them about 1.

    python3 bench/lease/gemv_timeline.py bench/lease/decode.toml gemv_12288x4096 gemv_4096x4096 \\
        --json gemv_timeline.json
"""

from __future__ import annotations

import sys

import numpy as np

from decoder_timeline import QUEUED, last_timeline, save, stamps, timeline_arguments, timeline_kernel
from ptxgen.errors import exit_from
from ptxgen.kernels.q4k_gemv import TIMELINE_STAMPS


def summarize(timeline: np.ndarray) -> dict:
    """The launch's figures (ns) from the rows of the CTAs it ran (a row of zeros: a CTA a shrunk
    grid did not run)."""
    t = stamps(timeline[timeline.any(axis=1)])
    start, waited, staged, ends = t[:, 0], t[:, 2], t[:, 3], t[:, TIMELINE_STAMPS:]
    end = ends.max(axis=1)
    staging, rows = staged - waited, end - staged
    return {"ctas": int(len(t)), "kernel_ns": int(end.max() - start.min()),
            "start_spread_ns": int(start.max() - start.min()), "wait_ns": int((waited - start).max()),
            "staging_mean_ns": int(staging.mean()), "staging_max_ns": int(staging.max()),
            "rows_mean_ns": int(rows.mean()), "rows_max_ns": int(rows.max()),
            "warp_spread_ns": int((end - ends.min(axis=1)).mean()),
            "tail_ns": int(end.max() - np.median(end))}


def measure(kernel, backend: str = "device", launches: int = 2, back_to_back: int = 1,
            inputs: dict | None = None) -> dict:
    """summarize() of the last launch of `launches` runs, each of `back_to_back` launches queued
    together, on `inputs` (default: the kind's sample inputs)."""
    return summarize(last_timeline(kernel, {}, backend, launches, inputs, back_to_back))


def report(how: str, summary: dict) -> str:
    us = lambda key: f"{summary[key] / 1e3:.2f}"  # noqa: E731
    return (f"{how}: {summary['ctas']} CTAs over {us('kernel_ns')} us, started {us('start_spread_ns')} us apart, "
            f"PDL wait at most {us('wait_ns')} us; staging x {us('staging_mean_ns')} us (longest "
            f"{us('staging_max_ns')}), rows {us('rows_mean_ns')} us (longest {us('rows_max_ns')}), a CTA's warps "
            f"ending {us('warp_spread_ns')} us apart, the last CTA {us('tail_ns')} us after the median one")


def main(argv: list[str]) -> int:
    args = timeline_arguments(__doc__, argv)
    summaries: dict = {}
    for name in args.kernels:
        kernel = timeline_kernel(args.spec, name)
        inputs = kernel.definition.sample_inputs(np.random.default_rng(0), {})
        figures = summaries.setdefault(kernel.name, {})
        print(f"{kernel.name}:")
        for how, queued in QUEUED:
            figures[how] = measure(kernel, back_to_back=queued, inputs=inputs)
            print(f"  {report(how, figures[how])}")
            save(args.json, summaries)
    return 0


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
