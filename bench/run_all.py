"""`make bench`: check and time every kernel of specs/qwen3.toml on this machine's GPU.

Every kernel is checked on the device against its float64 reference first, then timed as
`ptxgen bench --graph` does (CUDA events in chunks below the launch queue's depth, rotated
buffers, copy bandwidth measured in the same run, peers where the kind names them), with
seq_len sweeps for the attention kernels, all in one device worker process (a kernel that
faults fails its row; the rest go on in a fresh one). Then the Qwen3-8B decode step
(specs/qwen3_decoder.toml, 36 layers, random Q4_K weights, at pos 4095): the persistent decoder
in one launch (and as a CUDA-graph replay) against the same step as 468 separate kernels
(the best there are: fused norm + GEMV) launched one by one and as one CUDA graph,
checked against each other first, in tokens/s; its one-layer twin at the same shapes is also
checked against the float64 reference. The prefill attention also runs as its sm_90a (wgmma)
variant on an H100. Last, whole-model decode as `ptxgen generate` runs it (embedding to token,
Qwen3-8B shapes, random Q4_K_M-like weights: the persistent decoder and the separate kernels,
with and without the lm_head). Writes bench/results/<device>-<date>.json
(every figure) and a Markdown table next to it, including the performance targets and
whether each is met, and each fused norm + GEMV against the plain GEMV of its shape (issue 12:
within 5%).

The JSON is rewritten after every row (its `planned_rows` says how many the run meant to make), so
a run stopped by a time limit keeps what it made; `--out DIR` writes both files there instead (a
lent GPU's $OUT: `timeout 570 python3 bench/run_all.py --out "$OUT"`).

Exit status: 0 when every kernel passed its check (targets are reported, not enforced),
1 when one failed, 2 without a GPU (the message says so).
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "qwen3.toml"
DECODER_SPEC = ROOT / "specs" / "qwen3_decoder.toml"
DECODER = "qwen3_8b_decoder"
RESULTS = ROOT / "bench" / "results"
ITERS = 200

# Extra rows: kind -> (runtime scalar, values); values outside a kernel's limits are skipped.
SWEEPS = {
    "incremental_attention": ("seq_len", [1024, 4096, 8192, 16384, 32768]),
    "flash_attention": ("seq_len", [512, 1024, 2048, 4096, 8192]),
}


@dataclass(frozen=True)
class Target:
    label: str
    kind: str
    config: dict  # the kernel config fields a row must have
    scalars: Callable[[dict], bool]  # which of its rows count
    metric: str  # a row figure: median_us, pct_copy_bw, tflops
    bound: float
    at_least: bool  # metric >= bound (else <=)
    kernel: str | None = None  # only this kernel's rows (a config cannot say which cubin ran)


def at(length: int) -> Callable[[dict], bool]:
    return lambda scalars: scalars.get("seq_len") == length


# Issue 12's and 13's targets on an H100.
ANY = lambda scalars: True  # noqa: E731
PREFILL = {"causal": True, "dtype": "f16", "head_dim": 128}
PREFILL_KERNEL = "qwen3_8b_prefill_attention"
# The same prefill built for sm_90a alone, so that an H100 runs its wgmma variant.
HOPPER_PREFILL = "qwen3_8b_prefill_attention_sm90a"
TARGETS = [
    Target("q4k_gemv 12288x4096 >= 80% of copy bandwidth", "q4k_gemv", {"n": 12288, "k": 4096}, ANY, "pct_copy_bw",
           80, True),
    Target("q4k_gemv 4096x12288 >= 80% of copy bandwidth", "q4k_gemv", {"n": 4096, "k": 12288}, ANY, "pct_copy_bw",
           80, True),
    Target("q4k_gemv 4096x4096 >= 60% of copy bandwidth", "q4k_gemv", {"n": 4096, "k": 4096}, ANY, "pct_copy_bw",
           60, True),
    Target("q6k_gemv n=151936 k=4096 (lm_head) >= 80% of copy bandwidth", "q6k_gemv", {"n": 151936, "k": 4096}, ANY,
           "pct_copy_bw", 80, True),
    Target("q8_0_gemv n=12288 k=4096 >= 80% of copy bandwidth", "q8_0_gemv", {"n": 12288, "k": 4096}, ANY,
           "pct_copy_bw", 80, True),
    Target("incremental_attention >= 55% of copy bandwidth at seq_len 4096", "incremental_attention", {}, at(4096),
           "pct_copy_bw", 55, True),
    Target("incremental_attention >= 75% of copy bandwidth at seq_len 8192", "incremental_attention", {}, at(8192),
           "pct_copy_bw", 75, True),
    Target("incremental_attention >= 85% of copy bandwidth at seq_len 32768", "incremental_attention", {}, at(32768),
           "pct_copy_bw", 85, True),
    Target("rmsnorm <= 5 us (decode, one row)", "rmsnorm", {}, lambda s: s.get("rows") == 1, "median_us", 5, False),
    Target("flash_attention (mma.sync) causal f16 d128 >= 420 TFLOP/s at seq_len 4096", "flash_attention", PREFILL,
           at(4096), "tflops", 420, True, PREFILL_KERNEL),
    Target("flash_attention (mma.sync) causal f16 d128 >= 300 TFLOP/s at seq_len 1024", "flash_attention", PREFILL,
           at(1024), "tflops", 300, True, PREFILL_KERNEL),
    *(Target(f"flash_attention (sm_90a wgmma) causal f16 d128 >= 600 TFLOP/s at seq_len {n}", "flash_attention",
             PREFILL, at(n), "tflops", 600, True, HOPPER_PREFILL) for n in (4096, 8192)),
    Target("Qwen3-8B decode step (36 layers, pos 4095) <= 2000 us, >= 500 tokens/s", "persistent_decoder",
           {"num_layers": 36}, ANY, "median_us", 2000, False),
]
# Whole-model decode (ptxgen.generate.random_model_decode_speed): Qwen3-8B shapes, random weights;
# tokens/s over this many steps from an empty cache, and the step at pos 4095 with the lm_head.
WHOLE_MODEL_TOKENS = 32


def matches(config: dict, fields: dict) -> bool:
    return all(config.get(name) == value for name, value in fields.items())


def target_kernels(spec, notes: list[str]) -> list:
    """Kernels for targets the spec has no instance of: its first instance of the kind with the fields set."""
    from ptxgen.kernels import KINDS

    extra = []
    for target in TARGETS:
        if target.kind not in KINDS or not target.config or target.kernel:
            continue
        same_kind = [k for k in spec.spec.kernels if k.kind == target.kind]
        if any(matches(k.model_dump(mode="json"), target.config) for k in same_kind + extra):
            continue
        base = same_kind[0].model_dump(mode="json") if same_kind else {"kind": target.kind}
        name = f"target_{target.kind}"[:64]
        try:
            extra.append(KINDS[target.kind].Config.model_validate({**base, **target.config, "name": name}))
        except Exception as error:  # a config the kind refuses: report, bench the rest
            notes.append(f"cannot build a kernel for target {target.label!r}: {error}")
        else:
            notes.append(f"{name}: added for target {target.label!r} (no such instance in {SPEC.name})")
    return extra


def plan(kernels, notes: list[str]) -> list[tuple[object, dict]]:
    """(compiled kernel, scalars) rows: each kernel at its example scalars, and its kind's sweep."""
    rows = []
    for kernel in kernels:
        kind = kernel.definition
        base = kind.example_scalars()
        rows.append((kernel, base))
        if kernel.kind not in SWEEPS:
            continue
        scalar, values = SWEEPS[kernel.kind]
        low, high = kernel.scalar_limits.get(scalar, (0, -1))
        for value in values:
            if not low <= value <= high:
                notes.append(f"{kernel.name}: {scalar}={value} skipped (outside {low}..{high})")
            elif value != base.get(scalar):
                rows.append((kernel, {**base, scalar: value}))
    return rows


def evaluate(target: Target, rows: list[dict], figure: str = "median") -> tuple[str, str]:
    """(measured, met) of one target over the rows it applies to, by the rows' per-run figures
    (`median`) or their batched ones (`batch`: runs back to back, ten between two events)."""
    chosen = [r for r in rows if r["kind"] == target.kind and matches(r["config"], target.config)
              and target.scalars(r["scalars"]) and target.kernel in (None, r["kernel"])]
    if not chosen:
        return "no matching row", "n/a"
    if any(not r["passed"] for r in chosen):
        return "kernel failed its check", "no"
    figures = [(r, r if figure == "median" else r.get(figure)) for r in chosen]
    timed = [(r, f[target.metric]) for r, f in figures if f and f[target.metric] is not None]
    if not timed:
        return "not timed", "n/a"
    unit = {"median_us": " µs", "pct_copy_bw": "%", "tflops": " TFLOP/s"}[target.metric]
    measured = ", ".join(f"{value:.1f}{unit}" + (f" ({describe(r['scalars'])})" if r["scalars"] else "")
                         for r, value in timed)
    met = all(value >= target.bound if target.at_least else value <= target.bound for _, value in timed)
    return measured, "yes" if met else "no"


def fusion_lines(rows: list[dict]) -> list[str]:
    """Target-table lines: each fused norm + GEMV row against the plain GEMV row of its config,
    per run and batched (bench.fusion_comparisons: issue 12's 5%)."""
    from ptxgen.bench import FUSION_BOUND, fusion_comparisons

    lines = []
    for comparison in fusion_comparisons(rows):
        fused, plain = comparison["fused"], comparison["plain"]
        cells = []
        for figure in comparison["figures"].values():
            if "ratio" in figure:
                cells += [f"{figure['ratio']:.3f}x ({figure['fused_us']:.2f} against {figure['plain_us']:.2f} µs)",
                          "yes" if figure["met"] else "no"]
            else:
                cells += [figure["status"], "n/a" if figure["met"] is None else "no"]
        label = (f"{fused['kind']} {fused['config']['n']}x{fused['config']['k']} within {FUSION_BOUND - 1:.0%} of "
                 f"{plain['kind']} ({fused['kernel']} against {plain['kernel']})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def describe(scalars: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in scalars.items())


def decoder_table(rows: list[dict]) -> list[str]:
    """Tokens/s of each way to run a decode step (rows whose kind has separate kernels)."""
    from ptxgen.bench import microseconds

    lines = []
    for row in rows:
        step = row.get("step")
        if not step or row["median_us"] is None:
            continue
        wall = step["wall_us"]
        ways = [("one launch (persistent kernel)", row, wall["kernel"]),
                ("one launch, CUDA-graph replay", row["graph"], None),
                (f"separate kernels, {step['launches']} launches one by one", step["one_by_one"], wall["one_by_one"]),
                ("separate kernels, one CUDA graph", step["graph"], wall["graph"])]
        lines += ["", f"## Decode step: {row['kernel']} ({describe(row['scalars'])})", "",
                  "GPU µs: CUDA events over back-to-back calls, in chunks below the launch queue's depth, each "
                  "behind a spin kernel that holds the GPU while the host queues it (* host-bound: the host could "
                  "not). Wall µs: one call at a time, queued from Python and synchronized (what a batch-1 decode "
                  "loop sees).", "",
                  "| way | GPU µs a token | tokens/s | wall µs a token | tokens/s (wall) |", "|---|---|---|---|---|"]
        for label, figure, wall_us in ways:
            cells = [microseconds(figure, 1), f"{1e6 / figure['median_us']:.1f}"] if figure else ["", ""]
            cells += [f"{wall_us:.1f}", f"{1e6 / wall_us:.1f}"] if wall_us else ["", ""]
            lines.append("| " + " | ".join([label, *cells]) + " |")
    return lines


def whole_model(worker, notes: list[str]) -> list[dict]:
    """Qwen3-8B-shaped decode with random weights, embedding to token (ptxgen generate's path):
    the persistent decoder and the separate kernels, both over Q4_K_M-like layers."""
    from ptxgen.errors import PtxgenError
    from ptxgen.generate import QWEN3_8B, WHOLE_MODEL_PATHS, random_model_decode_speed

    rows = []
    for fused, lm_head in WHOLE_MODEL_PATHS:
        path = f"{'fused' if fused else 'separate kernels'}, {(lm_head or 'q6_k').upper()} lm_head"
        print(f"bench: whole model, {path}", file=sys.stderr)
        try:
            rows.append(worker.call(random_model_decode_speed, QWEN3_8B, fused, WHOLE_MODEL_TOKENS, lm_head=lm_head))
        except PtxgenError as error:
            notes.append(f"whole-model decode ({path}) failed: {error}")
    return rows


def whole_model_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    first = rows[0]
    lines = ["", f"## Whole-model decode: {first['model']}, random weights", "",
             f"GPU µs: the step at pos {first['pos']} between CUDA events, one step at a time, its launches queued "
             "ahead (* host-bound: the host could not), with the head (final norm, lm_head, argmax) and without "
             f"(issue 12's step with the lm_head). Tokens/s: wall clock over {first['tokens']} steps from a one-token "
             "prompt, one token at a time as `ptxgen generate` runs it (launches from Python, the token read back "
             "each step).", "",
             "| layers | weights | GPU µs a step with lm_head + argmax | GPU µs, layers only | the head | "
             "tokens/s with lm_head + argmax | tokens/s, layers only |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = "*" if r["host_bound"] else ""
        lines.append(f"| {r['layers']} | {r['weights']}, {r['lm_head']} lm_head | {r['step_us']:.1f}{mark} | "
                     f"{r['layers_us']:.1f}{mark} | {r['head_us']:.1f} | {r['tokens_per_s']:.1f} | "
                     f"{r['layers_tokens_per_s']:.1f} |")
    return lines


def markdown(results: dict, notes: list[str]) -> str:
    from ptxgen.bench import CALLS_PER_EVENT, HOST_BOUND_NOTE, batched, microseconds, timed_figures

    device, copy = results["device"], results["copy_bandwidth"]
    lines = [
        f"# ptxgen bench on {device['name']}",
        "",
        f"- date: {results['date']}",
        f"- device: {device['name']} ({device['arch']}, {device['sm_count']} SMs, "
        f"{device['l2_bytes'] / 2**20:.0f} MiB L2), driver {device['driver']}",
        f"- ptxgen {results['ptxgen_version']}, commit {results['git_commit'] or 'unknown'}, "
        f"torch {results['torch'] or 'not available'}",
        f"- device-to-device copy: {copy['gbs']:.0f} GB/s (read + write, {copy['bytes'] / 2**20:.0f} MiB), "
        f"the 100% of the '% copy bw' columns",
        f"- {results['iters']} timed runs per figure after warm-up; median (p10-p90); buffers rotated past L2",
        "- kernels with `pdl = true` (their config) ran their sm_90 PTX under programmatic dependent launch; "
        "the median has a CUDA event after each run, which waits for the whole grid, so only the batched "
        f"figure ({CALLS_PER_EVENT} runs between two events, the event's cost a tenth a run) can show a run's start "
        "overlapping the previous run's end; the targets are judged on both",
        "",
        "## Kernels",
        "",
        "| kernel | scalars | median µs (p10-p90) | GB/s | TFLOP/s | % copy bw | batched µs (% copy bw) | graph µs | "
        "peer | peer µs | peer % copy bw | peer TFLOP/s | peer batched µs (% copy bw) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        if row.get("failure"):
            cells = ["FAILED (see the notes)", "", "", "", "", ""]
        elif not row["passed"]:
            cells = ["FAILED its check", "", "", "", "", ""]
        elif row["median_us"] is None:
            cells = ["not timed", "", "", "", "", ""]
        else:
            cells = [f"{microseconds(row)} ({row['p10_us']:.2f}-{row['p90_us']:.2f})", f"{row['gbs']:.1f}",
                     f"{row['tflops']:.3g}", f"{row['pct_copy_bw']:.1f}%", batched(row),
                     microseconds(row["graph"]) if row["graph"] else ""]
        peers = [p for p in row["peers"] if "median_us" in p]
        best = (row.get("best_peer") or {}).get("name")
        peer_cells = ["<br>".join(p["name"] + (" (best)" if p["name"] == best and len(peers) > 1 else "") for p in peers),
                      "<br>".join(microseconds(p) for p in peers),
                      "<br>".join(f"{p['pct_copy_bw']:.1f}%" for p in peers),
                      "<br>".join(f"{p['tflops']:.3g}" for p in peers),
                      "<br>".join(batched(p) for p in peers)]
        lines.append("| " + " | ".join([row["kernel"], describe(row["scalars"]), *cells, *peer_cells]) + " |")
    lines += decoder_table(results["rows"])
    lines += whole_model_table(results.get("whole_model", []))
    lines += ["", "## Targets", "",
              "Judged on each run alone (an event after every run, as the issues' figures were measured) and on "
              f"the batched runs (back to back, {CALLS_PER_EVENT} between two events, as an engine's stream has "
              "them; the copy bandwidth they are a percentage of was timed on copies of at least 256 MiB, whose event "
              "costs little beside their ~180 µs on an H100).",
              "", "| target | measured (each run) | met | measured (batched) | met (batched) |", "|---|---|---|---|---|"]
    for target in TARGETS:
        cells = [cell for figure in ("median", "batch") for cell in evaluate(target, results["rows"], figure)]
        lines.append(f"| {target.label} | " + " | ".join(cells) + " |")
    lines += fusion_lines(results["rows"])
    all_notes = sorted(set(notes) | {note for row in results["rows"] for note in row["notes"]}
                       | {f"{row['kernel']} ({describe(row['scalars'])}) failed: {row['failure']}"
                          for row in results["rows"] if row.get("failure")})
    if any(figure.get("host_bound") for figure in timed_figures(results)):
        all_notes.append(HOST_BOUND_NOTE)
    if all_notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in all_notes]
    return "\n".join(lines) + "\n"


def stem_of(folder: Path, device: str, day: datetime.date) -> Path:
    """<folder>/<device>-<date>: where the run's .json and .md go."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-")
    return folder / f"{slug}-{day.isoformat()}"


def main(argv: list[str]) -> int:
    from rich.console import Console

    from ptxgen.artifacts import check_output_file, write_file
    from ptxgen.bench import device_info, failures, print_results, run_bench, write_json
    from ptxgen.device import driver
    from ptxgen.errors import PtxgenError
    from ptxgen.pipeline import compile_kernel, compile_spec
    from ptxgen.spec import load_spec
    from ptxgen.worker import DeviceWorker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and Markdown files")
    out = parser.parse_args(argv).out
    if not out.is_dir():
        raise PtxgenError(f"--out: {out} is not a folder")
    # no GPU: DeviceUnavailable, before anything costly
    driver(instead="make bench times kernels on a GPU (ptxgen show gives the performance model without one)")
    spec = load_spec(SPEC)
    notes: list[str] = []
    started = datetime.date.today()  # one pair of files, also for a run past midnight
    with DeviceWorker() as worker:  # the device work, in a process a faulting kernel cannot take down
        info = worker.call(device_info)
        stem = stem_of(out, info["name"], started)
        for suffix in (".json", ".md"):  # before the GPU's minutes, not after them
            check_output_file(stem.with_suffix(suffix), "--out")
        decoder = load_spec(DECODER_SPEC).spec.kernel(DECODER)
        decoder = decoder.model_copy(update={"sm_count": info["sm_count"]})  # one CTA an SM
        # One layer at the same shapes: small enough for the float64 reference, so the full-size grid
        # (barriers included) is checked against it, not only against the separate kernels.
        one_layer = decoder.model_copy(update={"num_layers": 1, "name": f"{DECODER}_1layer"})
        configs = list(spec.spec.kernels) + target_kernels(spec, notes) + [one_layer, decoder]
        hopper = spec.spec.kernel(PREFILL_KERNEL).model_copy(update={"name": HOPPER_PREFILL})
        kernels = [*compile_spec(spec.spec.model_copy(update={"kernels": tuple(configs)})).kernels,
                   compile_kernel(hopper, ("sm_90a",))]
        results = run_bench({"file": str(spec.path), "sha256": spec.sha256}, plan(kernels, notes), ITERS, graph=True,
                            progress=lambda label: print(f"bench: {label}", file=sys.stderr), worker=worker,
                            row_done=lambda so_far: write_json(stem.with_suffix(".json"), {**so_far, "notes": notes},
                                                               "--out"))
        results["whole_model"] = whole_model(worker, notes)
    results["notes"] = notes
    print_results(results, Console(soft_wrap=True), Console(stderr=True, soft_wrap=True))
    write_json(stem.with_suffix(".json"), results, "--out")
    write_file(stem.with_suffix(".md"), markdown(results, notes).encode(), "--out")
    print(f"wrote {stem.with_suffix('.json')} and {stem.with_suffix('.md')}", file=sys.stderr)
    for target in TARGETS:
        (measured, met), (batched, batched_met) = (evaluate(target, results["rows"], f) for f in ("median", "batch"))
        print(f"target {target.label}: {met} ({measured}); batched: {batched_met} ({batched})", file=sys.stderr)
    problems = failures(results)
    for line in problems:
        print(f"FAIL {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    from ptxgen.errors import exit_from

    exit_from(main, sys.argv[1:])
