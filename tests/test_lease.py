"""bench/lease: the prepared call for a lent GPU. Its specs load and assemble without spills (a
stale field or a spilling variant would cost the lease itself), and its script parses."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from ptxgen import perf
from ptxgen.errors import PtxgenError
from ptxgen.pipeline import compile_spec
from ptxgen.spec import load_spec

from helpers import ROOT, needs_nvdisasm, needs_ptxas

LEASE = ROOT / "bench" / "lease"


@needs_ptxas
@needs_nvdisasm
@pytest.mark.parametrize("spec", sorted(path.name for path in LEASE.glob("*.toml")))
def test_each_lease_spec_builds_without_spills(spec):
    """No lease kernel spills, but where a spill stays outside every loop (SASS, nvdisasm; at most
    16 bytes: the split prefill's pointer kept across its key loop, tests/test_flash_attention.py)."""
    loaded = load_spec(LEASE / spec)
    for kernel in compile_spec(loaded.spec).kernels:
        for arch, binary in kernel.binaries.items():
            res = binary.resources
            assert res["local_bytes"] == 0, f"{kernel.name} {arch}: {res}"
            if res["spill_stores"] or res["spill_loads"]:
                assert res["spill_stores"] <= 16 and perf.nvdisasm() is not None, f"{kernel.name} {arch}: {res}"
                assert perf.sass_counts(binary.cubin)["loop_spills"] == 0, f"{kernel.name} {arch} spills in a loop"


def test_the_lease_script_parses_and_names_every_spec():
    script = (LEASE / "run.sh").read_text()
    subprocess.run(["bash", "-n", str(LEASE / "run.sh")], check=True)
    for spec in LEASE.glob("*.toml"):
        assert spec.stem in script, f"bench/lease/run.sh never benches {spec.name}"


def test_the_profile_script_names_kernels_its_specs_hold():
    """bench/lease/profile.sh (Nsight Compute, the lease's second call) parses, and every kernel it
    profiles is in the spec it names: a stale name would cost a lent GPU's minutes."""
    subprocess.run(["bash", "-n", str(LEASE / "profile.sh")], check=True)
    calls = [line.split()[1:3] for line in (LEASE / "profile.sh").read_text().splitlines()
             if line.startswith("profile bench/")]
    assert len(calls) == 4
    for spec, name in calls:
        load_spec(ROOT / spec).spec.kernel(name)
    decoders = load_spec(LEASE / "decoder.toml").spec
    for name in ("qwen3_8b_decoder", "qwen3_8b_decoder_kv_prefetch"):  # the timeline's
        assert name in (LEASE / "profile.sh").read_text() and decoders.kernel(name).kind == "persistent_decoder"


def test_the_tune_script_sweeps_variants_that_all_build():
    """bench/lease/tune.sh (bench --tune, the lease's other second call) parses; each sweep names a
    kernel of its spec, scalars it takes, and fields whose every combination is a valid config that
    assembles (one refused would be a wasted line; one that renders another's kernel is skipped
    before the GPU, at no cost)."""
    from ptxgen import tune
    from ptxgen.kernels import kind_of

    script = (LEASE / "tune.sh").read_text()
    subprocess.run(["bash", "-n", str(LEASE / "tune.sh")], check=True)
    sweeps = [shlex.split(line)[1:] for line in script.replace("\\\n", " ").splitlines()
              if re.match(r"tune [0-9]+ ", line)]
    assert len(sweeps) == 4
    for _cap, spec, name, *options in sweeps:
        loaded = load_spec(ROOT / spec)
        kernel = loaded.spec.kernel(name)
        fields = tune.parse_tune([value for option, value in zip(options[::2], options[1::2]) if option == "--tune"])
        scalars = [value.split("=")[0] for option, value in zip(options[::2], options[1::2]) if option == "--set"]
        assert set(scalars) <= set(kind_of(kernel).scalar_limits()), (name, scalars)
        made, skipped = tune.variants(loaded, kernel, fields)
        made = tune.compile_variants(loaded, made, skipped)
        assert len(made) > 2 and all(skip["reason"].startswith("the same kernel") for skip in skipped), (name, skipped)


def test_the_lease_steps_keep_to_the_budget_and_run_programs(tmp_path):
    """common.sh's `step` runs a program under min(its cap, what is left of the budget), logs its
    exit, and skips it below 20 s; `timeout` cannot run a shell function, so no script hands one
    of its functions to `step`."""
    script = (f"source {LEASE / 'common.sh'}; OUT={tmp_path}; lease log.txt 50; step first 30 true; "
              "step second 100 sh -c 'exit 3'; echo rc=$?; START=$((SECONDS - 45)); step third 10 true; echo rc=$?")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    log = (tmp_path / "log.txt").read_text()
    assert "== first (at most 30 s)" in log and "== first: exit 0" in log
    assert "== second (at most 50 s)" in log and "== second: exit 3" in log and "rc=3" in log
    assert "== third: skipped, 5 s of the budget left" in log and log.rstrip().endswith("rc=1"), done.stderr
    functions = set()
    for path in LEASE.glob("*.sh"):
        functions |= set(re.findall(r"^([a-z_]+)\(\) \{", path.read_text(), re.M))
    assert {"lease", "installed", "step", "tune", "profile"} <= functions
    for path in LEASE.glob("*.sh"):
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] == ["step"]:
                command = shlex.split(line.rstrip("\\"))[3]
                assert command not in functions, f"{path.name}: step runs the shell function {command}"


def test_one_launch_runs_a_spec_kernel_once(capsys):
    """bench/lease/one_launch.py: one launch on the kind's sample inputs at the given scalars (here
    in the emulator; on the lease, the device under ncu)."""
    sys.path.insert(0, str(LEASE))
    import one_launch

    assert one_launch.main([str(LEASE / "prefill.toml"), "prefill_mma", "seq_len=17"], backend="emulator") == 0
    assert capsys.readouterr().out == "prefill_mma {'seq_len': 17}: one launch (emulator)\n"
    for argv, message in (([], "usage: one_launch.py SPEC KERNEL"),
                          ([str(LEASE / "prefill.toml"), "prefill_mma", "seq_len=x"], "expected NAME=INTEGER"),
                          ([str(LEASE / "prefill.toml"), "nosuch"], "no kernel named 'nosuch'")):
        with pytest.raises(PtxgenError, match=message):
            one_launch.main(argv, backend="emulator")


def test_decoder_timeline_adds_phases_and_barriers_up_to_the_step():
    """bench/lease/decoder_timeline.py on a timeline decoder in the interpreter (its timers count
    instructions): the phases' and barriers' spans sum to the step exactly, each at least 0, every
    phase's balance in (0, 1], and the bytes are the weights and the cache rows up to pos."""
    sys.path.insert(0, str(LEASE))
    import decoder_timeline

    from helpers import make_kernel

    kernel = make_kernel("persistent_decoder", name="pd", hidden=512, num_heads=4, num_kv_heads=2, head_dim=128,
                         intermediate=1024, max_seq_len=64, num_layers=2, ctas=5, timeline=True)
    summary = decoder_timeline.measure(kernel, 9, backend="emulator", launches=1)
    phases, barriers = summary["phases"], summary["barriers_ns"]
    assert sum(p["span_ns"] for p in phases.values()) + sum(barriers.values()) == summary["step_ns"] > 0
    assert all(p["span_ns"] > 0 and 0 < p["balance"] <= 1 for p in phases.values()), phases
    assert min(barriers.values()) >= 0 and summary["start_skew_ns"] == 0
    q4k_row = 144 * 512 // 256
    assert phases["qkv"]["bytes"] == 2 * (512 + 2 * 256) * q4k_row          # 2 layers of wq, wk, wv
    assert phases["down"]["bytes"] == 2 * 512 * 144 * 1024 // 256
    assert phases["attention"]["bytes"] == 2 * 2 * 2 * 10 * 128 * 2          # K and V, 2 layers, 2 heads, 10 rows
    assert "barrier F" in decoder_timeline.report(summary)


def test_decoder_phases_models_each_phase_and_sees_what_head_prep_takes_off_qkv():
    """bench/lease/decoder_phases.py on the tiny decoder: every phase of a layer priced (its bytes
    the timeline's, a layer's worth), the barriers at BARRIER_ROUND_TRIPS each; with head_prep
    "attention" phase A's Q/K tasks lose their count-in, whose fence and atomic the model counts
    as rounds of their own; the GEMV phases after it do not change; the report puts a timeline's measured span a layer beside each phase."""
    sys.path.insert(0, str(LEASE))
    import decoder_phases

    from helpers import make_config
    from ptxgen.kernels.persistent_decoder import BARRIER_ROUND_TRIPS
    from ptxgen.perf import GPUS

    gpu = GPUS["h200"]
    shapes = dict(hidden=512, num_heads=4, num_kv_heads=2, head_dim=128, intermediate=1024, max_seq_len=64,
                  num_layers=2)
    plain, moved = (decoder_phases.layer_model(make_config("persistent_decoder", name="pd", **shapes, **extra), gpu, 9)
                    for extra in ({}, {"head_prep": "attention"}))
    assert list(plain["phases"]) == list(decoder_phases.LAYER_PHASES)
    q4k_row = 144 * 512 // 256
    assert plain["phases"]["qkv"]["bytes_us"] == round((512 + 2 * 256) * q4k_row / (gpu.bandwidth_gbs * 1e3), 3)
    assert plain["barrier_us"] == BARRIER_ROUND_TRIPS * gpu.latency_ns * 1e-3
    # 512 two-row tasks on 1024 warps: a task a warp at most, its count-in 2 rounds of the model's.
    assert moved["phases"]["qkv"]["rounds_per_warp"] < plain["phases"]["qkv"]["rounds_per_warp"] / 2
    # (their instructions differ by the barrier polls, which follow the CTAs' timing)
    assert all(moved["phases"][p][term] == plain["phases"][p][term] for p in ("o", "gate_up", "down")
               for term in ("bytes_us", "rounds_per_warp"))
    timeline = {"phases": {p: {"span_ns": 2000 * (i + 1)} for i, p in enumerate(decoder_phases.LAYER_PHASES)},
                "barriers_ns": {b: 1000 for b in "ACDEF"}}
    table = decoder_phases.report("pd", plain, timeline, 2).splitlines()
    assert "measured: the timeline's span over its 2 layers / 2" in table[0]
    assert table[2].split()[0] == "qkv" and table[2].split()[-1] == "1.00"
    assert table[-1].split()[-1] == "2.50"  # 5 barriers x 1 us over 2 layers


@pytest.mark.parametrize("seq_len", (555, 20))
def test_attention_timeline_locates_a_launchs_ramp_stream_and_merge(seq_len):
    """bench/lease/attention_timeline.py on a timeline decode attention in the interpreter (its
    timers count instructions), the second of two launches queued back to back: one row a
    launched CTA (4 splits x 2 KV heads at 555 keys), every stamp in order, the last split done
    before the launch ends and a count-in and merge after it; a lone split (20 keys) has no
    count-in, so no split figures."""
    sys.path.insert(0, str(LEASE))
    import attention_timeline

    from helpers import make_kernel

    kernel = make_kernel("incremental_attention", name="a", num_heads=8, num_kv_heads=2, head_dim=128,
                         max_seq_len=600, sm_count=4, pdl=True, timeline=True)
    summary = attention_timeline.measure(kernel, seq_len, backend="emulator", launches=1, back_to_back=2)
    splits = kernel.definition.splits(seq_len)
    assert summary["ctas"] == 2 * splits and summary["start_spread_ns"] >= 0 and summary["wait_ns"] >= 0
    if splits == 1:
        assert "split_mean_ns" not in summary
    else:
        assert 0 < summary["split_mean_ns"] <= summary["split_max_ns"] < summary["last_split_ns"] < summary["kernel_ns"]
        assert summary["after_last_split_ns"] > 0
        assert "of count-in and merge" in attention_timeline.report(seq_len, summary, "last of 2 back to back")


def test_gemv_timeline_locates_a_launchs_ramp_staging_rows_and_tail():
    """bench/lease/gemv_timeline.py on a timeline GEMV in the interpreter (its timers count
    instructions), alone and as the second of two queued back to back: a row a CTA, the staging
    and rows under the launch's span, no tail beyond it."""
    sys.path.insert(0, str(LEASE))
    import gemv_timeline

    from helpers import make_kernel

    kernel = make_kernel("q4k_gemv", name="g", n=300, k=1024, pdl=True, warps=4, timeline=True)
    for queued in (1, 2):
        summary = gemv_timeline.measure(kernel, backend="emulator", launches=1, back_to_back=queued)
        assert summary["ctas"] == kernel.definition.plan.ctas, summary
        assert 0 < summary["staging_mean_ns"] <= summary["staging_max_ns"], summary
        assert 0 < summary["rows_mean_ns"] <= summary["rows_max_ns"] < summary["kernel_ns"], summary
        assert 0 <= summary["tail_ns"] < summary["kernel_ns"] and summary["warp_spread_ns"] >= 0, summary
        assert "the last CTA" in gemv_timeline.report("alone", summary)


def test_whole_model_exits_2_without_a_gpu_before_any_weights():
    """bench/lease/whole_model.py without a GPU: one line naming it, exit 2, no traceback (the
    random 8B weights would take minutes first)."""
    from ptxgen import device
    from ptxgen.errors import DeviceUnavailable

    try:
        device.driver()
        pytest.skip("a GPU is present")
    except DeviceUnavailable:
        pass
    done = subprocess.run([sys.executable, str(LEASE / "whole_model.py"), "--tokens", "2"], capture_output=True,
                          text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("error: no CUDA driver/GPU found") and "whole-model decode is timed on a GPU" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_whole_model_writes_both_paths_fused_first(tmp_path, monkeypatch, capsys):
    """Its loop: the persistent decoder, with a Q4_K lm_head too, then the separate kernels, at the
    position asked, the JSON rewritten after each (random_model_decode_speed itself runs on the
    simulated GPU in tests/test_generate.py)."""
    sys.path.insert(0, str(LEASE))
    import whole_model

    calls = []

    def speed(shape, fused, tokens, pos, lm_head):
        calls.append((shape["name"], fused, tokens, pos, lm_head))
        layers = "persistent_decoder" if fused else "separate kernels"
        return {"model": shape["name"], "layers": layers, "device": "test", "tokens_per_s": 2.0 + fused,
                "layers_tokens_per_s": 4.0, "pos": pos, "step_us": 2150.0 - fused, "layers_us": 2000.0,
                "head_us": 150.0 - fused, "host_bound": not fused, "lm_head": (lm_head or "q6_k").upper()}

    monkeypatch.setattr(whole_model, "random_model_decode_speed", speed)
    out = tmp_path / "whole_model.json"
    rows = whole_model.measure({"name": "m"}, 3, 4095, out)
    assert calls == [("m", True, 3, 4095, None), ("m", True, 3, 4095, "q4_k"), ("m", False, 3, 4095, None)]
    assert json.loads(out.read_text()) == rows
    assert [r["layers"] for r in rows] == ["persistent_decoder", "persistent_decoder", "separate kernels"]
    printed = capsys.readouterr().out.splitlines()
    assert "at pos 4095 the step takes 2149.0 us with the Q6_K lm_head and argmax, 2000.0 the layers alone;" in printed[0]
    assert "2149.0 us with the Q4_K lm_head and argmax" in printed[1]
    assert "2150.0 us with the Q6_K lm_head and argmax, 2000.0 the layers alone (host-bound);" in printed[2]


def test_each_lease_call_writes_at_most_the_eight_files_a_call_brings_back():
    """The device tool returns at most 8 files from $OUT a call: each script's log, its `"$OUT/..."`
    outputs and one report per `profile`/`tune` line must fit, or the last ones are lost."""
    for path in LEASE.glob("*.sh"):
        text = path.read_text()
        logs = re.findall(r"^lease (\S+) ", text, re.M)
        if not logs:
            continue
        outputs = set(re.findall(r'"\$OUT/([\w.]+)"', text))
        reports = re.findall(r"^(?:profile|tune) ", text, re.M)
        assert len(logs) + len(outputs) + len(reports) <= 8, (path.name, logs, sorted(outputs), len(reports))


def test_whole_model_checks_its_json_before_any_gpu_work(tmp_path, monkeypatch):
    """--json in a folder that does not exist, not a .json name, or a read-only file: one message
    naming --json before the driver is asked or any weights made (they take minutes of a lease);
    it failed with a traceback after the first path's measurement (or replaced a read-only file)."""
    sys.path.insert(0, str(LEASE))
    import whole_model

    from ptxgen.errors import PtxgenError

    calls = []
    monkeypatch.setattr(whole_model, "driver", lambda instead="": calls.append("driver"))
    monkeypatch.setattr(whole_model, "random_model_decode_speed", lambda *args, **kwargs: calls.append("speed"))
    locked = tmp_path / "locked.json"
    locked.write_text("[]")
    locked.chmod(0o444)
    cases = {tmp_path / "missing" / "w.json": "does not exist", tmp_path / "w.txt": "expected a .json file name",
             locked: "read-only"}  # refused for root too (artifacts.read_only)
    for path, message in cases.items():
        with pytest.raises(PtxgenError, match=f"--json {re.escape(str(path))}: .*{message}"):
            whole_model.main(["--tokens", "2", "--json", str(path)])
        assert calls == [], calls
    assert locked.read_text() == "[]"
