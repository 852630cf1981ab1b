"""rope: rotate pair i of every head by pos * inv_freq[i], the pairs (x[h, i], x[h, i + head_dim/2])
(`style = "rotate_half"`, the default: Qwen3 / NeoX) or (x[h, 2i], x[h, 2i + 1]) (`style =
"interleaved"`: GPT-J, llama.cpp's rope for GGUF llama files, whose Q/K rows conversion permuted).
The two differ only in where a thread loads and stores its pairs (the rope family's pair_load /
pair_store); the angles and the rotation are the same, and so is the accuracy below.

Accuracy at large positions is the whole difficulty. With theta = 1e6 the angle pos * inv_freq[0]
equals pos, so an angle formed in f32 and fed to sin.approx is off by up to ulp(pos)/2 plus the
f32 rounding of inv_freq times pos: about 0.06 rad at pos = 2^20 and 0.9 rad at 2^24 (measured).
The kernel instead:

1. forms inv_freq[i] = theta^(-2i/head_dim) as an unevaluated f32 pair (hi + lo, about 46 good
   bits): each thread owns `vec` consecutive i starting at i0 = chunk * vec, and
   R^i0 (R = theta^(-2/head_dim)) is a product of the host-computed pairs R^(vec * 2^b) for the
   set bits b of its runtime chunk index, times the compile-time pair R^j for j < vec. Every
   factor is computed on the host in float64 and emitted as exact f32 immediates (no table in
   memory, so no extra load on the critical path: this work overlaps the loads of x);
2. splits pos * inv_freq exactly: p = RN(pos * hi), e = fma(pos, hi, -p) (exact), plus
   t = fma(pos, lo, e); pos <= 2^24 is exact in f32;
3. reduces modulo 2*pi by Cody-Waite with two f32 constants (C1 = RN(2*pi), C2 = RN(2*pi - C1));
   k * C1 - p is exact with one fma, so no large rounding error survives; a second, cheap
   reduction step brings the argument into [-pi, pi] even where k was off by one;
4. takes sin.approx/cos.approx of the reduced argument.

Measured in an exact f32 emulation of these steps (head_dim 2..1022, theta 1..1e9, pos up to
2^24) and in the interpreter on the real PTX with exact sin/cos: max |sin, cos error| <= 3.6e-7
(2^-21.4) against float64, max error of a rotated element <= ARITHMETIC_ERROR = 3.7e-7 of its
pair's norm n. On an H100 sin.approx / cos.approx err by up to 3.4e-7 absolute on [-pi, pi]
(measured; ptxgen.hardware_errors), which moves x1 cos a - x2 sin a by at most
3.4e-7 (|x1| + |x2|) <= sqrt(2) 3.4e-7 n. So every element is within ANGLE_ERROR = 3.7e-7 +
sqrt(2) 3.4e-7 = 8.5e-7 of n (error_bound; the pessimistic interpreter measures up to 6.8e-7 of
n), and since the squared pair norms sum to ||x||^2 and a pair holds two elements, the relative
L2 error is at most sqrt(2) ANGLE_ERROR = 1.2e-6 (ROPE_TOLERANCE; measured up to 4.4e-7). Other
archs' sin/cos.approx are not measured.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field

from ..hardware_errors import SIN_COS_ABS
from .base import Geometry, Kind, Param, PdlConfig, Traffic, ceil_div, round_up
from .families.rope import RopePlan, RopeStyle
from .rmsnorm import vector_width

MAX_POS = 2**24  # every integer up to here is exact in f32; verified bound of the accuracy claim
MAX_HEAD_DIM = 1024
MAX_THREADS = 128
ARITHMETIC_ERROR = 3.7e-7  # of a pair's norm, with exact sin/cos (measured, above)
# Max |computed - exact| of a rotated element, relative to its pair's norm, on an H100 (above).
ANGLE_ERROR = ARITHMETIC_ERROR + math.sqrt(2) * SIN_COS_ABS[0][1]
ROPE_TOLERANCE = math.sqrt(2) * ANGLE_ERROR


def inv_freq(theta: float, head_dim: int) -> np.ndarray:
    """Float64 theta^(-2i/head_dim) for i < head_dim/2 (the reference's and the kernel's source)."""
    return theta ** (-2.0 * np.arange(head_dim // 2, dtype=np.float64) / head_dim)


def pair_norms(x: np.ndarray, style: RopeStyle = "rotate_half") -> np.ndarray:
    """|(x1, x2)| of the pair each element of x belongs to, in x's shape (a rotation keeps it)."""
    if style == "interleaved":
        return np.repeat(np.hypot(x[..., 0::2], x[..., 1::2]), 2, axis=-1)
    half = x.shape[-1] // 2
    norm = np.hypot(x[..., :half], x[..., half:])
    return np.concatenate([norm, norm], axis=-1)


def rotate_half(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """Float64 NeoX rotation of the last axis at position pos."""
    x = np.asarray(x, dtype=np.float64)
    half = x.shape[-1] // 2
    angle = pos * inv_freq(theta, x.shape[-1])
    cos, sin = np.cos(angle), np.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def interleaved(x: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """Float64 GPT-J (interleaved) rotation of the last axis at position pos: pairs (2i, 2i + 1)."""
    x = np.asarray(x, dtype=np.float64)
    angle = pos * inv_freq(theta, x.shape[-1])
    cos, sin = np.cos(angle), np.sin(angle)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty(x.shape)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = odd * cos + even * sin
    return out


ROTATIONS = {"rotate_half": rotate_half, "interleaved": interleaved}


def rotate(x: np.ndarray, pos: int, theta: float, style: RopeStyle = "rotate_half") -> np.ndarray:
    """Float64 rope of the last axis at position pos in the given pairing."""
    return ROTATIONS[style](x, pos, theta)


class RopeConfig(PdlConfig):
    kind: Literal["rope"]
    head_dim: int = Field(ge=2, le=MAX_HEAD_DIM, multiple_of=2)
    num_heads: int = Field(ge=1, le=65536)
    # theta >= 1 keeps every inv_freq <= 1, so the angle stays <= pos <= 2^24; the accuracy
    # claim above is verified for theta up to 1e9.
    theta: float = Field(default=1000000.0, ge=1.0, le=1e9)
    style: RopeStyle = "rotate_half"


class Rope(Kind):
    name = "rope"
    Config = RopeConfig

    def params(self) -> list[Param]:
        return [
            Param("x", "f32", (self.config.num_heads, self.config.head_dim), "inout"),
            Param("pos", "u32", role="scalar"),
        ]

    @property
    def plan(self) -> RopePlan:
        # Pairs per thread: the widest 16/8/4-byte f32 vector that tiles the half.
        half = self.config.head_dim // 2
        return RopePlan.of(self.config.theta, self.config.head_dim, vector_width(half, 4), self.config.style)

    @property
    def units(self) -> int:
        """Threads with work: one per (head, chunk of vec pairs)."""
        return self.config.num_heads * self.plan.chunks

    @property
    def threads(self) -> int:
        return min(MAX_THREADS, round_up(self.units, 32))

    def geometry(self) -> Geometry:
        return Geometry(grid=(ceil_div(self.units, self.threads), 1, 1), block=(self.threads, 1, 1))

    def launch_note(self) -> str:
        plan = self.plan
        return (f"one thread per head and {plan.vec} consecutive {self.config.style} pairs "
                f"({self.units} = num_heads*{plan.chunks} threads)")

    def template_vars(self) -> dict:
        return {"plan": self.plan, "head_dim": self.config.head_dim, "threads": self.threads, "units": self.units}

    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        return {"pos": (0, MAX_POS)}

    def example_scalars(self) -> dict[str, int]:
        return {"pos": 4095}

    def verify_scalars(self) -> list[dict[str, int]]:
        return [{"pos": p} for p in (0, 1, 4095, 40959, 2**20, MAX_POS)]

    def sample_inputs(self, rng, scalars):
        x = rng.standard_normal((self.config.num_heads, self.config.head_dim)) + 0.25
        return {"x": x.astype(np.float32)}

    def reference(self, arrays, scalars):
        return {"x": rotate(arrays["x"], int(scalars["pos"]), self.config.theta, self.config.style)}

    def tolerance(self, param: Param) -> float:
        return ROPE_TOLERANCE

    def error_bound(self, param, arrays, reference, scalars):
        return ANGLE_ERROR * pair_norms(reference, self.config.style)

    def traffic(self, scalars) -> Traffic:
        elements = self.config.num_heads * self.config.head_dim
        # x read and written once; per pair 4 mul + 2 add. The angles (head-independent) are
        # not counted: a minimal implementation computes each once per call.
        return Traffic(bytes=2 * 4 * elements, flops=3 * elements)

    def torch_peer(self, torch, tensors, scalars):
        """bench's peer: the rotation with a precomputed cos/sin row, as inference engines do."""
        x, half = tensors["x"], self.config.head_dim // 2
        angle = torch.from_numpy(scalars["pos"] * inv_freq(self.config.theta, self.config.head_dim)).to(x.device)
        cos, sin = torch.cos(angle).float(), torch.sin(angle).float()

        def rotate_pairs():
            if self.config.style == "interleaved":
                even, odd = x[..., 0::2], x[..., 1::2]
                return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
            x1, x2 = x[..., :half], x[..., half:]
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

        return rotate_pairs
