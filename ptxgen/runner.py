"""Run one kernel once: check inputs against its parameters, poison outputs, launch, collect.

The same path serves `ptxgen run`, `ptxgen verify`, tests and benches, on either backend.
"""

from __future__ import annotations

import math

import numpy as np

from .dtypes import DTYPES, poison
from .errors import LaunchError
from .kernels import kind_of
from .kernels.base import Call, Kind

BACKENDS = ("emulator", "device")


def check_inputs(kind: Kind, inputs: dict[str, np.ndarray], scalars: dict[str, int]) -> None:
    """Every read array present with the exact dtype and shape; nothing unknown."""
    name = kind.config.name
    known = {p.name for p in kind.params()}
    for key in inputs:
        if key not in known:
            raise LaunchError(f"{name}: unknown input {key!r} (parameters: {', '.join(sorted(known))})")
    for param in kind.params():
        if param.role not in ("in", "inout"):
            continue
        if param.name not in inputs:
            raise LaunchError(f"{name}: input {param.name!r} is missing: expected {param.describe()}")
        array = inputs[param.name]
        expected_dtype = DTYPES[param.dtype].numpy
        expected_shape = param.concrete_shape(scalars)
        if not isinstance(array, np.ndarray) or array.dtype != expected_dtype or array.shape != expected_shape:
            given = f"{array.dtype}{list(array.shape)}" if isinstance(array, np.ndarray) else type(array).__name__
            raise LaunchError(
                f"{name}: input {param.name!r}: expected {expected_dtype}{list(expected_shape)} "
                f"({param.describe()}), got {given}"
            )


def prepare_arrays(kind: Kind, inputs: dict[str, np.ndarray], scalars: dict[str, int]) -> dict[str, np.ndarray]:
    """Copies of the inputs, NaN-poisoned outputs, zeroed workspaces: one array per array param."""
    kind.check_scalars(scalars)
    check_inputs(kind, inputs, scalars)
    arrays = {}
    for param in kind.params():
        if param.role in ("in", "inout"):
            arrays[param.name] = np.ascontiguousarray(inputs[param.name]).copy()
        elif param.role == "out":
            arrays[param.name] = poison(param.concrete_shape(scalars), param.dtype)
        elif param.role == "workspace":
            arrays[param.name] = np.zeros(param.concrete_shape(scalars), dtype=DTYPES[param.dtype].numpy)
    kind.check_arrays(arrays, scalars)
    return arrays


def launch_args(kind: Kind, arrays: dict[str, np.ndarray], scalars: dict[str, int]) -> list:
    """Arguments in PTX parameter order."""
    return [arrays[p.name] if p.is_array else int(scalars[p.name]) for p in kind.params()]


def run(kernel, ptx: str, inputs: dict[str, np.ndarray], scalars: dict[str, int], backend: str = "emulator",
        sanitize: bool = True) -> dict[str, np.ndarray]:
    """Launch `kernel` (a validated config) once; return every array parameter afterwards."""
    kind = kind_of(kernel)
    arrays = prepare_arrays(kind, inputs, scalars)
    launch = kind.launch(scalars)
    if launch.empty:
        return arrays
    args = launch_args(kind, arrays, scalars)
    if backend == "emulator":
        from .interp import launch as interpret

        interpret(ptx, kernel.name, launch.grid, launch.block, args, dynamic_shared=launch.dynamic_shared,
                  sanitize=sanitize, kernel_name=kernel.name)
    elif backend == "device":
        from .device import run_on_device

        run_on_device(ptx, kernel.name, launch, args)
    else:
        raise LaunchError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
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
    if array.dtype != DTYPES[param.dtype].numpy or array.size != math.prod(shape):
        raise LaunchError(f"{call.kernel.name}: {param.name} ({param.describe()} = {list(shape)}) cannot be "
                          f"{name}{'' if index is None else f'[{index}]'} ({array.dtype}{list(array.shape)})")
    view = array.view()
    view.shape = shape  # raises rather than copy: results must land in the buffer
    return name, view


def run_step(calls: list[Call], buffers: dict[str, np.ndarray], ptx_of, backend: str = "emulator",
             sanitize: bool = True) -> None:
    """Run a multi-kernel step in order; every written parameter lands in its buffer in place.

    `ptx_of(kernel)` gives each call's PTX (e.g. a spec's Spec.ptx).
    """
    for call in calls:
        kind = kind_of(call.kernel)
        views = {p.name: bind(call, p, buffers)[1] for p in kind.params() if p.name in call.args}
        inputs = {p.name: views[p.name] for p in kind.params() if p.role in ("in", "inout")}
        results = run(call.kernel, ptx_of(call.kernel), inputs, call.scalars, backend, sanitize)
        for param in kind.params():
            if param.written:
                views[param.name][...] = results[param.name]
