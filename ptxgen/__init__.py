"""ptxgen: declarative kernel specs -> PTX -> cubins, checked on CPU and GPU."""

__version__ = "0.1.0"
