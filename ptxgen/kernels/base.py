"""What every kernel kind declares: config model, parameters, launch, reference, traffic."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..abi import Geometry, Launch, Param, TensorMap, ceil_div, round_up  # noqa: F401  (the kinds' vocabulary)

# A kernel name becomes the PTX entry and file names, so it must be a plain identifier; PTX
# takes a leading underscore only before at least one more character.
Identifier = Field(pattern=r"^([A-Za-z][A-Za-z0-9_]{0,63}|_[A-Za-z0-9_]{1,63})$")
# The GPU a kind sizes its grid or split rule for unless the spec says (`sm_count`): an H100 SXM.
SM_COUNT = 132
SmCount = Field(default=SM_COUNT, ge=1, le=1024)

# Relative L2 error allowed against the float64 reference by default, for f32 results only:
# f32 dot products and reductions of up to ~10^4 terms (the Q4_K GEMVs and decode attention,
# measured at <= 5e-7). Every kind with an f16/bf16 result, and every kind whose error analysis
# gives less, derives its own (Kind.tolerance, Kind.error_bound).
F32_TOLERANCE = 1e-5


F32_MIN_NORMAL = 2.0**-126

# Programmatic dependent launch (PDL, Hopper and later). A kernel whose config sets `pdl` gets a
# PTX variant for PDL_TARGET (griddepcontrol is PTX ISA 7.8, sm_90) that lets the next kernel of
# its stream start early (griddepcontrol.launch_dependents, at its start) and waits for the
# previous one (griddepcontrol.wait) before it touches any array but the `stable` ones (a
# model's weights); the launcher gives that variant CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
# SERIALIZATION, so its CTAs start, and load weights, while the previous kernel drains. Other
# archs below it keep the portable PTX, launched as before (later ones run the sm_90 PTX: see
# compiled.serving_variant). Every thread passes the wait before it ends:
# a grid whose CTAs all ended without waiting could complete before its own predecessor, and its
# dependent would not wait for that one.
PDL_TARGET = "sm_90"
PDL_PTX_VERSION = (7, 8)


def f32_rounded(value: float) -> float:
    """value rounded to the nearest f32 (inf beyond the f32 range)."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def list_as_tuple(value: Any) -> Any:
    """TOML and YAML give lists; strict validation takes only tuples for tuple fields (use as
    Annotated[tuple[...], BeforeValidator(list_as_tuple)])."""
    return tuple(value) if isinstance(value, list) else value


class KernelConfig(BaseModel):
    """Fields common to every kernel entry of a spec; each kind adds its own. Values are taken
    strictly: "4096", 4096.0 or true is no integer (an integer is a fine float)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Identifier

    @field_validator("*")
    @classmethod
    def normal_f32(cls, value: Any) -> Any:
        """Every float field ends up an f32 in the kernel (an immediate, or math on one): it must
        round to a finite, normal f32 (1e-50 would become 0, 1e300 inf: NaN outputs)."""
        if isinstance(value, float) and value != 0:
            rounded = f32_rounded(value)
            if not math.isfinite(rounded) or abs(rounded) < F32_MIN_NORMAL:
                raise ValueError(f"expected a finite, normal f32 number (magnitude from {F32_MIN_NORMAL:.4g} to "
                                 f"3.403e+38), got {value!r}")
        return value


class PdlConfig(KernelConfig):
    """A kind that can run under programmatic dependent launch (PDL_TARGET)."""

    # Where the spec has an arch of PDL_TARGET or later, the PTX made for PDL_TARGET overlaps the
    # previous kernel of the stream on those archs (kernels.rendered_targets); older archs keep
    # the portable PTX.
    pdl: bool = False


@dataclass(frozen=True)
class Traffic:
    """Minimum bytes a call must move to/from global memory and the flops it must do."""

    bytes: int
    flops: int


@dataclass(frozen=True)
class TailStep:
    """One step of a DependentTail: `round_trips` global-memory round trips, each waiting for the
    one before. `every_cta`: every CTA waits through it (else only the CTA that completes its
    group, e.g. a merge). `returns_value`: the step waits for loads or a value-returning atomic,
    which the performance model's load rounds already count; False for a wait they cannot see
    (a release waiting for the CTA's stores to be acknowledged). `overlapped_bytes`: loads
    issued before the step and still in flight through it (a persistent kernel's next phase's
    first weights, issued before a grid barrier's wait), streamed while its round trips run."""

    what: str
    round_trips: int
    every_cta: bool
    returns_value: bool
    overlapped_bytes: int = 0


@dataclass(frozen=True)
class DependentTail:
    """Work a launch does only after its streamed bytes are consumed, one step after another up
    to its end (a split-KV count-in and merge), or between the phases of a persistent kernel (its
    grid barriers): neither the bytes nor other warps overlap it, so the performance model adds
    it to both of its estimates. `group_ctas`: the CTAs whose last one
    runs the final steps (the first `group_ctas` CTAs in x, y, z order form a group), so that the
    model's interpreter sample holds a whole group."""

    steps: tuple[TailStep, ...]
    group_ctas: int

    @property
    def round_trips(self) -> int:
        return sum(step.round_trips for step in self.steps)

    @property
    def counted_by_every_warp(self) -> int:
        """Round trips of the tail that every warp's load rounds already hold."""
        return sum(step.round_trips for step in self.steps if step.every_cta and step.returns_value)


# The performance model makes a call's sample inputs whole (float64 references of some of them too):
# a call moving more than this is counted at smaller configs (Kind.model_scaling) or not at all
# (20M rows of a 256-wide RMSNorm would take 38 GiB; the Qwen3-8B lm_head's 511 MB, whose queue's
# persistent CTAs cannot be sampled, about 2 minutes whole).
MAX_COUNTED_BYTES = 256 << 20


@dataclass(frozen=True)
class ModelScaling:
    """How the performance model counts a launch too large to interpret, from smaller configs of
    the same kind that repeat its work: the counts of `base`, plus for each (config, times) of
    `steps` `times` the difference between that config's counts and base's (a persistent
    decoder: one layer, plus one two-layer config per distinct kind of later layer; a GEMV: one
    round of rows a CTA, plus the rounds after it), the launch's totals (not its per-warp
    figures) then times `cta_scale` (a GEMV counted on fewer CTAs than it launches, each doing
    the same work). With `dealt`, the steps' work is dealt from a queue, which evens the warps
    out as it goes: the slowest warp stays as far above the mean as in the last step's config
    (a decoder's layers, one after another behind grid barriers, each add their own slowest
    warp). `note` says what was counted."""

    base: object  # a KernelConfig
    steps: tuple[tuple[object, float], ...]
    note: str
    cta_scale: float = 1.0
    dealt: bool = False


@dataclass(frozen=True)
class Call:
    """One launch of a multi-kernel step (a fused kind's work done by the separate kinds).

    `args` binds each array parameter of `kernel` to a buffer of the step: a name, or (name, i)
    for slice i along the buffer's first axis. A bound buffer holds exactly the parameter's
    elements and dtype (its shape may differ: f32[hidden] serves as f32[1, hidden]).
    """

    kernel: KernelConfig
    args: dict[str, str | tuple[str, int]]
    scalars: dict[str, int]


class Kind:
    """Base of all kernel kinds. A subclass in ptxgen/kernels/<kind>.py is the kind."""

    name: ClassVar[str]
    Config: ClassVar[type[KernelConfig]]
    # Oldest PTX ISA whose instructions the template uses.
    ptx_version: ClassVar[tuple[int, int]] = (7, 0)

    # None for a kind's portable PTX. A subclass that sets an arch-specific target (e.g. "sm_90a")
    # is that kind's variant for it: when a spec lists the target, the pipeline renders the
    # variant's own PTX (its template, geometry and resources) for that arch, and every other
    # arch keeps the portable PTX. Parameters, reference and traffic are the kind's.
    target: ClassVar[str | None] = None
    # True for the PDL variant of a kind whose Config is a PdlConfig (the registry makes it).
    pdl: ClassVar[bool] = False
    # Where that variant waits for the previous kernel: at the start of the body (base.ptx.j2),
    # or, if True, where the kind's template puts it (after loads of `stable` arrays only).
    pdl_wait_in_body: ClassVar[bool] = False
    # Config fields that give the problem's size rather than how it is computed (a GEMV's n and k):
    # bench.size_fits draws one line through kernels that differ only in these.
    shape_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: KernelConfig):
        self.config = config

    @classmethod
    def size_fields(cls) -> set[str]:
        """The fields that size a problem: the config's required ones (the shapes and heads a spec
        must name) and shape_fields."""
        return ({name for name, field in cls.Config.model_fields.items() if field.is_required()} - {"name", "kind"}
                | set(cls.shape_fields))

    @property
    def template(self) -> str:
        return f"{self.name}.ptx.j2"

    # --- declarations every kind provides -------------------------------------------------
    def params(self) -> list[Param]:
        raise NotImplementedError

    def geometry(self) -> Geometry:
        """Grid, block and dynamic shared memory as formulas of the runtime scalars (ptxgen.abi)."""
        raise NotImplementedError

    def launch_note(self) -> str:
        """What the geometry means, for people (show, the manifest, the C header)."""
        return ""

    def tensor_maps(self) -> tuple[TensorMap, ...]:
        """The tensor maps the entry takes after params() (abi.TensorMap; the launchers encode them)."""
        return ()

    def template_vars(self) -> dict[str, Any]:
        raise NotImplementedError

    def reference(self, arrays: dict[str, np.ndarray], scalars: dict[str, int]) -> dict[str, np.ndarray]:
        """Float64 results of every written parameter, from the stored input arrays."""
        raise NotImplementedError

    def traffic(self, scalars: dict[str, int]) -> Traffic:
        raise NotImplementedError

    def sample_inputs(self, rng: np.random.Generator, scalars: dict[str, int]) -> dict[str, np.ndarray]:
        """Random non-zero inputs in realistic ranges for every read parameter."""
        raise NotImplementedError

    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        """Inclusive range of every runtime scalar the launcher accepts. Names that are not PTX
        parameters are optional size hints (used for sample inputs and traffic)."""
        raise NotImplementedError

    def example_scalars(self) -> dict[str, int]:
        """Runtime scalars of a typical call (show, bench)."""
        raise NotImplementedError

    def verify_scalars(self) -> list[dict[str, int]]:
        """Small runtime sizes of the same compiled PTX, for the interpreter."""
        return [self.example_scalars()]

    # --- optional hooks ------------------------------------------------------------------------
    def torch_peer(self, torch, tensors: dict, scalars: dict) -> Callable | dict[str, Callable] | None:
        """bench's peers for this kernel, or None. `tensors` holds every parameter the kernel reads
        (role in / inout) as a CUDA tensor keyed by parameter name (f32 -> float32, f16 -> float16,
        bf16 -> bfloat16, u8 -> uint8, u32 -> int32 with the same bits); `scalars` the runtime
        scalars. Each callable (a dict keys them by a label such as "torch sdpa") computes the
        kernel's result with torch or a library on top of it and returns a tensor with the elements
        of the kind's first written parameter; bench times it on the kernel's stream and compares
        it with the float64 reference when that is cheap."""
        return None

    def dependent_tail(self, scalars: dict[str, int]) -> DependentTail | None:
        """The launch's dependent tail at these scalars (see DependentTail), or None where the
        launch ends when its streaming ends (the performance model then takes the slowest warp's
        extra load rounds from the PTX alone)."""
        return None

    def cta_work(self, scalars: dict[str, int]) -> np.ndarray | None:
        """Relative work of each CTA of the launch at these scalars, in the order the hardware hands
        them out (linear id, x fastest), where CTAs differ (a causal prefill's query blocks); None
        where every CTA does the same. The performance model scales a sample of CTAs by it and
        list-schedules it over the resident CTA slots (perf.dispatch_balance)."""
        return None

    def ring_bytes(self) -> int:
        """Bytes a CTA keeps in flight in copies that complete on an mbarrier (an sm_90a
        producer's ring of shared-memory stages), which no thread of it waits for: at most the
        ring, all of its stages being filled. The performance model adds them to the bytes its
        threads' own loads keep in flight. Default: none."""
        return 0

    def model_scaling(self) -> ModelScaling | None:
        """For a config the interpreter cannot run whole (its weights too many): the smaller
        configs the performance model counts instead (ModelScaling); None: count this one."""
        return None

    def stand_ins(self) -> list[tuple[object, list[dict[str, int]], str]]:
        """For a config with no verify sizes (too large to interpret): smaller configs of the same
        code that verify checks in its place, each with its sizes and what it stands for.
        Default: none."""
        return []

    def forced(self, inputs: dict[str, np.ndarray], arrays: dict[str, np.ndarray],
               scalars: dict[str, int]) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
        """Results graded a second time against a reference fed the launch's own roundings
        ("teacher forcing": `arrays` are its results), where the free-running reference can part
        from a right kernel by more than a wrong one would: label -> (the results as float64, their
        float64 reference, the relative L2 error allowed). Default: none."""
        return {}

    def separate_step(self, scalars: dict) -> tuple[list[Param], list[Call]] | None:
        """For a kind that fuses other kinds' work: the same work as launches of the separate kinds
        (Calls over the kernel's own buffers plus the returned temporaries), or None. bench runs
        both from the same state, compares the first written parameter, and times the separate
        kernels one by one and as one CUDA graph."""
        return None

    # --- derived ---------------------------------------------------------------------------
    def launch(self, scalars: dict[str, int]) -> Launch:
        return self.geometry().at(scalars)

    def launch_rule(self) -> str:
        """The launch geometry as a formula of the runtime scalars, with what it means."""
        note = self.launch_note()
        return self.geometry().describe() + (f": {note}" if note else "")

    def resources(self) -> tuple[int, int]:
        """Threads per CTA and shared bytes (static + dynamic, at most) of this config."""
        launch = self.launch(self.example_scalars())
        return launch.threads_per_cta, launch.dynamic_shared + self.static_shared()

    def static_shared(self) -> int:
        return 0

    def unbuildable(self) -> str | None:
        """Why this config has no kernel of its own though it is valid (it still describes work,
        e.g. persistent_decoder's separate step over weight types its fused kernel lacks); None
        when it can be built. Spec validation refuses such an entry with this message."""
        return None

    def tolerance(self, param: Param) -> float:
        """Relative L2 error allowed for written `param` against the float64 reference (over the
        elements `rewritten` names, for an inout parameter that has them), from the kind's error
        analysis. The default covers f32 results only (F32_TOLERANCE)."""
        if param.dtype != "f32":
            raise NotImplementedError(f"{self.name}: no tolerance derived for {param.dtype} output {param.name!r}")
        return F32_TOLERANCE

    def error_bound(self, param: Param, arrays: dict[str, np.ndarray], reference: np.ndarray,
                    scalars: dict[str, int]) -> np.ndarray | None:
        """Per-element bound on |result - reference| for written `param` (float64, the reference's
        shape), from the kind's error analysis; None where the kind gives only `tolerance`.
        `arrays` are the launch's arrays: read only its read-only parameters (they hold the inputs);
        `scalars` its runtime scalars."""
        return None

    def error_scale(self, param: Param, arrays: dict[str, np.ndarray], reference: np.ndarray,
                    scalars: dict[str, int]) -> np.ndarray | None:
        """Per-element magnitude that `tolerance`'s relative L2 error is measured against, where the
        kind's analysis states it against something other than the reference itself (None: the
        reference). Arguments as in error_bound."""
        return None

    def rewritten(self, param: Param, arrays: dict[str, np.ndarray], scalars: dict[str, int]) -> tuple | None:
        """For an inout parameter: the numpy index of the elements the kernel writes without reading
        them first (kv_append's row pos), or None when it reads and rewrites every element (rope's
        x). Those elements start NaN-poisoned (runner.prepare_arrays) and are graded against the
        reference; every other element must keep its input bits (verify.compare). `arrays` as in
        error_bound."""
        return None

    def unrested(self, param: Param, array: np.ndarray) -> int | None:
        """For a workspace: how many of its words a launch left other than the next launch needs
        them (counters and queues back at 0), or None where the kind claims nothing of it (split
        partials that every launch overwrites before reading). Default: counters of unsigned
        integers are back at 0, floats are scratch, a `timeline` holds stamps for the host."""
        if param.name == "timeline":
            return None
        return int(np.count_nonzero(array)) if array.dtype.kind == "u" else None

    def param(self, name: str) -> Param:
        return next(p for p in self.params() if p.name == name)
