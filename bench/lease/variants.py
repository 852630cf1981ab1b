"""Which variant rows of recorded `ptxgen bench --json` files beat the rows they vary (the table
`ptxgen bench` prints after its rows; bench.variant_comparisons), for files recorded before it did,
and each fused norm + GEMV against the plain GEMV of its config (issue 12's 5%, as `make bench`'s
targets judge it: bench.fusion_comparisons):

    python3 bench/lease/variants.py bench/results/H200-2026-11-28-lease/*.json
"""

from __future__ import annotations

import sys

from rich.console import Console

from ptxgen.bench import FUSION_BOUND, fusion_comparisons, print_variants, read_results, variant_comparisons
from ptxgen.errors import exit_from


def main(paths: list[str]) -> int:
    console = Console(highlight=False, soft_wrap=True)  # plain tables and unwrapped lines in pipes and logs
    for path in paths:
        results = read_results(path)
        console.print(f"{path}:" if results is not None else f"{path}: not a `ptxgen bench --json` file: skipped",
                      markup=False)
        if results is not None:
            print_variants(variant_comparisons(results), console)
            for comparison in fusion_comparisons(results["rows"]):
                console.print(fusion_line(comparison), markup=False)
    return 0


def fusion_line(comparison: dict) -> str:
    """One fused norm + GEMV row against its plain GEMV, per run and batched."""
    cells = [f"{label} {figure['ratio']:.3f}x ({'within' if figure['met'] else 'over'} {FUSION_BOUND:.2f})"
             if "ratio" in figure else f"{label} {figure['status']}"
             for label, figure in zip(("per run", "batched"), comparison["figures"].values())]
    return f"fused {comparison['fused']['kernel']} against {comparison['plain']['kernel']}: {', '.join(cells)}"


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
