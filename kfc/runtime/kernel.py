"""Calling a kfc kernel from torch.

    rmsnorm = kfc.load("kernels/rmsnorm.kfc")      # target from the current GPU
    y = rmsnorm(x, w)                                # compiled for x's row length on first use

The first call of a signature checks every tensor (dtype, device, contiguity, shape against the
signature), binds the dims, fetches the kernel for those dims from the JIT cache (compiling on a
miss), allocates the outputs (or takes `out=`), and prepares the launch (kfc.runtime.launcher).
Later calls of the same positional signature take the fast path: contiguity and alignment
checks, output allocation, argument slots updated in place, one launch. Anything the fast path
does not recognise goes the full way, which says what is wrong.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from pathlib import Path
from typing import Any

import attrs

from ..diagnostics import KfcError
from ..frontend.spec import instantiate, load_kfc
from ..model.spec import OpSpec
from ..ir.dtypes import dtype_of_torch
from ..ir.printer import print_ir
from ..ir.signature import bind_dims, output_shape
from ..ir.types import MemSpace
from ..model.target import Target, parse_target
from . import cache, contract, fastcall, tensor_maps
from .driver import CTYPES, LoadedKernel


def spec_key(spec: OpSpec) -> tuple:
    return tuple(sorted(spec.dtypes.items()))


def current_target() -> Target:
    import torch

    if not torch.cuda.is_available():
        from ..diagnostics import GpuUnavailable

        raise GpuUnavailable("no CUDA GPU is visible", hint="pass target= to compile without running")
    major, minor = torch.cuda.get_device_capability()
    sm = major * 10 + minor
    if sm not in (90, 100):
        raise KfcError(f"this GPU is sm_{sm}; kfc targets Hopper (sm_90) and Blackwell (sm_100)")
    return Target(sm, True)


class KfcKernel:
    def __init__(self, spec: OpSpec, target: str | Target | None = None, pipeline: str | None = None) -> None:
        self.spec = spec
        self.func = spec.func
        self._instances: dict[tuple, OpSpec] = {spec_key(spec): spec}
        self._kernels: dict[tuple, KfcKernel] = {}
        self._target = parse_target(target) if isinstance(target, str) else target
        self.pipeline = pipeline
        self._loaded: dict[tuple, tuple[LoadedKernel, dict]] = {}
        self._lock = threading.Lock()
        self._native = _UNRESOLVED  # the compiled fast path, None for the ctypes one below; built on first launch
        self._launchers: list = []  # the compiled fast path's prepared signatures, newest first
        self._fast: dict[tuple, PreparedCall] = {}

    @property
    def name(self) -> str:
        return self.func.sym_name

    @property
    def target(self) -> Target:
        if self._target is None:
            self._target = current_target()
        return self._target

    # --- binding ------------------------------------------------------------------------------
    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        names = self.func.input_names
        if len(args) > len(names):
            raise KfcError(f"{self.name} takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise KfcError(f"{self.name} has no input {k!r}", hint=f"its inputs are {', '.join(names)}")
            if k in bound:
                raise KfcError(f"input {k!r} given twice")
            bound[k] = v
        return bound

    def check_tensor(self, name: str, value, t, device) -> None:
        import torch

        if value is None:
            if not t.optional:
                raise KfcError(f"{self.name}: missing tensor {name!r} ({t})")
            return
        if not isinstance(value, torch.Tensor):
            raise KfcError(f"{self.name}: {name!r} must be a torch tensor, not {type(value).__name__}")
        if value.dtype != t.dtype.torch:
            raise KfcError(f"{self.name}: {name!r} is {value.dtype}, the kernel takes {t.dtype} ({t.dtype.torch})",
                           hint=f"convert it with .to({t.dtype.torch})")
        if value.device.type != "cuda":
            raise KfcError(f"{self.name}: {name!r} is on {value.device}; kernels run on the GPU",
                           hint="move it with .cuda()")
        if device is not None and value.device != device:
            raise KfcError(f"{self.name}: {name!r} is on {value.device} but the other tensors are on {device}")
        if not value.is_contiguous():
            raise KfcError(f"{self.name}: {name!r} is not contiguous (strides {tuple(value.stride())})",
                           hint="call .contiguous() first")
        if value.data_ptr() % 16:
            raise KfcError(f"{self.name}: {name!r} is not 16-byte aligned", hint="pass a freshly allocated tensor")

    # --- compile ------------------------------------------------------------------------------
    def kernel_for(self, dims: dict[str, int], device_index: int):
        from ..compile import fixed_dims

        fixed = fixed_dims(self.func, dims)
        memo = (tuple(sorted(fixed.items())), device_index)
        with self._lock:
            if memo not in self._loaded:
                cubin, report = cached_compile(self.spec, self.target, self.pipeline, dims)
                name = contract.kernels_of(report, self.name)[0]["name"]
                self._loaded[memo] = (LoadedKernel(cubin, name, device_index), report)
            return self._loaded[memo]

    def instance_for(self, bound: dict[str, Any]) -> "KfcKernel":
        """The kernel instantiated for the dtypes of the tensors passed to typed parameters."""
        if not self.spec.type_params:
            return self
        want = dict(self.spec.dtypes)
        for param, tv in self.spec.typed_params.items():
            value = bound.get(param)
            if value is None or not hasattr(value, "dtype"):
                continue
            kd = dtype_of_torch(value.dtype)
            name = kd.value if kd is not None else str(value.dtype)
            options = dict(self.spec.type_params)[tv]
            if name not in options:
                raise KfcError(f"{self.name}: {param!r} is {value.dtype}; its type {tv} takes {' | '.join(options)}")
            want[tv] = name
        key = tuple(sorted(want.items()))
        if key not in self._instances:
            self._instances[key] = instantiate(self.spec, want)
        spec = self._instances[key]
        if spec is self.spec:
            return self
        inst = self._kernels.get(key)
        if inst is None:
            inst = KfcKernel(spec, self._target, self.pipeline)
            inst._native = self._native
            self._kernels[key] = inst
        return inst

    # --- call ---------------------------------------------------------------------------------
    def __call__(self, *args, out=None, **kwargs):
        if not kwargs:
            native = self._native
            fast = native.dispatch(self._launchers, args, out, _MISS) if native else _MISS
            if fast is _MISS:  # a signature the compiled launcher does not serve (several kernels)
                fast = self._fast_call(args, out)
            if fast is not _MISS:
                return fast
        bound = self.bind(args, kwargs)
        inst = self.instance_for(bound)
        if inst is not self:
            result = inst(*args, out=out, **kwargs)
            if self._native is _UNRESOLVED:  # the instance chose the launcher on its first launch
                self._native = inst._native
            if not kwargs:  # the instance's prepared calls serve this signature from here on
                key = (_signature(args), _out_signature(out))
                if key in inst._fast:
                    self._fast[key] = inst._fast[key]
                for launcher in inst._launchers:
                    if launcher not in self._launchers:
                        _remember(self._launchers, launcher)
            return result
        return self._call(bound, out, args if not kwargs else None)

    def _fast_call(self, args: tuple, out):
        """A call whose signature was seen before: check contiguity and alignment, allocate
        the outputs, fill the argument slots, launch. _MISS when the signature is new (or a
        check fails: the full path then says what is wrong)."""
        key = (_signature(args), _out_signature(out))
        prepared = self._fast.get(key)
        if prepared is None:
            return _MISS
        return prepared.call(args, out)

    def _call(self, bound: dict[str, Any], out, positional: tuple | None = None):
        import torch

        func = self.func
        device = None
        shapes = {}
        for v in func.inputs:
            t = v.ttype
            if t.space is MemSpace.REG:
                continue
            value = bound.get(v.name)
            self.check_tensor(v.name, value, t, device)
            if value is not None:
                device = device or value.device
            shapes[v.name] = None if value is None else tuple(value.shape)
        if device is None:
            raise KfcError(f"{self.name}: no tensor input tells the device")
        dims = bind_dims(func, shapes)
        outs = self.outputs(out, dims, device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        loaded, report = self.kernel_for(dims, index)
        if self._native is _UNRESOLVED:
            self._native = fastcall.module()
        call = self.prepare(loaded, report, bound, dims, index, out is not None)
        call.run_bound(bound, outs)
        if positional is not None:  # the same signature skips all of this next time
            if self._native and call.can_be_native(positional, out):
                _remember(self._launchers, call.native(self._native, positional, out))
            else:
                self._fast[(_signature(positional), _out_signature(out))] = call
        result = tuple(outs[v.name] for v in func.outputs)
        return result[0] if len(result) == 1 else result

    def outputs(self, out, dims, device) -> dict[str, Any]:
        import torch

        outs = {}
        given = {}
        if out is not None:
            given = dict(zip(self.func.output_names, out if isinstance(out, (tuple, list)) else (out,)))
        for v in self.func.outputs:
            shape = output_shape(v.ttype, dims)
            if v.name in given:
                o = given[v.name]
                self.check_tensor(v.name, o, v.ttype, device)
                if o is not None and tuple(o.shape) != shape:
                    raise KfcError(f"{self.name}: out {v.name!r} is {tuple(o.shape)}, must be {shape}")
                outs[v.name] = o
            else:
                outs[v.name] = torch.empty(shape, dtype=v.ttype.dtype.torch, device=device)
        return outs

    def prepare(self, loaded: LoadedKernel, report: dict, bound: dict, dims: dict, device_index: int,
                outputs_given: bool) -> "PreparedCall":
        """Everything about a launch that its signature fixes: the grid, the argument slots, the
        dims' and defaulted scalars' values, the outputs' shapes."""
        import torch

        kernels = contract.kernels_of(report, self.name)
        call = None
        for n, launch in enumerate(kernels):
            function = loaded if n == 0 else loaded.sibling(launch["name"])
            stage, grid = self.prepare_stage(function, launch, bound, dims, device_index, first=n == 0)
            if call is None:
                allocations = [Allocation(v.ttype.dtype.torch, output_shape(v.ttype, dims), device_index, bound,
                                          self.func.input_names) for v in self.func.outputs]
                call = PreparedCall(stage, allocations, outputs_given)
                call.scalar_args = {self.func.input_names.index(p["name"]) for p in launch["params"]
                                    if p["kind"] == "scalar"}
            else:
                call.followers.append(stage)
            dims = contract.defined_dims(launch, dims, grid[0])
            for p in launch["params"]:
                if p["kind"] == "workspace" and p["name"] not in call.workspaces:
                    call.workspaces[p["name"]] = contract.workspace_shape(p, dims)
        call.device = torch.device("cuda", device_index)
        return call

    def prepare_stage(self, loaded: LoadedKernel, launch: dict, bound: dict, dims: dict, device_index: int,
                      first: bool) -> tuple["Stage", tuple]:
        """One kernel's launch: its grid and its argument slots (the kernels after the first
        take the op's outputs, workspaces and dims only)."""
        import torch

        from ..ir import constexpr
        from .driver import ensure_context
        from .launcher import PreparedLaunch, TensorMapSlot

        slot_types, kinds, fixed, tensors, scalars, outputs, workspaces = [], [], {}, [], [], [], []
        maps = []
        names = self.func.input_names
        for k, p in enumerate(launch["params"]):
            # a tensor map has no fastcall kind: a call that takes one goes the Python way (can_be_native)
            kinds.append(None if p["kind"] == "tensor_map" else fastcall.KINDS[
                p["ctype"] if p["kind"] == "scalar" else "long long" if p["kind"] == "dim" else "ptr"])
            if not first and (p["kind"] == "scalar" or p["kind"] in ("tensor", "tensor_map") and not p["is_output"]):
                raise KfcError(f"{self.name}: its kernel {launch['name']} takes the input {p['name']!r}; this "
                               "runtime passes only outputs, workspaces and dims to the kernels after the first")
            if p["kind"] == "tensor_map":
                if p["is_output"]:
                    raise KfcError(f"{self.name}: its kernel {launch['name']} takes a tensor map of its output "
                                   f"{p['name']!r}; this runtime encodes tensor maps of inputs only")
                slot_types.append(TensorMapSlot)
                maps.append((names.index(p["name"]), k, p, f"{self.name}: {p['name']!r}"))
            elif p["kind"] == "workspace":
                slot_types.append(ctypes.c_void_p)
                workspaces.append((p["name"], k))
            elif p["kind"] == "tensor":
                slot_types.append(ctypes.c_void_p)
                if p["is_output"]:
                    outputs.append((p["name"], k))
                else:
                    tensors.append((names.index(p["name"]), p["name"], k))
            elif p["kind"] == "scalar":
                if p["ctype"] not in CTYPES:
                    raise KfcError(f"{self.name}: scalar parameters of C type {p['ctype']} are not supported")
                slot_types.append(CTYPES[p["ctype"]])
                is_float = "float" in p["ctype"] or "double" in p["ctype"]
                if bound.get(p["name"]) is None:
                    value = self.func.default_of(p["name"])
                    if value is None:
                        raise KfcError(f"{self.name}: missing scalar {p['name']!r}")
                    if isinstance(value, str):
                        value = constexpr.evaluate(value, dims)
                    fixed[k] = float(value) if is_float else int(value)
                else:
                    scalars.append((names.index(p["name"]), p["name"], k, float if is_float else int))
            else:
                slot_types.append(CTYPES["long long"])
                fixed[k] = int(dims[p["name"]])
        cluster, block, smem = launch["cluster"][0], launch["block"], launch["smem_dynamic_bytes"]
        grid = contract.prepare_function(launch, dims, loaded,
                                         torch.cuda.get_device_properties(device_index).multi_processor_count)
        prepared = PreparedLaunch(int(loaded.function), int(ensure_context(device_index)), grid, block, cluster, smem,
                                  slot_types, device_index, loaded.name)
        for k, value in fixed.items():
            prepared.slots.values[k].value = value
        return Stage(prepared, kinds, fixed, tensors, scalars, outputs, workspaces, maps, all(grid)), grid

    # --- torch integration --------------------------------------------------------------------
    def as_torch_op(self, name: str | None = None):
        """This kernel as the torch custom op torch.ops.kfc.<name> (see kfc.ops)."""
        from ..ops import register

        return register(self, name)


_MISS = object()


class _Unresolved:
    """The launcher not chosen yet (falsy, so a call takes the ctypes fast path, misses, and
    the full path chooses)."""

    def __bool__(self) -> bool:
        return False


_UNRESOLVED = _Unresolved()


@functools.cache
def _torch():
    """torch, imported on first use (kfc imports without it)."""
    import torch

    return torch


def _signature(args: tuple) -> tuple:
    """What a call's launch depends on, per positional argument: a tensor's dtype, shape and
    device; for anything else its type (a scalar's value goes into its slot on every call)."""
    return tuple((a.dtype, a.shape, a.get_device()) if isinstance(a, _torch().Tensor) else type(a)
                 for a in args)


def _out_signature(out) -> tuple | None:
    if out is None:
        return None
    return _signature(tuple(out) if isinstance(out, (tuple, list)) else (out,))


def _remember(launchers: list, launcher, keep: int = 16) -> None:
    """Put a prepared signature first; the oldest goes beyond `keep` (each miss costs a check)."""
    launchers.insert(0, launcher)
    del launchers[keep:]


class Allocation:
    """How the ctypes fast path makes one output: like an input of its shape and dtype when
    there is one (torch.empty_like costs a third of torch.empty's host time), else like an input
    of its dtype, else from scratch. (The compiled launcher calls at::empty.)"""

    LIKE, NEW, EMPTY = range(3)

    def __init__(self, dtype, shape: tuple, device_index: int, bound: dict, names: list[str]) -> None:
        torch = _torch()
        self.dtype, self.shape, self.mode, self.arg = dtype, shape, self.EMPTY, -1
        self.device = torch.device("cuda", device_index)
        tensors = [(names.index(n), t) for n, t in bound.items() if isinstance(t, torch.Tensor)]
        for mode, fits in ((self.LIKE, lambda t: tuple(t.shape) == shape and t.dtype == dtype),
                           (self.NEW, lambda t: t.dtype == dtype)):
            hit = next((i for i, t in tensors if fits(t)), None)
            if hit is not None:
                self.mode, self.arg = mode, hit
                return

    def __call__(self, args: tuple):
        if self.mode == self.LIKE:
            return _torch().empty_like(args[self.arg])
        if self.mode == self.NEW:
            return args[self.arg].new_empty(self.shape)
        return _torch().empty(self.shape, dtype=self.dtype, device=self.device)


@attrs.frozen
class Stage:
    """One kernel of a call: its prepared launch and which values fill its argument slots."""

    launch: Any
    kinds: list           # per slot, fastcall.KINDS
    fixed: dict           # slot -> the value the signature fixes (dims, defaulted scalars)
    tensors: list         # (argument index, name, slot)
    scalars: list         # (argument index, name, slot, float | int)
    outputs: list         # (name, slot)
    workspaces: list      # (name, slot)
    maps: list            # (argument index, slot, contract param, what errors call it): encoded per call
    runs: bool            # False when its grid is empty: nothing to launch


class PreparedCall:
    """A signature's call: which positional arguments fill which slots, the outputs to
    allocate (or the given ones to check), and the prepared launches: the op's first kernel,
    then any that follow it (which read the workspaces the call allocates)."""

    def __init__(self, first: Stage, allocators, outputs_given: bool) -> None:
        self.launch = first.launch
        self.kinds = first.kinds
        self.fixed = first.fixed
        self.tensors = first.tensors
        self.scalars = first.scalars
        self.outputs = first.outputs
        self.maps = first.maps
        self.first = first
        self.followers: list[Stage] = []
        self.workspaces: dict[str, tuple[int, ...]] = {}  # name -> shape (f32), allocated per call
        self.device = None
        self.allocators = allocators  # per output: an Allocation (its dtype, shape; how ctypes makes it)
        self.outputs_given = outputs_given
        self.scalar_args: set[int] = set()  # positional indices of the scalar parameters
        self.runs = first.runs      # False when there are no rows: nothing to launch
        self.lock = threading.Lock()
        self.values = first.launch.slots.values

    def run_bound(self, bound: dict, outs: dict) -> None:
        """The full path's launch: arguments by name (positional or keyword), outputs allocated."""
        ptrs = [0 if bound.get(name) is None else bound[name].data_ptr() for _, name, _ in self.tensors]
        scalars = [bound[name] for _, name, _, _ in self.scalars]
        self.run(ptrs, scalars, [outs.get(name) for name, _ in self.outputs],
                 [bound.get(p["name"]) for _, _, p, _ in self.maps])

    def run(self, ptrs: list, scalars: list, outs, maps: list) -> None:
        """Write the slots (tensor pointers, scalar values, output pointers, the tensor maps of
        `maps`' tensors) and launch."""
        values = self.values
        with self.lock:
            for (_, _, k), p in zip(self.tensors, ptrs):
                values[k].value = p
            if self.runs:  # an empty grid launches nothing, and an empty tensor has no map
                for (_, k, param, what), t in zip(self.maps, maps):
                    values[k].fill(None if t is None else tensor_maps.encodings.get(what, t, param))
            for (_, _, k, kind), v in zip(self.scalars, scalars):
                values[k].value = kind(v)
            for (_, k), o in zip(self.outputs, outs):
                values[k].value = 0 if o is None else o.data_ptr()
            if not self.followers and not self.workspaces:
                if self.runs:
                    self.launch.launch()
                return
            torch = _torch()
            # allocated on the current stream per call, like the outputs: calls on other
            # streams never share one
            spaces = {name: torch.empty(shape, dtype=torch.float32, device=self.device)
                      for name, shape in self.workspaces.items()}
            by_name = {name: o for (name, _), o in zip(self.outputs, outs)}
            for stage in (self.first, *self.followers):
                slots = stage.launch.slots.values
                for name, k in stage.workspaces:
                    slots[k].value = spaces[name].data_ptr()
                if stage is not self.first:
                    for name, k in stage.outputs:
                        o = by_name.get(name)
                        slots[k].value = 0 if o is None else o.data_ptr()
                if stage.runs:
                    stage.launch.launch()

    def can_be_native(self, args: tuple, out) -> bool:
        """Whether a compiled launcher can serve this signature: it launches one kernel and
        allocates no workspace; it checks scalars by value, so a scalar passed as None (its
        default) is not one it can tell apart; and it takes out= only as every output, each a
        tensor. Tensor maps are encoded per call in Python, which it does not do, so a kernel
        that takes one always goes the Python way."""
        if self.followers or self.workspaces or self.maps:
            return False
        if any(i < len(args) and args[i] is None for i in self.scalar_args):
            return False
        if out is None:
            return True
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return len(outs) == len(self.outputs) and all(o is not None for o in outs)

    def native(self, module, args: tuple, out):
        """This call as a compiled launcher (fastcall.cpp) for the signature of `args` and `out`."""
        from .driver import ensure_context
        from .launcher import libcuda

        lib = libcuda()
        fixed = dict(self.fixed)
        tensors = []
        for i, _, k in self.tensors:
            if i >= len(args):  # an optional tensor left out: a null pointer
                fixed[k] = 0
                continue
            tensors.append(_tensor_spec(i, k, args[i]))
        launch = self.launch
        config = launch.config
        outputs = [(j, k, a.dtype, a.shape, launch.device_index)
                   for j, ((_, k), a) in enumerate(zip(self.outputs, self.allocators))]
        return module.Launcher(
            launch=ctypes.cast(lib.cuLaunchKernelEx, ctypes.c_void_p).value,
            ctx_set=ctypes.cast(lib.cuCtxSetCurrent, ctypes.c_void_p).value,
            context=int(ensure_context(launch.device_index)), function=launch.function,
            grid=(config.gridDimX, config.gridDimY, config.gridDimZ),
            block=(config.blockDimX, config.blockDimY, config.blockDimZ), cluster=launch.cluster,
            smem=config.sharedMemBytes, kinds=bytes(self.kinds), fixed=fixed, nargs=len(args), tensors=tensors,
            scalars=[(i, k) for i, _, k, _ in self.scalars], outputs=outputs, outputs_given=self.outputs_given,
            stream_of=launch.stream_of, device=launch.device_index, on_error=launch.raise_error, miss=_MISS,
            name=launch.name)

    def call(self, args: tuple, out):
        """The fast path (see KfcKernel._fast_call)."""
        n = len(args)
        ptrs = []
        for i, _, _ in self.tensors:
            t = args[i] if i < n else None
            if t is None:
                ptrs.append(0)
                continue
            p = t.data_ptr()
            if p & 15 or not t.is_contiguous():
                return _MISS
            ptrs.append(p)
        maps = [args[i] if i < n else None for i, _, _, _ in self.maps]
        if any(t is not None and (t.data_ptr() & 15 or not t.is_contiguous()) for t in maps):
            return _MISS
        if self.outputs_given:
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            for o in outs:
                if o is not None and (o.data_ptr() & 15 or not o.is_contiguous()):
                    return _MISS
        else:
            outs = tuple(alloc(args) for alloc in self.allocators)
        self.run(ptrs, [args[i] for i, _, _, _ in self.scalars], outs, maps)
        return outs[0] if len(outs) == 1 else outs


def _tensor_spec(arg: int, slot: int, t) -> tuple:
    """What fastcall.cpp checks of a tensor argument: (argument, slot, dtype, shape, device
    index, -1 for the CPU); a None argument has dtype None."""
    if t is None:
        return (arg, slot, None, (), -1)
    return (arg, slot, t.dtype, tuple(t.shape), t.get_device())


def kernel_cache_key(spec: OpSpec, target: Target, pipeline: str | None, dims: dict[str, int]) -> str:
    """The JIT cache's key for `spec` built with `pipeline` at `dims`."""
    from ..codegen.toolchain import find_toolchain
    from ..compile import fixed_dims

    fixed = fixed_dims(spec.func, dims)
    return cache.cache_key(print_ir(spec.func), pipeline or "", target.name, fixed, find_toolchain().version_text)


def cached_compile(spec: OpSpec, target: Target, pipeline: str | None, dims: dict[str, int]):
    """The cubin and report for `spec` at `dims`, from the JIT cache or compiled into it."""
    from ..compile import compile_op

    key = kernel_cache_key(spec, target, pipeline, dims)
    hit = cache.lookup(key)
    if hit is not None:
        return hit
    result = compile_op(spec, target, pipeline, shape=dims)
    cache.store(key, result.kernel.cubin, result.report)
    return result.kernel.cubin, result.report


def load(path: str | Path, target: str | None = None, pipeline: str | None = None) -> KfcKernel:
    """Load a .kfc file as a callable kernel."""
    return KfcKernel(load_kfc(path), target, pipeline)
