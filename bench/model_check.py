"""The performance model (`ptxgen show`) against recorded GPU timings, no GPU needed.

    python bench/model_check.py bench/results/H100-2026-11-23-session3/gemv_sweep.json [...] [--gpu h100-sxm]

For every timed row of a `ptxgen bench --json` / `make bench` file: the row's kernel is rebuilt
from its recorded config with today's code, the model evaluated at the row's runtime scalars,
and the measured median printed beside the model's range (overlapped .. serialized, launch
cost and tail included; the tail column is what comes after the rest of the grid, e.g. decode
attention's count-in and merge, Kind.dependent_tail). A row whose measured time falls outside
that range by more than 10% is marked; the code may have changed since the recording (its commit
is printed). Prefill attention's rows are judged too since the model prices matrix work and
exponentials and scales them by how unevenly causal CTAs are dealt (perf's tensor and
special-function terms and compute_factor, session 19: on the H100 of 2026-11-27 the mma.sync
prefill's 430.10 us at 4k sits inside 157.50..502.61, its 51.26 us at 1k, one wave, inside
22.37..59.80). Where a row recorded the driver's occupancy
(`occupancy`, from 2026-11-27 on), the model's resident CTAs an SM are printed beside it. The
model's launch cost is the card's: where the files hold kernels that move under TINY_BYTES (the
lease's launch.toml), their median measured time less the model's own for them is taken as this
card's fixed cost of a launch, per run and batched, in place of the table's (`perf.GPUS`: the H100
of 2026-11-23, 3.9 us per run; none for the H200); then the batched medians (runs back to back
between events, from 2026-11-28 on) are judged too, against the model priced with the batched
cost, else only printed. For a kernel recorded at
several sizes (decode attention's seq_len), the line time = fixed + bytes / rate through the
measurements (bench.size_fits) is printed beside the same line through the model's two ends: on
the H100 of 2026-11-27 decode attention measured 10.93 us + 2863 GB/s, the model's overlapped end
6.32 us + 2983 GB/s: the model has its streaming rate and lacks 3-5 us of fixed cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from ptxgen import perf
from ptxgen.bench import line_fit, read_results, size_fits
from ptxgen.errors import PtxgenError, exit_from
from ptxgen.kernels import config_from_json
from ptxgen.pipeline import compile_kernel
from ptxgen.specgen import config_problem

MARGIN = 0.10  # how far outside the model's range a measurement may sit before it is marked
# Kernels moving fewer bytes are launch-bound: their time is the fixed cost of a launch plus the
# model's sub-microsecond own (the H100 of 2026-11-23: rope, kv_append, residual_add and swiglu,
# 2-100 KB, at 4.26-4.74 us a launch, 0.6-0.65 us of it the model's).
TINY_BYTES = 256 * 1024


def rows_of(path: Path) -> tuple[dict, list[dict]] | None:
    """A bench file's data and its timed rows; None for JSON of another kind (bench.read_results)."""
    data = read_results(path, model=True)
    return None if data is None else (data, [row for row in data["rows"] if row.get("median_us")])


def check_row(row: dict, gpu: perf.Gpu) -> dict:
    """The model's range for one recorded row and where the measurement falls; a row whose config,
    cubin arch or runtime scalars today's code refuses (the code may have changed since the
    recording) is not judged, with the reason."""
    def not_judged(why: str) -> dict:
        return {"kernel": row["kernel"], "scalars": row["scalars"], "measured_us": row["median_us"],
                "verdict": f"not judged ({why})"}

    try:
        config = config_from_json({**row["config"], "name": row["kernel"], "kind": row["kind"]})
    except ValidationError as error:
        return not_judged(f"today's code refuses its {row['kind']} config: {config_problem(error)}")
    # The cubin the GPU ran (an sm_90a variant on an H100), where the row says (since 2026-11-28).
    try:
        compiled = compile_kernel(config, archs=((row.get("occupancy") or {}).get("cubin_arch") or gpu.arch,))
        report = perf.evaluate_kernel(compiled, gpu, scalars=row["scalars"])
    except PtxgenError as error:
        return not_judged(f"today's code refuses it: {error}")
    if "skipped" in report:
        return not_judged(report["skipped"])
    launch = gpu.launch_us or 0.0
    low, high = report["estimate_us"]["overlapped"] - launch, report["estimate_us"]["serialized"] - launch
    result = {"kernel": row["kernel"], "scalars": row["scalars"], "measured_us": row["median_us"],
              "batched_us": (row.get("batch") or {}).get("median_us"), "own_us": (low, high),
              "tail_us": report["tail_time_us"], "bytes": row["bytes"]}
    return judge(result, {"per_run": gpu.launch_us})


def judge(result: dict, launch: dict) -> dict:
    """`result` with the model's range (its own time plus the per-run launch cost, 0 where none
    is known) and the verdict on the per-run median, and, where a batched launch cost is known,
    the verdict on the batched median against the model priced with it."""
    low, high = result["own_us"]

    def verdict(measured: float, fixed: float) -> str:
        if (low + fixed) * (1 - MARGIN) <= measured <= (high + fixed) * (1 + MARGIN):
            return "inside"
        return "outside"

    per_run = launch.get("per_run") or 0.0
    judged = {**result, "model_us": (low + per_run, high + per_run), "verdict": verdict(result["measured_us"], per_run)}
    if result["batched_us"] and launch.get("batched") is not None:
        judged["batched_model_us"] = (low + launch["batched"], high + launch["batched"])
        judged["batched_verdict"] = verdict(result["batched_us"], launch["batched"])
    return judged


def launch_costs(results: list[dict]) -> dict:
    """The card's fixed cost of a launch, per run and batched: the median over the launch-bound
    rows (fewer than TINY_BYTES moved) of the measured time less the model's own overlapped
    time; None where no such row was timed that way."""
    tiny = [r for r in results if "own_us" in r and r["bytes"] < TINY_BYTES]
    costs = {}
    for name, key in (("per_run", "measured_us"), ("batched", "batched_us")):
        gaps = sorted(r[key] - r["own_us"][0] for r in tiny if r.get(key))
        costs[name] = (gaps[(len(gaps) - 1) // 2] + gaps[len(gaps) // 2]) / 2 if gaps else None
    return costs


def occupancy_agrees(row: dict) -> bool:
    return row["occupancy"]["ctas_per_sm"] == row["occupancy"]["model_ctas_per_sm"]


def occupancy_line(row: dict) -> str:
    """The driver's resident CTAs an SM against the model's, for a row that recorded them."""
    seen = row["occupancy"]
    return (f"{row['kernel']:<28} CTAs an SM: driver {seen['ctas_per_sm']}, model {seen['model_ctas_per_sm']} "
            f"({seen['model_limiter']}){'' if occupancy_agrees(row) else '  DIFFERENT'}; registers {seen['registers']} / "
            f"{seen['model_registers']}, static shared {seen['static_shared']} / {seen['model_static_shared']} bytes")


def line_text(fixed_us: float, gbs: float) -> str:
    return f"{fixed_us:.2f} us + {gbs:.0f} GB/s"


def fit_lines(data: dict, results: list[dict]) -> list[str]:
    """For each kernel recorded at several sizes: its measured line, time = fixed + bytes / rate
    (bench.size_fits), beside the same line through the model's overlapped and serialized ends."""
    if not results:
        return []
    lines = []
    for fit in size_fits(data):
        measured = "; ".join(f"{name} {line_text(fit[name]['fixed_us'], fit[name]['gbs'])}"
                             for name in ("per_run", "batched") if fit[name])
        modelled = [r for r in results if r["kernel"] in fit["kernels"] and "model_us" in r]
        model = ""
        if len({r["bytes"] for r in modelled}) >= 2:
            ends = []
            for end, name in ((0, "overlapped"), (1, "serialized")):
                fixed, slope = line_fit([(r["bytes"] / 1e3, r["model_us"][end]) for r in modelled])
                ends.append(f"{name} {line_text(fixed, 1 / slope)}" if slope > 0 else f"{name} flat")
            model = "; model " + ", ".join(ends)
        lines.append(f"{fit['kernel']:<28} measured {measured}{model}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--gpu", default=perf.DEFAULT_GPU, choices=sorted(perf.GPUS))
    args = parser.parse_args(argv)
    gpu = perf.gpu_named(args.gpu)
    files = []
    for path in args.results:
        read = rows_of(path)
        if read is None:
            print(f"{path}: not a `ptxgen bench --json` file (no rows): skipped")
            continue
        data, rows = read
        files.append((path, data, rows, [check_row(row, gpu) for row in rows]))
    derived = launch_costs([result for *_, results in files for result in results])
    launch = {"per_run": derived["per_run"] if derived["per_run"] is not None else gpu.launch_us,
              "batched": derived["batched"]}
    source = {name: (f"{value:.2f} us (measured: launch-bound rows)" if derived[name] is not None else
                     f"{value} us (the table's)" if value is not None else "not known")
              for name, value in launch.items()}
    print(f"model: {gpu.name}, launch per run {source['per_run']}, batched {source['batched']}, copy "
          f"{gpu.bandwidth_gbs} GB/s, latency {gpu.latency_ns} ns, dependent issue {perf.DEPENDENT_ISSUE_CYCLES} "
          f"cycles at {gpu.clock_ghz} GHz")
    outside = batched_outside = different = 0
    for path, data, _, results in files:
        planned = data.get("planned_rows", len(data["rows"]))
        short = f"; cut short: {len(data['rows'])} of {planned} rows" if len(data["rows"]) < planned else ""
        print(f"\n{path} (commit {data.get('git_commit', '?')}, {data['device']['name']}{short})")
        print(f"{'kernel':<28} {'scalars':<18} {'measured us':>11} {'batched us':>10} {'model us':>17} {'tail us':>7}"
              "  verdict (batched)")
        results = [judge(result, launch) if "own_us" in result else result for result in results]
        for result in results:
            outside += result["verdict"] == "outside"
            batched_outside += result.get("batched_verdict") == "outside"
            scalars = ",".join(f"{k}={v}" for k, v in result["scalars"].items())
            if "model_us" in result:
                low, high = result["model_us"]
                model = f"{low:>8.2f}..{high:<8.2f} {result['tail_us']:>7.2f}"
            else:
                model = f"{'-':>17} {'-':>7}"
            batched = f"{result['batched_us']:>10.2f}" if result.get("batched_us") else f"{'-':>10}"
            against = (f" ({result['batched_verdict']}: {result['batched_model_us'][0]:.2f}.."
                       f"{result['batched_model_us'][1]:.2f})" if "batched_verdict" in result else "")
            print(f"{result['kernel']:<28} {scalars:<18} {result['measured_us']:>11.2f} {batched} {model}  "
                  f"{result['verdict']}{against}")
        fits = fit_lines(data, results)
        if fits:
            print("\nfixed cost and streaming rate (a least-squares line through each kernel's sizes):\n"
                  + "\n".join(fits))
        recorded = [row for row in data["rows"] if row.get("occupancy")]
        different += sum(not occupancy_agrees(row) for row in recorded)
        if recorded:
            print("\noccupancy (driver / model):\n" + "\n".join(map(occupancy_line, recorded)))
    judged_batched = f", {batched_outside} batched" if launch["batched"] is not None else ""
    print(f"\n{outside} row(s){judged_batched} outside the model's range by more than {MARGIN:.0%}; {different} row(s) "
          "whose occupancy the model got wrong")
    return 0


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
