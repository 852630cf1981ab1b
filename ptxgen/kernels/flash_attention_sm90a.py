"""flash_attention's Hopper (sm_90a) variant: FlashAttention-3's structure in our own PTX
(templates/flash_attention_sm90a.ptx.j2), rendered when a spec lists sm_90a. Same contract,
parameters, reference and traffic as flash_attention; the plan below turns a config and its
`sm90a` knobs into the template's variables and the launch geometry.

CTA = `consumers` consumer warpgroups of 64 query rows each, then `producer_warps` producer
warps; block_m = 64 * consumers rows of one head; grid (ceil(seq_len / block_m), num_heads).
- Producer: its threads load Q once and stream K and V tiles of block_n keys into a ring of
  `stages` shared-memory stages with 16-byte cp.async, each chunk stored where the 128-byte
  swizzle of the wgmma operand layout puts it, and hand each tile to an mbarrier with
  cp.async.mbarrier.arrive.noinc (no thread waits for its own copies). A 1-D cp.async.bulk
  cannot do that: it writes contiguous bytes, while every wgmma layout interleaves 16-byte
  pieces of 8 rows. With `tma`, cp.async.bulk.tensor does it: the entry takes a tensor map of
  q, k and v after its parameters (Kind.tensor_maps; the launchers encode them from the arrays,
  so callers pass the same arguments), one producer warp runs the loop and its elected lane
  (elect.sync) issues an expect_tx and head_dim / 64 copies a tile (a box of one 128-byte panel x
  the tile's rows, 128-byte swizzled, rows past seq_len zero-filled by the copy); any other
  producer warps exit. The copies write through
  the async proxy, so the consumers need no fence.proxy.async. The interpreter counts 5.9% fewer
  executed warp-instructions at 1k tokens (Qwen3-8B's heads: 4.87 M -> 4.58 M, the producer's
  cp.asyncs and their addresses, taken off the SM sub-partition the producer warp shares with
  two consumer warps) and ptxas 159 registers against 168; not yet timed. A warp's copy instruction fills 4
  whole 128-byte rows (lane: chunk lane % 8 of row lane / 8, and chunk ^ 4 of the row 4 below,
  both in the same swizzled slot): 4 shared-memory wavefronts for its 512 bytes and 128-byte
  global runs. Until session 18 the lanes held 8 rows x 4 chunks, 16 banks a row: 8 wavefronts
  (Nsight Compute on the H200's ping-pong prefill at 4k, 2026-11-28: 23% of all shared
  wavefronts excessive; the speed of the change is not measured, the bits are the same).
- Consumers: S = Q K^T with both operands from shared memory (Q and K K-major, 128-byte
  swizzle), O += P V with P from registers (the S accumulators converted in place) and V
  N-major (its rows [key][dim] as they are in memory, imm-trans-b = 1). As in the portable
  kernel, a row's reference max moves only where a tile's passes it by more than
  RESCALE_THRESHOLD (p <= 2^8), and a warp rescales its O only where one of its rows moved
  (vote.any): on the sample inputs at 1k tokens that skips most rescales, 166.6M -> 151.7M
  executed thread-instructions (64 multiplies a thread a tile). In order (the
  default), a tile's S, softmax and P V follow each other, and the two consumer warpgroups,
  scheduled independently, overlap one's softmax with the other's MMAs. With `overlap`
  (FlashAttention-3's intra-warpgroup overlap) the softmax of tile j runs while the tensor
  cores do P_{j-1} V_{j-1}: S_j and P_{j-1} V_{j-1} are issued back to back, wgmma.wait_group 1
  retires S_j alone, and O is rescaled after wait_group 0; that keeps P beside S, block_n / 4
  more registers per thread. With `pingpong` as well (FlashAttention-3's inter-warpgroup
  schedule, two consumers), the warpgroups take turns: each waits on its named barrier (1 + its
  index) before issuing a tile's MMAs and arrives on the other's after, so one's softmax runs
  while the other's MMAs have the tensor cores, instead of both contending at once. Warpgroup 0
  goes first (warpgroup 1 arrives on its barrier once at the start; the last issue arrives only
  from warpgroup 0, so no arrival is left over). Not yet timed on a GPU.
- `persistent`: a grid of min(blocks x heads, sm_count) CTAs (one an SM: sm_count is the GPU's
  SMs, an H100 SXM's 132 by default), each walking query blocks: round r deals blocks r * CTAs ..
  (heaviest first, numbered as query_block does) forward when r is even and backward when odd, so
  the CTA that took a round's heaviest block takes the next round's lightest (at 4k tokens the
  busiest CTA carries 0.2% more than an even share, 12% dealt forward each round). The ring's
  stages and parities run on from block to block, and Q has two buffers (block i in i % 2, an
  empty barrier each), so the producer loads the next block's Q and first K/V tiles while the
  consumers end this one (O's normalisation and stores), where one CTA an SM otherwise leaves the
  tensor cores idle from a block's last MMA to the next block's first tile. FlashAttention-3 is
  persistent too. Not yet timed on a GPU.
- Shared memory, dynamic, from smem[] rounded up to 1024 bytes at run time (ALIGN_SLACK: the
  toolchain aligns an .extern array to 16 bytes only, whatever its .align; nvJitLink 13.0 put it
  at 0x450 on an H100, which broke every swizzled read): [Q: block_m rows (two such tiles when
  persistent)][K: stages x block_n rows][V: same];
  a tile of r rows of head_dim is head_dim / 64 panels of r rows x 128 bytes (64 elements),
  16-byte chunk c of row i stored at chunk c ^ (i % 8) (the 128-byte swizzle, applied to
  address bits, so every panel starts on a 1024-byte boundary).
- Registers: consumers hold S (block_n / 2) and O (head_dim / 2) floats per thread, and P
  (block_n / 4) beside them with overlap. Two consumer warpgroups and a producer warp (288
  threads, 9 warps: 3 on one of the four register banks) may use 168 registers each, which
  head_dim 128 with 128-key tiles fills without spilling in order, and 64-key tiles with
  overlap. A whole producer warpgroup (producer_warps=4) hands its registers to the consumers
  with setmaxnreg (40 for it, 232 each for them: 128-key tiles with overlap, FlashAttention-3's
  split), which only whole-program compilation honours: nvJitLink compiles PTX as one unit of a
  link and ignores setmaxnreg (ptxas info C7504, CUDA 13.0-13.5), so there it spills 240 bytes;
  ptxas from the nvidia-cuda-nvcc wheel (extra "ptxas", chosen by `auto` for such PTX) keeps it
  and spills none (ptxas 13.5.37, head_dim 128).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..abi import TensorMap, minimum, mul, scalar
from ..dtypes import to_float64
from .base import SM_COUNT, Geometry, ceil_div
from .flash_attention import RESCALE_THRESHOLD, FlashAttention, FlashAttentionConfig, attention_error_bound

WARPGROUP = 128
REGISTER_FILE = 65536
MAX_SHARED = 232448            # sm_90 opt-in dynamic shared memory per CTA
ALIGN_SLACK = 1024 - 16        # rounding a 16-byte-aligned smem[] up to 1024 skips at most this
PRODUCER_REGISTERS = 40        # setmaxnreg of a producer warpgroup: addresses, counters, temporaries
# Consumer registers beyond the accumulators (descriptors, row statistics, indices): with
# ptxas 13.0, head_dim 128 / block_n 128 used 168 = 128 + 40 without spilling; head_dim 64 with
# three consumers (cap 128, 96 + 32) spilled 24 bytes.
REGISTER_OVERHEAD = 40


@dataclass(frozen=True)
class Sm90aPlan:
    head_dim: int
    block_n: int               # keys per K/V tile: N of S = Q K^T, K of O += P V
    consumers: int             # consumer warpgroups, 64 query rows each
    stages: int                # K/V tiles in flight
    producer_warps: int        # 1, or 4 (a warpgroup that hands registers over with setmaxnreg)
    overlap: bool              # softmax of tile j while P_{j-1} V_{j-1} runs (S and P both live)
    pingpong: bool = False     # the two consumer warpgroups issue their MMAs in turn (named barriers)
    persistent: bool = False   # a grid of at most sm_count CTAs, each walking query blocks in turn
    sm_count: int = SM_COUNT
    tma: bool = False          # the tiles come by cp.async.bulk.tensor through tensor maps, one lane issuing

    @property
    def q_buffers(self) -> int:
        """Q tiles in shared memory: a persistent CTA loads the next block's while it ends this one."""
        return 2 if self.persistent else 1

    @property
    def q_barriers(self) -> int:
        """Q's mbarriers: full, and with two buffers full and empty of each."""
        return 2 * self.q_buffers if self.persistent else 1

    @property
    def block_m(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return WARPGROUP * self.consumers + 32 * self.producer_warps

    @property
    def q_bytes(self) -> int:
        return self.block_m * self.head_dim * 2

    @property
    def tile_bytes(self) -> int:
        return self.block_n * self.head_dim * 2

    @property
    def dynamic_shared(self) -> int:
        return ALIGN_SLACK + self.q_buffers * self.q_bytes + 2 * self.stages * self.tile_bytes

    @property
    def static_shared(self) -> int:
        """The mbarriers: Q's, and full/empty of K and V per stage."""
        return 8 * (self.q_barriers + 4 * self.stages)

    @property
    def consumer_registers(self) -> int | None:
        """setmaxnreg count of the consumers (a producer warpgroup only)."""
        if self.producer_warps != 4:
            return None
        spare = REGISTER_FILE - WARPGROUP * PRODUCER_REGISTERS
        return min(256, spare // (WARPGROUP * self.consumers) // 8 * 8)

    @property
    def registers(self) -> int:
        """Registers a consumer thread may use: its setmaxnreg count, else the entry cap. The
        register file is four 16384-register banks, one per SM sub-partition, whose warps are
        spread evenly: 9 warps (288 threads) put 3 on one bank, so 16384 / 96 -> 168 (ptxas
        allocates in steps of 8), the same as 12 warps."""
        if self.consumer_registers:
            return self.consumer_registers
        warps_per_bank = ceil_div(ceil_div(self.threads, 32), 4)
        return min(255, REGISTER_FILE // 4 // (32 * warps_per_bank) // 8 * 8)


def sm90a_plan(config: FlashAttentionConfig, *, block_n: int = 128, consumers: int = 2,
               stages: int = 2, producer_warps: int = 1, overlap: bool | None = None,
               pingpong: bool = False, persistent: bool = False, sm_count: int = SM_COUNT,
               tma: bool = False) -> Sm90aPlan:
    """The plan for a config and the tuning knobs (ValueError naming a knob that cannot work);
    overlap=None overlaps wherever the registers allow it."""
    if block_n not in (32, 64, 128, 256):
        raise ValueError(f"block_n={block_n}: 32, 64, 128 or 256 (a power of two: tile indices are shifts)")
    if producer_warps not in (1, 4) or block_n % (8 * producer_warps):
        raise ValueError(f"producer_warps={producer_warps}: 1 or 4, and block_n a multiple of 8 per warp")
    if consumers not in (1, 2, 3) or stages < 1:
        raise ValueError(f"consumers={consumers}, stages={stages}: 1..3 consumer warpgroups, >= 1 stage")
    # accumulators per thread: S and O, and P beside them while S of the next tile is computed
    in_order = block_n // 2 + config.head_dim // 2
    registers = Sm90aPlan(config.head_dim, block_n, consumers, stages, producer_warps, False).registers
    if overlap is None:
        overlap = in_order + block_n // 4 + REGISTER_OVERHEAD <= registers
    if pingpong and (consumers != 2 or not overlap):
        raise ValueError(f"pingpong: two consumer warpgroups taking turns at the tensor cores while the other "
                         f"runs its softmax needs consumers=2 and overlap (got consumers={consumers}, "
                         f"overlap={overlap})")
    plan = Sm90aPlan(config.head_dim, block_n, consumers, stages, producer_warps, overlap, pingpong, persistent,
                     sm_count, tma)
    if plan.dynamic_shared + plan.static_shared > MAX_SHARED:
        raise ValueError(f"{plan.dynamic_shared + plan.static_shared} bytes of shared memory for "
                         f"block_n={block_n}, stages={stages}, consumers={consumers}"
                         f"{', persistent (two Q tiles)' if persistent else ''}: more than {MAX_SHARED}")
    live = in_order + (block_n // 4 if overlap else 0)
    if live + REGISTER_OVERHEAD > registers:
        raise ValueError(f"consumers would hold {live} accumulator registers of {registers}: "
                         "fewer consumers, a smaller block_n or no overlap")
    return plan


def sm90a_template_vars(config: FlashAttentionConfig, plan: Sm90aPlan) -> dict:
    """Variables of templates/flash_attention_sm90a.ptx.j2."""
    scale = config.scale if config.scale is not None else 1.0 / math.sqrt(config.head_dim)
    return {
        "head_dim": config.head_dim,
        "dtype": config.dtype,
        "out_dtype": config.out_dtype,
        "causal": config.causal,
        "num_heads": config.num_heads,
        "group": config.num_heads // config.num_kv_heads,
        "scale_log2": scale * math.log2(math.e),
        "block_m": plan.block_m,
        "block_n": plan.block_n,
        "consumers": plan.consumers,
        "stages": plan.stages,
        "overlap": plan.overlap,
        "pingpong": plan.pingpong,
        "persistent": plan.persistent,
        "q_buffers": plan.q_buffers,
        "q_barriers": plan.q_barriers,
        "threads": plan.threads,
        "producer_warps": plan.producer_warps,
        "tma": plan.tma,
        # arrivals that fill a Q, K or V buffer: the issuing thread's expect_tx, or every producer
        # thread's cp.async.mbarrier.arrive
        "fill_arrivals": 1 if plan.tma else 32 * plan.producer_warps,
        "q_bytes": plan.q_bytes,
        "tile_bytes": plan.tile_bytes,
        "producer_registers": PRODUCER_REGISTERS if plan.consumer_registers else None,
        "consumer_registers": plan.consumer_registers,
        # With causal masking, the first tile a CTA visits starts at key (tiles - 1) * block_n,
        # past the first rows of the block when block_n does not divide into whole blocks.
        "empty_rows": config.causal and plan.block_n % plan.block_m != 0,
        "rescale_threshold": RESCALE_THRESHOLD,
    }


def sm90a_geometry(config: FlashAttentionConfig, plan: Sm90aPlan) -> Geometry:
    blocks = ceil_div(scalar("seq_len"), plan.block_m)
    grid = (minimum(mul(blocks, config.num_heads), plan.sm_count), 1, 1) if plan.persistent else (
        blocks, config.num_heads, 1)
    return Geometry(grid=grid, block=(plan.threads, 1, 1), dynamic_shared=plan.dynamic_shared)


def persistent_work(work: np.ndarray, ctas: int) -> np.ndarray:
    """Each persistent CTA's work: the query blocks (`work` in the order query_block deals them,
    heaviest first) go out in rounds of `ctas`, forward in even rounds and backward in odd ones
    (CTA c takes c, then 2 ctas - 1 - c, ...), so that the CTA given the heaviest block of one round
    gets the lightest of the next."""
    rounds = ceil_div(len(work), ctas)
    dealt = np.zeros(rounds * ctas, work.dtype)
    dealt[:len(work)] = work
    dealt = dealt.reshape(rounds, ctas)
    dealt[1::2] = dealt[1::2, ::-1]
    return dealt.sum(axis=0)


class FlashAttentionSm90a(FlashAttention):
    """The variant the pipeline renders for sm_90a (wgmma, mbarriers, warpgroups: PTX ISA 8.0)."""

    target = "sm_90a"
    splits_kv = False  # split_kv_len is the mma.sync kernel's: this one ignores it
    ptx_version = (8, 0)

    @property
    def template(self) -> str:
        return "flash_attention_sm90a.ptx.j2"

    @property
    def plan(self) -> Sm90aPlan:
        return sm90a_plan(self.config, **self.config.sm90a.model_dump())

    def geometry(self) -> Geometry:
        return sm90a_geometry(self.config, self.plan)

    @property
    def block_shape(self) -> tuple[int, int]:
        return self.plan.block_m, self.plan.block_n

    def cta_work(self, scalars):
        """As flash_attention's; a persistent CTA's is the sum over the query blocks it walks."""
        plan, work = self.plan, super().cta_work(scalars)
        if not plan.persistent:
            return work
        if work is None:      # every block alike
            work = np.ones(ceil_div(scalars["seq_len"], plan.block_m) * self.config.num_heads, np.int64)
        return persistent_work(work, min(len(work), plan.sm_count))

    def launch_note(self) -> str:
        plan = self.plan
        rows = (f"at most {plan.sm_count} CTAs, each walking query blocks of {plan.block_m} rows of one head "
                "(heaviest first, dealt forward and back by round)" if plan.persistent
                else f"one CTA per {plan.block_m} query rows of one head")
        return (f"sm_90a: {rows}, {plan.consumers} consumer warpgroups "
                f"and {plan.producer_warps} producer warp(s), {plan.block_n}-key tiles in {plan.stages} stages")

    def template_vars(self) -> dict:
        return sm90a_template_vars(self.config, self.plan)

    def tensor_maps(self) -> tuple[TensorMap, ...]:
        """With tma: q, k and v as [heads, seq_len, head_dim] boxes of one 64-element (128-byte)
        panel x a tile's rows of one head, 128-byte swizzled: a copy lands as one panel of the
        wgmma layout, rows past seq_len zero-filled."""
        plan = self.plan
        if not plan.tma:
            return ()
        return (TensorMap("q_map", "q", (64, plan.block_m, 1), 128),
                TensorMap("k_map", "k", (64, plan.block_n, 1), 128),
                TensorMap("v_map", "v", (64, plan.block_n, 1), 128))

    def static_shared(self) -> int:
        return self.plan.static_shared

    def ring_bytes(self) -> int:
        """The K and V rings: every stage of each (Q, once a block, left out)."""
        return 2 * self.plan.stages * self.plan.tile_bytes

    def error_bound(self, param, arrays, reference, scalars):
        """attention_error_bound of this kernel's arithmetic: l adds the f32 P, P V the rounded P."""
        c = self.config
        q, k, v = (to_float64(arrays[name], c.dtype) for name in ("q", "k", "v"))
        return attention_error_bound(q, k, v, self.scale, c.causal, c.dtype, c.out_dtype, self.plan.block_n,
                                     rounded_sum=False)
