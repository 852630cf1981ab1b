"""flash_attention for sm_90a (wgmma, mbarrier-fed producer/consumer warpgroups): the real PTX
of templates/flash_attention_sm90a.ptx.j2, rendered directly, in the interpreter with the
sanitizer on and outputs NaN-poisoned, against the float64 reference; and assembled for
sm_90a by nvJitLink.

Interpreter time is the budget: heads stay few and the shapes are a spread over seq_len 1,
primes, lengths just past a tile, several key tiles (both ring stages reused), causal and not,
MHA / GQA / MQA, head_dim 64 / 128, f16 / bf16 in, f32 / f16 / bf16 out, and the plan's knobs.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from ptxgen import perf
from ptxgen.assemble import ptxas_binary
from ptxgen.dtypes import from_float
from ptxgen.kernels.flash_attention_sm90a import sm90a_plan
from ptxgen.pipeline import compile_kernel
from ptxgen.runner import run
from ptxgen.verify import compare, verify_kernel

from helpers import assert_passes, make_config, needs_ptxas


def attention_config(num_heads, num_kv_heads, head_dim, causal=True, dtype="f16", out_dtype="f32", knobs=None,
                     **extra):
    return make_config("flash_attention", name="attn", num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, causal=causal, dtype=dtype, out_dtype=out_dtype, sm90a=knobs or {}, **extra)


def attention_kernel(*args, until="ptx", **kwargs):
    """The kernel compiled for sm_80 (the portable PTX) and sm_90a (its own variant)."""
    return compile_kernel(attention_config(*args, **kwargs), ("sm_80", "sm_90a"), until=until)


def verify_sm90a(kernel, seq_len, seed, inputs=None):
    """One sanitized interpreter launch of the sm_90a PTX on random (or given) inputs vs float64."""
    scalars = {"seq_len": seq_len}
    if inputs is None:
        return verify_kernel(kernel, scalars, seed=seed, arch="sm_90a")
    reference = kernel.definition.reference(inputs, scalars)
    return compare(kernel, run(kernel, inputs, scalars, arch="sm_90a"), reference, scalars, "sm_90a")


def assert_caught(verify):
    """A planted bug is caught: verify() raises a sanitizer finding or one of its checks fails."""
    from ptxgen.errors import SanitizerError

    try:
        checks = verify()
    except SanitizerError:
        return
    assert any(check.failure for check in checks), [check.failure for check in checks]


# (num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, knobs); the default plan
# is 2 consumer warpgroups (128 query rows), 1 producer warp, 128-key tiles, 2 stages, softmax
# beside P V for head_dim 64 and in order for 128 (what the 168 registers allow).
CASES = [
    (2, 2, 64, 1, True, "f16", "f32", {}),                     # one token: one tile, the rest zero-filled
    (2, 1, 128, 17, False, "bf16", "bf16", {}),                # MQA, prime length
    (4, 1, 64, 65, True, "f16", "f16", {"block_n": 64}),       # 64-key tiles: rows 0..63 see no key of the first
    (2, 2, 128, 130, False, "f16", "f32", {"overlap": True, "block_n": 64}),  # 3 key tiles, 2 keys in the last
    (4, 2, 64, 130, True, "bf16", "f32", {"overlap": False}),  # GQA 2:1, causal, in order
    (2, 1, 128, 200, True, "bf16", "f16", {}),                 # 2 query blocks, the diagonal tile partly past seq_len
    (2, 2, 64, 300, False, "f16", "bf16", {"stages": 3}),      # 3 key tiles through a 3-stage ring
    (2, 1, 64, 129, True, "f16", "f32", {"consumers": 1}),     # 64-row blocks: 3 query blocks, up to 2 key tiles
    (2, 1, 128, 97, True, "f16", "f16", {"producer_warps": 4, "overlap": True}),  # producer warpgroup, setmaxnreg
    (2, 2, 64, 300, True, "bf16", "f32", {"pingpong": True}),  # consumers take turns at the tensor cores, 3 tiles
    (8, 1, 64, 40, False, "bf16", "bf16", {"block_n": 32}),    # MQA 8:1, 32-key tiles: the 2-stage ring wraps
    # persistent: 12 blocks of 3 lengths on 3 CTAs, 4 rounds (both Q buffers reused, the ring runs on)
    (4, 2, 128, 300, True, "f16", "f16", {"persistent": True, "sm_count": 3}),
    (2, 1, 64, 257, False, "bf16", "f32", {"persistent": True, "sm_count": 2, "pingpong": True}),  # turns across blocks
    (4, 1, 64, 129, True, "f16", "f32", {"persistent": True, "sm_count": 5, "consumers": 1}),  # rounds of 5, 5, 2
    # tma: tiles by cp.async.bulk.tensor, rows past seq_len zero-filled by the copy itself
    (2, 1, 128, 17, True, "f16", "f32", {"tma": True}),        # one tile, mostly past seq_len
    (4, 2, 64, 300, False, "bf16", "bf16", {"tma": True, "block_n": 64, "stages": 3}),  # 5 tiles, the ring wraps
    (2, 1, 128, 200, True, "f16", "f16", {"tma": True, "producer_warps": 4, "overlap": True}),  # setmaxnreg
    (4, 2, 64, 257, True, "bf16", "f32", {"tma": True, "persistent": True, "sm_count": 3, "pingpong": True}),
    (2, 2, 64, 129, True, "f16", "f32", {"tma": True, "consumers": 1, "block_n": 32}),  # 64-row boxes, 32-key tiles
]


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, knobs", CASES)
def test_matches_float64(num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, knobs):
    kernel = attention_kernel(num_heads, num_kv_heads, head_dim, causal, dtype, out_dtype, knobs)
    assert kernel.variant("sm_90a").target == "sm_90a" and ".target sm_90a" in kernel.variant("sm_90a").ptx
    assert_passes(verify_sm90a(kernel, seq_len, seed=seq_len + head_dim))


@pytest.mark.parametrize("overlap", [False, True])
def test_large_scores_need_online_rescaling(overlap):
    """Scores spanning about +-60 after scaling, the largest in the first keys, which the kernel
    visits last: the running maximum grows on later tiles, so O and l must be rescaled (and,
    with overlap, O only after the P V of the tile before has retired). A non-default scale
    checks that scale * log2(e) is folded in."""
    kernel = attention_kernel(2, 1, 64, causal=False, dtype="f16", out_dtype="f32",
                              knobs={"overlap": overlap, "block_n": 64}, scale=0.3)
    rng = np.random.default_rng(7)
    seq_len = 150
    q = rng.standard_normal((2, seq_len, 64)) * 2.0
    k = rng.standard_normal((1, seq_len, 64)) * 2.0
    k[:, :20] *= 3.0
    v = rng.standard_normal((1, seq_len, 64))
    inputs = {"q": from_float(q, "f16"), "k": from_float(k, "f16"), "v": from_float(v, "f16")}
    assert_passes(verify_sm90a(kernel, seq_len, seed=0, inputs=inputs))


@pytest.mark.parametrize("block_n", [32, 64, 128])
def test_every_score_takes_part_in_its_rows_maximum(block_n):
    """Query row r's one large score (about 150 after scaling: e^150 overflows f32) is with key
    r, so over the rows it sits at every place of a tile's S registers: a row maximum that missed
    any of them (row_reduce's chains) would exponentiate it to infinity. The maxima are exact
    whatever the order, so only such scores tell a chain that skips a value."""
    kernel = attention_kernel(1, 1, 64, causal=False, dtype="f16", out_dtype="f32", knobs={"block_n": block_n})
    seq_len = 128
    rows = np.arange(seq_len)
    q = np.zeros((1, seq_len, 64))
    q[0, rows, rows % 64] = np.where(rows < 64, 1.0, -1.0)
    k = np.zeros((1, seq_len, 64))
    k[0, rows, rows % 64] = np.where(rows < 64, 1200.0, -1200.0)       # q_r . k_r = 1200, x 0.125
    v = np.random.default_rng(3).standard_normal((1, seq_len, 64))
    inputs = {"q": from_float(q, "f16"), "k": from_float(k, "f16"), "v": from_float(v, "f16")}
    assert_passes(verify_sm90a(kernel, seq_len, seed=0, inputs=inputs))


@pytest.mark.parametrize("head_dim, knobs", [(128, {}), (128, {"overlap": True, "block_n": 64}),
                                              (64, {}), (128, {"stages": 3}), (128, {"persistent": True}),
                                              (128, {"tma": True}),
                                              (128, {"tma": True, "producer_warps": 4, "pingpong": True,
                                                     "persistent": True})])
@needs_ptxas
def test_assembles_for_sm90a_without_spills(head_dim, knobs):
    kernel = attention_kernel(32, 8, head_dim, True, "bf16", "bf16", knobs, until="cubin")
    plan = kernel.definition.config.sm90a
    assembled = kernel.binaries["sm_90a"]
    resources = assembled.resources
    assert assembled.target == "sm_90a", "the sm_90a cubin comes from the sm_90a PTX"
    assert resources["spill_stores"] == resources["spill_loads"] == resources["stack_bytes"] == 0, assembled.info_log
    assert resources["registers"] <= sm90a_plan(attention_config(32, 8, head_dim), **plan.model_dump()).registers
    # ptxas serialises wgmmas it cannot keep asynchronous (C7509, C7510, C7519, ...): none here
    assert "wgmma.mma_async instructions are serialized" not in assembled.info_log, assembled.info_log


@pytest.mark.parametrize("knobs", [{}, {"tma": True}, {"producer_warps": 4, "pingpong": True}, {"persistent": True},
                                   {"tma": True, "producer_warps": 4, "pingpong": True, "persistent": True}],
                         ids=("default", "tma", "pingpong", "persistent", "fa3-tma"))
def test_the_tile_loop_keeps_its_wgmma_descriptors_in_uniform_registers(knobs):
    """The warpgroup index comes from lane 0 (shfl.sync.idx), so ptxas knows the descriptors are
    the same across a warp: the SASS loop that issues a tile's wgmmas copies none in from vector
    registers (R2UR), where it copied 48 (default, tma, persistent) or 16 (ping-pong) a tile when
    the index was %tid / 128."""
    if perf.nvdisasm() is None:
        pytest.skip("nvidia-cuda-nvdisasm is not installed (pip install '.[sass]')")
    kernel = attention_kernel(32, 8, 128, True, "f16", "f16", knobs, until="cubin")
    tile = 128 // 16 + kernel.definition.config.sm90a.block_n // 16  # S's k-steps and P V's
    sass = perf.sass_counts(kernel.binaries["sm_90a"].cubin)
    loops = [(body, copies) for body, wgmmas, copies in
             zip(sass["loop_bodies"], sass["wgmmas_per_loop"], sass["uniform_copies_per_loop"]) if wgmmas >= tile]
    assert loops, sass
    assert min(loops)[1] == 0, sass


@pytest.mark.parametrize("knobs", [{"producer_warps": 4, "pingpong": True},
                                   {"producer_warps": 4, "pingpong": True, "persistent": True},
                                   {"block_n": 64, "overlap": True}])
def test_an_overlapped_tile_makes_its_two_stages_visible_with_one_proxy_fence(knobs):
    """With overlap a tile waits for its K stage and the previous tile's V stage back to back;
    one fence.proxy.async after both makes both visible to the wgmmas (in SASS a MEMBAR.ALL.CTA
    and a FENCE.VIEW.ASYNC.S), where each wait had its own: one MEMBAR in the tile loop, not two."""
    if perf.nvdisasm() is None:
        pytest.skip("nvidia-cuda-nvdisasm is not installed (pip install '.[sass]')")
    plan = sm90a_plan(attention_config(32, 8, 128), **knobs)
    assert plan.overlap and not plan.tma
    kernel = attention_kernel(32, 8, 128, True, "f16", "f16", knobs, until="cubin")
    sass = perf.sass_counts(kernel.binaries["sm_90a"].cubin)
    tile = 128 // 16 + plan.block_n // 16  # S's k-steps and P V's
    loops = [(body, membars) for body, wgmmas, membars in
             zip(sass["loop_bodies"], sass["wgmmas_per_loop"], sass["membars_per_loop"]) if wgmmas >= tile]
    assert loops, sass
    assert min(loops)[1] == 1, sass


@pytest.mark.parametrize("knobs, message", [
    ({"block_n": 96}, "block_n=96: 32, 64, 128 or 256"),
    ({"consumers": 3}, "consumers would hold 96 accumulator registers of 128"),
    ({"overlap": True}, "consumers would hold 160 accumulator registers of 168"),
    ({"stages": 4}, "bytes of shared memory for block_n=128, stages=4"),
    ({"stages": 3, "persistent": True}, "stages=3, consumers=2, persistent (two Q tiles): more than 232448"),
    ({"producer_warps": 2}, "producer_warps=2: 1 or 4"),
    ({"pingpong": True}, "pingpong: two consumer warpgroups taking turns at the tensor cores while the other runs "
                         "its softmax needs consumers=2 and overlap (got consumers=2, overlap=False)"),
])
def test_plan_rejects_knobs_that_cannot_work(knobs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sm90a_plan(attention_config(4, 1, 64 if "consumers" in knobs else 128), **knobs)


def test_plan_overlaps_where_registers_allow():
    assert sm90a_plan(attention_config(4, 1, 64)).overlap
    assert not sm90a_plan(attention_config(4, 1, 128)).overlap
    assert sm90a_plan(attention_config(4, 1, 128), block_n=64).overlap


def test_an_sm90_gpu_runs_the_sm90a_variant_with_its_geometry():
    """Built for sm_80, sm_90 and sm_90a: a GPU of sm_90 loads the sm_90a cubin (binary_for), so the
    variant, launch geometry and grading for "sm_90" are sm_90a's; sm_80 and sm_86 GPUs get the
    portable ones. (Before, variant("sm_90") gave the portable geometry for the sm_90a cubin.)"""
    kernel = compile_kernel(attention_config(2, 1, 64), ("sm_80", "sm_90", "sm_90a"))
    scalars = {"seq_len": 300}
    assert kernel.binary_for("sm_90").target == "sm_90a"
    assert kernel.variant("sm_90").target == "sm_90a"
    assert kernel.launch(scalars, "sm_90") == kernel.launch(scalars, "sm_90a") != kernel.launch(scalars, "sm_80")
    for arch in ("sm_80", "sm_86"):
        assert kernel.variant(arch) is kernel.portable and kernel.binary_for(arch).target == kernel.portable.target


def test_a_producer_warpgroup_hands_its_registers_over_where_ptxas_assembles_it():
    """FlashAttention-3's split: the producer warpgroup drops to 40 registers, the consumers rise to
    232, enough for S, O and P of 128-key tiles at head_dim 128 (intra-warpgroup overlap). nvJitLink
    ignores setmaxnreg (C7504, it compiles one unit of a link) and spills; `auto` assembles PTX
    with setmaxnreg through ptxas (extra "ptxas") where it is installed, as a whole program."""
    from ptxgen.assemble import assemble_nvjitlink, assembler_for, cubin_static_shared, parse_resources, ptxas_binary

    kernel = attention_kernel(32, 8, 128, True, "f16", "f16", {"producer_warps": 4}, until="ptx")
    plan = sm90a_plan(attention_config(32, 8, 128), producer_warps=4)
    assert plan.consumer_registers == 232 and plan.overlap and plan.block_n == 128
    ptx = kernel.variants["sm_90a"].ptx
    assert assembler_for("auto", kernel.portable.ptx) == "nvjitlink"
    linked = assemble_nvjitlink(ptx, "sm_90a", {"verbose": True})
    dropped = linked.info_log
    assert "C7504" in dropped and "bytes spill stores" in dropped
    if ptxas_binary() is None:
        pytest.skip("the nvidia-cuda-nvcc wheel (ptxgen[ptxas]) is not installed")
    assert assembler_for("auto", ptx) == "ptxas"
    built = attention_kernel(32, 8, 128, True, "f16", "f16", {"producer_warps": 4}, until="cubin")
    binary = built.binaries["sm_90a"]
    assert built.assembler["sm_90a"].startswith("ptxas ") and "C7504" not in binary.info_log
    assert binary.resources["spill_stores"] == binary.resources["spill_loads"] == 0, binary.info_log
    assert "wgmma.mma_async instructions are serialized" not in binary.info_log
    # ptxas's log leaves out the 1 KB the sm_90 cubin's shared section holds beyond Q's mbarriers;
    # both cubins hold the same section, and the resources come from it.
    assert cubin_static_shared(binary.cubin) == cubin_static_shared(linked.cubin) == parse_resources(dropped)[
        "shared_bytes"] == binary.resources["shared_bytes"] == 1104
    assert parse_resources(binary.info_log)["shared_bytes"] == 80


def test_a_build_that_drops_setmaxnreg_says_so(tmp_path):
    from helpers import run_cli

    spec = tmp_path / "fa3.toml"
    spec.write_text('[target]\narchs = ["sm_90a"]\n\n[[kernels]]\nname = "fa3"\nkind = "flash_attention"\n'
                    'num_heads = 2\nnum_kv_heads = 1\nhead_dim = 128\nsm90a = { producer_warps = 4 }\n')
    result = run_cli("build", str(spec), "-o", str(tmp_path / "out"), "--assembler", "nvjitlink", "-q")
    assert result.returncode == 0, result.stderr
    assert "note: fa3 sm_90a: nvjitlink " in result.stderr
    assert ": (C7504) 'setmaxnreg' ignored to maintain compatibility across compilation units; install " \
           "ptxgen[ptxas]" in result.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert list(manifest["kernels"]["fa3"]["assembler"]) == ["sm_90a"]


@pytest.mark.parametrize("knobs", [{"producer_warps": 4, "pingpong": True},
                                   {"tma": True, "producer_warps": 4, "pingpong": True, "persistent": True}],
                         ids=("pingpong", "fa3-tma"))
def test_the_softmax_runs_while_the_previous_tiles_p_v_does(knobs):
    """With overlap, a tile's exponentials are computed between the wait for its S (wgmma
    wait_group 1: DEPBAR.LE gsb0, 0x1) and the wait for the previous tile's P V (0x0), in the
    SASS ptxas makes, not after the second: ptxas hoists a wait to the top of its basic block,
    and the template gives it a block of its own. Without that block the wait came first: no
    exponential between them."""
    text = perf.disassemble(attention_kernel(32, 8, 128, True, "f16", "f16", knobs, until="cubin")
                            .binaries["sm_90a"].cubin)
    if text is None:
        pytest.skip("nvidia-cuda-nvdisasm is not installed (pip install '.[sass]')")
    assert sm90a_plan(attention_config(32, 8, 128), **knobs).overlap
    between, counts = None, []
    for line in text.splitlines():
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            between = 0
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line and between is not None:
            counts.append(between)
            between = None
        elif "MUFU.EX2" in line and between is not None:
            between += 1
    assert counts and min(counts) >= 128 // 2, counts  # a thread's 64 exponentials of a 128-key tile


def test_a_build_whose_wgmmas_ptxas_serialises_says_so(monkeypatch):
    """ptxas makes every wgmma wait for the one before where it cannot keep them asynchronous
    (here: rcp.rn, a subroutine call, in the epilogue: C7509); the build reports it, with the
    reason, and the shipped kernel has no such note."""
    from ptxgen import pipeline
    from ptxgen.pipeline import BuildOptions

    exact = "rcp.approx.ftz.f32 %l0, %l0;"

    def with_call(*args, **kwargs):
        ptx = render(*args, **kwargs)
        return ptx.replace(exact, "rcp.rn.f32 %l0, %l0;") if ".target sm_90a" in ptx else ptx

    notes = []
    options = BuildOptions(assembler="nvjitlink", report=notes.append)
    config = attention_config(2, 1, 64, out_dtype="f16")
    shipped = compile_kernel(config, ("sm_90a",), options=options)
    assert exact in shipped.variants["sm_90a"].ptx and notes == []
    render = pipeline.render
    monkeypatch.setattr(pipeline, "render", with_call)
    compile_kernel(config, ("sm_90a",), options=options)
    assert len(notes) == 1 and notes[0].startswith(
        f"attn sm_90a: {shipped.assembler['sm_90a']}: (C7509) wgmma.mma_async instructions are serialized due to "
        "the presence of Extern calls"), notes


def test_show_reports_the_assemblers_performance_losses(capsys):
    """`show` lists what ptxas says it gave up (here nvJitLink: setmaxnreg ignored, and so the
    wgmmas serialised for want of registers), in the table and the JSON; the shipped build has
    none."""
    from ptxgen.cli import print_show, show_report
    from ptxgen.perf import GPUS
    from ptxgen.pipeline import BuildOptions

    gpu = GPUS["h100-sxm"]
    config = attention_config(2, 1, 128, out_dtype="f16", knobs={"producer_warps": 4})
    linked = compile_kernel(config, ("sm_90a",), options=BuildOptions(assembler="nvjitlink"))
    report = show_report(linked, None, gpu, None, {"seq_len": 128}, False, gpu.tensor_tflops)
    losses = report["performance_losses"]["sm_90a"]
    assert [loss[:7] for loss in losses] == ["(C7504)", "(C7512)"], losses
    print_show(report, gpu)
    shown = capsys.readouterr().out
    assert f"sm_90a: the assembler reports {losses[1]}" in shown, shown
    if ptxas_binary() is not None:
        whole = compile_kernel(config, ("sm_90a",))
        assert show_report(whole, None, gpu, None, {"seq_len": 128}, False, gpu.tensor_tflops)[
            "performance_losses"] == {}


# A ring phase set instead of flipped is right for the first two rounds of a two-stage ring and
# wrong from the third: verify's sizes (70, 257: three 128-key tiles) wrap the ring once and pass
# it (mutation testing, session 12), five tiles (641 keys) catch it; causal work grows as the
# square of the length, so verify of a 32-head prefill at 641 would cost about six times 257's:
# it is tested here, on a small config.
@pytest.mark.parametrize("text, planted", [
    ("@%pm xor.b32 %full, %full, 1;", "@%pm mov.u32 %full, 1;"),      # the consumers' full-barrier parity
    ("@%pm xor.b32 %free, %free, 1;", "@%pm mov.u32 %free, 0;"),      # the producer's empty-barrier parity
])
def test_a_ring_phase_set_instead_of_flipped_fails_once_the_ring_wraps_twice(text, planted):
    from helpers import with_ptx

    kernel = attention_kernel(2, 1, 64, causal=True)
    ptx = kernel.variants["sm_90a"].ptx
    assert ptx.count(text) == 2, text         # next_stage: before a block's first tile, and between tiles
    assert_passes(verify_sm90a(kernel, 641, seed=4))
    mutant = with_ptx(kernel, ptx.replace(text, planted), "sm_90a")
    assert_caught(lambda: verify_sm90a(mutant, 641, seed=4))


# Bugs of the sm_90a variant that verify's sizes missed while its two-stage ring never wrapped
# (mutation testing, session 10), and the ones the interpreter could not see until copies handed
# to an mbarrier stayed in flight until a waiting thread parked and setmaxnreg.inc waited for the
# registers it asks (session 12): each makes verify fail or the sanitizer object.
RING_BUGS = [
    ("prefill_sm90a", "@!%ready bra FREE_K;", ""),                                   # no wait for a free K stage
    ("prefill_sm90a", "add.u32 %tiles, %seq_len, 127;", "add.u32 %tiles, %seq_len, 126;"),  # a key tile of one key lost
    ("prefill_sm90a", "@%pm xor.b32 %full, %full, 1;", ""),                           # the phase parity not flipped
    ("prefill_sm90a", "@!%ready bra FREE_V;", ""),             # V refilled while the consumers have yet to read it
    ("prefill_sm90a", "@!%ready bra V;", ""),                  # P V reads a V stage whose copies are in flight
    ("prefill_sm90a", "@!%ready bra Q_FULL;", ""),             # S reads Q before it has landed
    ("prefill_sm90a_fa3_persistent", "setmaxnreg.dec.sync.aligned.u32 40;", ""),  # the consumers' inc can never be met
    ("prefill_sm90a", "selp.f32 %mx0, %mx0, %m0, %moves0;", ""),  # the running max forgotten: NaN once a row's max falls
    ("prefill_sm90a", "@!%rescale bra.uni O_KEPT;", "bra.uni O_KEPT;"),  # O never rescaled for a moved maximum
    ("prefill_sm90a", "selp.f32 %alpha0, %alpha0, 0f3F800000, %moves0;", "mov.f32 %alpha0, 0f3F800000;"),  # l and O kept
    ("prefill_sm90a_pingpong", "@%p bar.arrive 1, 256;", ""),  # warpgroup 0 never gets its first turn
    ("prefill_sm90a_pingpong", "bar.arrive %next_turn, 256;", ""),  # a turn not handed over: both wait
]


@pytest.mark.parametrize("name, text, planted", RING_BUGS)
def test_verify_catches_ring_bugs_of_the_shipped_sm90a_prefill(name, text, planted):
    from ptxgen.verify import verify_sizes

    from helpers import ROOT, spec_kernel, with_ptx

    kernel = spec_kernel(ROOT / "bench" / "lease" / "prefill_sm90a.toml", name)
    ptx = kernel.variants["sm_90a"].ptx
    assert text in ptx, text
    mutant = with_ptx(kernel, ptx.replace(text, planted, 1), "sm_90a")
    assert_caught(lambda: [check for checks in verify_sizes(mutant, kernel.definition.verify_scalars(), seed=11,
                                                            arch="sm_90a") for check in checks])


# Bugs of the tma producer: each makes verify fail or the sanitizer object (GQA 2:1, head_dim
# 128: two panels a tile; 300 keys: three 128-key tiles through the two-stage ring).
TMA_BUGS = [
    ("_, [%full], 32768;", "_, [%full], 16384;"),  # expects one panel of two: the tx count never balances
    ("[%dst+16384], [%k_map", "[%dst+0], [%k_map"),       # K's second panel over its first
    ("{%col, %tmp, %kv_head}], [%full];", "{%col, %tmp, %head}], [%full];"),  # K/V of the query head, not its group's
    ("@!%ready bra FREE_K;", ""),                        # a K stage refilled while the consumers read it
]


@pytest.mark.parametrize("text, planted", TMA_BUGS)
def test_verify_catches_bugs_of_the_tma_producer(text, planted):
    from helpers import with_ptx

    kernel = attention_kernel(4, 2, 128, causal=False, knobs={"tma": True})
    ptx = kernel.variants["sm_90a"].ptx
    assert text in ptx, text
    mutant = with_ptx(kernel, ptx.replace(text, planted), "sm_90a")
    assert_caught(lambda: verify_sm90a(mutant, 300, seed=5))


def test_the_sm90a_variant_weighs_its_ctas_by_its_own_blocks():
    """The performance model's CTA work (Kind.cta_work) of the variant a GPU runs: sm_90a's
    128-row blocks of 128-key tiles, not the portable kernel's 64 x 64."""
    kernel = attention_kernel(4, 1, 128, causal=True)
    portable, variant = kernel.definition.cta_work({"seq_len": 300}), kernel.definition_for("sm_90a").cta_work(
        {"seq_len": 300})
    assert list(variant) == [3 + 1] * 4 + [2 + 1] * 4 + [1 + 1] * 4      # blocks of rows 256.., 128.., 0..
    assert len(portable) == 5 * 4 and portable[0] == 5 + 1                # 64-row blocks of 64 keys
    assert attention_kernel(4, 1, 128, causal=False).definition_for("sm_90a").cta_work({"seq_len": 300}) is None
    # Persistent without masking: 3 blocks a head (the last of 44 rows) x 4 heads, alike, dealt on 5 CTAs.
    persistent = attention_kernel(4, 1, 128, causal=False, knobs={"persistent": True, "sm_count": 5})
    assert list(persistent.definition_for("sm_90a").cta_work({"seq_len": 300})) == [3, 3, 2, 2, 2]


# A persistent CTA's hand-offs between query blocks: each bug deadlocks, races or leaves blocks unwritten.
# A persistent CTA's hand-offs between query blocks, as edits of the PTX (each text occurs once):
# each bug deadlocks, races or leaves blocks unwritten (from a mutation round of 19 edits on three
# configs: those that change the output or the order of the rounds only, and the ones below).
RELEASE_Q = "\t@%wg_leader mbarrier.arrive.shared::cta.b64 _, [%q_bar+16];\n"
PERSISTENT_BUGS = [
    [(RELEASE_Q, "")],                                       # Q's buffer never released
    [("@!%ready bra Q_FREE;", "")],                          # the next block's Q loaded over one still in use
    [("@%another bra CONSUMER_ITEM;", "")],                  # consumers stop after their first block
    [(RELEASE_Q, ""), ("@!%ready bra Q_FULL;\n", "@!%ready bra Q_FULL;\n" + RELEASE_Q)],  # Q released before its MMAs
    [("PRODUCER_ITEM:\n", "PRODUCER_ITEM:\n\tmov.u32 %stage, 1;\n\tmov.u32 %free, 0;\n")],  # the ring restarted a block
]


@pytest.mark.parametrize("edits", PERSISTENT_BUGS)
def test_planted_persistent_hand_off_bugs_are_caught(edits):
    from helpers import with_ptx

    # 8 blocks of one 128-key tile on 2 CTAs: the producer reaches a block's Q before the consumers
    # are done with the block two before it (a ring of 2 stages holds back one tile a block only)
    kernel = attention_kernel(8, 2, 64, causal=True, knobs={"persistent": True, "sm_count": 2})
    ptx = kernel.variants["sm_90a"].ptx
    assert_passes(verify_sm90a(kernel, 100, seed=3))
    for text, planted in edits:
        assert ptx.count(text) == 1, text
        ptx = ptx.replace(text, planted)
    mutant = with_ptx(kernel, ptx, "sm_90a")
    assert_caught(lambda: verify_sm90a(mutant, 100, seed=3))


def test_the_last_v_stage_of_a_block_is_released_for_the_next():
    """With overlap the last tile's V is read after the loop; a persistent CTA's ring runs on into
    the next block, so that stage must be released there too (else the producer waits for it
    forever once the ring comes round)."""
    from ptxgen.errors import SanitizerError

    from helpers import with_ptx

    kernel = attention_kernel(2, 1, 64, causal=False, knobs={"persistent": True, "sm_count": 1, "overlap": True})
    ptx = kernel.variants["sm_90a"].ptx
    v_empty = 8 * (4 + 3 * 2)          # q_full[2], q_empty[2], then k_full, v_full, k_empty of 2 stages
    release = f"\tmad.lo.u32 %bar, %stage, 8, %bars;\n\t@%wg_leader mbarrier.arrive.shared::cta.b64 _, [%bar+{v_empty}];\n"
    assert ptx.count(release) == 1
    assert_passes(verify_sm90a(kernel, 200, seed=5))
    mutant = with_ptx(kernel, ptx.replace(release, ""), "sm_90a")
    with pytest.raises(SanitizerError, match="deadlock|more arrivals"):
        verify_sm90a(mutant, 200, seed=5)


def test_a_persistent_grid_deals_blocks_forward_and_back():
    """At most sm_count CTAs; round r deals the blocks (heaviest first) forward when r is even and
    backward when odd, so the work evens out: at 4k tokens (32 heads, 128-row blocks of 128-key
    tiles, 1024 blocks on 132 CTAs) the heaviest CTA carries 0.2% more than an even share, where
    dealing every round forward gives 12% (the hardware's dispatch of 1024 CTAs: 1.009x)."""
    from ptxgen import perf
    from ptxgen.kernels.flash_attention import causal_cta_work
    from ptxgen.kernels.flash_attention_sm90a import persistent_work

    assert list(persistent_work(np.array([5, 4, 3, 2, 1]), 2)) == [5 + 2 + 1, 4 + 3]
    kernel = attention_kernel(32, 8, 128, causal=True, knobs={"persistent": True})
    scalars = {"seq_len": 4096}
    assert kernel.launch(scalars, "sm_90a").grid == (132, 1, 1)
    assert attention_kernel(2, 1, 128, knobs={"persistent": True}).launch({"seq_len": 300}, "sm_90a").grid == (6, 1, 1)
    work = kernel.definition_for("sm_90a").cta_work(scalars)
    blocks = causal_cta_work(4096, 32, 128, 128)
    assert len(work) == 132 and work.sum() == blocks.sum()
    assert work.max() * 132 / work.sum() == pytest.approx(1.002, abs=0.001)
    forward = np.bincount(np.arange(len(blocks)) % 132, weights=blocks)
    assert forward.max() * 132 / forward.sum() == pytest.approx(1.120, abs=0.001)
    assert perf.dispatch_report(work, 132)["longest_over_even"] == pytest.approx(1.002, abs=0.001)   # show's figure


def test_a_persistent_ctas_blocks_on_the_device_are_the_ones_its_modelled_work_counts(monkeypatch):
    """The device deals the query blocks as persistent_work models them (forward in even rounds,
    backward in odd ones): per CTA, the blocks whose rows it stores weigh what cta_work says (a
    block: its key tiles + 1). Dealt forward every round, the output is the same and only this
    tells (12 causal blocks of 1, 2 and 3 tiles on 3 CTAs: 13, 12, 11 a CTA instead of 12 each)."""
    import importlib

    from ptxgen.interp import ops

    kernel = attention_kernel(4, 2, 128, causal=True, dtype="f16", out_dtype="f16",
                              knobs={"persistent": True, "sm_count": 3})
    seq_len, block_m, block_n, osize = 300, 128, 128, 2
    interp_launch = importlib.import_module("ptxgen.interp.launch")
    original, stores = ops.COMPILERS["st"], []

    def recording(c):
        compiled = original(c)
        if c.space() != "global":
            return compiled
        address, run_store = c.address(c.ops[0], "global"), compiled.run

        def run_recorded(st, sel):
            threads = st.indices(sel)
            to = np.broadcast_to(address(st, sel), threads.shape)
            stores.append(np.stack([st.cta[threads], to], axis=1))
            run_store(st, sel)

        compiled.run = run_recorded
        return compiled

    monkeypatch.setitem(ops.COMPILERS, "st", recording)
    monkeypatch.setattr(interp_launch, "_CACHE", {})     # compiled anew, with the recording store
    assert_passes(verify_sm90a(kernel, seq_len, seed=2))
    cta, address = np.concatenate(stores).T
    rows = (address - address.min()) // (128 * osize)    # o[head, row, :]: rows of head h from h * seq_len
    blocks = rows // seq_len * 1000 + rows % seq_len // block_m
    work = np.zeros(3, np.int64)
    for c in range(3):
        for block in np.unique(blocks[cta == c]):
            work[c] += min(-(-seq_len // block_n), (block % 1000 + 1) * block_m // block_n) + 1
    modelled = kernel.definition_for("sm_90a").cta_work({"seq_len": seq_len})
    assert len(np.unique(blocks)) == 4 * 3
    assert list(work) == list(modelled) == [12, 12, 12], (list(work), list(modelled))


def test_verify_in_the_interpreter_checks_the_sm90a_variant_too(tmp_path):
    """`ptxgen verify` without --arch checks the portable PTX and each arch-specific variant the spec
    builds (before, only the portable one: a spec of sm_90a alone shipped a wgmma kernel that verify
    never ran); --arch picks one."""
    from helpers import run_cli_in_process

    spec = tmp_path / "prefill.toml"
    spec.write_text('[target]\narchs = ["sm_80", "sm_90a"]\n\n[[kernels]]\nname = "attn"\nkind = "flash_attention"\n'
                    'num_heads = 2\nnum_kv_heads = 1\nhead_dim = 64\n')
    verified = run_cli_in_process("verify", str(spec))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    rows = [line.split() for line in verified.stdout.splitlines() if line.startswith("attn")]
    portable = [row for row in rows if row[1] == "seq_len=70"]
    hopper = [row for row in rows if row[1:3] == ["(sm_90a)", "seq_len=70"]]
    assert len(rows) == 4 and len(portable) == len(hopper) == 1, verified.stdout
    assert portable[0][-1] == hopper[0][-1] == "pass" and portable[0][5] != hopper[0][6], rows   # two kernels' errors
    only = run_cli_in_process("verify", str(spec), "--arch", "sm_90a")
    assert only.returncode == 0 and sum(line.startswith("attn") for line in only.stdout.splitlines()) == 2, only.stdout


def copy_wavefronts(monkeypatch, launch) -> list[int]:
    """For each warp's execution of each plain cp.async that `launch()` (interpreted launches)
    runs, the shared-memory wavefronts its writes need: the most distinct 4-byte words that fall
    in one of the 32 banks."""
    import importlib

    from ptxgen.interp import ops

    interp_launch = importlib.import_module("ptxgen.interp.launch")
    original = ops.COMPILERS["cp"]
    found = []

    def recording(c):
        compiled = original(c)
        if c.mods[:2] != ["async", "cg"]:
            return compiled
        address, run_copy = c.address(c.ops[0], "shared"), compiled.run

        def run_recorded(st, sel):
            threads = st.indices(sel)
            to, warps = np.broadcast_to(address(st, sel), threads.shape), st.warp[threads]
            for warp in np.unique(warps):
                words = np.unique((to[warps == warp][:, None] + 4 * np.arange(4)).ravel() // 4)
                found.append(int(np.bincount(words % 32).max()))
            run_copy(st, sel)

        compiled.run = run_recorded
        return compiled

    monkeypatch.setitem(ops.COMPILERS, "cp", recording)
    monkeypatch.setattr(interp_launch, "_CACHE", {})     # compiled anew, with the recording copy
    launch()
    return found


@pytest.mark.parametrize("knobs", [{}, {"producer_warps": 4}], ids=("one-warp", "warpgroup"))
def test_the_producers_copies_fill_whole_rows_of_banks(monkeypatch, knobs):
    """Each producer warp's cp.async of a Q, K or V tile writes 4 whole 128-byte rows of the
    swizzled tile: 4 wavefronts for its 32 x 16 bytes, none more (8 lanes to a row of 8 rows,
    16 banks a row, took 8: Nsight Compute's 23% excessive shared wavefronts on the H200)."""
    kernel = attention_kernel(2, 1, 128, causal=True, knobs=knobs)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(0), {"seq_len": 200})
    found = copy_wavefronts(monkeypatch, lambda: run(kernel, inputs, {"seq_len": 200}, arch="sm_90a"))
    assert found and set(found) == {4}, sorted(set(found))


def test_a_built_folder_keeps_the_tma_variants_maps_and_its_header_encodes_them(tmp_path):
    """`ptxgen build` of a tma kernel: the manifest lists the sm_90a variant's maps (the PTX entry takes
    them after its parameters), a folder loaded back (ptxgen.load's path) has them and runs that
    variant in the interpreter to float64, and the C header gives engines their encoding."""
    from ptxgen.compiled import load_folder

    from helpers import run_cli_in_process

    spec = tmp_path / "tma.toml"
    spec.write_text('[target]\narchs = ["sm_90a"]\n\n[[kernels]]\nname = "attn"\nkind = "flash_attention"\n'
                    'num_heads = 4\nnum_kv_heads = 2\nhead_dim = 64\nsm90a = { tma = true }\n')
    built = run_cli_in_process("build", str(spec), "-o", str(tmp_path / "out"))
    assert built.returncode == 0, built.stdout + built.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    maps = manifest["kernels"]["attn"]["variants"]["sm_90a"]["tensor_maps"]
    assert [(m["name"], m["array"], m["box"], m["swizzle"]) for m in maps] == [
        ("q_map", "q", [64, 128, 1], 128), ("k_map", "k", [64, 128, 1], 128), ("v_map", "v", [64, 128, 1], 128)]
    (kernel,) = load_folder(tmp_path / "out")
    assert kernel.variant("sm_90a").tensor_maps == attention_kernel(4, 2, 64, knobs={"tma": True}).variants[
        "sm_90a"].tensor_maps
    assert_passes(verify_sm90a(kernel, 131, seed=3))
    header = (tmp_path / "out" / "tma.h").read_text()
    assert "#include <cuda.h>" in header and "attn_sm_90a_encode_tensor_maps" in header
