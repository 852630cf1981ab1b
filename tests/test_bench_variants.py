"""bench.variant_comparisons: each row of a lease spec against the row it varies (same kind,
scalars and shapes; the longest prefix of its name), the ratios of its medians and a verdict."""

from __future__ import annotations

import pytest
from rich.console import Console

from ptxgen.bench import print_results, variant_comparisons


def gemv(name: str, us: float, batched_us: float | None = None, n: int = 4096, scalars: dict | None = None,
         **config) -> dict:
    """A timed q4k_gemv row (n x 4096) as bench records it."""
    return {"kernel": name, "kind": "q4k_gemv", "config": {"n": n, "k": 4096, "pdl": True, **config},
            "scalars": scalars or {}, "passed": True, "median_us": us,
            "batch": {"median_us": batched_us} if batched_us else None}


def by_kernel(rows: list[dict]) -> dict:
    return {found["kernel"]: found for found in variant_comparisons({"rows": rows})}


def test_a_variant_is_judged_against_the_row_its_name_extends():
    """gemv_warps8_prefetch changes gemv_warps8, which changes gemv: each against the one before,
    whatever the spec's order (a lease lists the most wanted rows first)."""
    found = by_kernel([gemv("gemv_warps8_prefetch", 8.1, 4.4, warps=8, prefetch_rows=2),
                       gemv("gemv_warps8", 7.7, 4.5, warps=8), gemv("gemv", 8.4, 5.4)])
    assert set(found) == {"gemv_warps8_prefetch", "gemv_warps8"}
    warps8, prefetch = found["gemv_warps8"], found["gemv_warps8_prefetch"]
    assert warps8["baseline"] == "gemv" and warps8["changes"] == {"warps": 8}
    assert warps8["per_run"] == pytest.approx(7.7 / 8.4) and warps8["batched"] == pytest.approx(4.5 / 5.4)
    assert warps8["verdict"] == "faster"
    assert prefetch["baseline"] == "gemv_warps8" and prefetch["changes"] == {"prefetch_rows": 2}
    assert prefetch["per_run"] == pytest.approx(8.1 / 7.7) and prefetch["verdict"] == "slower per run, within 5% batched"


def test_verdicts_need_every_figure_beyond_the_margin():
    found = by_kernel([gemv("g", 10.0, 8.0), gemv("g_slow", 10.6, 8.5, warps=16), gemv("g_same", 10.4, 7.7, unroll=2),
                       gemv("g_mixed", 9.8, 10.0, schedule="queue"), gemv("g_alone", 9.0, None, split_k=2)])
    assert found["g_slow"]["verdict"] == "slower"
    assert found["g_same"]["verdict"] == "within 5%"
    assert found["g_mixed"]["verdict"] == "within 5% per run, slower batched"
    assert found["g_alone"]["verdict"] == "faster" and "batched" not in found["g_alone"], \
        "a figure the baseline or the variant lacks is no ratio"


def test_other_shapes_scalars_kinds_and_untimed_rows_are_not_compared():
    rows = [gemv("g", 10.0), gemv("g_other_n", 5.0, n=12288), gemv("g_at_2", 5.0, scalars={"seq_len": 2}),
            {**gemv("g_failed", 1.0, warps=8), "passed": False, "median_us": None},
            {**gemv("g_unknown_kind", 1.0), "kind": "no_such_kind"}]
    assert variant_comparisons({"rows": rows}) == []
    # A variant whose base failed is judged against the first row of its group that extends no other.
    found = by_kernel([gemv("g", 10.0), {**gemv("g_w8", 1.0, warps=8), "passed": False, "median_us": None},
                       gemv("g_w8_prefetch", 9.0, warps=8, prefetch_rows=2)])
    assert found["g_w8_prefetch"]["baseline"] == "g"
    assert found["g_w8_prefetch"]["changes"] == {"prefetch_rows": 2, "warps": 8}


def test_nested_tables_differ_by_dotted_field():
    base = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "sm90a": {"pingpong": False, "tma": False}}

    def prefill(name, us, **sm90a):
        return {"kernel": name, "kind": "flash_attention", "config": {**base, "sm90a": {**base["sm90a"], **sm90a}},
                "scalars": {"seq_len": 4096}, "passed": True, "median_us": us, "batch": None}

    (found,) = variant_comparisons({"rows": [prefill("p", 300.0), prefill("p_tma", 270.0, tma=True)]})
    assert found["changes"] == {"sm90a.tma": True} and found["verdict"] == "faster"


def test_bench_prints_the_variants_beside_the_rows(capsys):
    rows = [gemv("g", 10.0, 8.0), gemv("g_w8", 8.0, 6.0, warps=8)]
    for row in rows:
        row.update(p10_us=row["median_us"], p90_us=row["median_us"], gbs=1.0, tflops=1.0, pct_copy_bw=1.0,
                   graph=None, step=None, peers=[], notes=[], checks=[])
        row["batch"]["pct_copy_bw"] = 1.0
    results = {"copy_bandwidth": {"gbs": 4000.0}, "rows": rows, "fits": [],
               "device": {"name": "GPU", "arch": "sm_90", "driver": "13.0"}, "iters": 100}
    print_results({**results, "variants": variant_comparisons(results)}, Console(), Console(stderr=True))
    text = capsys.readouterr().out
    assert "variants: time as a ratio" in text
    assert "g_w8" in text and "warps=8" in text and "0.800" in text and "0.750" in text and "faster" in text


def test_variants_script_judges_each_fused_norm_gemv_against_its_plain_gemv(tmp_path):
    """bench/lease/variants.py on a lease's decode.json: the variant table, then each fused norm +
    GEMV against the plain GEMV of its config (issue 12: within 5%), per run and batched."""
    import json
    import subprocess
    import sys

    from helpers import ROOT

    fused = {**gemv("norm_q", 10.2, 8.8), "kind": "fused_rmsnorm_q4k_gemv"}
    fused["config"]["eps"] = 1e-6
    path = tmp_path / "decode.json"
    path.write_text(json.dumps({"rows": [gemv("g", 10.0, 8.0), gemv("g_w8", 8.0, 6.0, warps=8), fused]}))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "lease" / "variants.py"), str(path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "fused norm_q against g: per run 1.020x (within 1.05), batched 1.100x (over 1.05)" in done.stdout, done.stdout
