"""Parsing: declarations, scopes, labels, comments, layout, caching and clear refusals."""
import importlib

import numpy as np
import pytest

from ptxgen.errors import InterpError
from ptxgen.interp import launch
from ptxgen.interp.parser import parse
from interp_helpers import module

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


def test_unknown_entry_and_other_entries_skipped():
    ptx = module("  ret;", "", name="first") + module("  ret;", "", name="second").split("\n", 4)[4]
    launch(ptx, "second", (1, 1, 1), (1, 1, 1), [])
    with pytest.raises(InterpError, match="entry 'third' not found"):
        launch(ptx, "third", (1, 1, 1), (1, 1, 1), [])
