"""Where a decode attention launch's time goes: a spec's `incremental_attention` with `timeline =
true`, each CTA's thread 0 stamping %globaltimer as it starts, after its PDL wait, before its
count-in and at its end (incremental_attention's TIMELINE), launched alone (after one to warm up)
and as the last of ten queued back to back (as bench's batched figures run them: a PDL launch
overlaps the one before); prints, per length, the launch's span over its CTAs, how far apart
they started (the launch ramp), the longest PDL wait, each CTA's split (its keys, from the wait
to its count-in: mean and longest), when the last split was done, and what came after it (the
count-in and the merge of the last KV head to finish). Why: the H200's decode attention costs 7.62 us a launch
beyond its bytes (ten launches between two events), and the model 3-5 us less than that.

    python3 bench/lease/attention_timeline.py bench/lease/attention.toml decode_attention \\
        --seq-len 4096 8192 32768 --json attention_timeline.json
"""

from __future__ import annotations

import sys

import numpy as np

from decoder_timeline import QUEUED, last_timeline, save, stamps, timeline_arguments, timeline_kernel
from ptxgen.errors import exit_from


def launched_rows(kind, seq_len: int) -> np.ndarray:
    """The timeline rows (kv_head * max_splits + split) of the CTAs a launch at seq_len runs."""
    plan = kind.plan
    width = plan.max_splits if kind.config.indirect_seq_len else max(1, kind.splits(kind.clamped_length({"seq_len": seq_len})))
    return np.array([head * plan.max_splits + split for head in range(kind.config.num_kv_heads) for split in range(width)])


def summarize(timeline: np.ndarray) -> dict:
    """The launch's figures (ns) from its CTAs' rows (start low/high, waited, counting in, end)."""
    t = stamps(timeline)
    start, waited, counting, end = t[:, 0], t[:, 2], t[:, 3], t[:, 4]
    split = timeline[:, 3] != 0  # a lone split has no count-in (word 3 unstamped)
    summary = {"ctas": int(len(t)), "kernel_ns": int(end.max() - start.min()),
               "start_spread_ns": int(start.max() - start.min()), "wait_ns": int((waited - start).max())}
    if split.all():
        keys = counting - waited
        summary.update(split_mean_ns=int(keys.mean()), split_max_ns=int(keys.max()),
                       last_split_ns=int(counting.max() - start.min()),
                       after_last_split_ns=int(end.max() - counting.max()))
    return summary


def measure(kernel, seq_len: int, backend: str = "device", launches: int = 2, inputs: dict | None = None,
            back_to_back: int = 1) -> dict:
    """summarize() of the last launch of `launches` runs at seq_len, each of `back_to_back` launches
    queued together, on `inputs` (default: the kind's sample inputs)."""
    timeline = last_timeline(kernel, {"seq_len": seq_len}, backend, launches, inputs, back_to_back)
    return summarize(timeline[launched_rows(kernel.definition, seq_len)])


def report(seq_len: int, summary: dict, how: str = "alone") -> str:
    line = (f"seq_len {seq_len}, {how}: {summary['ctas']} CTAs over {summary['kernel_ns'] / 1e3:.2f} us, started "
            f"{summary['start_spread_ns'] / 1e3:.2f} us apart, PDL wait at most {summary['wait_ns'] / 1e3:.2f} us")
    if "split_mean_ns" in summary:
        line += (f"; a split {summary['split_mean_ns'] / 1e3:.2f} us (longest {summary['split_max_ns'] / 1e3:.2f}), "
                 f"the last done at {summary['last_split_ns'] / 1e3:.2f} us, "
                 f"then {summary['after_last_split_ns'] / 1e3:.2f} us of count-in and merge")
    return line


def main(argv: list[str]) -> int:
    args = timeline_arguments(__doc__, argv, lambda parser: parser.add_argument(
        "--seq-len", type=int, nargs="+", default=[4096, 8192, 32768]))
    summaries: dict = {}
    for name in args.kernels:
        kernel = timeline_kernel(args.spec, name)
        figures = summaries.setdefault(kernel.name, {})
        print(f"{kernel.name}:")
        for seq_len in args.seq_len:
            for how, queued in QUEUED:
                figures.setdefault(str(seq_len), {})[how] = summary = measure(kernel, seq_len, back_to_back=queued)
                print(f"  {report(seq_len, summary, how)}")
                save(args.json, summaries)
    return 0


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
