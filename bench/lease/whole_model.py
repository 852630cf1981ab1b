"""Whole-model decode as `ptxgen generate` runs it, embedding to token: Qwen3-8B's shapes with random
Q4_K_M-like weights (Q6_K lm_head), through the persistent decoder and through the separate
kernels, in tokens/s with the head (final norm, lm_head, argmax, the token read back) and without
it (generate.decode_speed: 32 greedy steps from an empty cache, so the attention is short). Issue
12 asks for the step with the lm_head; `make bench` measures it too, but no lease call runs `make bench`.

    python3 bench/lease/whole_model.py [--tokens 32] [--json whole_model.json]

Exit 2 without a GPU, before minutes of random weights.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ptxgen.device import driver
from ptxgen.errors import exit_from
from ptxgen.generate import QWEN3_8B, random_model_decode_speed


def measure(shape: dict, tokens: int, json_path: Path | None = None) -> list[dict]:
    """Both paths' rows, fused first; the JSON (if any) is rewritten after each, so a cut keeps the first."""
    rows = []
    for fused in (True, False):
        row = random_model_decode_speed(shape, fused, tokens)
        rows.append(row)
        print(f"{row['model']}, {row['layers']}: {row['tokens_per_s']:.1f} tokens/s with the lm_head and argmax, "
              f"{row['layers_tokens_per_s']:.1f} the layers alone ({row['device']})", flush=True)
        if json_path:
            json_path.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    driver(instead="whole-model decode is timed on a GPU")
    measure(QWEN3_8B, args.tokens, args.json)
    return 0


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
