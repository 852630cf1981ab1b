"""bench/model_check.py: the performance model against a recorded H100 timing, no GPU."""
import sys

from ptxgen import perf

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import model_check  # noqa: E402

SWEEP = ROOT / "bench" / "results" / "H100-2026-11-23-session3" / "gemv_sweep.json"


def test_the_model_brackets_the_h100s_4096_square_gemv():
    """Measured 9.15 us (34.6% of copy bandwidth) for 9.5 MB: the model's range includes it only
    with the launch cost (bytes 3.2 us + issue + latency alone would say 4.8 us at most)."""
    _, rows = model_check.rows_of(SWEEP)
    row = next(r for r in rows if r["kernel"] == "g4096_default")
    gpu = perf.gpu_named("h100-sxm")
    result = model_check.check_row(row, gpu)
    low, high = result["model_us"]
    assert result["verdict"] == "inside", result
    assert high - gpu.launch_us < row["median_us"] / (1 + model_check.MARGIN), "the launch term is what explains it"


def test_the_model_brackets_the_h100s_36_layer_decode_step(monkeypatch):
    """Measured 3275 us for Qwen3-8B's 36 layers in one launch (the 2026-11-23 baseline): the model,
    counted from one and two layers, brackets it only with the serial steps (179 grid barriers and
    36 count-ins at the GPU's latency): without them it says at most ~2600 us."""
    _, rows = model_check.rows_of(ROOT / "bench" / "results" / "NVIDIA-H100-80GB-HBM3-2026-11-23.json")
    row = next(r for r in rows if r["kernel"] == "qwen3_8b_decoder")
    gpu = perf.gpu_named("h100-sxm")
    result = model_check.check_row(row, gpu)
    assert result["verdict"] == "inside" and result["tail_us"] > 400, result
    from ptxgen.kernels.persistent_decoder import PersistentDecoder

    monkeypatch.setattr(PersistentDecoder, "dependent_tail", lambda self, scalars: None)
    assert model_check.check_row(row, gpu)["verdict"] == "outside"
