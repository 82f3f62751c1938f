"""The compiled launch fast path (kfc/runtime/fastcall.cpp) on the host, no GPU: it builds
warning-free against torch, its CUDA structures match cuda.h, and a Launcher driven by CPU
tensors and a stand-in cuLaunchKernelEx (a ctypes callback) fills every argument slot, makes
the outputs, takes the stream, and refuses (returns `miss` for) every argument the signature
does not cover."""

import ctypes
import subprocess
import sysconfig

import pytest
import torch

from kfc.codegen.toolchain import find_toolchain
from kfc.runtime import fastcall, launcher

pytestmark = pytest.mark.xdist_group("fastcall")  # on one pytest-xdist worker: it builds the fast-call extension once

MISS = object()


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    path = fastcall.build(tmp_path_factory.mktemp("fastcall"),
                          ("-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
                           "-Wno-cast-function-type"))
    return fastcall.load_from(path)


def test_the_c_structures_have_cuda_h_layout(tmp_path):
    """fastcall.cpp's static_asserts against cuda.h (nvcc compiles only that part of it)."""
    r = subprocess.run([find_toolchain().nvcc, "-c", "-x", "c++", "-DKFC_CHECK_CUDA_H", f"-I{sysconfig.get_paths()['include']}",
                        str(fastcall.SOURCE), "-o", str(tmp_path / "check.o")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr


def tensor(*shape, dtype=torch.float32, offset=0):
    """A CPU tensor whose address is 16-byte aligned plus `offset` bytes."""
    n = 1
    for d in shape:
        n *= d
    base = torch.empty(n + 64, dtype=dtype)
    skip = (-base.data_ptr() % 16 + offset) // base.element_size()
    return base[skip:skip + n].view(*shape)


class Driver:
    """A stand-in for cuLaunchKernelEx / cuCtxSetCurrent that records what it was given."""

    LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(launcher._LaunchConfig), ctypes.c_void_p,
                              ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
    CTX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)

    def __init__(self, results=(0,)):
        self.results = list(results)
        self.calls = []
        self.contexts = []
        self.launch = self.LAUNCH(self._launch)
        self.ctx = self.CTX(self._ctx)

    def _launch(self, config, function, params, extra):
        c = config.contents
        cluster = tuple(c.attrs.contents.value.cluster) if c.numAttrs else None
        raw = [ctypes.c_uint64.from_address(params[k]).value for k in range(5)]
        self.calls.append({"grid": (c.gridDimX, c.gridDimY, c.gridDimZ), "block": c.blockDimX, "stream": c.hStream,
                           "function": function, "cluster": cluster, "raw": raw})
        return self.results.pop(0) if self.results else 0

    def _ctx(self, context):
        self.contexts.append(context)
        return 0


def make(native, driver, *, nargs=3, given=False, grid=(4, 1, 1), cluster=1, errors=None):
    """A launcher for f(x: f32[2, 8], w: f32[8], eps: float) -> y: f32[2, 8] on the CPU (device
    -1), slots (x, w, eps, y, M)."""
    errors = errors if errors is not None else []

    def on_error(code):
        errors.append(code)
        raise RuntimeError(f"launch failed with {code}")

    k = fastcall.KINDS
    return native.Launcher(
        launch=ctypes.cast(driver.launch, ctypes.c_void_p).value, ctx_set=ctypes.cast(driver.ctx, ctypes.c_void_p).value,
        context=0xC0, function=0xF0, grid=grid, block=(128, 1, 1), cluster=cluster, smem=0,
        kinds=bytes([k["ptr"], k["ptr"], k["float"], k["ptr"], k["long long"]]), fixed={4: 2},
        nargs=nargs, tensors=[(0, 0, torch.float32, (2, 8), -1), (1, 1, torch.float32, (8,), -1)],
        scalars=[(2, 2)] if nargs == 3 else [], outputs=[(0, 3, torch.float32, (2, 8), -1)], outputs_given=given,
        stream_of=lambda device: 0x5000 + device + 1, device=-1, on_error=on_error, miss=MISS, name="k")


def as_float(raw):
    return ctypes.c_float.from_buffer_copy(ctypes.c_uint32(raw & 0xFFFFFFFF)).value


def test_a_launch_fills_every_slot(native):
    drv = Driver()
    lau = make(native, drv, cluster=2)
    x, w = tensor(2, 8), tensor(8)
    y = lau((x, w, 0.5))
    assert isinstance(y, torch.Tensor) and y.shape == (2, 8) and y.dtype == torch.float32 and y.is_contiguous()
    (call,) = drv.calls
    assert call["grid"] == (4, 1, 1) and call["block"] == 128 and call["stream"] == 0x5000
    assert call["function"] == 0xF0 and call["cluster"] == (2, 1, 1)
    raw = call["raw"]
    assert raw[0] == x.data_ptr() and raw[1] == w.data_ptr() and as_float(raw[2]) == 0.5
    assert raw[3] == y.data_ptr() and raw[4] == 2
    y2 = native.dispatch([lau], (x, w, 2), None, MISS)  # an int where a float goes
    assert as_float(drv.calls[-1]["raw"][2]) == 2.0 and y2.data_ptr() != y.data_ptr()


@pytest.mark.parametrize("change", ["dtype", "shape", "contiguous", "aligned", "none", "type", "nargs", "scalar",
                                    "out", "meta"])
def test_what_the_signature_does_not_cover_misses(native, change):
    drv = Driver()
    lau = make(native, drv)
    x, w = tensor(2, 8), tensor(8)
    args, out = (x, w, 0.5), None
    if change == "dtype":
        args = (tensor(2, 8, dtype=torch.float16), w, 0.5)
    elif change == "shape":
        args = (tensor(3, 8), w, 0.5)
    elif change == "contiguous":
        args = (tensor(8, 2).t(), w, 0.5)
    elif change == "aligned":
        args = (x, tensor(8, offset=4), 0.5)
    elif change == "none":
        args = (x, None, 0.5)
    elif change == "type":
        args = ([1.0] * 16, w, 0.5)
    elif change == "nargs":
        args = (x, w)
    elif change == "scalar":
        args = (x, w, "0.5")
    elif change == "out":
        out = tensor(2, 8)
    elif change == "meta":
        args = (torch.empty(2, 8, device="meta"), w, 0.5)
    assert lau(args, out) is MISS
    assert native.dispatch([lau], args, out, MISS) is MISS
    assert not drv.calls


def test_given_outputs_are_checked_not_made(native):
    drv = Driver()
    lau = make(native, drv, given=True)
    x, w, y = tensor(2, 8), tensor(8), tensor(2, 8)
    assert lau((x, w, 0.5), y) is y
    assert lau((x, w, 0.5), [y]) is y
    assert drv.calls[-1]["raw"][3] == y.data_ptr()
    for bad in (None, tensor(2, 4), tensor(2, 8, offset=8), tensor(2, 8, dtype=torch.float64), (y, y)):
        assert lau((x, w, 0.5), bad) is MISS


def test_an_int_slot_out_of_range_misses(native):
    drv = Driver()
    k = fastcall.KINDS
    lau = native.Launcher(
        launch=ctypes.cast(drv.launch, ctypes.c_void_p).value, ctx_set=ctypes.cast(drv.ctx, ctypes.c_void_p).value,
        context=1, function=2, grid=(1, 1, 1), block=(32, 1, 1), cluster=1, smem=0,
        kinds=bytes([k["int"], k["ptr"], 0, 0, 0]), fixed={}, nargs=1, tensors=[], scalars=[(0, 0)],
        outputs=[(0, 1, torch.int32, (3,), -1)], outputs_given=False, stream_of=lambda d: 0, device=-1,
        on_error=lambda c: None, miss=MISS, name="i")
    assert lau((2**31 - 1,)) is not MISS
    assert ctypes.c_int32(drv.calls[-1]["raw"][0] & 0xFFFFFFFF).value == 2**31 - 1
    assert lau((-5,)) is not MISS and ctypes.c_int32(drv.calls[-1]["raw"][0] & 0xFFFFFFFF).value == -5
    for bad in (2**31, -(2**31) - 1, 2**70, 1.5):
        assert lau((bad,)) is MISS


def test_no_rows_makes_the_outputs_but_does_not_launch(native):
    drv = Driver()
    lau = make(native, drv, grid=(0, 1, 1))
    y = lau((tensor(2, 8), tensor(8), 0.5))
    assert y.shape == (2, 8) and not drv.calls


def test_a_missing_context_is_made_current_and_the_launch_retried(native):
    drv = Driver(results=[launcher.INVALID_CONTEXT, 0])
    lau = make(native, drv)
    lau((tensor(2, 8), tensor(8), 0.5))
    assert drv.contexts == [0xC0] and len(drv.calls) == 2


def test_a_failed_launch_raises_through_on_error(native):
    drv = Driver(results=[700])
    errors = []
    lau = make(native, drv, errors=errors)
    with pytest.raises(RuntimeError, match="launch failed with 700"):
        lau((tensor(2, 8), tensor(8), 0.5))
    assert errors == [700]


def test_dispatch_takes_the_first_launcher_that_fits(native):
    drv = Driver()
    lau = make(native, drv)
    x, w = tensor(2, 8), tensor(8)
    assert native.dispatch([object(), lau], (x, w, 0.5), None, MISS) is not MISS
    assert native.dispatch([], (x, w, 0.5), None, MISS) is MISS


@pytest.mark.parametrize("bad", [{"tensors": [(0, 5, torch.float32, (1,), -1)]}, {"tensors": [(3, 0, torch.float32, (1,), -1)]},
                                 {"scalars": [(0, 9)]}, {"fixed": {7: 1}}, {"kinds": bytes(65)},
                                 {"tensors": [(0, 0, "f32", (1,), -1)]}])
def test_bad_construction_is_refused(native, bad):
    drv = Driver()
    spec = dict(launch=ctypes.cast(drv.launch, ctypes.c_void_p).value, ctx_set=0, context=0, function=0,
                grid=(1, 1, 1), block=(32, 1, 1), cluster=1, smem=0, kinds=bytes([0, 0]), fixed={}, nargs=1,
                tensors=[], scalars=[], outputs=[], outputs_given=False, stream_of=lambda d: 0, device=-1,
                on_error=lambda c: None, miss=MISS, name="bad")
    spec.update(bad)
    with pytest.raises((ValueError, TypeError)):
        native.Launcher(**spec)


def test_a_launcher_never_initialised_or_initialised_twice_is_refused(native):
    drv = Driver()
    bare = native.Launcher.__new__(native.Launcher)
    with pytest.raises(RuntimeError, match="never initialised"):
        bare(())
    with pytest.raises(RuntimeError, match="never initialised"):
        native.dispatch([bare], (), None, MISS)
    lau = make(native, drv)
    x, w = tensor(2, 8), tensor(8)
    spec = dict(launch=0, ctx_set=0, context=0, function=0, grid=(1, 1, 1), block=(32, 1, 1), cluster=1, smem=0,
                kinds=bytes([0]), fixed={}, nargs=1, tensors=[], scalars=[], outputs=[], outputs_given=False,
                stream_of=lambda d: 0, device=-1, on_error=lambda c: None, miss=MISS, name="again")
    with pytest.raises(RuntimeError, match="initialised once"):
        lau.__init__(**spec)
    assert lau((x, w, 0.5)) is not MISS, "the refused second init changed nothing"
    assert lau((x,)) is MISS


def test_an_empty_grid_dimension_launches_nothing(native):
    drv = Driver()
    lau = make(native, drv, grid=(4, 0, 1))
    lau((tensor(2, 8), tensor(8), 0.5))
    assert not drv.calls


def test_which_signatures_the_compiled_launcher_serves():
    """A scalar passed as None takes its default, which the launcher cannot tell from a value;
    out= must give every output as a tensor."""
    from kfc.runtime.calls import PreparedCall

    call = PreparedCall.__new__(PreparedCall)
    call.scalar_args, call.outputs = {2}, [("y", 3), ("z", 4)]
    call.followers, call.workspaces, call.maps, call.out_maps = [], {}, [], []
    x = object()
    assert call.can_be_native((x, x, 0.5), None)
    assert call.can_be_native((x, x), None)
    assert not call.can_be_native((x, x, None), None)
    assert call.can_be_native((x, x, 0.5), (x, x)) and call.can_be_native((x, x, 0.5), [x, x])
    assert not call.can_be_native((x, x, 0.5), (x, None))
    assert not call.can_be_native((x, x, 0.5), x)
    call.workspaces = {"kfc_ws0": (4, 8)}  # an op of several kernels: the ctypes path launches them
    assert not call.can_be_native((x, x, 0.5), None)
