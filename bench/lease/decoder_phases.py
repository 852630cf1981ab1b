"""The performance model of a persistent decoder's layer, phase by phase, beside what a timeline
measured (bench/lease/decoder_timeline.py's JSON), on a machine with no GPU: each spec kernel's
first layer run whole in the interpreter (perf.segment_counts, the phases ending at the labels
their barrier arrivals end at), and for each phase its bytes at the GPU's copy rate, the mean
warp's dependent load rounds at its latency and its warp-instructions at its issue rate, added
up (serialized) and the largest (overlapped), the attention phase's split-KV count-in and merge
(AttentionPlan.count_in_tail) on top of both; each grid barrier its BARRIER_ROUND_TRIPS. Why:
`ptxgen show` prices a whole step, and the timeline says which phases lose the time; this says
which of them the model sees.

    python3 bench/lease/decoder_phases.py bench/lease/decoder.toml qwen3_8b_decoder \\
        qwen3_8b_decoder_head_prep --gpu h200 \\
        --measured bench/results/H200-2026-11-28-lease/decoder_timeline.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from decoder_timeline import BARRIERS, LAYER_PHASES, phase_bytes
from ptxgen.errors import PtxgenError, exit_from
from ptxgen.kernels import kind_of
from ptxgen.kernels.persistent_decoder import BARRIER_ROUND_TRIPS
from ptxgen.perf import GPUS, bandwidth_floor_us, issue_time_us, segment_counts
from ptxgen.pipeline import compile_kernel
from ptxgen.runner import prepare_arrays
from ptxgen.spec import load_spec

# Where each phase's code ends: the label after the barrier arrival that closes it (the last
# layer's down phase runs to the end of the code).
PHASE_ENDS = [(phase, f"BARRIER_ARRIVED_{barrier}") for phase, barrier in zip(LAYER_PHASES, BARRIERS[:-1])]
PHASE_ENDS.append((LAYER_PHASES[-1], None))


def layer_model(config, gpu, pos: int, seed: int = 0) -> dict:
    """One layer of `config` (its first), counted whole: each phase's model in microseconds."""
    compiled = compile_kernel(kind_of(config).layers_config(0), (gpu.arch,))
    scalars = {"pos": pos}
    arrays = prepare_arrays(compiled, compiled.definition.sample_inputs(np.random.default_rng(seed), scalars), scalars)
    counts = segment_counts(compiled.variant(gpu.arch).ptx, compiled.name, compiled.launch(scalars, gpu.arch),
                            compiled.args(arrays, scalars), PHASE_ENDS)
    moved = phase_bytes(compiled, pos)
    attention = compiled.definition.attention
    _, splits = attention.split(pos + 1)
    count_in = attention.count_in_tail(splits, splits)
    phases = {}
    for count in counts:
        terms = {"bytes": bandwidth_floor_us(moved[count.name], gpu),
                 "latency": count.rounds_per_warp * gpu.latency_ns * 1e-3,
                 "issue": issue_time_us(count.warp_instructions, gpu)}
        # The split-KV count-in and merge after the last key tile, on top of either estimate.
        tail = count_in.round_trips * gpu.latency_ns * 1e-3 if count.name == "attention" and count_in else 0.0
        phases[count.name] = {**{f"{term}_us": round(value, 3) for term, value in terms.items()},
                              "rounds_per_warp": round(count.rounds_per_warp, 3), "tail_us": round(tail, 3),
                              "overlapped_us": round(max(terms.values()) + tail, 3),
                              "serialized_us": round(sum(terms.values()) + tail, 3)}
    return {"phases": phases, "barrier_us": round(BARRIER_ROUND_TRIPS * gpu.latency_ns * 1e-3, 3)}


def report(name: str, model: dict, measured: dict | None, layers: int) -> str:
    """A table of a layer's phases: the model's terms and range, and the measured span a layer."""
    source = f"; measured: the timeline's span over its {layers} layers / {layers}" if measured else ""
    lines = [f"{name} (a layer{source})",
             f"{'phase':<10} {'bytes us':>8} {'rounds':>7} {'latency us':>10} {'issue us':>8} {'tail us':>7} "
             f"{'model us':>14} {'measured us':>11}"]
    for phase, figures in model["phases"].items():
        span = measured["phases"][phase]["span_ns"] / 1e3 / layers if measured else None
        lines.append(f"{phase:<10} {figures['bytes_us']:>8.2f} {figures['rounds_per_warp']:>7.2f} "
                     f"{figures['latency_us']:>10.2f} {figures['issue_us']:>8.2f} {figures['tail_us']:>7.2f} "
                     f"{figures['overlapped_us']:>6.2f}..{figures['serialized_us']:<6.2f} "
                     f"{'' if span is None else f'{span:.2f}':>11}")
    barriers = sum(measured["barriers_ns"].values()) / 1e3 / layers if measured else None
    lines.append(f"{'barriers':<10} {'':>8} {'':>7} {'':>10} {'':>8} {'':>7} {5 * model['barrier_us']:>14.2f} "
                 f"{'' if barriers is None else f'{barriers:.2f}':>11}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("kernels", nargs="+")
    parser.add_argument("--gpu", default="h200", choices=sorted(GPUS))
    parser.add_argument("--pos", type=int, default=4095)
    parser.add_argument("--measured", type=Path, help="decoder_timeline.py's JSON")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    spec = load_spec(args.spec).spec
    measured = {}
    if args.measured:
        try:
            measured = json.loads(args.measured.read_text())
        except (OSError, ValueError) as error:
            raise PtxgenError(f"--measured {args.measured}: not a timeline JSON ({error})") from None
    models = {}
    for name in args.kernels:
        config = spec.kernel(name)
        models[name] = layer_model(config, GPUS[args.gpu], args.pos)
        print(report(name, models[name], measured.get(name), config.num_layers) + "\n")
        if args.json:
            args.json.write_text(json.dumps(models, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
