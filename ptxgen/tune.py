"""`ptxgen bench KERNEL --tune FIELD=V,V...`: variants of one spec kernel, its config fields swept
over the listed values (every combination, the spec's own config first), each validated and
compiled like a spec entry, then checked on the GPU and timed as bench rows; the fastest at each
runtime-scalar set is named with its spec entry. A variant the kind refuses (a spec error) or the
assembler fails is skipped with its reason, not fatal: knobs interact (a split_k must divide a
row's steps, an sm90a overlap needs registers), and a sweep should time what can run.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import LaunchError, PtxgenError, SpecError
from .kernels import KINDS
from .quote import clip, echo
from .spec import LoadedSpec, check_against_archs, validate
from .specgen import toml_value

MAX_VARIANTS = 256
FIXED_FIELDS = ("name", "kind")
# Fields that change what a kernel computes or takes (types, the math, how lengths arrive), not
# how: --tune compares ways of computing one result, and prints the fastest as the spec's entry.
# A kind's shapes (Kind.size_fields) are refused with them.
MEANING_FIELDS = ("dtype", "out_dtype", "kv_dtype", "causal", "scale", "eps", "theta", "rope_theta", "style",
                  "rope_style", "qk_norm", "weight_quants", "indirect_seq_len", "indirect_pos")


@dataclass(frozen=True)
class Variant:
    config: object          # the validated kernel config, named `<kernel>_v<index>`
    changes: dict           # field path -> value, against the spec's entry ({} for the spec's own)
    compiled: object = None  # its CompiledKernel, once compiled


def parse_value(text: str):
    """A --tune value as TOML would read it: true/false, an integer (0x40 too), a float, `none`
    (the field's default where that is None), else a word (a string field's value)."""
    word = text.strip()
    if word in ("true", "false"):
        return word == "true"
    if word == "none":
        return None
    for parse in (lambda t: int(t, 0), lambda t: int(t, 10), float):
        try:
            return parse(word)
        except ValueError:
            pass
    return word


def parse_tune(assignments: list[str]) -> dict[str, list]:
    """--tune FIELD=V[,V...] (FIELD may be dotted into a table: sm90a.block_n) into {field: values}."""
    fields = {}
    for assignment in assignments:
        field, equals, text = assignment.partition("=")
        field = field.strip()
        if not equals or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", field) \
                or not text.strip():
            raise LaunchError(f"--tune: expected FIELD=VALUE[,VALUE...], got {echo(assignment)}")
        if field in fields:
            raise LaunchError(f"--tune {field}: given twice")
        values = [parse_value(part) for part in text.split(",")]
        if len(set(map(repr, values))) < len(values):
            raise LaunchError(f"--tune {field}: a value is listed twice in {echo(text)}")
        fields[field] = values
    return fields


def field_holder(entry: dict, field: str, kernel) -> tuple[dict, str]:
    """The dict of `entry` (a config's JSON dump) holding a dotted field, and its last name; a
    field the kind does not have is refused, naming those it has."""
    *tables, last = field.split(".")
    holder, where = entry, ""
    for table in tables:
        if not isinstance(holder.get(table), dict):
            raise LaunchError(f"--tune {field}: kernel {kernel.name!r} ({kernel.kind}) has no table {where + table!r}")
        holder, where = holder[table], f"{where}{table}."
    if last in FIXED_FIELDS and not tables:
        raise LaunchError(f"--tune {field}: a kernel's {last} is not a tuning field")
    if last not in holder:
        names = ", ".join(where + name for name in holder if not (name in FIXED_FIELDS and not where))
        raise LaunchError(f"--tune {field}: kernel {kernel.name!r} ({kernel.kind}) has no field {field!r} "
                          f"(its fields: {names})")
    if not tables and (last in MEANING_FIELDS or last in KINDS[kernel.kind].size_fields()):
        raise LaunchError(f"--tune {field}: changes what kernel {kernel.name!r} computes (a shape, a type or the "
                          "math), not how; --tune compares ways of computing the same result")
    if isinstance(holder[last], dict):
        names = ", ".join(f"{field}.{name}" for name in holder[last])
        raise LaunchError(f"--tune {field}: a table; name one of its fields ({names})")
    return holder, last


def describe(changes: dict) -> str:
    """`a=1 b=true`, or `as in the spec` for no change."""
    return " ".join(f"{field}={toml_value(value) if value is not None else 'none'}"
                    for field, value in changes.items()) or "as in the spec"


def one_kernel(loaded: LoadedSpec, entry: dict):
    """`entry` validated as the only kernel of the loaded spec's target (SpecError if refused)."""
    path = Path(loaded.path)
    spec = validate(path, {"target": loaded.spec.target.model_dump(mode="json"), "kernels": [entry]})
    check_against_archs(path, spec)
    return spec


def reason(error: PtxgenError) -> str:
    """A spec error's first line without its file and kernel (the variant's changes name it)."""
    line = str(error).splitlines()[0]
    return clip(re.sub(r"^.*?\(kernels\[0\]\): ", "", line))


def variants(loaded: LoadedSpec, kernel, fields: dict[str, list]) -> tuple[list[Variant], list[dict]]:
    """The spec's config of `kernel` then every other combination of the fields' values, each
    validated as a spec entry; and those refused ({"changes", "reason"})."""
    base = kernel.model_dump(mode="json")
    for field in fields:
        field_holder(base, field, kernel)
    combos = list(itertools.product(*fields.values()))
    if len(combos) > MAX_VARIANTS:
        raise LaunchError(f"--tune: {len(combos)} combinations; at most {MAX_VARIANTS} (list fewer values)")
    made, skipped, seen = [], [], set()
    for values in [(), *combos]:
        entry = copy.deepcopy(base)
        changes = {}
        for field, value in zip(fields, values):
            holder, last = field_holder(entry, field, kernel)
            if holder[last] != value or type(holder[last]) is not type(value):
                holder[last], changes[field] = value, value
        key = repr(sorted(changes.items()))
        if key in seen:
            continue  # the spec's own config, or a value that repeats it
        seen.add(key)
        entry["name"] = f"{kernel.name}_v{len(made) + len(skipped)}"
        try:
            made.append(Variant(one_kernel(loaded, entry).kernels[0], changes))
        except SpecError as error:
            skipped.append({"changes": changes, "reason": reason(error)})
    return enough(made, skipped), skipped


def compile_variants(loaded: LoadedSpec, made: list[Variant], skipped: list[dict]) -> list[Variant]:
    """Each variant compiled for the spec's target (through the cache); one the assembler fails
    joins `skipped`."""
    from .pipeline import compile_spec

    compiled, kernels = [], {}
    for variant in made:
        try:
            (kernel,) = compile_spec(loaded.spec.model_copy(update={"kernels": (variant.config,)})).kernels
        except PtxgenError as error:
            if not variant.changes:
                raise
            skipped.append({"changes": variant.changes, "reason": clip(str(error).splitlines()[0])})
            continue
        same = kernels.setdefault(identity(kernel), kernel.name)
        if same != kernel.name:  # e.g. an unroll past a row's steps: the plan caps it
            skipped.append({"changes": variant.changes, "reason": f"the same kernel as {same} (PTX and launch)"})
            continue
        compiled.append(Variant(variant.config, variant.changes, kernel))
    return enough(compiled, skipped)


def identity(kernel) -> tuple:
    """What a variant runs: each target's PTX instructions (its entry name aside; the header's
    config comment differs) and launch rule."""
    def code(ptx: str) -> str:
        return "\n".join(line for line in ptx.replace(kernel.name, "@").splitlines()
                         if not line.lstrip().startswith("//"))
    return tuple(sorted((target, code(v.ptx), v.geometry.describe()) for target, v in kernel.variants.items()))


def enough(made: list[Variant], skipped: list[dict]) -> list[Variant]:
    """`made`, if it holds a variant beside the spec's own config (SpecError naming why not)."""
    if len(made) > 1:
        return made
    why = "; ".join(f"{describe(s['changes'])}: {s['reason']}" for s in skipped[:3])
    raise SpecError(f"--tune: no variant but the spec's own config can be built ({why})" if why
                    else "--tune: every value listed is the spec's own: nothing to compare")


def fastest(results: dict, kernel_name: str, made: list[Variant], rank: str) -> list[dict]:
    """Per runtime-scalar set: the fastest timed variant, its time beside the spec's config's, and
    the spec entry that would build it (the spec kernel's name, fields left at their defaults
    omitted)."""
    from .bench import figure_us

    by_name = {variant.config.name: variant for variant in made}
    spec_name = made[0].config.name
    found = []
    for scalars in dict.fromkeys(repr(row["scalars"]) for row in results["rows"]):
        rows = [row for row in results["rows"] if repr(row["scalars"]) == scalars and row["kernel"] in by_name]
        timed = [(figure_us(row, rank), row) for row in rows if row["passed"] and figure_us(row, rank)]
        if not timed:
            continue
        best_us, best = min(timed, key=lambda pair: pair[0])
        spec_us = next((us for us, row in timed if row["kernel"] == spec_name), None)
        variant = by_name[best["kernel"]]
        fields = variant.config.model_dump(mode="json", exclude_defaults=True, exclude={"name", "kind"})
        entry = {"name": kernel_name, "kind": variant.config.kind, **fields}
        found.append({"scalars": best["scalars"], "kernel": best["kernel"], "changes": variant.changes, "us": best_us,
                      "spec_us": spec_us, "entry": entry})
    return found


def entry_toml(entry: dict) -> str:
    """A [[kernels]] table of a spec, its nested tables inline."""
    return "\n".join(["[[kernels]]"] + [f"{key} = {toml_value(value)}" for key, value in entry.items()])


def summary(kernel_name: str, fields: dict, rank: str, made: list[Variant], skipped: list[dict]) -> dict:
    """The JSON's `tune` section before any timing: what was swept and what each variant is."""
    return {"kernel": kernel_name, "fields": fields, "rank": rank,
            "variants": {variant.config.name: variant.changes for variant in made}, "skipped": skipped, "fastest": []}


def print_tune(results: dict, made: list[Variant], console, err) -> None:
    """The variants by scalars and ranked time, what was skipped, and each scalar set's fastest
    with its spec entry."""
    from .bench import batched, describe_scalars, figure_us, microseconds
    from .tables import print_table

    tune = results["tune"]
    spec_name, label = made[0].config.name, {"median": "per-run median", "batch": "batched", "graph": "graph replay"}
    table = []
    spec_us = {repr(row["scalars"]): figure_us(row, tune["rank"]) for row in results["rows"]
               if row["kernel"] == spec_name}
    order = {repr(row["scalars"]): index for index, row in enumerate(results["rows"])}
    rows = sorted(results["rows"], key=lambda row: (order[repr(row["scalars"])],
                                                    figure_us(row, tune["rank"]) or float("inf")))
    for row in rows:
        us, base = figure_us(row, tune["rank"]), spec_us.get(repr(row["scalars"]))
        timing = (["FAIL" if not row["passed"] else "-", "", "", ""] if row["median_us"] is None else
                  [microseconds(row), batched(row), microseconds(row["graph"]) if row["graph"] else "",
                   f"{base / us:.2f}x" if base and us else ""])
        table.append([row["kernel"], describe(tune["variants"][row["kernel"]]), describe_scalars(row["scalars"]),
                      *timing])
    print_table(f"--tune {tune['kernel']}: ranked by the {label[tune['rank']]}",
                ["variant", "changes", "scalars", "median µs", "batched µs (% copy bw)", "graph µs",
                 "vs the spec's config"], table, console)
    for skip in tune["skipped"]:
        err.print(f"skipped {describe(skip['changes'])}: {skip['reason']}", markup=False, highlight=False)
    for best in tune["fastest"]:
        at = f" at {describe_scalars(best['scalars'])}" if best["scalars"] else ""
        ratio = f", {best['spec_us'] / best['us']:.2f}x the spec's config ({best['spec_us']:.2f} µs)" \
            if best["spec_us"] else ""
        console.print(f"fastest{at}: {best['kernel']} ({describe(best['changes'])}), {best['us']:.2f} µs{ratio}; "
                      f"its spec entry:", markup=False, highlight=False)
        console.print(entry_toml(best["entry"]), markup=False, highlight=False)


def model_summary(kernel_name: str, made: list[Variant], skipped: list[dict], reports: list[dict]) -> dict:
    """`show --tune`'s JSON: each variant's changes beside its show report, those skipped."""
    return {"kernel": kernel_name, "skipped": skipped,
            "variants": [{"changes": variant.changes, **report} for variant, report in zip(made, reports)]}


def model_range(report: dict) -> tuple[float, float] | None:
    """The model's (overlapped, serialized) µs of a show report, where it ran."""
    estimate = report.get("model", {}).get("estimate_us")
    return (estimate["overlapped"], estimate["serialized"]) if estimate else None


def print_models(section: dict, gpu, console, err) -> None:
    """The variants' launches, resources (of the cubin the GPU runs) and models, by the model's
    serialized estimate."""
    from .tables import print_table

    table = []
    variants = section["variants"]
    spec_range = model_range(variants[0])
    for report in sorted(variants, key=lambda r: (model_range(r) or (0, float("inf")))[1]):
        model, span, arch = report.get("model", {}), model_range(report), report["gpu_cubin"]
        resources, fit = report["resources"].get(arch, {}), report["occupancy_detail"].get(arch)
        launch = report["launch"]
        table.append([
            report["name"], describe(report["changes"]),
            f"{launch['grid'][0] * launch['grid'][1] * launch['grid'][2]} x {launch['block'][0]}",
            str(resources.get("registers", "-")), f"{100 * fit['fraction']:.0f}%" if fit else "-",
            str(model.get("thread_instructions_per_byte", "-")),
            f"{model['bytes_in_flight']['per_sm'] / 1024:.1f}" if "bytes_in_flight" in model else "-",
            str(model.get("rounds_per_warp", "-")),
            f"{span[0]:.2f}..{span[1]:.2f}" if span else model.get("skipped", "not run"),
            f"{spec_range[1] / span[1]:.2f}x" if span and spec_range else ""])
    print_table(f"show --tune {section['kernel']} on {gpu.name}: the performance model, ranked by its serialized "
                "estimate", ["variant", "changes", "grid x block", "registers", "occupancy", "thread-instr. a byte",
                             "KB in flight an SM", "load rounds a warp", "model µs", "vs the spec's config"],
                table, console)
    for skip in section["skipped"]:
        err.print(f"skipped {describe(skip['changes'])}: {skip['reason']}", markup=False, highlight=False)
