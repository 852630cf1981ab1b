"""A kernel's calling convention as plain data: parameters in PTX order, and launch geometry as
formulas of the runtime scalars.

This module imports nothing but the standard library, so a CompiledKernel loaded from an artifact
folder (ptxgen.load on a `ptxgen build` output) works without pydantic or Jinja, and the same
formulas are evaluated in Python, stored in manifest.json and written out as C for engines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

DTYPE_SIZES = {"f32": 4, "f16": 2, "bf16": 2, "u8": 1, "u32": 4}
ROLES = ("in", "out", "inout", "scalar", "workspace")
SCALAR_DTYPES = ("u32", "u64")  # header.C_SCALAR types them


@dataclass(frozen=True)
class Param:
    """One PTX entry parameter. `shape` holds ints and names of runtime scalars."""

    name: str
    dtype: str
    shape: tuple[int | str, ...] = ()
    role: str = "in"  # in | out | inout | scalar | workspace
    layout: str = ""  # "q4_k": rows of GGML block_q4_K (u8), loadable from a GGUF tensor
    # The same in every launch of a step (a model's weights): a kernel under programmatic dependent
    # launch may read it before griddepcontrol.wait, while the previous kernel still runs.
    stable: bool = False
    # Every element within (low, high), inclusive: a length or position the kernel reads on the
    # device, checked wherever the host holds the array (ptxgen run, the API on numpy arrays).
    values: tuple[int, int] | None = None

    def __post_init__(self):
        known = DTYPE_SIZES if self.is_array else SCALAR_DTYPES
        if self.role not in ROLES or self.dtype not in known:
            raise ValueError(f"parameter {self.name!r}: unknown role {self.role!r} or dtype {self.dtype!r} for it")
        if not all(isinstance(d, str) or (isinstance(d, int) and d >= 0) for d in self.shape):
            raise ValueError(f"parameter {self.name!r}: shape {list(self.shape)} is not of sizes and scalar names")

    @property
    def is_array(self) -> bool:
        return self.role != "scalar"

    @property
    def written(self) -> bool:
        return self.role in ("out", "inout")

    @property
    def read(self) -> bool:
        return self.role in ("in", "inout")

    @property
    def ptx_type(self) -> str:
        """The `.param` type: arrays are passed as 64-bit global addresses."""
        return "u64" if self.is_array else self.dtype

    def concrete_shape(self, scalars: dict[str, int]) -> tuple[int, ...]:
        return tuple(int(scalars[d]) if isinstance(d, str) else d for d in self.shape)

    def nbytes(self, scalars: dict[str, int]) -> int:
        return math.prod(self.concrete_shape(scalars)) * DTYPE_SIZES[self.dtype]

    def describe(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]" if self.is_array else f"{self.dtype} scalar"

    def out_of_range(self, array) -> str | None:
        """Where a host array breaks `values` ("[0]: expected 0..16, got 17"), None where it keeps them."""
        if self.values is None:
            return None
        low, high = self.values
        flat = array.reshape(-1).astype("int64")  # a u32 parameter's array may come as int32 (the API)
        outside = (flat < low) | (flat > high)
        if not outside.any():
            return None
        bad = int(outside.argmax())
        index = ", ".join(str(i) for i in divmod_index(bad, array.shape))
        return f"[{index}]: expected {low}..{high}, got {flat[bad]}"

    def to_json(self) -> dict:
        extra = {"values": list(self.values)} if self.values is not None else {}
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "role": self.role,
                "layout": self.layout, "stable": self.stable, **extra}

    @classmethod
    def from_json(cls, data: dict) -> Param:
        values = data.get("values")
        return cls(data["name"], data["dtype"], tuple(data["shape"]), data["role"], data.get("layout", ""),
                   data.get("stable", False), (int(values[0]), int(values[1])) if values is not None else None)


def divmod_index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The row-major index of element `flat` of an array of `shape`."""
    index = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))


# --- formulas ----------------------------------------------------------------------------------
# An integer formula of runtime scalars: an int, or an Expr node. The helpers below fold
# constants, so a formula without scalars is just an int.

@dataclass(frozen=True)
class Expr:
    op: str  # scalar | add | mul | ceil_div | min | max
    args: tuple

    def __add__(self, other: Formula) -> Formula:
        return add(self, other)

    __radd__ = __add__

    def __mul__(self, other: Formula) -> Formula:
        return mul(self, other)

    __rmul__ = __mul__


Formula = Union[int, Expr]
_FOLD = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "ceil_div": lambda a, b: -(-a // b),
         "min": min, "max": max}


def scalar(name: str) -> Expr:
    return Expr("scalar", (name,))


def _node(op: str, a: Formula, b: Formula) -> Formula:
    if isinstance(a, int) and isinstance(b, int):
        return _FOLD[op](a, b)
    return Expr(op, (a, b))


def add(a: Formula, b: Formula) -> Formula:
    return a if b == 0 else b if a == 0 else _node("add", a, b)


def mul(a: Formula, b: Formula) -> Formula:
    return a if b == 1 else b if a == 1 else _node("mul", a, b)


def ceil_div(a: Formula, b: Formula) -> Formula:
    return a if b == 1 else _node("ceil_div", a, b)


def round_up(a: Formula, b: Formula) -> Formula:
    return mul(ceil_div(a, b), b)


def minimum(a: Formula, b: Formula) -> Formula:
    return _node("min", a, b)


def maximum(a: Formula, b: Formula) -> Formula:
    return _node("max", a, b)


def evaluate(formula: Formula, scalars: dict[str, int]) -> int:
    if isinstance(formula, int):
        return formula
    if formula.op == "scalar":
        return int(scalars[formula.args[0]])
    a, b = (evaluate(arg, scalars) for arg in formula.args)
    return _FOLD[formula.op](a, b)


def scalars_in(formula: Formula) -> set[str]:
    if isinstance(formula, int):
        return set()
    if formula.op == "scalar":
        return {formula.args[0]}
    return set().union(*(scalars_in(arg) for arg in formula.args))


def formula_text(formula: Formula) -> str:
    """For people: ceil(seq_len/64), min(seq_len, 4096), ..."""
    if isinstance(formula, int):
        return str(formula)
    if formula.op == "scalar":
        return formula.args[0]
    a, b = (formula_text(arg) for arg in formula.args)
    return {"add": f"{a} + {b}", "mul": f"{a}*{b}", "ceil_div": f"ceil({a}/{b})",
            "min": f"min({a}, {b})", "max": f"max({a}, {b})"}[formula.op]


def formula_c(formula: Formula) -> str:
    """A C expression in uint64_t arithmetic over the scalars (as variables of the same names)."""
    if isinstance(formula, int):
        return f"UINT64_C({formula})"
    if formula.op == "scalar":
        return f"(uint64_t){formula.args[0]}"
    a, b = (formula_c(arg) for arg in formula.args)
    return {"add": f"({a} + {b})", "mul": f"({a} * {b})", "ceil_div": f"(({a} + {b} - 1) / {b})",
            "min": f"ptxgen_min({a}, {b})", "max": f"ptxgen_max({a}, {b})"}[formula.op]


def formula_json(formula: Formula):
    if isinstance(formula, int):
        return formula
    if formula.op == "scalar":
        return formula.args[0]
    return [formula.op, *(formula_json(arg) for arg in formula.args)]


def formula_from_json(data) -> Formula:
    if isinstance(data, bool) or not isinstance(data, (int, str, list)):
        raise ValueError(f"not a launch formula: {data!r}")
    if isinstance(data, int):
        return data
    if isinstance(data, str):
        return scalar(data)
    op, *args = data
    if op not in _FOLD or len(args) != 2:
        raise ValueError(f"not a launch formula: {data!r}")
    return Expr(op, tuple(formula_from_json(arg) for arg in args))


# --- launch geometry ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Launch:
    """One concrete launch."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int = 0
    cooperative: bool = False
    # Correct with any 1-D grid of at least one CTA (grid-stride loops, the CTA count read from
    # %nctaid): a device may shrink a cooperative grid to what is co-resident on it.
    any_grid: bool = False

    @property
    def threads_per_cta(self) -> int:
        return math.prod(self.block)

    @property
    def ctas(self) -> int:
        return math.prod(self.grid)

    @property
    def empty(self) -> bool:
        return self.ctas == 0


@dataclass(frozen=True)
class Geometry:
    """Launch geometry as formulas of the runtime scalars (block size is fixed per config)."""

    grid: tuple[Formula, Formula, Formula]
    block: tuple[int, int, int]
    dynamic_shared: Formula = 0
    cooperative: bool = False
    any_grid: bool = False

    def at(self, scalars: dict[str, int]) -> Launch:
        grid = tuple(evaluate(g, scalars) for g in self.grid)
        return Launch(grid, self.block, evaluate(self.dynamic_shared, scalars), self.cooperative, self.any_grid)

    def describe(self) -> str:
        grid = ",".join(formula_text(g) for g in self.grid)
        text = f"grid=({grid}) block=({','.join(map(str, self.block))})"
        if self.dynamic_shared != 0:
            text += f" dynamic shared={formula_text(self.dynamic_shared)} B"
        return ("cooperative " if self.cooperative else "") + text

    def to_json(self) -> dict:
        return {"grid": [formula_json(g) for g in self.grid], "block": list(self.block),
                "dynamic_shared": formula_json(self.dynamic_shared), "cooperative": self.cooperative,
                "any_grid": self.any_grid}

    @classmethod
    def from_json(cls, data: dict) -> Geometry:
        return cls(tuple(formula_from_json(g) for g in data["grid"]), tuple(data["block"]),
                   formula_from_json(data["dynamic_shared"]), bool(data["cooperative"]), bool(data["any_grid"]))


# --- tensor maps -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorMap:
    """A tensor map (CUtensorMap, 128 bytes by value, `.param .align 64 .b8 NAME[128]`) over an
    array parameter, for cp.async.bulk.tensor: the launcher encodes it from that array's address
    and shape at each launch (cuTensorMapEncodeTiled on a GPU, the interpreter's own record in
    emulation), so callers pass the same arguments as ever. Dimensions run innermost first: the
    array's shape reversed, its rows packed (byte strides of a C-contiguous array); a copy moves a
    `box` of elements, zero-filled where it passes the array's edge; `swizzle` (0 or 128) stores
    16-byte chunk c of each 128-byte shared row r at chunk c ^ (r % 8), as wgmma's 128-byte
    swizzled layouts read it."""

    name: str
    array: str
    box: tuple[int, ...]
    swizzle: int = 0

    def __post_init__(self):
        if not 1 <= len(self.box) <= 5 or not all(isinstance(b, int) and 1 <= b <= 256 for b in self.box):
            raise ValueError(f"tensor map {self.name!r}: box {list(self.box)} needs 1..5 sizes of 1..256")
        if self.swizzle not in (0, 128):
            raise ValueError(f"tensor map {self.name!r}: swizzle {self.swizzle} is not 0 or 128")

    def check(self, param: Param) -> None:
        """Reject a map its array cannot have (rank, 16-byte rows of the box, the swizzle's span)."""
        inner = self.box[0] * DTYPE_SIZES[param.dtype]
        if len(self.box) != len(param.shape) or inner % 16 or (self.swizzle and inner > self.swizzle):
            raise ValueError(f"tensor map {self.name!r}: box {list(self.box)} does not fit {param.name} "
                             f"({param.describe()}, swizzle {self.swizzle})")

    def dim_formulas(self, param: Param) -> list[Formula]:
        """Elements per dimension, innermost first, as formulas of the runtime scalars."""
        return [scalar(d) if isinstance(d, str) else d for d in reversed(param.shape)]

    def stride_formulas(self, param: Param) -> list[Formula]:
        """Bytes between consecutive indices of dimensions 1.. (dimension 0's elements are packed)."""
        strides, stride = [], DTYPE_SIZES[param.dtype]
        for dim in self.dim_formulas(param)[:-1]:
            stride = mul(stride, dim)
            strides.append(stride)
        return strides

    def dims(self, param: Param, scalars: dict[str, int]) -> tuple[int, ...]:
        return tuple(evaluate(d, scalars) for d in self.dim_formulas(param))

    def strides(self, param: Param, scalars: dict[str, int]) -> tuple[int, ...]:
        return tuple(evaluate(s, scalars) for s in self.stride_formulas(param))

    def encoding(self, param: Param) -> tuple[str, str, str, str, str]:
        """cuTensorMapEncodeTiled's enum arguments, by their cuda.h names: the element type, no
        interleave, the swizzle, 256-byte L2 promotion, zeros past the edges (no NaN fill)."""
        return (TENSOR_MAP_DTYPES[param.dtype], "CU_TENSOR_MAP_INTERLEAVE_NONE",
                "CU_TENSOR_MAP_SWIZZLE_128B" if self.swizzle else "CU_TENSOR_MAP_SWIZZLE_NONE",
                "CU_TENSOR_MAP_L2_PROMOTION_L2_256B", "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")

    def to_json(self) -> dict:
        return {"name": self.name, "array": self.array, "box": list(self.box), "swizzle": self.swizzle}

    @classmethod
    def from_json(cls, data: dict) -> TensorMap:
        return cls(data["name"], data["array"], tuple(int(b) for b in data["box"]), int(data["swizzle"]))


TENSOR_MAP_BYTES = 128
# cuTensorMapEncodeTiled's element type (CUtensorMapDataType) of each array dtype (DTYPE_SIZES).
TENSOR_MAP_DTYPES = {"f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", "bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
                     "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32", "u8": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
                     "u32": "CU_TENSOR_MAP_DATA_TYPE_UINT32"}
