"""Which variant rows of recorded `ptxgen bench --json` files beat the rows they vary (the table
`ptxgen bench` prints after its rows; bench.variant_comparisons), for files recorded before it did:

    python3 bench/lease/variants.py bench/results/H200-2026-11-28-lease/*.json
"""

from __future__ import annotations

import sys

from rich.console import Console

from ptxgen.bench import print_variants, read_results, variant_comparisons
from ptxgen.errors import exit_from


def main(paths: list[str]) -> int:
    console = Console(width=200)
    for path in paths:
        results = read_results(path)
        console.print(f"{path}:" if results is not None else f"{path}: not a `ptxgen bench --json` file: skipped",
                      markup=False)
        if results is not None:
            print_variants(variant_comparisons(results), console)
    return 0


if __name__ == "__main__":
    exit_from(main, sys.argv[1:])
