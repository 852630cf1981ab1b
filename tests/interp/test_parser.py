"""Parsing: declarations, scopes, labels, comments, layout, caching and clear refusals."""
import importlib
import re

import numpy as np
import pytest

from ptxgen.errors import InterpError
from ptxgen.interp import launch
from ptxgen.interp.parser import parse
from interp_helpers import elementwise, module

launch_module = importlib.import_module("ptxgen.interp.launch")


def test_scopes_labels_comments_and_layout():
    ptx = module("""
  /* a block comment
     spanning lines */
  .reg .b32 %r<3>, %acc;          // a family and a named register
  .reg .b64 %out;
  .shared .align 4 .b8 small[3];
  .shared .align 16 .b32 big[4];
  ld.param.u64 %out, [out];
  mov.u32 %acc, 0;
  {                               // a macro-style scope with its own registers and label
    .reg .b32 %i;
    mov.u32 %i, 0;
  LOOP:
    add.u32 %acc, %acc, 2;
    add.u32 %i, %i, 1;
    setp.lt.u32 %p, %i, 3;
    @%p bra LOOP;
  }
  {
    .reg .b32 %i;
    mov.u32 %i, 0;
  LOOP:
    add.u32 %acc, %acc, 10;
    add.u32 %i, %i, 1;
    setp.lt.u32 %p, %i, 2;
    @%p bra LOOP;
  }
  mov.u32 %r0, small;
  mov.u32 %r1, big;
  st.global.v4.u32 [%out], {%acc, %r0, %r1, %acc};
  ret;
""", ".param .u64 out", prelude="")
    ptx = ptx.replace(".reg .b64 %out;", ".reg .b64 %out;\n  .reg .pred %p;")
    out = np.zeros(4, np.uint32)
    launch(ptx, "k", (1, 1, 1), (1, 1, 1), [out])
    assert list(out[:3]) == [26, 0x400, 0x410]  # shared data starts at 0x400; big is aligned up past small
    prog = parse(ptx, "k")
    assert [r.name for r in prog.regs][:4] == ["%r0", "%r1", "%r2", "%acc"]
    assert "%i@1" in [r.name for r in prog.regs]  # scoped registers get unique names
    first = prog.instructions[0]
    assert ptx.splitlines()[first.line - 1].strip() == first.text == "ld.param.u64 %out, [out];"


def test_program_is_parsed_once():
    ptx = module("  ret;", "")
    assert launch_module._program(ptx, "k") is launch_module._program(ptx, "k")


@pytest.mark.parametrize("body,message", [
    ("  .reg .b32 %r;\n  mov.u32 %r, 1;\n  match.any.sync.b32 %r, %r, 0xffffffff;",
     r"line 9: `match.any.sync.b32 %r, %r, 0xffffffff;`: unsupported opcode match.any.sync.b32"),
    ("  .reg .b32 %r;\n  add.cc.u32 %r, %r, %r;", r"line 8: .*carry arithmetic"),
    ("  mov.u32 %nope, 1;", r"line 7: undeclared register %nope"),
    ("  bra NOWHERE;", r"unknown label NOWHERE"),
    ("  .reg .b32 %r;\n  cvt.u32.f32 %r, %r;", r"needs .rni, .rzi, .rmi or .rpi"),
    ("  .reg .b32 %r;\n  shfl.up.b32 %r, %r, 1, 0;", r"only shfl.sync"),
])
def test_unsupported_ptx_is_refused_with_line(body, message):
    with pytest.raises(InterpError, match=message):
        launch(module(body + "\n  ret;", ""), "k", (1, 1, 1), (1, 1, 1), [])


_REGS = "  .reg .b32 %r;\n  .reg .b64 %w;\n  .reg .b16 %h;\n  .reg .pred %p;\n  "


@pytest.mark.parametrize("ins,message", [
    # types the interpreter lacks are named, whatever the opcode
    ("add.u16x2 %r, %r, %r;", "unsupported type .u16x2"),
    ("sub.s16x2 %r, %r, %r;", "unsupported type .s16x2"),
    ("min.u16x2 %r, %r, %r;", "unsupported type .u16x2"),
    ("max.relu.s16x2 %r, %r, %r;", "unsupported type .s16x2"),
    ("abs.s16x2 %r, %r;", "unsupported type .s16x2"),
    ("add.rn.f32x2 %w, %w, %w;", "unsupported type .f32x2"),
    ("mul.rn.f32x2 %w, %w, %w;", "unsupported type .f32x2"),
    ("fma.rn.f32x2 %w, %w, %w, %w;", "unsupported type .f32x2"),
    ("setp.lt.u16x2 %p, %r, %r;", "unsupported type .u16x2"),
    ("cvt.rna.tf32.f32 %r, %r;", "unsupported type .tf32"),
    ("cvt.rn.satfinite.e4m3x2.f32 %h, %r, %r;", "unsupported type .e4m3x2"),
    ("cvt.rn.satfinite.e5m2x2.f32 %h, %r, %r;", "unsupported type .e5m2x2"),
    # and the forms of cvt it lacks
    ("cvt.rn.satfinite.f16x2.f32 %r, %r, %r;", "unsupported modifier .satfinite on cvt"),
    ("cvt.pack.sat.u16.s32.b32 %r, %r, %r, %r;", "unsupported modifier .pack on cvt"),
    # bitwise operations on floats are not PTX
    ("not.f32 %r, %r;", "not needs a .b, .u, .s or .pred type, not .f32"),
    ("and.f32 %r, %r, %r;", "and needs a .b, .u, .s or .pred type, not .f32"),
])
def test_unsupported_types_and_forms_are_named(ins, message):
    with pytest.raises(InterpError, match=rf"line \d+: `{re.escape(ins)}`: {re.escape(message)}$"):
        launch(module(_REGS + ins + "\n  ret;", ""), "k", (1, 1, 1), (1, 1, 1), [])


def test_unknown_entry_and_other_entries_skipped():
    ptx = module("  ret;", "", name="first") + module("  ret;", "", name="second").split("\n", 4)[4]
    launch(ptx, "second", (1, 1, 1), (1, 1, 1), [])
    with pytest.raises(InterpError, match="entry 'third' not found"):
        launch(ptx, "third", (1, 1, 1), (1, 1, 1), [])


@pytest.mark.parametrize("snippet, message", [
    ("add %d, %a, %b;", "add needs a type"),
    ("mov %d, %a;", "mov needs a type"),
    ("add.relu.f16x2 %d, %a, %b;", "unsupported modifier .relu on add"),
    ("add.rn.u32 %d, %a, %b;", "rounding modifiers and .ftz need a float type"),
    ("add.sat.f64 %D, %A, %B;", r"\.sat needs \.f32, \.f16 or \.f16x2"),
    ("fma.rn.ftz.f64 %D, %A, %B, %C;", r"\.ftz needs \.f32, \.f16 or \.f16x2"),
    ("fma.rn.u32 %d, %a, %b, %c;", "fma needs a float type, not .u32"),
    ("mul.wide.f32 %d, %a, %b;", r"\.lo, \.hi and \.wide need an integer type"),
    ("mad.lo.rn.u32 %d, %a, %b, %c;", "unsupported modifier .rn on mad"),
])
def test_arithmetic_modifiers_a_type_lacks_are_refused(snippet, message):
    """A modifier the interpreter would ignore, or a missing type, is a one-line error at compile."""
    ones = np.ones(2, np.uint64 if "%D" in snippet else np.uint32)
    with pytest.raises(InterpError, match=message):
        elementwise(snippet, ones, ones, ones, wide="%D" in snippet)
