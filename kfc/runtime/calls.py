"""A launch prepared once per call signature, shared by kfc's runtime (kfc.runtime.kernel) and
the packages `kfc package` writes (copied into them beside launcher.py, fastcall.py and
contract.py; the standard library, ctypes and torch only).

The first call of a signature goes the full way: `bind` its arguments to the op's inputs,
`check_tensor` each tensor, `make_outputs`, and `prepare` the call: per kernel of the launch
contract, on its module (launcher.Module), the grid and the argument slots, the values the
signature fixes (dims, defaulted scalars), and the workspaces the kernels share. The
`PreparedCall` it gives then serves every later call of that signature (`PreparedCall.call`,
or a compiled launcher from `PreparedCall.native`).
"""

from __future__ import annotations

import ctypes
import functools
import operator
import threading

from . import contract, fastcall, launcher

try:
    from ..diagnostics import KfcError as CallError
    from . import tensor_maps
except ImportError:  # vendored into a package `kfc package` wrote, which runs without kfc (and without TMA)
    tensor_maps = None

    class CallError(ValueError):
        """A call the op cannot take: what is wrong and what to do."""

        def __init__(self, message: str, hint: str | None = None) -> None:
            super().__init__(f"{message}; {hint}" if hint else message)

CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "int": ctypes.c_int, "long long": ctypes.c_longlong,
          "bool": ctypes.c_bool, "signed char": ctypes.c_int8}


# --- the full path ------------------------------------------------------------------------------
def bind(what: str, names: list[str], args: tuple, kwargs: dict) -> dict:
    """The call's arguments by input name."""
    if len(args) > len(names):
        raise CallError(f"{what} takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise CallError(f"{what} has no input {k!r}", hint=f"its inputs are {', '.join(names)}")
        if k in bound:
            raise CallError(f"{what}: input {k!r} given twice")
        bound[k] = v
    return bound


def keyword_plan(names: list[str], fillers: dict[str, Any], n_positional: int, keywords: tuple[str, ...]):
    """How a call with `n_positional` arguments and these keywords becomes the positional call
    it equals, so that it takes the positional fast path: a function of (args, kwargs) giving
    the inputs from the first keyword's place to the last one's, each from the keywords or, for
    a gap, from `fillers` (what an input left out of the middle means: its default, or None for
    an optional tensor). None where no positional call is the same (an unknown or repeated name,
    a gap nothing fills): the full path then binds it, or says what is wrong."""
    rest = names[n_positional:]
    if not set(keywords) <= set(rest):
        return None
    span = rest[:max(rest.index(k) for k in keywords) + 1]
    if any(n not in keywords and n not in fillers for n in span):
        return None
    if len(span) == 1:
        (name,) = span
        return lambda args, kwargs: args + (kwargs[name],)
    if all(n in keywords for n in span):  # the common case, one C call: no gap to fill
        take = operator.itemgetter(*span)
        return lambda args, kwargs: args + take(kwargs)
    given = {n: fillers[n] for n in span if n not in keywords}
    return lambda args, kwargs: args + tuple(kwargs[n] if n not in given else given[n] for n in span)


def check_tensor(what: str, name: str, value, dtype, optional: bool, type_text: str, device, dtype_text=None):
    """Check one tensor argument against the op (`dtype` a torch dtype, described as
    `dtype_text`); the device the call runs on from here (`device`, else this tensor's)."""
    torch = _torch()
    if value is None:
        if not optional:
            raise CallError(f"{what}: missing tensor {name!r} ({type_text})")
        return device
    if not isinstance(value, torch.Tensor):
        raise CallError(f"{what}: {name!r} must be a torch tensor, not {type(value).__name__}")
    if value.dtype != dtype:
        raise CallError(f"{what}: {name!r} is {value.dtype}, the kernel takes {dtype_text or dtype}",
                        hint=f"convert it with .to({dtype})")
    if value.device.type != "cuda":
        raise CallError(f"{what}: {name!r} is on {value.device}; kernels run on the GPU", hint="move it with .cuda()")
    if device is not None and value.device != device:
        raise CallError(f"{what}: {name!r} is on {value.device} but the other tensors are on {device}")
    if not value.is_contiguous():
        raise CallError(f"{what}: {name!r} is not contiguous (strides {tuple(value.stride())})",
                        hint="call .contiguous() first")
    if value.data_ptr() % 16:
        raise CallError(f"{what}: {name!r} is not 16-byte aligned", hint="pass a freshly allocated tensor")
    return device or value.device


def make_outputs(what: str, outputs: list, out, device, check) -> dict:
    """The outputs, by name: those `out` gives (each checked by `check(name, tensor)` and against
    its shape), the others allocated. `outputs`: (name, shape, torch dtype) in order."""
    given = {}
    if out is not None:
        given = dict(zip([name for name, _, _ in outputs], out if isinstance(out, (tuple, list)) else (out,)))
    outs = {}
    for name, shape, dtype in outputs:
        if name in given:
            o = given[name]
            check(name, o)
            if o is not None and tuple(o.shape) != shape:
                raise CallError(f"{what}: out {name!r} is {tuple(o.shape)}, must be {shape}")
            outs[name] = o
        else:
            outs[name] = _torch().empty(shape, dtype=dtype, device=device)
    return outs


def prepare(what: str, module, kernels: list, names: list[str], bound: dict, dims: dict, device_index: int,
            outputs: list, default, outputs_given: bool) -> "PreparedCall":
    """Everything about a launch that its signature fixes: per kernel of the contract (`kernels`,
    the first on `module`, the others its siblings) the grid and the argument slots, the dims'
    and defaulted scalars' values (`default(name, dims)`: a scalar's default, None without one),
    the outputs' shapes and dtypes (`outputs`: (name, shape, torch dtype)), the workspaces."""
    torch = _torch()
    call = None
    for n, launch in enumerate(kernels):
        function = module if n == 0 else module.sibling(launch["name"])
        stage, grid = prepare_stage(what, function, launch, names, bound, dims, device_index, default, first=n == 0)
        if call is None:
            allocations = [Allocation(dtype, shape, device_index, bound, names) for _, shape, dtype in outputs]
            call = PreparedCall(stage, allocations, outputs_given)
            call.scalar_args = {names.index(p["name"]) for p in launch["params"] if p["kind"] == "scalar"}
        else:
            # a later kernel reads the inputs and scalars the first one's slots were given
            missing = {name for _, name, _ in stage.tensors} - {name for _, name, _ in call.tensors}
            missing |= {name for _, name, _, _ in stage.scalars} - {name for _, name, _, _ in call.scalars}
            if missing:
                raise CallError(f"{what}: its kernel {launch['name']} takes {', '.join(sorted(missing))}, which the "
                                "first kernel does not; this runtime passes a later kernel the first one's arguments")
            call.followers.append(stage)
        dims = contract.defined_dims(launch, dims, grid[0])
        for p in launch["params"]:
            if p["kind"] == "workspace" and p["name"] not in call.workspaces:
                call.workspaces[p["name"]] = (contract.workspace_shape(p, dims),
                                              getattr(torch, TORCH_NAMES[p.get("dtype", "f32")]))
    call.device = torch.device("cuda", device_index)
    return call


def prepare_stage(what: str, function, launch: dict, names: list[str], bound: dict, dims: dict, device_index: int,
                  default, first: bool) -> tuple[Stage, tuple]:
    """One kernel's launch: its grid and its argument slots (the kernels after the first
    take the op's outputs, workspaces and dims only)."""
    slot_types, kinds, fixed, tensors, scalars, outputs, workspaces = [], [], {}, [], [], [], []
    maps, out_maps = [], []
    for k, p in enumerate(launch["params"]):
        # a tensor map has no fastcall kind: a call that takes one goes the Python way (can_be_native)
        kinds.append(None if p["kind"] == "tensor_map" else fastcall.KINDS[
            p["ctype"] if p["kind"] == "scalar" else "long long" if p["kind"] == "dim" else "ptr"])
        if not first and p["kind"] == "tensor_map" and not p["is_output"]:
            raise CallError(f"{what}: its kernel {launch['name']} takes a tensor map of {p['name']!r}; this "
                            "runtime encodes an input's tensor map for an op's first kernel only")
        if p["kind"] == "tensor_map":
            slot_types.append(launcher.TensorMapSlot)
            if not p["is_output"]:
                maps.append((names.index(p["name"]), k, p, f"{what}: {p['name']!r}"))
            elif not first:
                raise CallError(f"{what}: its kernel {launch['name']} stores {p['name']!r} through a tensor map; "
                                "this runtime encodes an output's tensor map for an op's first kernel only")
            else:  # an output's map (a TMA store): encoded per call from the output, after the tensors
                out_maps.append((p["name"], k, p, f"{what}: {p['name']!r}"))
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
                raise CallError(f"{what}: scalar parameters of C type {p['ctype']} are not supported")
            slot_types.append(CTYPES[p["ctype"]])
            is_float = "float" in p["ctype"] or "double" in p["ctype"]
            if bound.get(p["name"]) is None:
                value = default(p["name"], dims)
                if value is None:
                    raise CallError(f"{what}: missing scalar {p['name']!r}")
                fixed[k] = float(value) if is_float else int(value)
            else:
                scalars.append((names.index(p["name"]), p["name"], k, float if is_float else int))
        else:
            slot_types.append(CTYPES["long long"])
            fixed[k] = int(dims[p["name"]])
    cluster, block, smem = launch["cluster"][0], launch["block"], launch["smem_dynamic_bytes"]
    grid = contract.prepare_function(launch, dims, function,
                                     _torch().cuda.get_device_properties(device_index).multi_processor_count)
    prepared = launcher.PreparedLaunch(int(function.function), launcher.primary_context(device_index), grid, block,
                                       cluster, smem, slot_types, device_index, function.name)
    for k, value in fixed.items():
        prepared.slots.values[k].value = value
    out_maps = [([name for name, _ in outputs].index(name), k, p, w) for name, k, p, w in out_maps]
    return Stage(prepared, kinds, fixed, tensors, scalars, outputs, workspaces, maps, out_maps, all(grid)), grid


# a workspace's dtype (the contract's name) as torch names it: row sums' partials, scratch tensors
TORCH_NAMES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "e4m3": "float8_e4m3fn",
               "e5m2": "float8_e5m2", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8",
               "bool": "bool"}


# --- the signature's call -----------------------------------------------------------------------
MISS = object()


@functools.cache
def _torch():
    """torch, imported on first use (kfc imports without it)."""
    import torch  # lazy: torch, seconds cold (importtime: 14.6 s here); kfc.runtime imports without it

    return torch


def call_signature(args: tuple) -> tuple:
    """What a call's launch depends on, per positional argument: a tensor's dtype, shape and
    device; for anything else its type (a scalar's value goes into its slot on every call)."""
    return tuple((a.dtype, a.shape, a.get_device()) if isinstance(a, _torch().Tensor) else type(a)
                 for a in args)


def out_signature(out) -> tuple | None:
    if out is None:
        return None
    return call_signature(tuple(out) if isinstance(out, (tuple, list)) else (out,))


def remember(launchers: list, prepared, keep: int = 16) -> None:
    """Put a prepared signature first; the oldest goes beyond `keep` (each miss costs a check)."""
    launchers.insert(0, prepared)
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


class Stage:
    """One kernel of a call: its prepared launch and which values fill its argument slots."""

    __slots__ = ("launch", "kinds", "fixed", "tensors", "scalars", "outputs", "workspaces", "maps", "out_maps", "runs")

    def __init__(self, launch, kinds: list, fixed: dict, tensors: list, scalars: list, outputs: list,
                 workspaces: list, maps: list, out_maps: list, runs: bool) -> None:
        self.launch = launch          # a launcher.PreparedLaunch
        self.kinds = kinds            # per slot, fastcall.KINDS
        self.fixed = fixed            # slot -> the value the signature fixes (dims, defaulted scalars)
        self.tensors = tensors        # (argument index, name, slot)
        self.scalars = scalars        # (argument index, name, slot, float | int)
        self.outputs = outputs        # (name, slot)
        self.workspaces = workspaces  # (name, slot)
        self.maps = maps              # (argument index, slot, contract param, what errors call it): encoded per call
        self.out_maps = out_maps      # (index in outputs, slot, contract param, what errors call it): likewise
        self.runs = runs              # False when its grid is empty: nothing to launch


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
        self.out_maps = first.out_maps
        self.first = first
        self.followers: list[Stage] = []
        self.workspaces: dict[str, tuple] = {}  # name -> (shape, torch dtype), allocated per call
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
            if self.runs:
                for j, k, param, what in self.out_maps:
                    values[k].fill(None if outs[j] is None else tensor_maps.encodings.get(what, outs[j], param))
            if not self.followers and not self.workspaces:
                if self.runs:
                    self.launch.launch()
                return
            torch = _torch()
            # allocated on the current stream per call, like the outputs: calls on other
            # streams never share one
            spaces = {name: torch.empty(shape, dtype=dtype, device=self.device)
                      for name, (shape, dtype) in self.workspaces.items()}
            by_name = {name: o for (name, _), o in zip(self.outputs, outs)}
            given = {name: values[k].value for _, name, k in self.tensors}
            given.update((name, values[k].value) for _, name, k, _ in self.scalars)
            for stage in (self.first, *self.followers):
                slots = stage.launch.slots.values
                for name, k in stage.workspaces:
                    slots[k].value = spaces[name].data_ptr()
                if stage is not self.first:
                    for name, k in stage.outputs:
                        o = by_name.get(name)
                        slots[k].value = 0 if o is None else o.data_ptr()
                    for _, name, k in stage.tensors:
                        slots[k].value = given[name]
                    for _, name, k, _ in stage.scalars:
                        slots[k].value = given[name]
                if stage.runs:
                    stage.launch.launch()

    def can_be_native(self, args: tuple, out) -> bool:
        """Whether a compiled launcher can serve this signature: it launches one kernel and
        allocates no workspace; it checks scalars by value, so a scalar passed as None (its
        default) is not one it can tell apart; and it takes out= only as every output, each a
        tensor. Tensor maps are encoded per call in Python, which it does not do, so a kernel
        that takes one always goes the Python way."""
        if self.followers or self.workspaces or self.maps or self.out_maps:
            return False
        if any(i < len(args) and args[i] is None for i in self.scalar_args):
            return False
        if out is None:
            return True
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return len(outs) == len(self.outputs) and all(o is not None for o in outs)

    def native(self, module, args: tuple, out):
        """This call as a compiled launcher (fastcall.cpp) for the signature of `args` and `out`."""
        lib = launcher.libcuda()
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
            context=launch.context, function=launch.function,
            grid=(config.gridDimX, config.gridDimY, config.gridDimZ),
            block=(config.blockDimX, config.blockDimY, config.blockDimZ), cluster=launch.cluster,
            smem=config.sharedMemBytes, kinds=bytes(self.kinds), fixed=fixed, nargs=len(args), tensors=tensors,
            scalars=[(i, k) for i, _, k, _ in self.scalars], outputs=outputs, outputs_given=self.outputs_given,
            stream_of=launch.stream_of, device=launch.device_index, on_error=launch.raise_error, miss=MISS,
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
                return MISS
            ptrs.append(p)
        maps = [args[i] if i < n else None for i, _, _, _ in self.maps]
        if any(t is not None and (t.data_ptr() & 15 or not t.is_contiguous()) for t in maps):
            return MISS
        if self.outputs_given:
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            for o in outs:
                if o is not None and (o.data_ptr() & 15 or not o.is_contiguous()):
                    return MISS
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

