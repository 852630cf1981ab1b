"""ptxgen: declarative kernel specs -> PTX -> cubins, checked on CPU and GPU.

`ptxgen.load(path)` gives the compiled kernels of a spec or of a `ptxgen build` folder, callable
on torch/CuPy/DLPack GPU arrays or on numpy arrays (the interpreter); see ptxgen.api.
"""

from .errors import DeviceUnavailable, LaunchError, PtxgenError, SpecError

__version__ = "0.2.0"
__all__ = ["load", "PtxgenError", "SpecError", "LaunchError", "DeviceUnavailable", "__version__"]


def load(path, *, archs=None):
    """The compiled kernels of a spec file or an artifact folder (ptxgen.api.load)."""
    from .api import load as load_kernels

    return load_kernels(path, archs=archs)
