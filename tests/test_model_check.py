"""bench/model_check.py: the performance model against a recorded H100 timing, no GPU."""
import re
import sys

import pytest

from ptxgen import perf
from ptxgen.kernels.base import DependentTail, TailStep
from ptxgen.kernels.persistent_decoder import BARRIER_ROUND_TRIPS, PersistentDecoder

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
    assert result["batched_us"] is None, "recorded before batched figures"
    batched = model_check.check_row({**row, "batch": {"median_us": 7.5}}, gpu)
    assert batched["batched_us"] == 7.5 and batched["verdict"] == result["verdict"], "printed, not judged"


def recorded_barriers(tail: DependentTail) -> DependentTail:
    """`tail` with the grid barriers of the recorded commit (b51b4c7): 4 round trips each (a
    fence, the arrival atomic, the last arriver's fence, the poll that sees the new generation),
    the next phase's loads issued only after them."""
    barriers = [step for step in tail.steps if "grid barriers" in step.what]
    count = sum(step.round_trips for step in barriers) // BARRIER_ROUND_TRIPS
    rest = tuple(step for step in tail.steps if step not in barriers)
    return DependentTail((TailStep(f"{count} grid barriers x 4 round trips", 4 * count, True, False), *rest),
                         tail.group_ctas)


def test_the_model_brackets_the_h100s_36_layer_decode_step(monkeypatch):
    """Measured 3275 us for Qwen3-8B's 36 layers in one launch (the 2026-11-23 baseline): the model,
    counted from one and two layers, brackets it only with the serial steps of the barriers that
    ran then (179 grid barriers of 4 round trips, 36 count-ins, at the GPU's latency): without them
    it says at most ~2600 us. Today's barriers (2 round trips, the next phase's first weights in
    flight through them) put the whole range below that recording: a prediction, not measured."""
    _, rows = model_check.rows_of(ROOT / "bench" / "results" / "NVIDIA-H100-80GB-HBM3-2026-11-23.json")
    row = next(r for r in rows if r["kernel"] == "qwen3_8b_decoder")
    gpu = perf.gpu_named("h100-sxm")
    today = model_check.check_row(row, gpu)
    assert today["verdict"] == "outside" and today["model_us"][1] * (1 + model_check.MARGIN) < row["median_us"], today
    declared = PersistentDecoder.dependent_tail
    monkeypatch.setattr(PersistentDecoder, "dependent_tail", lambda self, scalars: recorded_barriers(declared(self, scalars)))
    result = model_check.check_row(row, gpu)
    assert result["verdict"] == "inside" and result["tail_us"] > 400, result
    monkeypatch.setattr(PersistentDecoder, "dependent_tail", lambda self, scalars: None)
    assert model_check.check_row(row, gpu)["verdict"] == "outside"


def test_a_row_with_the_drivers_occupancy_is_compared_with_the_models():
    row = {"kernel": "g", "occupancy": {"ctas_per_sm": 3, "registers": 64, "static_shared": 48, "dynamic_shared": 0,
                                        "model_ctas_per_sm": 2, "model_limiter": "shared", "model_registers": 64,
                                        "model_static_shared": 1072}}
    assert not model_check.occupancy_agrees(row)
    line = model_check.occupancy_line(row)
    assert "driver 3, model 2 (shared)  DIFFERENT" in line and "static shared 48 / 1072 bytes" in line, line
    row["occupancy"]["model_ctas_per_sm"] = 3
    assert model_check.occupancy_agrees(row) and "DIFFERENT" not in model_check.occupancy_line(row)


def test_a_results_file_cut_short_says_so(tmp_path, capsys):
    """A bench stopped mid-run leaves the rows it made (its --json is rewritten after each);
    model_check says how many of the planned rows the file holds."""
    import json

    path = tmp_path / "short.json"
    path.write_text(json.dumps({"git_commit": "abc", "device": {"name": "GPU"}, "copy_bandwidth": {"gbs": 3000.0},
                                "planned_rows": 3, "rows": [recorded_row(kernel="k", median_us=None, batch=None,
                                                                         peers=[])]}))
    assert model_check.main([str(path)]) == 0
    assert f"{path} (commit abc, GPU; cut short: 1 of 3 rows)" in capsys.readouterr().out


def test_a_lease_folders_other_json_is_skipped_and_a_bad_file_is_one_message(tmp_path):
    """Run over a lease folder's *.json: whole_model.json and the timelines are not bench files
    (skipped, with a line saying so, as bench/lease/variants.py does); an unreadable or non-JSON
    file is one error line and exit 2, no traceback."""
    import subprocess

    (tmp_path / "whole_model.json").write_text('[{"model": "qwen3-8b"}]')
    (tmp_path / "broken.json").write_text("{")
    for script in (ROOT / "bench" / "model_check.py", ROOT / "bench" / "lease" / "variants.py"):
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "whole_model.json")], capture_output=True,
                              text=True)
        assert done.returncode == 0 and "whole_model.json: not a `ptxgen bench --json` file" in done.stdout, done
        for bad, why in (("broken.json", "not a JSON file"), ("missing.json", "cannot read: No such file")):
            done = subprocess.run([sys.executable, str(script), str(tmp_path / bad)], capture_output=True, text=True)
            assert done.returncode == 2 and done.stderr.startswith(f"error: {tmp_path / bad}: {why}"), done
            assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_the_decode_attention_line_shows_the_models_missing_fixed_cost():
    """The H100's decode attention at 4k/8k/32k keys (2026-11-27) lies on 10.93 us + 2863 GB/s; the
    same line through the model's overlapped end streams at about that rate but starts 3-5 us lower:
    what the model lacks is fixed cost, not bandwidth."""
    path = ROOT / "bench" / "results" / "H100-2026-11-27-lease" / "attention.json"
    data, rows = model_check.rows_of(path)
    gpu = perf.gpu_named("h100-sxm")
    rows = [row for row in rows if row["kernel"] == "decode_attention"]
    results = [model_check.check_row(row, gpu) for row in rows]
    (line,) = model_check.fit_lines({**data, "rows": rows}, results)
    assert line.startswith("decode_attention") and "measured per_run 10.93 us + 2863 GB/s" in line, line
    measured_fixed, measured_slope = model_check.line_fit([(r["bytes"] / 1e3, r["median_us"]) for r in rows])
    fixed, slope = model_check.line_fit([(r["bytes"] / 1e3, r["model_us"][0]) for r in results])
    assert abs(measured_slope / slope - 1) < 0.1, "the overlapped end streams at the measured rate"
    assert 3 < measured_fixed - fixed < 5, (measured_fixed, fixed)


def test_launch_bound_rows_give_the_cards_launch_cost_and_batched_figures_are_judged_with_it():
    """The median, over rows moving under TINY_BYTES, of measured less the model's own time is the
    card's launch cost, per run and batched (an outlier does not move it); a larger row's batched
    median is then judged against the model priced with the batched cost, its per-run one with
    the per-run cost."""
    def row(nbytes, own, measured, batched):
        return {"kernel": "k", "scalars": {}, "bytes": nbytes, "own_us": own, "measured_us": measured,
                "batched_us": batched, "tail_us": 0.0, "judged": True}

    tiny = [row(8192, (0.5, 0.6), m, b) for m, b in ((4.5, 2.1), (4.6, 2.0), (9.9, 2.2))]
    costs = model_check.launch_costs([*tiny, row(10**7, (5.0, 7.0), 12.0, 8.5)])
    assert abs(costs["per_run"] - 4.1) < 1e-9 and abs(costs["batched"] - 1.6) < 1e-9, costs
    judged = model_check.judge(row(10**7, (5.0, 7.0), 12.0, 8.5), costs)
    assert judged["model_us"] == (9.1, 11.1) and judged["verdict"] == "inside"
    assert judged["batched_model_us"] == (6.6, 8.6) and judged["batched_verdict"] == "inside"
    assert model_check.judge(row(10**7, (5.0, 7.0), 12.0, 10.0), costs)["batched_verdict"] == "outside"
    unknown = model_check.judge(row(10**7, (5.0, 7.0), 12.0, 8.5), {"per_run": 4.1, "batched": None})
    assert "batched_verdict" not in unknown, "no batched cost: printed, not judged"
    assert model_check.launch_costs([row(10**7, (5.0, 7.0), 12.0, 8.5)]) == {"per_run": None, "batched": None}


def test_the_h100s_smallest_kernels_give_its_table_launch_cost():
    """The H100 of 2026-11-23's launch-bound rows (norms, rope, kv_append, residual_add, swiglu)
    give 4.0 us per run, beside the 3.9 us perf.GPUS took from four of them."""
    _, rows = model_check.rows_of(ROOT / "bench" / "results" / "NVIDIA-H100-80GB-HBM3-2026-11-23.json")
    gpu = perf.gpu_named("h100-sxm")
    tiny = [model_check.check_row(row, gpu) for row in rows if row["bytes"] < model_check.TINY_BYTES]
    assert len(tiny) >= 8
    costs = model_check.launch_costs(tiny)
    assert abs(costs["per_run"] - gpu.launch_us) < 0.2 and costs["batched"] is None, costs


def recorded_row(**changes) -> dict:
    """A timed row as `ptxgen bench --json` writes it (bench.new_row's fields), of a residual add."""
    row = {"kernel": "resid", "kind": "residual_add", "config": {"n": 4096}, "scalars": {}, "bytes": 49152,
           "flops": 4096, "checks": [], "passed": True, "failure": None, "median_us": 4.5, "batch": {"median_us": 2.0},
           "graph": None, "peers": [{"name": "torch", "median_us": 5.0, "batch": None}], "step": None,
           "occupancy": None, "notes": []}
    return {**row, **changes}


def recorded_file(tmp_path, name: str, rows: list, **changes):
    import json

    path = tmp_path / name
    path.write_text(json.dumps({"git_commit": "abc", "device": {"name": "GPU"}, "copy_bandwidth": {"gbs": 3000.0},
                                "planned_rows": len(rows), "rows": rows, **changes}))
    return path


def test_a_malformed_results_file_is_one_message_naming_what_is_wrong(tmp_path):
    """A file with rows that is not what bench writes (a row not an object, a field missing or of
    another type, a median that is no positive number; for model_check no device or copy
    bandwidth): both scripts stop with one line naming the file and the field, exit 2, before
    printing any row; they raised KeyError, TypeError or AttributeError with a traceback."""
    import subprocess

    sys.path.insert(0, str(ROOT / "bench" / "lease"))
    import variants

    from ptxgen.errors import PtxgenError

    good = recorded_row()
    cases = {
        "not_object.json": ([1], {}, "rows[0]: Input should be an object (got 1)"),
        "no_kind.json": ([{k: v for k, v in good.items() if k != "kind"}], {}, "rows[0].kind: Field required"),
        "text_median.json": ([recorded_row(median_us="fast")], {}, "rows[0].median_us: Input should be a valid number "
                                                                  "(got 'fast')"),
        "bad_batch.json": ([recorded_row(batch={"median_us": -1})], {}, "rows[0].batch.median_us: Input should be greater than 0 (got -1)"),
        "no_passed.json": ([{k: v for k, v in good.items() if k != "passed"}], {}, "rows[0].passed: Field required"),
        "peer_name.json": ([recorded_row(peers=[{"median_us": 3.0}])], {}, "rows[0].peers[0].name: Field required"),
        "peers_number.json": ([recorded_row(peers=5)], {}, "rows[0].peers: Input should be a valid list (got 5)"),
    }
    # what model_check alone reads (variants.py compares the rows' medians by kind, config and scalars)
    model_cases = {
        "text_bytes.json": ([recorded_row(bytes="many")], {}, "rows[0].bytes: Input should be a valid integer (got 'many')"),
        "no_device.json": ([good], {"device": None}, "device: Input should be an object (got None)"),
        "no_copy.json": ([good], {"copy_bandwidth": {}}, "copy_bandwidth.gbs: Field required"),
        "occupancy.json": ([recorded_row(occupancy={"ctas_per_sm": 2})], {}, "rows[0].occupancy.model_ctas_per_sm: Field required"),
    }
    for name, (rows, changes, message) in [*cases.items(), *model_cases.items()]:
        path = recorded_file(tmp_path, name, rows, **changes)
        for main in (model_check.main, variants.main) if name in cases else (model_check.main,):
            with pytest.raises(PtxgenError, match=re.escape(f"{path}: not a whole `ptxgen bench --json` file: {message}")):
                main([str(path)])
    path = tmp_path / "text_median.json"
    for script in (ROOT / "bench" / "model_check.py", ROOT / "bench" / "lease" / "variants.py"):
        done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True)
        assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr, done
        assert done.stderr.strip().splitlines() == [f"error: {path}: not a whole `ptxgen bench --json` file: "
                                                    "rows[0].median_us: Input should be a valid number (got 'fast')"], done.stderr


def test_a_row_whose_config_todays_code_refuses_is_not_judged(tmp_path, capsys):
    """The code may have moved on since a recording: a kind it no longer has, a config field it
    refuses or a runtime scalar past today's limits leaves that row unjudged, with the reason,
    and the other rows are judged (it was a pydantic traceback or exit 2 for the whole run)."""
    rows = [recorded_row(kernel="gone", kind="no_such_kind"), recorded_row(kernel="negative", config={"n": -4}),
            recorded_row(kernel="scalar", scalars={"rows": 3}), recorded_row()]
    assert model_check.main([str(recorded_file(tmp_path, "old.json", rows))]) == 0
    printed = capsys.readouterr().out
    lines = {line.split()[0]: line for line in printed.splitlines() if line.split()[:1] in (["gone"], ["negative"],
                                                                                              ["scalar"], ["resid"])}
    assert "not judged (today's code refuses its no_such_kind config: Input tag 'no_such_kind' found using 'kind' " \
        "does not match any of the expected tags: 'argmax'," in lines["gone"], lines["gone"]
    assert lines["negative"].endswith("not judged (today's code refuses its residual_add config: n: Input should be "
                                      "greater than or equal to 1 (got -4))"), lines["negative"]
    assert "not judged (today's code refuses it:" in lines["scalar"] and "'rows'" in lines["scalar"], lines["scalar"]
    assert "not judged" not in lines["resid"] and re.search(r"\b(inside|outside)\b", lines["resid"]), lines["resid"]
