"""Small builders for test kernels: wrap a PTX body into a module and run per-element snippets."""
import numpy as np

from ptxgen.interp import launch

HEADER = ".version 8.0\n.target sm_80\n.address_size 64\n\n"


def module(body, params="", name="k", prelude=""):
    """A complete PTX module with one entry `name(params)` whose body is `body`."""
    return f"{HEADER}{prelude}.visible .entry {name}({params})\n{{\n{body}\n}}\n"


_ELEMENTWISE = """
  .reg .b32 %a, %b, %c, %d, %e, %i, %n;
  .reg .b64 %A, %B, %C, %D, %E, %pa, %pb, %pc, %pd, %pe, %off, %off8;
  .reg .pred %p, %q, %oob;
  ld.param.u64 %pa, [pa];
  ld.param.u64 %pb, [pb];
  ld.param.u64 %pc, [pc];
  ld.param.u64 %pd, [pd];
  ld.param.u64 %pe, [pe];
  ld.param.u32 %n, [n];
  mov.u32 %i, %ctaid.x;
  mov.u32 %e, %tid.x;
  mad.lo.u32 %i, %i, 128, %e;
  setp.ge.u32 %oob, %i, %n;
  @%oob bra DONE;
  mul.wide.u32 %off, %i, 4;
  mul.wide.u32 %off8, %i, 8;
  add.s64 %pa, %pa, %off{s};
  add.s64 %pb, %pb, %off{s};
  add.s64 %pc, %pc, %off{s};
  add.s64 %pd, %pd, %off{s};
  add.s64 %pe, %pe, %off;
  ld.global.b{w} %{a}, [%pa];
  ld.global.b{w} %{b}, [%pb];
  ld.global.b{w} %{c}, [%pc];
  mov.b32 %e, 0;
  {{
{snippet}
  }}
  st.global.b{w} [%pd], %{d};
  st.global.b32 [%pe], %e;
DONE:
  ret;
"""


def elementwise_ptx(snippet, wide=False):
    regs = dict(a="A", b="B", c="C", d="D") if wide else dict(a="a", b="b", c="c", d="d")
    body = _ELEMENTWISE.format(snippet=snippet, w=64 if wide else 32, s="8" if wide else "", **regs)
    return module(body, ".param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd, "
                        ".param .u64 pe, .param .u32 n")


def elementwise(snippet, a, b=None, c=None, wide=False, extra=False, **launch_options):
    """Run snippet once per element. Inputs arrive as raw bits in %a %b %c (32-bit) or
    %A %B %C (wide=True); the snippet leaves its result bits in %d / %D, and optionally a
    second 32-bit result in %e. Returns the result bits (and %e when extra=True).
    launch_options go to launch (seed, approx, ...)."""
    bits = np.uint64 if wide else np.uint32
    a = np.ascontiguousarray(a).view(bits).ravel()
    n = a.size
    b = np.zeros(n, bits) if b is None else np.ascontiguousarray(b).view(bits).ravel()
    c = np.zeros(n, bits) if c is None else np.ascontiguousarray(c).view(bits).ravel()
    d = np.zeros(n, bits)
    e = np.zeros(n, np.uint32)
    launch(elementwise_ptx(snippet, wide), "k", (-(-n // 128), 1, 1), (128, 1, 1),
           [a, b, c, d, e, n], **launch_options)
    return (d, e) if extra else d


def f32(values):
    return np.asarray(values, np.float32)
