"""Why the 36-layer Qwen3-8B decoder parted from its separate kernels by 2.7e-2 (rel. L2 of x) on an
H100 on 2026-11-27: a race, or int8/f16 rounding flips compounding through the layers?

On the device (bench/lease/decoder_depth.toml: the decoder at 1, 4, 12 and 36 layers, and at 36
layers on half the grid), for each depth over the same weights (the first L layers of one set):
the decoder and its separate kernels each run twice (a race shows as run-to-run differences),
against each other, and each against itself from x moved by one f32 ulp in every element (the
model's own sensitivity: what any two correct implementations may differ by after L layers).
One layer is also graded against the float64 reference. Prints and writes $OUT/decoder_depth.json.

Inputs: one layer's Q4_K weights from ggml's quantiser (the decoder's sample_inputs), each later
layer's the same rows in another order (sample_inputs for 36 layers takes two minutes)."""
import json
import os
import time

import numpy as np

from ptxgen.bench import DeviceStep, separate_kernels
from ptxgen.device import session
from ptxgen.kernels.persistent_decoder import decoder_reference
from ptxgen.pipeline import compile_spec
from ptxgen.runner import prepare_arrays
from ptxgen.spec import load_spec
from ptxgen.verify import relative_l2

POS = 4095
SPEC = os.path.join(os.path.dirname(__file__), "decoder_depth.toml")


def deep_inputs(one_layer, layers: int, rng) -> dict[str, np.ndarray]:
    """`layers` layers from one layer's sample inputs: weight rows permuted a layer, fresh norms
    and caches."""
    kind = one_layer.definition
    base = kind.sample_inputs(rng, {"pos": POS})
    inputs = {"x": base["x"]}
    for name, array in base.items():
        if name == "x":
            continue
        if array.dtype == np.uint8:  # a weight stack [1, rows, row bytes]
            inputs[name] = np.stack([array[0][rng.permutation(array.shape[1])] for _ in range(layers)])
        elif name in ("k_cache", "v_cache"):
            inputs[name] = np.concatenate([array] + [array[:, :, :, rng.permutation(array.shape[3])]
                                                     for _ in range(layers - 1)])
        else:  # norms [1, n]
            inputs[name] = (1.0 + 0.2 * rng.standard_normal((layers, array.shape[1]))).astype(np.float32)
    return inputs


def main() -> None:
    out = os.environ.get("OUT", "bench/lease/out")
    kernels = {k.name: k for k in compile_spec(load_spec(SPEC).spec).kernels}
    start = time.time()
    inputs = deep_inputs(kernels["decoder_l1"], 36, np.random.default_rng(0))
    print(f"inputs: {time.time() - start:.1f} s", flush=True)
    gpu = session()
    scalars = {"pos": POS}
    results = {}
    for name, compiled in kernels.items():
        layers = compiled.definition.config.num_layers
        mine = {n: (a if n == "x" else a[:layers]) for n, a in inputs.items()}
        arrays = prepare_arrays(compiled, mine, scalars)
        step = DeviceStep(gpu, compiled, arrays, scalars, separate_kernels(("sm_90",)))
        try:
            fused = [step.outcome(step.run_kernel) for _ in range(2)]
            separate = [step.outcome(step.run_step) for _ in range(2)]
            spreads = step.spread(step.run_kernel, fused[0]), step.spread(step.run_step, separate[0])
        finally:
            step.free()
        row = {
            "layers": layers, "ctas": compiled.definition.config.ctas,
            "fused_vs_separate": relative_l2(fused[0], separate[0]),
            "fused_run_to_run_max_abs": float(np.max(np.abs(fused[0] - fused[1]))),
            "separate_run_to_run_max_abs": float(np.max(np.abs(separate[0] - separate[1]))),
            "fused_one_ulp_x": spreads[0],
            "separate_one_ulp_x": spreads[1],
        }
        if layers == 1:
            reference = decoder_reference(mine, compiled.definition.config, POS)["x"]
            row["fused_vs_float64"] = relative_l2(fused[0], reference)
            row["separate_vs_float64"] = relative_l2(separate[0], reference)
        results[name] = row
        print(name, json.dumps(row), flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "decoder_depth.json"), "w") as f:
        json.dump({"device": gpu.name if hasattr(gpu, "name") else None, "pos": POS, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
