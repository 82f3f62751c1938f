"""The CUDA driver through cuda-python: load cubins, query and set kernel attributes (the
launch itself goes through kfc.runtime.launcher).

Everything here runs in torch's CUDA context (the primary context of the current device), on
the caller's stream. Without a GPU or driver, the first call raises one clear KfcError.
"""

from __future__ import annotations

import ctypes
import functools

from ..diagnostics import GpuUnavailable, KfcError
from .launcher import max_active_clusters


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # older cuda-python
        except ImportError:
            raise GpuUnavailable("cuda-python is not installed", hint="pip install cuda-python") from None
    return driver


def check(result, what: str):
    """Unpack a cuda-python (err, *values) tuple, raising on error."""
    drv = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, msg = drv.cuGetErrorString(err)
        text = msg.decode() if isinstance(msg, bytes) else str(msg)
        raise KfcError(f"CUDA error in {what}: {err.name if hasattr(err, 'name') else err}: {text}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


@functools.cache
def ensure_context(device_index: int):
    """Make torch's context for the device current (creating it if torch has not yet)."""
    try:
        import torch
    except ImportError:
        raise GpuUnavailable("torch is needed to run kernels") from None
    if not torch.cuda.is_available():
        raise GpuUnavailable("no CUDA GPU is visible", hint="kernels run on a machine with an NVIDIA GPU; "
                                                            "`kfc compile` works without one")
    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.empty(1, device=f"cuda:{device_index}")  # forces the primary context
    drv = _driver()
    try:
        check(drv.cuInit(0), "cuInit")
    except Exception as e:  # noqa: BLE001 - a missing driver library shows up here
        raise GpuUnavailable(f"the CUDA driver is unavailable: {e}") from None
    dev = check(drv.cuDeviceGet(device_index), "cuDeviceGet")
    ctx = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    return ctx


class LoadedKernel:
    """One kernel of a loaded cubin, bound to a device."""

    def __init__(self, cubin: bytes, name: str, device_index: int) -> None:
        drv = _driver()
        self.device_index = device_index
        ctx = ensure_context(device_index)
        check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.module = check(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.function = check(drv.cuModuleGetFunction(self.module, name.encode()), "cuModuleGetFunction")
        self.name = name
        self._non_portable = False
        self._siblings: dict[str, LoadedKernel] = {}

    def sibling(self, name: str) -> "LoadedKernel":
        """Another kernel of the same cubin, from the module already loaded."""
        if name not in self._siblings:
            other = object.__new__(LoadedKernel)
            other.device_index, other.module, other.name = self.device_index, self.module, name
            other.function = check(_driver().cuModuleGetFunction(self.module, name.encode()), "cuModuleGetFunction")
            other._non_portable, other._siblings = False, {}
            self._siblings[name] = other
        return self._siblings[name]

    def allow_large_clusters(self) -> None:
        """Clusters of more than 8 CTAs are 'non-portable' and must be allowed per kernel."""
        if not self._non_portable:
            drv = _driver()
            check(drv.cuFuncSetAttribute(
                self.function, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                "allowing a cluster of more than 8 CTAs")
            self._non_portable = True

    def allow_dynamic_smem(self, nbytes: int) -> None:
        """Dynamic shared memory past 48 KB must be allowed per kernel."""
        drv = _driver()
        check(drv.cuFuncSetAttribute(
            self.function, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
            f"allowing {nbytes} bytes of dynamic shared memory")

    def max_active_blocks(self, block: int, smem: int = 0) -> int:
        drv = _driver()
        return check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, block, smem),
                     "cuOccupancyMaxActiveBlocksPerMultiprocessor")

    def max_active_clusters(self, block: int, smem: int, cluster: int) -> int:
        return max_active_clusters(int(self.function), block, smem, cluster)



CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "int": ctypes.c_int, "long long": ctypes.c_longlong,
          "bool": ctypes.c_bool, "signed char": ctypes.c_int8}
