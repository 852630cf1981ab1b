"""The C header of an artifact folder, so a C++ engine can cuModuleLoadData + cuLaunchKernel the
cubins: entry names, cubin files per arch, parameters in launch order, launch geometry as
functions of the runtime scalars, scalar range checks and workspace sizes, and for a cubin that
takes tensor maps, C that encodes them (the header then includes cuda.h). Made from the manifest
alone (pure data), so it says exactly what the folder holds.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from . import __version__
from .abi import DTYPE_SIZES, Geometry, Param, TensorMap, formula_c

C_SCALAR = {"u32": "uint32_t", "u64": "uint64_t"}


def header_name(spec_path: str) -> str:
    return f"{Path(spec_path).stem}.h"


def _guard(name: str) -> str:
    """The include guard of a spec's header: its name in C letters, and a hash of the name itself
    (a-b.toml and a_b.toml, or two names that differ only in case or in non-ASCII letters, would
    otherwise share one, and a program including both would lose one header)."""
    tag = hashlib.sha256(name.encode()).hexdigest()[:8].upper()
    return f"PTXGEN_{re.sub(r'[^A-Za-z0-9]', '_', name).upper()}_{tag}"


def _workspace_bytes(param: Param) -> str:
    """A C expression of the workspace's bytes (its shape may name runtime scalars)."""
    factors = [f"(uint64_t){d}" if isinstance(d, str) else f"UINT64_C({d})" for d in param.shape]
    return " * ".join([*factors, f"UINT64_C({DTYPE_SIZES[param.dtype]})"])


def defined_names(name: str, targets, mapped=()) -> set[str]:
    """The C identifiers and macros a kernel's block defines (its workspace-size functions aside),
    with a launch block for its portable PTX and each of `targets`: what two kernels' names must
    not share. `mapped`: the blocks whose variant takes tensor maps ("" for the portable one); their
    names start as the block's `_grid` does, so a clash of theirs is a clash of those too."""
    macro = name.upper()
    names = {f"{name}{s}" for s in ("_cubins", "_cubin_pdl", "_args", "_params", "_scalars_ok")}
    names |= {f"{macro}{s}" for s in ("_ENTRY", "_NUM_PARAMS", "_NUM_CUBINS")}
    for target in ["", *targets]:
        suffix = f"_{target}" if target else ""
        names |= {f"{name}{suffix}{s}" for s in ("_grid", "_block", "_dynamic_shared")}
        names.add(f"{macro}{suffix.upper()}_COOPERATIVE")
        if target in mapped:
            names |= {f"{name}{suffix}_encode_tensor_maps", f"{name}{suffix}_params_with_maps",
                      f"{macro}{suffix.upper()}_NUM_TENSOR_MAPS"}
    return names


def _kernel(name: str, entry: dict) -> list[str]:
    params = [Param.from_json(p) for p in entry["params"]]
    limits = entry["scalar_limits"]
    arguments = ", ".join(f"uint32_t {s}" for s in limits) or "void"
    unused = "".join(f" (void){s};" for s in limits)
    prefix, macro = name, name.upper()
    lines = [f"/* --- {name}: {entry['kind']} {_config_text(entry['config'])} */",
             f'#define {macro}_ENTRY "{name}"',
             f"#define {macro}_NUM_PARAMS {len(params)}",
             f"static const char* const {prefix}_cubins[][2] = {{"
             + ", ".join(f'{{"{arch}", "{c["file"]}"}}' for arch, c in entry["cubins"].items()) + "};",
             f"#define {macro}_NUM_CUBINS {len(entry['cubins'])}",
             "/* Per cubin above, 1 where its PTX waits for the previous kernel itself: launch it with "
             "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuLaunchKernelEx) to overlap that kernel's end; "
             "correct either way. */",
             f"static const int {prefix}_cubin_pdl[] = {{"
             + ", ".join(str(int(_cubin_pdl(entry, cubin))) for cubin in entry["cubins"].values()) + "};",
             "typedef struct {"]
    for param in params:
        c_type = "uint64_t" if param.is_array else C_SCALAR[param.ptx_type]
        range_note = f" {limits[param.name][0]}..{limits[param.name][1]}" if param.name in limits else ""
        lines.append(f"    {c_type} {param.name}; /* {param.describe()}, {param.role}{range_note} */")
    lines += [f"}} {prefix}_args;",
              f"/* kernelParams for cuLaunchKernel: {len(params)} pointers into *a, in PTX order. */",
              f"static inline void {prefix}_params({prefix}_args* a, void** params) {{",
              *[f"    params[{i}] = &a->{param.name};" for i, param in enumerate(params)],
              "}",
              "/* 1 when every runtime scalar is within what the kernel accepts (check before launching). */",
              f"static inline int {prefix}_scalars_ok({arguments}) {{",
              "    return " + (" && ".join(_in_range(s, low, high) for s, (low, high) in limits.items()) or "1") + ";",
              "}"]
    for param in params:
        if param.role == "workspace":
            lines += [f"/* Workspace {param.name}: allocate, zero once, pass to every launch (the kernel leaves it "
                      "ready for the next). */",
                      f"static inline uint64_t {prefix}_workspace_bytes_{param.name}({arguments}) {{{unused}",
                      f"    return {_workspace_bytes(param)};", "}"]
    portable = entry["ptx_target"]
    for target, variant in entry["variants"].items():
        suffix = "" if target == portable else f"_{target}"
        geometry = Geometry.from_json(variant["geometry"])
        lines += [f"/* Launch{' of the ' + target + ' cubin' if suffix else ''}: {variant['launch']} */",
                  f"#define {macro}{suffix.upper()}_COOPERATIVE {int(geometry.cooperative)}",
                  f"static inline ptxgen_dim3 {prefix}{suffix}_grid({arguments}) {{{unused}",
                  "    ptxgen_dim3 d = {" + ", ".join(f"(uint32_t){formula_c(g)}" for g in geometry.grid) + "};",
                  "    return d;", "}",
                  f"static inline ptxgen_dim3 {prefix}{suffix}_block(void) {{",
                  "    ptxgen_dim3 d = {" + ", ".join(f"{b}u" for b in geometry.block) + "};", "    return d;", "}",
                  f"static inline uint32_t {prefix}{suffix}_dynamic_shared({arguments}) {{{unused}",
                  f"    return (uint32_t){formula_c(geometry.dynamic_shared)};", "}"]
        maps = [TensorMap.from_json(m) for m in variant.get("tensor_maps", ())]
        if maps:
            lines += _tensor_maps(prefix + suffix, prefix, params, maps, list(limits), target if suffix else "")
    return lines + [""]


def _tensor_maps(block: str, prefix: str, params: list[Param], maps: list[TensorMap], scalars: list[str],
                 target: str) -> list[str]:
    """A launch block's tensor maps: a function that encodes them, and its kernelParams with them."""
    arrays = {param.name: param for param in params}
    of = f" of the {target} cubin" if target else ""
    signature = f"const {prefix}_args* a, " + "".join(f"uint32_t {s}, " for s in scalars) + "CUtensorMap* maps"
    lines = [f"/* Tensor maps{of} ({', '.join(f'{m.name} over {m.array}' for m in maps)}), passed by value after "
             "its parameters: encode them into maps[] (64-byte aligned, as CUtensorMap is from C11 and C++11) with "
             "cuTensorMapEncodeTiled before launching, and again whenever an array's address or a runtime scalar in "
             "its shape changes. Returns the first failure. */",
             f"#define {block.upper()}_NUM_TENSOR_MAPS {len(maps)}",
             f"static inline CUresult {block}_encode_tensor_maps({signature}) {{"
             + "".join(f" (void){s};" for s in scalars),
             "    CUresult status;"]
    for index, tensor_map in enumerate(maps):
        param = arrays[tensor_map.array]
        dims, strides = tensor_map.dim_formulas(param), tensor_map.stride_formulas(param)
        rank = len(dims)
        kind, interleave, swizzle, l2, fill = tensor_map.encoding(param)
        lines += [f"    {{   /* {tensor_map.name}: {param.name}, {param.describe()}, in boxes of "
                  f"{' x '.join(map(str, tensor_map.box))} (innermost first) */",
                  f"        const cuuint64_t dims[{rank}] = {{{', '.join(formula_c(d) for d in dims)}}};",
                  # A rank-1 map has no strides; C has no empty arrays.
                  f"        const cuuint64_t strides[{max(rank - 1, 1)}] = "
                  f"{{{', '.join(formula_c(s) for s in strides) or '0'}}};",
                  f"        const cuuint32_t box[{rank}] = {{{', '.join(f'{b}u' for b in tensor_map.box)}}};",
                  f"        const cuuint32_t steps[{rank}] = {{{', '.join('1u' for _ in dims)}}};",
                  f"        status = cuTensorMapEncodeTiled(&maps[{index}], {kind}, {rank}, "
                  f"(void*)(uintptr_t)a->{param.name}, dims, strides, box, steps, {interleave}, "
                  f"{swizzle}, {l2}, {fill});",
                  "        if (status != CUDA_SUCCESS) return status;",
                  "    }"]
    count = len(params)
    lines += ["    return CUDA_SUCCESS;", "}",
              f"/* kernelParams{of}: {prefix}_params' {count} pointers into *a, then {len(maps)} into maps[]. */",
              f"static inline void {block}_params_with_maps({prefix}_args* a, CUtensorMap* maps, void** params) {{",
              f"    {prefix}_params(a, params);",
              *[f"    params[{count + i}] = &maps[{i}];" for i in range(len(maps))],
              "}"]
    return lines


def _cubin_pdl(entry: dict, cubin: dict) -> bool:
    """Whether a cubin was made from PTX for programmatic dependent launch."""
    return any(v.get("pdl", False) for v in entry["variants"].values() if v["ptx"] == cubin["ptx"])


def _in_range(name: str, low: int, high: int) -> str:
    checks = ([f"{name} >= {low}u"] if low > 0 else []) + ([f"{name} <= {high}u"] if high < 2**32 - 1 else [])
    return "(" + " && ".join(checks) + ")" if checks else "1"


def _has_tensor_maps(manifest: dict) -> bool:
    return any(variant.get("tensor_maps") for entry in manifest["kernels"].values()
               for variant in entry["variants"].values())


def _config_text(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items()) if k not in ("name", "kind"))


def render_header(manifest: dict) -> str:
    """The header text for a manifest (ptxgen.pipeline.manifest_of)."""
    spec = manifest["spec"]["file"]
    guard = _guard(Path(spec).stem) + "_H"
    lines = [f"/* Generated by ptxgen {__version__} from {spec} (sha256 {manifest['spec']['sha256']}).",
             " * Do not edit: change the spec and rebuild.",
             " *",
             " * Per kernel: its entry name, its cubin file per arch (relative to this folder), its",
             " * parameters in launch order, and its launch geometry as functions of its runtime scalars.",
             " * With the CUDA driver API:",
             " *   cuModuleLoadData(&module, bytes of NAME_cubins[i][1] for the GPU's arch);",
             " *   cuModuleGetFunction(&function, module, NAME_ENTRY);",
             " *   NAME_args a = {...}; void* params[NAME_NUM_PARAMS]; NAME_params(&a, params);",
             " *   ptxgen_dim3 g = NAME_grid(scalars...), b = NAME_block();",
             " *   cuLaunchKernel(function, g.x, g.y, g.z, b.x, b.y, b.z, NAME_dynamic_shared(scalars...),",
             " *                  stream, params, NULL);  (cuLaunchCooperativeKernel when NAME_COOPERATIVE)",
             " * Dynamic shared memory above 48 KiB needs cuFuncSetAttribute(function,",
             " * CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes) once after loading.",
             " */",
             f"#ifndef {guard}", f"#define {guard}", "#include <stdint.h>",
             *(["#include <cuda.h>  /* CUtensorMap, cuTensorMapEncodeTiled */"] if _has_tensor_maps(manifest) else []),
             "",
             "#ifndef PTXGEN_COMMON_DEFINED", "#define PTXGEN_COMMON_DEFINED",
             "typedef struct { uint32_t x, y, z; } ptxgen_dim3;",
             "static inline uint64_t ptxgen_min(uint64_t a, uint64_t b) { return a < b ? a : b; }",
             "static inline uint64_t ptxgen_max(uint64_t a, uint64_t b) { return a > b ? a : b; }",
             "#endif", ""]
    for name, entry in manifest["kernels"].items():
        lines += _kernel(name, entry)
    lines += [f"#endif /* {guard} */", ""]
    return "\n".join(lines)

