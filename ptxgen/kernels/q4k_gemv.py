"""q4k_gemv: y = dequant(w) @ xq for GGML Q4_K rows (decode GEMV at batch 1, bandwidth bound),
where xq is x quantised to int8 in blocks of 32 with an f32 scale, exactly as the kernel does it
(`families.quant_gemv.quantize_x`; llama.cpp's mmvq quantises x to Q8_1 the same way). The reference
is that product in float64, so the kind's tolerance and per-element bound are its f32 summation's
(the error analysis above `f32_error`, shared by every kind of the family).

How far xq's product is from the unquantised dequant(w) @ x (the KERNELS.md formula): x is
rounded to 8 bits relative to each block's max|x|, so each element moves by at most dx/2 =
max|x|/254. On Gaussian x (mean 0.25, sd 1) and Gaussian-quantised Q4_K rows the relative L2
error of y is 0.53% on average (0.52-0.58% over 5 seeds each at k = 256, 4096, 12288, 16384: it
does not depend on k); QUANTISATION_ERROR bounds it, and tests check it. For scale: the Q4_K
quantisation of those weights moves y by 7.7%.

The kernel is the quantised GEMV family's (geometry, defaults, the int8 path in
ptxgen/kernels/families/quant_gemv.py, macros in templates/families/quant_gemv.ptx.j2) under a
64-register cap: 32 warps an SM (occupancy 0.5 on sm_80/sm_90, 0.67 on sm_86/sm_89), each lane with
48-96 bytes of weights in flight. Under the queue schedule (the default where every CTA gets at
least 4 units of rows) the kernel takes one more parameter, `queue`: a u32[2] workspace, zeroed
once by its owner; every launch leaves it at zero again.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from ..dtypes import UNIT_ROUNDOFF
from ..q4k import unpack
from ..quants import QUANT_TYPES
from .base import MAX_COUNTED_BYTES, Geometry, Kind, ModelScaling, Param, PdlConfig, SmCount, Traffic
from .families.quant_gemv import (FORMATS, MAX_K, MAX_REGISTERS, MAX_ROW_STEPS, MAX_ROWS, MAX_WARPS,
                                  STEP_WEIGHTS, X_GROUP, QuantGemvPlan, dequantize_x, divisors, min_warps,
                                  queue_split)

MAX_N = 2**31 - 1
# `ptxgen verify` (the interpreter) runs a config only up to this many weights: the Qwen3-8B lm_head
# (151936 x 4096, 622M Q6_K weights) takes about 3 minutes a launch on one CPU core (measured: 5.4 s
# for 12288 of its rows in the interpreter, 3.8 s for their float64 reference).
MAX_VERIFY_WEIGHTS = 1 << 30
# The float64 reference and error analysis go through the weights this many at a time (8 bytes a
# weight, several arrays of it: whole, the lm_head's would take tens of GB).
CHUNK_WEIGHTS = 1 << 22
# Relative L2 error of dequant(w) @ xq against dequant(w) @ x on Gaussian data (see the docstring).
QUANTISATION_ERROR = 6e-3


def by_rows(weights: np.ndarray, k: int, per_rows) -> np.ndarray:
    """per_rows (quantised rows -> one float64 value a row) over `weights` [n, row bytes], about
    CHUNK_WEIGHTS at a time."""
    rows = max(1, CHUNK_WEIGHTS // k)
    return np.concatenate([per_rows(weights[start:start + rows]) for start in range(0, len(weights), rows)])


def check_k(k: int, quant: str) -> int:
    """k for weights of type `quant`: whole parts of a lane (format.min_k), at most MAX_K."""
    fmt = FORMATS[quant]
    if k < fmt.min_k or k % fmt.min_k:
        blocks = fmt.min_k // fmt.block_weights
        why = f"{quant.upper()} block" if blocks == 1 else f"{blocks} {quant.upper()} blocks: a lane's part of a row"
        raise ValueError(f"expected a multiple of {fmt.min_k} ({why}) of at least {fmt.min_k}, got {k}")
    if k > MAX_K:
        raise ValueError(f"expected at most {MAX_K} (a warp's row-steps are unrolled), got {k}")
    return k


# PREFETCH_ROWS: a launch is about a fixed cost plus its bytes at the streaming rate (H200,
# 2026-11-28, ten launches between two events: 2.96 us + bytes / 3911 GB/s), and PDL lets the next
# launch's CTAs start as the previous grid's free an SM, where, before their griddepcontrol.wait,
# they load only the first row-steps the registers hold. With prefetch_rows each CTA also asks L2
# for every 128-byte line of its rows there (prefetch.global.L2, a thread a line: 1.7 a thread for
# 12288 x 4096's 96-row CTAs of 32 warps), so its weights stream while the previous kernel drains
# and the row loop finds them in L2. The performance model does not count it. Not timed yet: off
# by default.
# TIMELINE: nothing measured says where that fixed cost goes. With `timeline` thread 0 of each CTA
# stamps %globaltimer at its start (words 0 and 1: low and high; read as it begins, kept in shared
# memory and stored after the PDL wait, before which nothing of the timeline is written: the
# previous launch of the stream may still be writing its own), after the PDL wait (2) and once x
# is staged (3, after the CTA barrier), and lane 0 of warp w once the warp is done (4 + w): the
# launch ramp, the wait for the previous kernel, the staging, the rows and the CTA's and grid's
# tails, one by one (bench/lease/gemv_timeline.py).
TIMELINE_STAMPS = 4  # the words before the warps' ends


# MODEL_CTAS: the performance model interprets a call of at most MAX_COUNTED_BYTES; a larger GEMV
# (the Qwen3-8B lm_head: 511 MB of Q6_K, 132 queued CTAs of 12 rounds) is counted on this many
# CTAs of its plan, every CTA's rows being the same work (model_scaling).
MODEL_CTAS = 4


def gamma(m: int) -> float:
    """Higham's gamma_m = m u / (1 - m u) for f32: the relative error bound of m roundings."""
    u = UNIT_ROUNDOFF["f32"]
    return m * u / (1 - m * u)


class QuantGemvTuning(PdlConfig):
    """The family's tuning fields (None: the plan's defaults, see QuantGemvPlan.of), for weights of
    type `quant` (the subclasses of the other formats set it)."""

    quant: ClassVar[str] = "q4_k"
    k: int
    warps: int | None = Field(default=None, ge=1, le=MAX_WARPS)
    rows_per_warp: int | None = Field(default=None, ge=1, le=MAX_ROWS)
    split_k: int | None = Field(default=None, ge=1, le=MAX_WARPS)
    unroll: int | None = Field(default=None, ge=1, le=4)
    l1_no_allocate: bool = False
    l2_prefetch: Literal[0, 64, 128, 256] = 0
    # Each CTA first requests all of its rows (with the queue, its first unit's) into L2, before its
    # PDL wait (PREFETCH_ROWS).
    prefetch_rows: bool = False
    # static: a CTA a unit of rows; queue: a persistent grid takes units from a work counter
    # (the `queue` workspace); None: queue where the grid gets at least 4 units a CTA
    # (FORMATS["q4_k"].min_queue_rounds).
    schedule: Literal["static", "queue"] | None = None
    # The queue's grid: ctas_per_sm CTAs (default: what an SM holds, 32 warps) on each of sm_count SMs.
    sm_count: int = SmCount
    ctas_per_sm: int | None = Field(default=None, ge=1, le=32)
    # The queue takes a CTA's next unit at the end of each round (True) or at its start: later
    # binds fewer units ahead, so the last ones go to the CTAs that finish first.
    late_grab: bool = True
    # Where a launch's time goes: stamps of %globaltimer in the workspace `timeline` (TIMELINE).
    # Off: no stamps, no parameter.
    timeline: bool = False

    @field_validator("k")
    @classmethod
    def k_is_blocks(cls, k: int) -> int:
        return check_k(k, cls.quant)

    @model_validator(mode="after")
    def tuning_fits(self):
        steps = -(-self.k // STEP_WEIGHTS)
        if self.split_k is not None and steps % self.split_k:
            raise ValueError(f"split_k: expected a divisor of the {steps} warp steps of a row (k/2048 rounded up): "
                             f"one of {', '.join(map(str, divisors(steps)))}; got {self.split_k}")
        if self.warps is not None and self.split_k is not None and self.warps % self.split_k:
            raise ValueError(f"warps: expected a multiple of split_k ({self.split_k}), got {self.warps}")
        if self.warps is not None and self.warps < min_warps(self.k):
            raise ValueError(f"warps: k = {self.k} needs at least {min_warps(self.k)} warps to quantise x "
                             f"(16 values a thread, at most 8 rounds), got {self.warps}")
        if self.schedule == "queue" and self.rows_per_warp is not None:
            unit_steps = FORMATS[self.quant].queue_row_steps
            part = steps // (self.split_k or queue_split(steps, self.warps, unit_steps))
            if self.rows_per_warp * part > MAX_ROW_STEPS:
                raise ValueError(f"rows_per_warp: with schedule = \"queue\" a warp's rows of a unit are unrolled: "
                                 f"rows_per_warp x {part} steps (k / 2048 / split_k) must be at most "
                                 f"{MAX_ROW_STEPS}, got {self.rows_per_warp}")
        return self


class Q4kGemvConfig(QuantGemvTuning):
    kind: Literal["q4k_gemv"]
    n: int = Field(ge=1, le=MAX_N)


def weight_param(name: str, n: int, k: int, quant: str) -> Param:
    """A weight matrix parameter of type `quant`: u8[n, row bytes] (Q4_K: (k/256)*144), loadable
    from a GGUF tensor; stable (a PDL variant loads its first rows before it waits)."""
    return Param(name, "u8", (n, QUANT_TYPES[quant].row_bytes(k)), layout=quant, stable=True)


class Q4kGemv(Kind):
    """The single-matrix kind; the group kinds override `matrices` (name -> rows), q6k_gemv and
    q8_0_gemv the config's `quant`."""

    name = "q4k_gemv"
    Config = Q4kGemvConfig
    fused = False
    pdl_wait_in_body = True  # after the first weight loads (templates/q4k_gemv.ptx.j2)
    shape_fields = ("n", "k", "matrices")  # the group kinds' matrices: name -> rows

    @property
    def quant(self) -> str:
        """The weights' type: the config's (QuantGemvTuning.quant)."""
        return self.Config.quant

    @property
    def ptx_version(self) -> tuple[int, int]:
        # .L1::no_allocate / .L2::<N>B on loads: PTX ISA 7.4.
        c = self.config
        return (7, 4) if c.l1_no_allocate or c.l2_prefetch else (7, 0)

    @property
    def matrices(self) -> dict[str, int]:
        """Output name suffix -> rows; parameters y<suffix>, w<suffix>."""
        return {"": self.config.n}

    @property
    def plan(self) -> QuantGemvPlan:
        return QuantGemvPlan.of(self.config, tuple(self.matrices.values()), self.quant)

    def params(self) -> list[Param]:
        k = self.config.k
        outputs = [Param(f"y{name}", "f32", (n,), "out") for name, n in self.matrices.items()]
        weights = [weight_param(f"w{name}", n, k, self.quant) for name, n in self.matrices.items()]
        extra = [Param("gamma", "f32", (k,))] if self.fused else []
        # The queue's work counter and the count of CTAs done (the last CTA puts both back to 0).
        queue = [Param("queue", "u32", (2,), "workspace")] if self.plan.queue else []
        timeline = ([Param("timeline", "u32", (self.plan.ctas, self.timeline_words), "workspace")]
                    if self.config.timeline else [])
        return [*outputs, *weights, Param("x", "f32", (k,)), *extra, *queue, *timeline]

    @property
    def timeline_words(self) -> int:
        """Words of a CTA's timeline row (TIMELINE): start (2), waited, staged, each warp's end."""
        return TIMELINE_STAMPS + self.plan.warps

    # --- geometry --------------------------------------------------------------------------
    def geometry(self) -> Geometry:
        plan = self.plan
        # The queue schedule is right with any grid (units past the grid's come from the counter).
        return Geometry(grid=(plan.ctas, 1, 1), block=(plan.threads, 1, 1), dynamic_shared=plan.shared_bytes,
                        any_grid=plan.queue)

    def launch_note(self) -> str:
        p = self.plan
        split = f", split over {p.split_k} warps" if p.split_k > 1 else ""
        rows = f"{p.rows_per_cta} rows ({p.rows_per_warp} per warp{split})"
        unit = (f"{p.ctas} CTAs take {p.units} units of {rows} from a work counter" if p.queue
                else f"{rows} per CTA")
        prefetch = (f"; each CTA first requests its {'first unit' if p.queue else 'rows'} into L2"
                    if self.config.prefetch_rows else "")
        return (f"{unit}; a warp step covers 2048 weights of a row (64 a lane: {p.step_bytes} bytes of "
                f"{self.quant.upper()} blocks), {p.unroll} row-steps of loads in flight{prefetch}")

    def static_shared(self) -> int:
        tickets = 8 if self.plan.queue else 0  # the next two units
        start = 16 if self.config.timeline else 0  # the CTA's start (8-byte aligned: with its padding)
        return (8 * self.plan.warps + 4 if self.fused else 4) + tickets + start  # warp sums and RMS factors; a zero word

    def template_vars(self) -> dict:
        plan = self.plan
        matrices, start = [], 0
        for (name, n), units in zip(self.matrices.items(), plan.matrix_units):
            matrices.append({"y": f"y{name}", "w": f"w{name}", "n": n, "unit_start": start})
            start += units
        weight_rows = [("%wq", "%wh", r * plan.row_bytes) for r in range(plan.rows_per_trip)]
        return {"plan": plan, "matrices": matrices, "weight_rows": weight_rows, "max_registers": MAX_REGISTERS,
                "fused": self.fused, "eps": getattr(self.config, "eps", 0.0), "early_loads": self.early_loads,
                "prefetch_rows": self.config.prefetch_rows, "timeline": self.config.timeline,
                "timeline_words": self.timeline_words, "timeline_stamps": TIMELINE_STAMPS}

    @property
    def early_loads(self) -> bool:
        """Whether the first weights go out before x is staged: where staging is one round (more
        rounds hold more registers: ptxas spilled), but for fused Q6_K, whose 30-register slot
        beside the staging's 16 x and 16 gamma values spilled 8-16 bytes at the 64-register cap
        (Qwen3-8B's q/k/v, v and gate/up groups, sm_86/sm_90)."""
        plan = self.plan
        return plan.stage_rounds(plan.threads) == 1 and not (self.fused and self.quant == "q6_k")

    def model_scaling(self) -> ModelScaling | None:
        """A single-matrix launch above MAX_COUNTED_BYTES: its plan (tuning fields pinned) on
        MODEL_CTAS CTAs, with one unit of rows each (static: what each of its CTAs does), and
        under the queue also with two, extrapolated to its units a CTA; its totals scaled to its
        CTAs. None where the launch is counted whole, or for a group of matrices."""
        c, plan = self.config, self.plan
        if len(self.matrices) > 1 or self.traffic({}).bytes <= MAX_COUNTED_BYTES:
            return None
        pinned = {"warps": plan.warps, "rows_per_warp": plan.rows_per_warp, "split_k": plan.split_k,
                  "unroll": plan.unroll, "schedule": "queue" if plan.queue else "static", "sm_count": MODEL_CTAS,
                  "ctas_per_sm": 1}

        def cut(rounds: int):
            return c.model_copy(update={**pinned, "name": f"{c.name}_model_{rounds}",
                                        "n": MODEL_CTAS * rounds * plan.rows_per_cta})

        if not plan.queue:  # a CTA a unit: one round
            return ModelScaling(cut(1), (), f"{MODEL_CTAS} CTAs of its plan interpreted, scaled to its {plan.ctas}",
                                cta_scale=plan.ctas / MODEL_CTAS)
        rounds = plan.units / plan.ctas
        note = (f"{MODEL_CTAS} CTAs of its plan interpreted with 1 and 2 queued units of {plan.rows_per_cta} rows "
                f"each, extrapolated to {rounds:.2f} units on each of its {plan.ctas} CTAs")
        return ModelScaling(cut(1), ((cut(2), rounds - 1),), note, cta_scale=plan.ctas / MODEL_CTAS, dealt=True)

    # --- runtime -----------------------------------------------------------------------------
    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        return {}

    def example_scalars(self) -> dict[str, int]:
        return {}

    def verify_scalars(self) -> list[dict[str, int]]:
        """The one launch; none when the weights are too many for the interpreter (MAX_VERIFY_WEIGHTS)."""
        return [] if sum(self.matrices.values()) * self.config.k > MAX_VERIFY_WEIGHTS else [{}]

    def sample_inputs(self, rng, scalars):
        """Quantised Gaussian weights, x Gaussian off zero; for the fused kinds gamma near 1 and x
        as small as eps (mean(x^2) about 1.06 eps), so eps is half of the norm's denominator and an
        eps the kernel gets wrong shows (the normalised x, what the GEMV multiplies, is of unit
        size whatever x's)."""
        k = self.config.k
        quant = QUANT_TYPES[self.quant]
        inputs = {f"w{name}": quant.random_weights(rng, n, k) for name, n in self.matrices.items()}
        x = rng.standard_normal(k) + 0.25
        inputs["x"] = (x * np.sqrt(self.config.eps) if self.fused else x).astype(np.float32)
        if self.fused:
            inputs["gamma"] = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
        return inputs

    def activations(self, arrays) -> np.ndarray:
        """xq: what the kernel multiplies the weights by, in float64."""
        return dequantize_x(arrays["x"])

    def reference(self, arrays, scalars):
        xq = self.activations(arrays)
        quant = QUANT_TYPES[self.quant]
        return {f"y{name}": by_rows(arrays[f"w{name}"], self.config.k, lambda w: quant.dequantize_f64(w) @ xq)
                for name in self.matrices}

    # --- error analysis -------------------------------------------------------------------------
    # The integer dot products are exact (dp4a on codes; |sc * dot| < 2^24, so its int-to-float is
    # exact too, except Q4_K's high-nibble dot, counted below). What rounds is f32 arithmetic on
    # the way from each product of weight and x codes to y, in the kernel's order:
    # - in the lane's item (format.item_roundings, its first accumulation included): Q4_K
    #   cvt(16 sc1 dot1) (>= 2^24 possible), * dx, fma with the other sub-block, fma into acc with
    #   d, fma with dmin (the min term: the staged s = dx * sum(q), * m, fma, fma: 4 as well);
    #   Q6_K * dx_0 then 3 fmas over the pieces, fma into acc with d (5); Q8_0 * dx, fma into acc
    #   with d, the second block's fma (3);
    # - each later item of the warp's part of the row: one fma into acc (Q6_K) or two (Q4_K, Q8_0);
    # - the sum over lanes and parts (plan.sum_roundings): static, the 5-level shuffle tree then
    #   split_k - 1 adds of the parts in order; queue, 4 chains of 8 * split_k adds and 2 joins.
    # Every term of y goes through at most depth = plan.output_roundings roundings, so (Higham,
    # the bound of recursive and tree summation) |y - ref| <= gamma(depth) * sum |term|, with
    # gamma(m) = m u / (1 - m u), u = 2^-24, and sum |term| <= magnitudes(w) @ |xq|: |dequant w|
    # for Q6_K and Q8_0 (one term a weight), |d sc q| + |dmin m| for Q4_K (its two terms).
    # Relative L2: a rounding at node v of the sum moves it by at most u |S_v|; over a row's terms
    # (independent, zero-mean: Gaussian weights and x) each level of the summation tree splits the
    # terms, so the partial sums' variances add up to depth * var(y) and the error's RMS is about
    # u sqrt(depth) sigma(y): gamma(depth) (>= that, with a margin of sqrt(depth)) is the
    # tolerance. sigma(y) is the root-sum-square of y's terms (error_scale), not |y|: one row whose
    # terms cancel (|y| far below them; a 1-row GEMV measured 52x over against |y|) keeps the
    # rounding of its partial sums, which are of the terms' size.
    def f32_error(self) -> float:
        """Relative bound (against magnitudes(w) @ |xq|) of y's f32 arithmetic."""
        return gamma(self.plan.output_roundings)

    def magnitudes(self, w: np.ndarray) -> np.ndarray:
        """float64 [n, k]: each weight's terms in the kernel, in absolute value (see above)."""
        if self.quant != "q4_k":
            return np.abs(QUANT_TYPES[self.quant].dequantize_f64(w))
        d, dmin, scales, mins, codes = (a.astype(np.float64) for a in unpack(w))
        n = w.shape[0]
        scaled = np.repeat((d[..., None] * scales).reshape(n, -1), X_GROUP, axis=1) * codes
        offsets = np.repeat((dmin[..., None] * mins).reshape(n, -1), X_GROUP, axis=1)
        return np.abs(scaled) + np.abs(offsets)

    def tolerance(self, param: Param) -> float:
        return self.f32_error()

    def error_bound(self, param, arrays, reference, scalars):
        weights, size = arrays["w" + param.name.removeprefix("y")], np.abs(self.activations(arrays))
        return self.f32_error() * by_rows(weights, self.config.k, lambda w: self.magnitudes(w) @ size)

    def error_scale(self, param, arrays, reference, scalars):
        weights, square = arrays["w" + param.name.removeprefix("y")], self.activations(arrays) ** 2
        return np.sqrt(by_rows(weights, self.config.k, lambda w: self.magnitudes(w) ** 2 @ square))

    def traffic(self, scalars) -> Traffic:
        k, rows = self.config.k, sum(self.matrices.values())
        vectors = 2 if self.fused else 1  # x (and gamma)
        return Traffic(bytes=rows * QUANT_TYPES[self.quant].row_bytes(k) + 4 * k * vectors + 4 * rows,
                       flops=2 * rows * k)

    def torch_activations(self, torch, tensors):
        """The vector the weights multiply, in torch (the fused kinds normalise it first)."""
        return tensors["x"]

    def torch_peer(self, torch, tensors, scalars):
        """bench's peers: for Q4_K torch's int4 GEMV and a bf16 cuBLAS GEMV over the same weights
        (ptxgen.peers), for the other types the cuBLAS one; of the first matrix for the group kinds."""
        from ..dtypes import f32_to_bf16
        from ..peers import bf16_row, q4k_gemv_peers

        name, n = next(iter(self.matrices.items()))
        activations = lambda: self.torch_activations(torch, tensors)  # noqa: E731
        w = tensors[f"w{name}"]
        if self.quant == "q4_k":
            return q4k_gemv_peers(torch, w, n, self.config.k, activations)
        dense_bits = f32_to_bf16(QUANT_TYPES[self.quant].dequantize(w.cpu().numpy(), self.config.k))
        dense = torch.from_numpy(dense_bits.view(np.int16)).to(w.device).view(torch.bfloat16)
        x = bf16_row(torch, activations)
        ratio = 2 * self.config.k / self.plan.row_bytes
        return {f"cuBLAS bf16 GEMV ({ratio:.1f}x the bytes)": lambda: torch.mv(dense, x()[0])}
