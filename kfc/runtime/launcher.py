"""The launch fast path: everything about a call that depends only on its signature (the
tensors' dtypes, shapes and device, the scalars' presence, whether outputs are given) is
decided once and kept in a `PreparedLaunch`; a call that matches one only checks what can
change between calls (contiguity and 16-byte alignment of each tensor), allocates the outputs,
writes the pointers into a ready argument array and calls `cuLaunchKernelEx` through ctypes.

Why ctypes on libcuda and not cuda-python's wrapper: the wrapper converts the argument tuple
and the launch config on every call; here both are C structures built once and updated in
place, so a launch costs one foreign call (`bench/launch_overhead.py` measures it).

Self-contained (the standard library, ctypes and torch): `kfc package` copies it into the
packages it writes, which run without kfc.

The CUDA structures are laid out as cuda.h declares them (CUDA 12 and 13):

    CUlaunchConfig { unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                     sharedMemBytes; CUstream hStream; CUlaunchAttribute *attrs; unsigned numAttrs; }
    CUlaunchAttribute { CUlaunchAttributeID id; char pad[4]; CUlaunchAttributeValue value; }
    CUlaunchAttributeValue: a 64-byte union; clusterDim is { unsigned x, y, z } at its start
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4; CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14 (tests/test_launcher.py reads them from cuda.h)
"""

from __future__ import annotations

import ctypes
import functools

try:
    from ..diagnostics import GpuUnavailable, KfcError as LaunchError
except ImportError:  # vendored into a package `kfc package` wrote, which runs without kfc
    class LaunchError(RuntimeError):
        pass

    class GpuUnavailable(LaunchError):
        pass

CLUSTER_DIMENSION = 4                   # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8       # CU_FUNC_ATTRIBUTE_*, as cuda.h numbers them
NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
INVALID_CONTEXT = 201  # CUDA_ERROR_INVALID_CONTEXT: no current context on this thread


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("cluster", ctypes.c_uint * 3), ("_align", ctypes.c_void_p)]


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def launch_config(grid, block, smem: int, cluster: int):
    """A CUlaunchConfig, with the cluster dimension attribute where clusters hold several CTAs,
    and that attribute (the config points at it: keep it alive as long as the config)."""
    config = _LaunchConfig(*grid, *block, smem, None, None, 0)
    attr = None
    if cluster > 1:
        attr = _LaunchAttribute()
        attr.id = CLUSTER_DIMENSION
        attr.value.cluster[0], attr.value.cluster[1], attr.value.cluster[2] = cluster, 1, 1
        config.attrs, config.numAttrs = ctypes.pointer(attr), 1
    return config, attr


@functools.cache
def libcuda():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GpuUnavailable(f"the CUDA driver library cannot be loaded: {e}") from None
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.cuLaunchKernelEx.restype = ctypes.c_int
    lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    lib.cuCtxSetCurrent.restype = ctypes.c_int
    lib.cuModuleGetFunction.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p]
    return lib


def current_stream_getter():
    """A function of a device index giving torch's current raw stream handle (the private
    accessor when torch has it: it skips building a Stream object)."""
    import torch  # lazy: torch, seconds cold (importtime: 14.6 s here); kfc.runtime imports without it

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class TensorMapSlot:
    """A CUtensorMap argument: 128 bytes at a 64-byte aligned address, as cuda.h declares it
    (ctypes before Python 3.13 aligns a structure to 16 at most, so it is cut out of a larger
    buffer)."""

    SIZE, ALIGN = 128, 64

    def __init__(self) -> None:
        self._buffer = (ctypes.c_char * (self.SIZE + self.ALIGN - 1))()
        base = ctypes.addressof(self._buffer)
        self.address = base + -base % self.ALIGN

    def fill(self, encoded: bytes | None) -> None:
        """Write an encoded map; None (an optional tensor left out) writes zeros."""
        ctypes.memmove(self.address, encoded or bytes(self.SIZE), self.SIZE)


class ArgSlots:
    """The kernel's argument array: one C value per parameter and the void* array pointing at
    them, so a call updates values in place."""

    def __init__(self, ctypes_types: list) -> None:
        self.values = [t() for t in ctypes_types]
        self.array = (ctypes.c_void_p * max(1, len(self.values)))(
            *[v.address if isinstance(v, TensorMapSlot) else ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
              for v in self.values])
        self.address = ctypes.addressof(self.array)


class PreparedLaunch:
    """One signature's launch: grid, block, cluster, the argument slots, and which call
    argument feeds each slot."""

    def __init__(self, function: int, context: int, grid: tuple[int, int, int], block: tuple[int, int, int],
                 cluster: int, smem: int, slot_types: list, device_index: int, name: str) -> None:
        self.lib = libcuda()
        self.function = function
        self.context = context
        self.device_index = device_index
        self.name = name
        self.slots = ArgSlots(slot_types)
        self.cluster = cluster
        self.config, self.attr = launch_config(grid, block, smem, cluster)
        self.config_ref = ctypes.byref(self.config)
        self.stream_of = current_stream_getter()

    def launch(self) -> None:
        lib = self.lib
        self.config.hStream = self.stream_of(self.device_index)
        err = lib.cuLaunchKernelEx(self.config_ref, self.function, self.slots.address, None)
        if err == INVALID_CONTEXT:  # a thread where torch has not made its context current yet
            err = lib.cuCtxSetCurrent(self.context) or \
                lib.cuLaunchKernelEx(self.config_ref, self.function, self.slots.address, None)
        if err:
            self.raise_error(err)

    def raise_error(self, err: int) -> None:
        raise LaunchError(f"CUDA error in launching {self.name}: {error_text(err)}")


def error_text(err: int) -> str:
    """The driver's name and description of an error code (CUDA_ERROR_...: ...)."""
    lib = libcuda()
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(err, ctypes.byref(name))
    lib.cuGetErrorString(err, ctypes.byref(text))
    return f"{(name.value or b'CUDA error %d' % err).decode()}: {(text.value or b'unknown error').decode()}"


def check(err: int, what: str) -> None:
    if err:
        raise LaunchError(f"CUDA error in {what}: {error_text(err)}")


class Module:
    """A cubin loaded into a context (torch's, from primary_context) with the driver's own calls,
    and one kernel of it: what kfc's runtime and the packages it writes (which ship without kfc
    and cuda-python) both load with."""

    def __init__(self, cubin: bytes, kernel: str, context: int) -> None:
        lib = libcuda()
        check(lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        self._image = ctypes.create_string_buffer(cubin, len(cubin))
        self.handle, fn = ctypes.c_void_p(), ctypes.c_void_p()
        check(lib.cuModuleLoadData(ctypes.byref(self.handle), self._image), "cuModuleLoadData")
        check(lib.cuModuleGetFunction(ctypes.byref(fn), self.handle, kernel.encode()), f"cuModuleGetFunction({kernel})")
        self.function = fn.value
        self.name = kernel
        self._siblings: dict[str, Module] = {}
        self._large_clusters = False

    def sibling(self, kernel: str) -> "Module":
        """Another kernel of the same cubin, from the module already loaded."""
        if kernel not in self._siblings:
            other = object.__new__(Module)
            other._image, other.handle, other.name = self._image, self.handle, kernel
            fn = ctypes.c_void_p()
            check(libcuda().cuModuleGetFunction(ctypes.byref(fn), self.handle, kernel.encode()),
                  f"cuModuleGetFunction({kernel})")
            other.function, other._siblings, other._large_clusters = fn.value, {}, False
            self._siblings[kernel] = other
        return self._siblings[kernel]

    def allow_large_clusters(self) -> None:
        """Clusters of more than 8 CTAs are 'non-portable' and must be allowed per kernel."""
        if not self._large_clusters:
            check(libcuda().cuFuncSetAttribute(ctypes.c_void_p(self.function), NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                  "allowing a cluster above 8")
            self._large_clusters = True

    def allow_dynamic_smem(self, nbytes: int) -> None:
        check(libcuda().cuFuncSetAttribute(ctypes.c_void_p(self.function), MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
              f"allowing {nbytes} bytes of dynamic shared memory")

    def max_active_blocks(self, block: int, smem: int = 0) -> int:
        n = ctypes.c_int()
        check(libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(self.function),
                                                                     block, ctypes.c_size_t(smem)),
              "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return n.value

    def max_active_clusters(self, block: int, smem: int, cluster: int) -> int:
        return max_active_clusters(self.function, block, smem, cluster)


def max_active_clusters(function: int, block: int, smem: int, cluster: int) -> int:
    """How many clusters of `cluster` CTAs of `block` threads can run at once on the whole GPU:
    clusters are placed within one GPC, so this is below SMs x CTAs per SM / cluster (measured
    on the H200: 45 clusters of 8 where that product gives 49, leaving 4 for a second wave)."""
    config, _attr = launch_config((cluster, 1, 1), (block, 1, 1), smem, cluster)
    n = ctypes.c_int()
    check(libcuda().cuOccupancyMaxActiveClusters(ctypes.byref(n), ctypes.c_void_p(function), ctypes.byref(config)),
          "cuOccupancyMaxActiveClusters")
    return n.value


@functools.cache
def primary_context(device_index: int) -> int:
    """torch's context for the device (its primary context, created if torch has not yet);
    without torch, a GPU or the driver, one clear GpuUnavailable."""
    try:
        import torch  # lazy: torch, seconds cold (importtime: 14.6 s here); kfc.runtime imports without it
    except ImportError:
        raise GpuUnavailable("torch is needed to run kernels") from None
    if not torch.cuda.is_available():
        raise GpuUnavailable("no CUDA GPU is visible; kernels run on a machine with an NVIDIA GPU "
                             "(`kfc compile` works without one)")
    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.empty(1, device=f"cuda:{device_index}")  # forces the primary context
    lib = libcuda()
    check(lib.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(lib.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
    check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    return ctx.value
