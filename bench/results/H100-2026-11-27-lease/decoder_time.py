"""Time the 36-layer Qwen3-8B decoder (pos 4095) and its separate kernels as one CUDA graph, over
bench/lease/decoder_depth.py's inputs: how decoder_time.json was measured (bench's own row
stopped at its check then, at 4cf7024; see bench.SPREAD_MULTIPLE). Run from the repository root
with bench/lease on PYTHONPATH."""
import json
import os

import numpy as np

from decoder_depth import POS, SPEC, deep_inputs

from ptxgen.bench import DeviceStep, separate_kernels, time_kernel
from ptxgen.device import session
from ptxgen.pipeline import compile_spec
from ptxgen.runner import prepare_arrays
from ptxgen.spec import load_spec

kernels = {k.name: k for k in compile_spec(load_spec(SPEC).spec).kernels}
compiled, scalars = kernels["decoder_l36"], {"pos": POS}
arrays = prepare_arrays(compiled, deep_inputs(kernels["decoder_l1"], 36, np.random.default_rng(0)), scalars)
gpu = session()
traffic = compiled.definition.traffic(scalars)
timed = time_kernel(gpu, compiled, arrays, scalars, 100, True, traffic.bytes)
step = DeviceStep(gpu, compiled, arrays, scalars, separate_kernels(("sm_90",)))
try:
    separate = step.time(100, traffic, 1.0)
finally:
    step.free()
result = {"decoder": {k: v for k, v in timed.items() if k in ("timing", "graph_timing")}, "separate": separate,
          "bytes": traffic.bytes}
print(json.dumps(result, default=str)[:3000])
json.dump(result, open(os.path.join(os.environ.get("OUT", "."), "decoder_time.json"), "w"), default=str, indent=1)
