"""Every kernel of every shipped spec passes `ptxgen verify` in the interpreter (sanitizer on)."""

from __future__ import annotations

import pytest

from ptxgen.errors import SanitizerError
from ptxgen.spec import load_spec
from ptxgen.verify import verify_sizes

from helpers import ROOT, SPECS, assert_passes, spec_kernel, with_ptx

# A GEMV of more than 2^27 weights takes minutes in the interpreter (the lm_head: about 2 a launch).
CASES = [pytest.param(path, kernel.name, id=f"{path.stem}:{kernel.name}",
                      marks=[pytest.mark.slow] if getattr(kernel, "n", 0) * getattr(kernel, "k", 0) > 1 << 27 else [])
         for path in SPECS for kernel in load_spec(path).spec.kernels]


@pytest.mark.parametrize("path, name", CASES)
def test_spec_kernel_matches_its_reference(path, name):
    kernel = spec_kernel(path, name)
    cases = kernel.definition.verify_scalars()
    if not cases:
        pytest.skip(f"{name}: no runtime size small enough for the interpreter (verify checks its one-layer "
                    f"stand-ins: tests/test_decoder_full_shape.py, tests/test_run_cli.py)")
    assert_passes([check for checks in verify_sizes(kernel, cases, seed=11) for check in checks])


# Bugs planted in shipped kernels' PTX that verify missed until mutation testing showed it (session
# 9): a reused workspace, lengths past max_splits tiles, several query blocks, x as small as eps.
PLANTED = [
    ("qwen3_8b_decode_attention", "setp.lt.u32 %ok1, %this_split, %active;",
     "setp.le.u32 %ok1, %this_split, %active;"),  # the merge reads a split past the active ones
    ("qwen3_8b_decode_attention", "@%ok bra RESCALED;", "bra RESCALED;"),  # o never rescaled
    ("qwen3_8b_decode_attention", "setp.gt.s32 %ok, %limit, 9;", "setp.gt.s32 %ok, %limit, 8;"),  # tail mask
    ("qwen3_8b_decode_attention", "@%first_thread st.global.u32 [%counters], 0;", ""),  # counter not reset
    ("qwen3_8b_prefill_attention", "mul.f32 %l0, %l0, %alpha0;", ""),  # l not rescaled
    ("qwen3_8b_prefill_attention", "vote.sync.any.pred %any, %any, 0xffffffff;", ""),  # bra.uni diverges
    ("qwen3_8b_attn_norm_q_proj", "0f358637BD", "0f360637BD"),  # eps 1e-6 -> 2e-6
    # Counting in across CTAs: the second-to-last CTA merges (its CTAs ran in lockstep, every key
    # already in); a relaxed count that no release puts after the data it announces (all atomics).
    ("qwen3_8b_argmax", "setp.ne.u32 %not_last, %old, 296;", "setp.ne.u32 %not_last, %old, 295;"),
    ("qwen3_8b_argmax", "membar.gl;\n\tatom.global.add.u32", "atom.global.add.u32"),
    ("qwen3_8b_decode_attention", "sub.u32 %flag, %nsplit, 1;", "sub.u32 %flag, %nsplit, 2;"),
    # The queue schedule (qwen3_8b_gate_up_group; the down projection is static since 2026-11-27).
    ("qwen3_8b_gate_up_group", "@%leader add.u32 %ticket, %ticket, 1;", "@%leader add.u32 %ticket, %ticket, 2;"),
    ("qwen3_8b_gate_up_group", "atom.acq_rel.gpu.global.add.u32 %ticket, [%queue+4], 1",
     "atom.relaxed.gpu.global.add.u32 %ticket, [%queue+4], 1"),
    # The count-out word not reset: two launches pass (the second counts on from the grid to twice
    # it), the third would not; the workspace is checked back at rest after every launch (session 10).
    ("qwen3_8b_gate_up_group", "@%last st.relaxed.gpu.global.u32 [%queue+4], 0;", ""),
    # A position past the cache that only the launcher refused: the kernel's own guard is gone
    # (verify launches it past its limits, session 11).
    ("qwen3_8b_kv_append", "@%skip bra DONE;", ""),
    # Bugs that only a smaller grid shows (a GPU with fewer SMs shrinks any_grid launches): a queue
    # round's bound off by one (caught at 9/11 of the grid), a grid-stride loop's (at a third).
    ("qwen3_8b_gate_up_proj_q8_0", "setp.lt.u32 %more, %next_unit, 768;", "setp.lt.u32 %more, %next_unit, 767;"),
    ("qwen3_tiny_decoder", "mad.lo.u32 %task, %grid_warps, 8, %task;\n\t}\n\tsetp.lt.u32 %has_task, %task, 512;",
     "mad.lo.u32 %task, %grid_warps, 8, %task;\n\t}\n\tsetp.lt.u32 %has_task, %task, 511;"),
]


@pytest.mark.parametrize("name, text, planted", PLANTED)
def test_verify_catches_bugs_planted_in_shipped_kernels(name, text, planted):
    kernel = spec_kernel(ROOT / "specs" / "qwen3.toml", name)
    assert text in kernel.portable.ptx, text
    mutant = with_ptx(kernel, kernel.portable.ptx.replace(text, planted, 1))
    try:
        checks = [check for checks in verify_sizes(mutant, kernel.definition.verify_scalars(), seed=11)
                  for check in checks]
    except SanitizerError:
        return
    assert any(check.failure for check in checks), [check.failure for check in checks]


def test_verify_launches_past_the_limits_no_array_size_depends_on():
    """verify_past_limits' values: a scalar no array's shape names (kv_append's pos, attention's
    seq_len) and a device-read length (the graph variant's seq_len_ptr), at limit + 1 and the
    type's largest value; a scalar that sizes an array (rmsnorm's rows) is the caller's to match."""
    from ptxgen.verify import past_limits

    spec = ROOT / "specs" / "qwen3.toml"
    assert past_limits(spec_kernel(spec, "qwen3_8b_kv_append")) == [("pos", 40960), ("pos", 2**32 - 1)]
    assert past_limits(spec_kernel(spec, "qwen3_8b_decode_attention")) == [("seq_len", 40961), ("seq_len", 2**32 - 1)]
    assert past_limits(spec_kernel(spec, "qwen3_8b_decode_attention_graph")) == [("seq_len_ptr", 40961),
                                                                                  ("seq_len_ptr", 2**32 - 1)]
    assert past_limits(spec_kernel(spec, "qwen3_8b_rmsnorm")) == []
