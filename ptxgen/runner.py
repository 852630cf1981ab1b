"""Run one compiled kernel once: check inputs against its parameters, poison outputs, launch, collect.

The same path serves `ptxgen run`, `ptxgen verify`, tests and benches, on either backend.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from .compiled import CompiledKernel
from .dtypes import DTYPES, poison
from .errors import LaunchError

if TYPE_CHECKING:  # annotations only: the API's interpreter path imports this module without pydantic
    from .kernels.base import Call

BACKENDS = ("emulator", "device")


def check_input_names(compiled: CompiledKernel, inputs: dict[str, np.ndarray]) -> None:
    """Every input names an array parameter (a runtime scalar comes apart from the arrays)."""
    known = {p.name for p in compiled.params}
    for key, array in inputs.items():
        if key not in known:
            raise LaunchError(f"{compiled.name}: unknown input {key!r} (parameters: {', '.join(sorted(known))})")
        if key in compiled.scalar_limits:
            given = f"{array.dtype}{list(array.shape)}" if isinstance(array, np.ndarray) else type(array).__name__
            raise LaunchError(f"{compiled.name}: input {key!r} is a runtime scalar: expected one integer (a 0-d "
                              f"array), got {given}")


def check_inputs(compiled: CompiledKernel, inputs: dict[str, np.ndarray], scalars: dict[str, int],
                 complete: bool = True) -> None:
    """Every read array present (unless not `complete`: more come later), and every array given,
    with the exact dtype and shape (one the kernel only writes, e.g. from an earlier run's
    outputs, is checked and not used)."""
    name = compiled.name
    for param in compiled.arrays + tuple(p for p in compiled.params if p.role == "workspace"):
        if param.name not in inputs:
            if param.read and complete:
                raise LaunchError(f"{name}: input {param.name!r} is missing: expected {param.describe()}")
            continue
        array = inputs[param.name]
        expected_dtype = DTYPES[param.dtype].numpy
        expected_shape = param.concrete_shape(scalars)
        if not isinstance(array, np.ndarray) or array.dtype != expected_dtype or array.shape != expected_shape:
            given = f"{array.dtype}{list(array.shape)}" if isinstance(array, np.ndarray) else type(array).__name__
            raise LaunchError(
                f"{name}: input {param.name!r}: expected {expected_dtype}{list(expected_shape)} "
                f"({param.describe()}), got {given}"
            )


def check_arguments(compiled: CompiledKernel, inputs: dict[str, np.ndarray], scalars: dict[str, int],
                    complete: bool = True) -> None:
    """The inputs' names, the runtime scalars, then the inputs' dtypes and shapes (check_inputs;
    `complete` too)."""
    check_input_names(compiled, inputs)
    compiled.check_scalars(scalars)
    check_inputs(compiled, inputs, scalars, complete)


def prepare_arrays(compiled: CompiledKernel, inputs: dict[str, np.ndarray],
                   scalars: dict[str, int]) -> dict[str, np.ndarray]:
    """Copies of the inputs, NaN-poisoned outputs, workspaces zeroed (or as `inputs` give them: what
    an earlier launch left there): one array per array param. The elements of an inout parameter
    that its kind says the kernel rewrites without reading them (Kind.rewritten) are poisoned too,
    so one the kernel fails to write shows."""
    check_arguments(compiled, inputs, scalars)
    kind = compiled.definition
    arrays = {}
    for param in compiled.params:
        if param.read:
            arrays[param.name] = np.ascontiguousarray(inputs[param.name]).copy()
        elif param.role == "out":
            arrays[param.name] = poison(param.concrete_shape(scalars), param.dtype)
        elif param.role == "workspace":
            given = inputs.get(param.name)
            arrays[param.name] = (np.zeros(param.concrete_shape(scalars), dtype=DTYPES[param.dtype].numpy)
                                  if given is None else np.ascontiguousarray(given).copy())
    compiled.check_values(arrays)
    for param in compiled.params:
        region = kind.rewritten(param, arrays, scalars) if param.role == "inout" else None
        if region is not None:
            arrays[param.name][region] = poison(arrays[param.name][region].shape, param.dtype)
    return arrays


def running_arch(backend: str, arch: str | None) -> str | None:
    """The arch whose variant (CompiledKernel.variant) a launch runs: on the device its own (it
    loads the cubin that fits it: sm_90a's on an H100, if built), in the emulator `arch` (None:
    the portable PTX)."""
    if backend != "device":
        return arch
    from .device import session

    return session().arch


def launch_arrays(compiled: CompiledKernel, arrays: dict[str, np.ndarray], scalars: dict[str, int],
                  backend: str = "emulator", sanitize: bool = True, arch: str | None = None,
                  grid: int | None = None, geometry_at: dict[str, int] | None = None, launches: int = 1,
                  contract: bool = False) -> None:
    """One launch over host arrays (every array parameter, workspaces included), updated in place,
    with the geometry of the variant that runs (running_arch); `grid`: that many CTAs instead, for
    a launch correct with any 1-D grid (Launch.any_grid), as a GPU with fewer SMs shrinks it;
    `geometry_at`: the geometry of these (checked) scalars, while the kernel gets `scalars` as
    they are (verify's launches past the launcher's limits); `launches`: that many on the same
    arrays, back to back (on a device, one stream with no synchronisation between them, as an
    engine queues them: a programmatic dependent launch overlaps the one before); `contract`: the
    interpreter runs the mul/add pairs ptxas may contract as fused (interp.contraction)."""
    if backend not in BACKENDS:
        raise LaunchError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    arch = running_arch(backend, arch)
    if backend == "device":
        from .device import session

        session().kernel(compiled)  # loaded first: a GPU none of its code runs on is named
    launch = compiled.launch(scalars if geometry_at is None else geometry_at, arch)
    if launch.empty:
        return
    if grid is not None:
        if not launch.any_grid or not 1 <= grid <= launch.grid[0]:
            raise LaunchError(f"{compiled.name}: a grid of {grid} CTAs instead of {launch.grid} needs a launch "
                              "correct with any smaller 1-D grid")
        launch = dataclasses.replace(launch, grid=(grid, 1, 1))
    args = compiled.args(arrays, scalars)
    if backend == "emulator":
        from .interp import launch as interpret

        variant = compiled.variant(arch)
        for _ in range(launches):
            interpret(variant.ptx, compiled.name, launch.grid, launch.block, args,
                      dynamic_shared=launch.dynamic_shared, sanitize=sanitize, kernel_name=compiled.name,
                      stable=compiled.stable, written=compiled.written, tensor_maps=variant.tensor_maps,
                      contract=contract)
    else:
        from .device import run_on_device

        run_on_device(compiled, launch, args, launches)


def run(compiled: CompiledKernel, inputs: dict[str, np.ndarray], scalars: dict[str, int],
        backend: str = "emulator", sanitize: bool = True, arch: str | None = None,
        grid: int | None = None, launches: int = 1, contract: bool = False) -> dict[str, np.ndarray]:
    """Launch `compiled` once (or `launches` times back to back: launch_arrays') on fresh copies of
    `inputs` (`grid`, `contract`: launch_arrays'); return every array parameter afterwards."""
    arrays = prepare_arrays(compiled, inputs, scalars)
    launch_arrays(compiled, arrays, scalars, backend, sanitize, arch, grid, launches=launches, contract=contract)
    return arrays


def bind(call: Call, param, buffers: dict[str, np.ndarray]) -> tuple[str, np.ndarray]:
    """The buffer's name and the view of it (or of a slice) that `call` binds to an array
    parameter, shaped like the parameter."""
    binding = call.args[param.name]
    name, index = (binding, None) if isinstance(binding, str) else binding
    if name not in buffers:
        raise LaunchError(f"{call.kernel.name}: {param.name} is bound to {name!r}, which the step does not have")
    array = buffers[name] if index is None else buffers[name][index]
    shape = param.concrete_shape(call.scalars)
    if array.dtype != DTYPES[param.dtype].numpy or array.size != math.prod(shape) or not array.flags.c_contiguous:
        raise LaunchError(f"{call.kernel.name}: {param.name} ({param.describe()} = {list(shape)}) cannot be "
                          f"{name}{'' if index is None else f'[{index}]'} ({array.dtype}{list(array.shape)})")
    return name, array.reshape(shape)  # a view: results must land in the buffer


def run_step(calls: list[Call], buffers: dict[str, np.ndarray], compiled_of: Callable[[object], CompiledKernel],
             backend: str = "emulator", sanitize: bool = True) -> None:
    """Run a multi-kernel step in order; every written parameter lands in its buffer in place.

    `compiled_of(config)` gives each call's CompiledKernel (e.g. a memo over pipeline.compile_kernel).
    """
    for call in calls:
        compiled = compiled_of(call.kernel)
        views = {p.name: bind(call, p, buffers)[1] for p in compiled.params if p.name in call.args}
        inputs = {p.name: views[p.name] for p in compiled.params if p.read}
        results = run(compiled, inputs, call.scalars, backend, sanitize)
        for param in compiled.params:
            if param.written:
                views[param.name][...] = results[param.name]
