"""Which variant rows of recorded `ptxgen bench --json` files beat the rows they vary (the table
`ptxgen bench` prints after its rows; bench.variant_comparisons), for files recorded before it did:

    python3 bench/lease/variants.py bench/results/H200-2026-11-28-lease/*.json
"""

from __future__ import annotations

import json
import sys

from rich.console import Console

from ptxgen.bench import print_variants, variant_comparisons


def main(paths: list[str]) -> int:
    console = Console(width=200)
    for path in paths:
        results = json.loads(open(path).read())
        if "rows" in results:
            console.print(f"{path}:")
            print_variants(variant_comparisons(results), console)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
