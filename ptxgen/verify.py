"""Check kernels against their float64 references: the ground truth of ptxgen."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .compiled import CompiledKernel
from .dtypes import to_float64
from .runner import launch_arrays, prepare_arrays, run, running_arch


@dataclass(frozen=True)
class Check:
    kernel: str
    param: str
    scalars: dict
    shape: tuple
    error: float  # relative L2 error against the float64 reference (over the graded elements; Kind.error_scale)
    tolerance: float
    unwritten: int  # graded elements still NaN-poisoned (or NaN for another reason)
    changed: int = 0  # elements the kernel must keep (outside Kind.rewritten) whose bits changed
    # Largest |result - reference| / the kind's per-element bound (Kind.error_bound); None: no bound.
    element_error: float | None = None
    again: bool = False  # a second launch at the same size, on other inputs and the workspaces the first left
    grid: int | None = None  # that launch at a smaller 1-D grid (verify_sizes: an any_grid launch)
    unrested: str = ""  # workspace words the launch left other than the next launch needs (Kind.unrested)

    @property
    def failure(self) -> str:
        """Why the check fails, or "" when it passes."""
        if self.unwritten:
            return f"{self.unwritten} unwritten"
        if self.changed:
            return f"{self.changed} kept elements changed"
        if not self.error <= self.tolerance:
            return f"rel. L2 error {self.error:.3e} > {self.tolerance:.3e}"
        if self.element_error is not None and not self.element_error <= 1:
            return f"an element {self.element_error:.3g}x its error bound"
        if self.unrested:
            return f"workspace not left ready for the next launch: {self.unrested}"
        return ""

    @property
    def passed(self) -> bool:
        return not self.failure

    @property
    def worst_ratio(self) -> float:
        """The larger of the error over its tolerance and the worst element over its bound (within
        both: at most 1); inf where either is NaN, or for an error where the tolerance is 0 (an
        exact check: argmax's index, a runtime value past its limit)."""
        over = 0.0 if self.error == 0 else self.error / self.tolerance if self.tolerance else math.inf
        ratios = [over, *([] if self.element_error is None else [self.element_error])]
        return max(math.inf if math.isnan(ratio) else ratio for ratio in ratios)

    def to_json(self) -> dict:
        """verify --json's check: what its table row says, NaN and infinities as null (JSON has none)."""
        return {"output": self.param, "shape": list(self.shape),
                "scalars": {name: int(value) for name, value in self.scalars.items()}, "again": self.again,
                "grid": self.grid, "error": json_number(self.error), "tolerance": self.tolerance,
                "element_error": json_number(self.element_error), "worst_ratio": json_number(self.worst_ratio),
                "passed": self.passed, "failure": self.failure or None}


def json_number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def relative_l2(result: np.ndarray, reference: np.ndarray, scale: np.ndarray | None = None) -> float:
    """||result - reference|| / ||scale|| (default: the reference), or the absolute norm when that
    is 0."""
    difference = np.linalg.norm((result - reference).ravel())
    norm = np.linalg.norm((reference if scale is None else scale).ravel())
    return float(difference / norm) if norm > 0 else float(difference)


def worst_ratio(error: np.ndarray, bound: np.ndarray) -> float:
    """max |error| / bound (an error where the bound is 0 counts as infinitely over it)."""
    error = np.abs(error)
    if error.size == 0:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(error == 0, 0.0, error / bound)
    return float(np.max(ratio))


def changed_count(result: np.ndarray, expected: np.ndarray, kept: np.ndarray) -> int:
    """Elements under `kept` whose value differs (-0.0 from 0.0 too; any NaN equals any NaN)."""
    same = ((result == expected) & (np.signbit(result) == np.signbit(expected))) | (np.isnan(result) & np.isnan(expected))
    return int(np.count_nonzero(~same & kept))


def ran_target(compiled: CompiledKernel, backend: str, arch: str | None) -> str:
    """The PTX target whose code a launch ran: the interpreter's `arch` variant, or on the device
    the cubin (or JIT-compiled PTX) that fits its GPU."""
    return compiled.variant(running_arch(backend, arch)).target


def compare(compiled: CompiledKernel, arrays: dict[str, np.ndarray], reference: dict[str, np.ndarray],
            scalars: dict, target: str | None = None) -> list[Check]:
    """One Check per written parameter, comparing the launch's arrays (made by the PTX of
    `target`, default the portable one) to the reference. An inout parameter whose kind names the
    elements it rewrites (Kind.rewritten) is graded on those; its other elements must equal their
    reference (the input) exactly."""
    kind = compiled.definition_for(target)
    unrested = ", ".join(f"{count} word{'s' if count > 1 else ''} of {param.name}" for param in compiled.workspaces
                         if (count := kind.unrested(param, arrays[param.name])))
    checks = []
    for param in compiled.params:
        if not param.written:
            continue
        result = to_float64(arrays[param.name], param.dtype)
        expected = np.asarray(reference[param.name], dtype=np.float64)
        bound = kind.error_bound(param, arrays, expected, scalars)
        scale = kind.error_scale(param, arrays, expected, scalars)
        region = kind.rewritten(param, arrays, scalars) if param.role == "inout" else None
        changed = 0
        if region is not None:
            kept = np.ones(result.shape, bool)
            kept[region] = False
            changed = changed_count(result, expected, kept)
            result, expected = result[region], expected[region]
            bound = None if bound is None else bound[region]
            scale = None if scale is None else scale[region]
        unwritten = int(np.count_nonzero(~np.isfinite(result)))
        finite = np.where(np.isfinite(result), result, 0.0)
        checks.append(Check(compiled.name, param.name, dict(scalars), arrays[param.name].shape,
                            relative_l2(finite, expected, scale), kind.tolerance(param), unwritten, changed,
                            None if bound is None else worst_ratio(finite - expected, bound), unrested=unrested))
    return checks


def forced_checks(compiled: CompiledKernel, inputs: dict[str, np.ndarray], arrays: dict[str, np.ndarray],
                  scalars: dict, target: str | None = None) -> list[Check]:
    """The kind's teacher-forced gradings of a launch (Kind.forced), one Check each."""
    checks = []
    for label, (result, reference, tolerance) in compiled.definition_for(target).forced(inputs, arrays, scalars).items():
        finite = np.where(np.isfinite(result), result, 0.0)
        checks.append(Check(compiled.name, f"{label} (teacher-forced)", dict(scalars), result.shape,
                            relative_l2(finite, reference), tolerance, int(np.count_nonzero(~np.isfinite(result)))))
    return checks


def verify_plan(compiled: CompiledKernel) -> list[tuple[str, CompiledKernel, list[dict]]]:
    """What verify launches for a kernel, as (label, kernel, sizes): the kernel at its kind's
    verify sizes, or where it has none (too large to interpret) each of its kind's stand-ins
    (Kind.stand_ins) built for the same archs; with neither, the kernel and no sizes."""
    kind = compiled.definition
    sizes = kind.verify_scalars()
    stand_ins = [] if sizes else kind.stand_ins()
    if not stand_ins:
        return [(compiled.name, compiled, sizes)]
    from .pipeline import compile_kernel

    archs = tuple(compiled.binaries)
    return [(f"{compiled.name}: {note}", compile_kernel(config, archs or ("sm_80",), until="cubin" if archs else "ptx"),
             stand_in_sizes) for config, stand_in_sizes, note in stand_ins]


def verify_kernel(compiled: CompiledKernel, scalars: dict, seed: int = 0, backend: str = "emulator",
                  sanitize: bool = True, arch: str | None = None, contract: bool = False) -> list[Check]:
    """Random non-zero inputs, poisoned outputs, one launch on zeroed workspaces, compare to the
    reference (and the kind's teacher-forced references). `contract`: verify_launch's."""
    return verify_launch(compiled, scalars, seed, backend, sanitize, arch, contract=contract)[0]


def verify_launch(compiled: CompiledKernel, scalars: dict, seed: int = 0, backend: str = "emulator",
                  sanitize: bool = True, arch: str | None = None, workspaces: dict[str, np.ndarray] | None = None,
                  grid: int | None = None, contract: bool = False) -> tuple[list[Check], dict[str, np.ndarray]]:
    """verify_kernel with the workspaces an earlier launch left (None: zeroed, as allocated), at
    `grid` CTAs if given (runner.launch_arrays); also returns the workspaces this launch leaves.
    `contract`: the interpreter fuses the mul/add pairs ptxas may contract (runner.launch_arrays)."""
    kind = compiled.definition
    inputs = kind.sample_inputs(np.random.default_rng(seed), scalars)
    arrays = run(compiled, {**inputs, **(workspaces or {})}, scalars, backend=backend, sanitize=sanitize, arch=arch,
                 grid=grid, contract=contract)
    target = ran_target(compiled, backend, arch)
    checks = compare(compiled, arrays, kind.reference(inputs, scalars), scalars, target)
    checks += forced_checks(compiled, inputs, arrays, scalars, target)
    return checks, {param.name: arrays[param.name] for param in compiled.workspaces}


def past_limits(compiled: CompiledKernel) -> list[tuple[str, int]]:
    """Values past the launcher's limits that no array's size depends on, as a caller that skips
    the launcher may pass them (a replayed CUDA graph whose device-side length went bad): each
    such runtime scalar's limit + 1 and its type's largest value, and the same for every
    device-read length (Param.values)."""
    shaped = {dim for param in compiled.params for dim in param.shape if isinstance(dim, str)}
    cases = []
    for param in compiled.params:
        if param.is_array and param.values is not None:
            high = param.values[1]
        elif not param.is_array and param.name in compiled.scalar_limits and param.name not in shaped:
            high = compiled.scalar_limits[param.name][1]
        else:
            continue
        top = int(np.iinfo(f"uint{param.dtype[1:]}").max)  # lengths and scalars are u32 or u64
        cases += [(param.name, value) for value in dict.fromkeys((high + 1, top)) if value <= top]
    return cases


def verify_past_limits(compiled: CompiledKernel, scalars: dict, seed: int = 0, arch: str | None = None) -> list[Check]:
    """The kernel in the interpreter (its sanitizer on) at `scalars`' geometry with each of
    past_limits' values in turn: it must not touch a byte outside its arrays (a sanitizer finding
    raises); each launch that stays in bounds is a passing Check."""
    checks = []
    inputs = compiled.definition.sample_inputs(np.random.default_rng(seed), scalars)
    for name, value in past_limits(compiled):
        arrays = prepare_arrays(compiled, inputs, scalars)
        past = dict(scalars)
        if name in arrays:
            arrays[name][...] = value
        else:
            past[name] = value
        launch_arrays(compiled, arrays, past, arch=arch, geometry_at=scalars)
        checks.append(Check(compiled.name, f"{name}={value}: past its limit, in bounds", dict(scalars), (), 0.0, 0.0, 0))
    return checks


def verify_sizes(compiled: CompiledKernel, sizes: list[dict], seed: int = 0, call=None, smaller_grids: bool = True,
                 **options) -> Iterator[list[Check]]:
    """The checks of verify_launch at each of `sizes` in order, a list a launch, each launch on the
    workspaces the one before left (zeroed once, the kernel must leave them ready for the next
    launch: an engine reuses its counters and partials, as a CUDA graph does); a kernel with
    workspaces and one size is launched twice, the second time on other inputs; a launch correct
    with any 1-D grid is launched again at the last size on smaller grids (unless not
    `smaller_grids`: bench checks what it times); in the interpreter, the last size's launch
    again with each value past the launcher's limits (verify_past_limits). `call(function,
    *args, **kwargs)` runs each launch (a DeviceWorker's call; default: here). `options`:
    verify_launch's backend, sanitize, arch, contract."""
    cases = [(scalars, seed, False, None) for scalars in sizes]
    if compiled.workspaces and len(sizes) == 1:
        cases.append((sizes[0], seed + 1, True, None))
    if sizes and smaller_grids:
        launch = compiled.launch(sizes[-1], options.get("arch"))
        if launch.any_grid and not launch.empty and launch.grid[0] > 1:
            # As a GPU with fewer SMs shrinks it: 9/11 (an H100's 132 CTAs to an A100's 108) and a
            # third (more trips of every grid-stride loop), each with other queue rounds than the
            # full grid (mutation testing: either grid alone missed a bug the other caught).
            full = launch.grid[0]
            cases += [(sizes[-1], seed + 2 + i, True, grid) for i, grid in
                      enumerate(dict.fromkeys(max(1, g) for g in (full * 9 // 11, full // 3)))]
    workspaces = None
    for scalars, case_seed, again, grid in cases:
        checks, workspaces = (call or _here)(verify_launch, compiled, scalars, case_seed, workspaces=workspaces,
                                             grid=grid, **options)
        yield [dataclasses.replace(check, again=True, grid=grid) for check in checks] if again else checks
    sanitized = options.get("backend", "emulator") == "emulator" and options.get("sanitize", True)
    if sizes and sanitized and past_limits(compiled):
        yield (call or _here)(verify_past_limits, compiled, sizes[-1], seed, options.get("arch"))


def _here(function, *args, **kwargs):
    return function(*args, **kwargs)
