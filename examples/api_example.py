"""ptxgen's Python API, end to end: load the kernels of a spec (or of a `ptxgen build` folder) and
call them. With torch and a GPU, the kernels run on the GPU on torch's current stream (and can be
captured in a CUDA graph); without, the same call on numpy arrays runs the PTX in the interpreter.

    python examples/api_example.py [SPEC_OR_ARTIFACT_FOLDER]
"""

import sys

import numpy as np

import ptxgen


def main(source: str) -> None:
    kernels = ptxgen.load(source)
    norm = kernels.qwen3_8b_rmsnorm
    print(norm)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4096)).astype(np.float32)
    gamma = np.ones(4096, np.float32)
    try:
        import torch

        on_gpu = torch.cuda.is_available()
    except ImportError:
        on_gpu = False
    if on_gpu:
        xt, gt = torch.from_numpy(x).cuda(), torch.from_numpy(gamma).cuda()
        yt = torch.empty_like(xt)
        norm(xt, gt, yt, rows=2)  # on torch's current stream; nothing allocated, nothing synchronised
        y = yt.cpu().numpy()
    else:
        y = np.empty_like(x)
        norm(x, gamma, y, rows=2)  # numpy arrays: the same PTX in the CPU interpreter
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6)
    print(f"ran on {'the GPU' if on_gpu else 'the interpreter'}; max |y - float64| = {np.abs(y - expected).max():.2e}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "specs/qwen3.toml")
