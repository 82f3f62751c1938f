"""Running kernels: cubins loaded and launched through cuda-python on torch's stream."""

from .kernel import KfcKernel, current_target, load

__all__ = ["KfcKernel", "current_target", "load"]
