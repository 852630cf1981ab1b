"""bench.size_fits: the line time = fixed + bytes / rate through a kernel's rows at several sizes
(and each peer's), which splits what a launch costs whatever its size from how fast it streams."""

from __future__ import annotations

import pytest
from rich.console import Console

from ptxgen.bench import print_results, size_fits

COPY_GBS = 4000.0


def row(kernel: str, seq_len: int, mbytes: float, fixed_us: float, gbs: float, flops_per_byte: float = 0.25,
        batch: tuple[float, float] | None = None, peers: dict[str, tuple[float, float]] | None = None,
        kind: str = "incremental_attention", config: dict | None = None) -> dict:
    """A timed row whose medians lie on fixed + bytes / rate (µs and GB/s), batched and peers alike."""
    nbytes = int(mbytes * 1e6)

    def at(fixed, rate):
        return fixed + nbytes / rate / 1e3

    figure = {"median_us": at(fixed_us, gbs)}
    return {"kernel": kernel, "kind": kind, "config": config if config is not None else {"name_of": kernel},
            "scalars": {"seq_len": seq_len} if seq_len else {}, "bytes": nbytes, "flops": flops_per_byte * nbytes,
            "median_us": figure["median_us"], "batch": {"median_us": at(*batch)} if batch else None,
            "peers": [{"name": name, "median_us": at(*line), "batch": None} for name, line in (peers or {}).items()],
            "passed": True}


def results(*rows) -> dict:
    return {"copy_bandwidth": {"gbs": COPY_GBS}, "rows": list(rows)}


def test_a_kernel_at_three_sizes_gives_back_its_fixed_cost_and_rate():
    rows = [row("attn", n, mb, 7.5, 3800.0, batch=(5.0, 3900.0), peers={"sdpa": (10.0, 4400.0)})
            for n, mb in ((4096, 16.8), (8192, 33.6), (32768, 134.3))]
    (fit,) = size_fits(results(*rows))
    assert fit["kernel"] == "attn" and [s["seq_len"] for s in fit["scalars"]] == [4096, 8192, 32768]
    assert fit["per_run"]["fixed_us"] == pytest.approx(7.5) and fit["per_run"]["gbs"] == pytest.approx(3800.0)
    assert fit["per_run"]["pct_copy_bw"] == pytest.approx(95.0) and fit["per_run"]["worst_residual"] < 1e-9
    assert fit["batched"]["fixed_us"] == pytest.approx(5.0) and fit["batched"]["gbs"] == pytest.approx(3900.0)
    sdpa = fit["peers"]["sdpa"]
    assert sdpa["per_run"]["fixed_us"] == pytest.approx(10.0) and sdpa["per_run"]["pct_copy_bw"] == pytest.approx(110.0)
    assert sdpa["batched"] is None, "no batched peer figures: no line"


def test_the_residual_says_how_far_the_sizes_are_from_a_line():
    rows = [row("attn", n, mb, 7.5, 3800.0) for n, mb in ((4096, 16.8), (8192, 33.6), (32768, 134.3))]
    rows[1]["median_us"] *= 1.1
    (fit,) = size_fits(results(*rows))
    assert 0.03 < fit["per_run"]["worst_residual"] < 0.1


def test_no_line_for_one_size_a_growing_intensity_or_a_time_that_does_not_grow():
    one_size = [row("gemv", 0, 28.3, 3.0, 3900.0)]
    # A causal prefill: flops grow as seq_len^2, bytes as seq_len: time is not a line in bytes.
    prefill = [row("prefill", n, 4e-3 * n, 5.0, 300.0, flops_per_byte=n / 8) for n in (1024, 4096)]
    flat = [row("flat", n, mb, 4.0, 1e12) for n, mb in ((1, 1.0), (4, 4.0))]
    flat[1]["median_us"] = flat[0]["median_us"]
    assert size_fits(results(*one_size, *prefill, *flat)) == []


def test_bench_prints_the_fits_beside_the_rows(capsys):
    rows = [row("attn", n, mb, 7.5, 3800.0, batch=(5.0, 3900.0)) for n, mb in ((4096, 16.8), (8192, 33.6))]
    for r in rows:
        r.update(p10_us=r["median_us"], p90_us=r["median_us"], gbs=1.0, tflops=1.0, pct_copy_bw=1.0, graph=None,
                 step=None, notes=[], checks=[])
        r["batch"]["pct_copy_bw"] = 1.0
    made = {**results(*rows), "device": {"name": "GPU", "arch": "sm_90", "driver": "13.0"}, "iters": 100}
    print_results({**made, "fits": size_fits(made)}, Console(), Console(stderr=True))  # not a terminal: all on stdout
    text = capsys.readouterr().out
    assert "fixed cost and streaming rate" in text
    assert "7.50 + 3800 (95.0%)" in text and "5.00 + 3900 (97.5%)" in text


def test_kernels_that_differ_only_in_shape_share_a_line():
    """Q4_K GEMVs at three n x k (Kind.shape_fields) with one config share a line; another schedule
    gets its own; one with a different CTA size, alone, none (the H200's figures, 2026-11-28)."""
    def gemv(name, n, k, mb, fixed, gbs, **config):
        return row(name, 0, mb, fixed, gbs, flops_per_byte=3.5, kind="q4k_gemv",
                   config={"n": n, "k": k, "pdl": True, **config})

    rows = [gemv("g12288x4096", 12288, 4096, 28.3, 2.96, 3911), gemv("g4096x12288", 4096, 12288, 28.3, 2.96, 3911),
            gemv("g4096x4096", 4096, 4096, 9.4, 2.96, 3911),
            gemv("q12288x4096", 12288, 4096, 28.3, 2.93, 2924, schedule="queue"),
            gemv("q4096x4096", 4096, 4096, 9.4, 2.93, 2924, schedule="queue"),
            gemv("w8", 4096, 4096, 9.4, 2.07, 3911, warps=8)]
    static, queue = size_fits(results(*rows))
    assert static["kernels"] == ["g12288x4096", "g4096x12288", "g4096x4096"]
    assert static["kernel"] == "g12288x4096 + g4096x12288 + g4096x4096" and static["scalars"] == [{}, {}, {}]
    assert static["per_run"]["fixed_us"] == pytest.approx(2.96) and static["per_run"]["gbs"] == pytest.approx(3911)
    assert queue["kernels"] == ["q12288x4096", "q4096x4096"] and queue["per_run"]["gbs"] == pytest.approx(2924)
