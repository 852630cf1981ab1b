"""Where a persistent decoder's step goes, phase by phase: one launch (after one to warm up) of a
spec's `persistent_decoder` with `timeline = true`, each CTA's thread 0 stamping %globaltimer as
it starts, arrives at and passes each grid barrier, and ends (PersistentDecoder.timeline_width);
prints, for each phase of a layer summed over the layers, its span (from the last CTA passing the
barrier before it to the last CTA arriving at the one after it: the phases and barriers add up to
the step), the mean CTA's share of that span (balance), its bytes and their rate, and the
barriers' spans (last arrival to last pass). Why: the 2026-11-27 step, 2338 us for 4.5 GB, is
bytes + the model's latency + tail, and nothing measured says which phases lose the time.

    python3 bench/lease/decoder_timeline.py bench/lease/decoder.toml qwen3_8b_decoder \\
        qwen3_8b_decoder_kv_prefetch --pos 4095 --json decoder_timeline.json

(several kernels of one shape share the sample inputs; the JSON maps each name to its summary).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ptxgen.bench import CALLS_PER_EVENT
from ptxgen.cli import compile_one
from ptxgen.device import driver
from ptxgen.dtypes import DTYPES
from ptxgen.errors import exit_from
from ptxgen.kernels.persistent_decoder import PHASES, layer_quants
from ptxgen.quants import quant_type
from ptxgen.runner import run
from ptxgen.spec import load_spec

LAYER_PHASES = ("qkv", "attention", "o", "gate_up", "down")  # phase i runs between barriers i - 1 and i
# How the single-launch timelines (attention_timeline.py, gemv_timeline.py) run a kernel: alone,
# and as the last of bench's batch queued back to back (a PDL launch overlaps the one before).
QUEUED = (("alone", 1), (f"last of {CALLS_PER_EVENT} back to back", CALLS_PER_EVENT))
BARRIERS = "ACDEF"                                           # a layer's grid barriers, in order


def stamps(timeline: np.ndarray) -> np.ndarray:
    """Nanoseconds since the earliest CTA start, per CTA and timeline word (-1 where a word has no
    stamp: the last layer's F). Word 0 and 1 are a CTA's 64-bit start; the others low words of
    %globaltimer, unwrapped against it."""
    rows = timeline.astype(np.int64)
    start = rows[:, 0] | rows[:, 1] << 32
    since = (rows - (start[:, None] & 0xFFFFFFFF)) % (1 << 32) + (start - start.min())[:, None]
    since[:, :2] = (start - start.min())[:, None]
    return since


def summarize(timeline: np.ndarray, layers: int, phase_bytes: dict[str, int]) -> dict:
    """The phases' and barriers' spans (summed over the layers, ns), each phase's balance (the mean
    CTA's busy time over its span) and bytes a second."""
    t = stamps(timeline)
    arrive = lambda b: t[:, 3 + 2 * b]  # noqa: E731  (barrier b = 5 layer + its index in BARRIERS)
    passed = lambda b: t[:, 4 + 2 * b]  # noqa: E731
    spans = {phase: 0 for phase in LAYER_PHASES}
    busy = dict(spans)
    barriers = {name: 0 for name in BARRIERS}
    for layer in range(layers):
        for index, phase in enumerate(LAYER_PHASES):
            b = 5 * layer + index
            begin = t[:, 0] if b == 0 else passed(b - 1)
            end = t[:, 2] if b == 5 * layers - 1 else arrive(b)
            spans[phase] += int(end.max() - begin.max())
            busy[phase] += int((end - begin).mean())
            if b < 5 * layers - 1:
                barriers[BARRIERS[index]] += int(passed(b).max() - arrive(b).max())
    step = int(t[:, 2].max() - t[:, 0].max())
    deltas = np.diff(np.unique(t[:, 2:]))
    return {
        "step_ns": step, "start_skew_ns": int(t[:, 0].max() - t[:, 0].min()),
        "resolution_ns": int(deltas[deltas > 0].min()) if (deltas > 0).any() else None,
        "phases": {phase: {"span_ns": spans[phase], "balance": round(busy[phase] / spans[phase], 3) if spans[phase] else None,
                           "bytes": phase_bytes.get(phase, 0),
                           "gbs": round(phase_bytes.get(phase, 0) / spans[phase], 1) if spans[phase] else None}
                   for phase in LAYER_PHASES},
        "barriers_ns": barriers,
    }


def phase_bytes(kernel, pos: int) -> dict[str, int]:
    """Bytes each phase reads over the whole step: its weights in every layer, and attention's
    K and V rows up to pos."""
    kind = kernel.definition
    config = kind.config
    shapes = kind.matrix_shapes()
    moved = {phase: sum(shapes[w][0] * quant_type(q).row_bytes(shapes[w][1]) for w in weights
                        for q in layer_quants(config, w)) for phase, weights in PHASES.items()}
    kv_bytes = DTYPES[config.kv_dtype].size
    moved["attention"] = 2 * config.num_layers * config.num_kv_heads * (pos + 1) * config.head_dim * kv_bytes
    return moved


def timeline_kernel(spec_path: Path, name: str):
    spec = load_spec(spec_path)
    return compile_one(spec, spec.spec.kernel(name).model_copy(update={"timeline": True}))


def last_timeline(kernel, scalars: dict, backend: str, launches: int, inputs: dict | None,
                  back_to_back: int = 1) -> np.ndarray:
    """The `timeline` workspace after `launches` runs at `scalars`, each of `back_to_back` launches
    queued together, on `inputs` (default: the kind's sample inputs): the last launch's stamps."""
    if inputs is None:
        inputs = kernel.definition.sample_inputs(np.random.default_rng(0), scalars)
    for _ in range(launches):
        out = run(kernel, dict(inputs), scalars, backend=backend, launches=back_to_back)
    return out["timeline"]


def measure(kernel, pos: int, backend: str = "device", launches: int = 2, inputs: dict | None = None) -> dict:
    """summarize() of the last of `launches` launches on `inputs` (default: the kind's sample inputs)."""
    timeline = last_timeline(kernel, {"pos": pos}, backend, launches, inputs)
    return summarize(timeline, kernel.definition.config.num_layers, phase_bytes(kernel, pos))


def report(summary: dict) -> str:
    step = summary["step_ns"]
    lines = [f"step {step / 1e3:.1f} us (CTA starts spread over {summary['start_skew_ns'] / 1e3:.2f} us; "
             f"timer resolution seen {summary['resolution_ns']} ns)",
             f"{'phase':<10} {'span us':>9} {'share':>6} {'balance':>7} {'GB/s':>7}"]
    for phase, figures in summary["phases"].items():
        lines.append(f"{phase:<10} {figures['span_ns'] / 1e3:>9.1f} {figures['span_ns'] / step:>6.1%} "
                     f"{figures['balance'] or 0:>7.2f} {figures['gbs'] or 0:>7.0f}")
    for name, span in summary["barriers_ns"].items():
        lines.append(f"barrier {name:<2} {span / 1e3:>9.1f} {span / step:>6.1%}")
    return "\n".join(lines)


def save(path: Path | None, summaries: dict) -> None:
    """--json's file, rewritten after each kernel (or length), so that a run cut short keeps them."""
    if path:
        path.write_text(json.dumps(summaries, indent=2) + "\n")


def timeline_arguments(doc: str, argv: list[str], add_options=lambda parser: None) -> argparse.Namespace:
    """The timeline scripts' command line, SPEC KERNEL... [--json F] and what add_options(parser)
    adds, refused without a GPU before minutes of compiling and sample inputs."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("kernels", nargs="+")
    parser.add_argument("--json", type=Path)
    add_options(parser)
    args = parser.parse_args(argv)
    driver(instead="the timeline is read on a GPU")
    return args


def main(argv: list[str]) -> int:
    args = timeline_arguments(__doc__, argv, lambda parser: parser.add_argument("--pos", type=int, default=4095))
    kernels = [timeline_kernel(args.spec, name) for name in args.kernels]
    inputs = kernels[0].definition.sample_inputs(np.random.default_rng(0), {"pos": args.pos})
    summaries = {}
    for kernel in kernels:
        summaries[kernel.name] = measure(kernel, args.pos, inputs=inputs)
        print(f"{kernel.name}:\n{report(summaries[kernel.name])}\n")
        save(args.json, summaries)
    return 0


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
