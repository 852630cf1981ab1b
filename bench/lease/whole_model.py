"""Whole-model decode as `ptxgen generate` runs it, embedding to token: Qwen3-8B's shapes with random
Q4_K_M-like weights (Q6_K lm_head; every layer the same values, made once: generate.RandomModel),
through the persistent decoder, then the same with a Q4_K lm_head (issue 12 names 151936 x 4096
Q4_K rows; a Q4_K_M file stores Q6_K ones), then through the separate kernels. Issue 12's step with the lm_head:
the step at pos 4095 on the GPU's clock with the head (final norm, lm_head, argmax) and without
it (generate.step_speed); and tokens/s on the wall clock from an empty cache, the token read back
each step (generate.decode_speed). `make bench` measures the same.

    python3 bench/lease/whole_model.py [--tokens 32] [--pos 4095] [--json whole_model.json]

Exit 2 without a GPU, before any weights are made.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ptxgen.artifacts import check_output_file, write_file
from ptxgen.device import driver
from ptxgen.errors import exit_from
from ptxgen.generate import QWEN3_8B, STEP_POS, WHOLE_MODEL_PATHS, random_model_decode_speed


def measure(shape: dict, tokens: int, pos: int, json_path: Path | None = None) -> list[dict]:
    """The PATHS' rows; the JSON (if any) is rewritten after each, so a cut keeps the first ones."""
    rows = []
    for fused, lm_head in WHOLE_MODEL_PATHS:
        row = random_model_decode_speed(shape, fused, tokens, pos=pos, lm_head=lm_head)
        rows.append(row)
        print(f"{row['model']}, {row['layers']} ({row['device']}): at pos {row['pos']} the step takes "
              f"{row['step_us']:.1f} us with the {row['lm_head']} lm_head and argmax, {row['layers_us']:.1f} the layers "
              f"alone{' (host-bound)' if row['host_bound'] else ''}; from an empty cache {row['tokens_per_s']:.1f} "
              f"tokens/s with the head, {row['layers_tokens_per_s']:.1f} the layers alone", flush=True)
        if json_path:
            write_file(json_path, (json.dumps(rows, indent=2) + "\n").encode(), "--json")
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--pos", type=int, default=STEP_POS)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.json is not None:  # before the driver and the weights: a bad name must not cost a lease's minutes
        check_output_file(args.json, "--json", ".json")
    driver(instead="whole-model decode is timed on a GPU")
    measure(QWEN3_8B, args.tokens, args.pos, args.json)
    return 0


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
