"""The runtime of a package `kfc package` writes: calls one op's prebuilt cubins from torch,
without kfc. Self-contained (the standard library, ctypes and torch, plus launcher.py,
fastcall.py and contract.py copied beside it); `kfc package` copies this file into the package as _op.py.

The op is described by the package's op.json (written from the op's IR by kfc.package.build):
its inputs and outputs with their shapes as symbols, literal sizes or symbol+offset, their
dtypes or type parameters, scalars' defaults, and per instance (type arguments) the kernels
built for each target and fixed dims, with their launch contracts. A call binds the
arguments, picks the instance by the tensors' dtypes and the kernel by the GPU and the dims,
checks every tensor (dtype, device, contiguity, 16-byte alignment, shape), makes the outputs
and launches; a signature seen before goes straight to the launch (fastcall's compiled
launcher where it builds, else ctypes).
"""

from __future__ import annotations

import ctypes
import json
import threading
from pathlib import Path

from . import contract, fastcall, launcher
from .contract import evaluate

CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "int": ctypes.c_int, "long long": ctypes.c_longlong,
          "bool": ctypes.c_bool, "signed char": ctypes.c_int8}
TORCH_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8",
                "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8", "bool": "bool"}
_MISS = object()


class OpError(ValueError):
    """A call the op cannot take: what is wrong and what to do."""


def torch_dtype(name: str):
    import torch

    return getattr(torch, TORCH_DTYPES[name])


def target_of_device(index: int) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major * 10 + minor}"


class Op:
    """One op of a package: `op(*inputs, out=None, **inputs)`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.meta = json.loads((self.root / "op.json").read_text())
        self.name = self.meta["op"]
        self.inputs = self.meta["inputs"]
        self.outputs = self.meta["outputs"]
        self._modules: dict[tuple, launcher.Module] = {}
        self._prepared: dict[tuple, object] = {}
        self._native = None
        self._launchers: list = []  # the compiled launcher's prepared signatures, newest first
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<kfc-packaged op {self.name}: {self.meta['signature']}>"

    # --- binding --------------------------------------------------------------------------------
    def bind(self, args: tuple, kwargs: dict) -> dict:
        names = [i["name"] for i in self.inputs]
        if len(args) > len(names):
            raise OpError(f"{self.name} takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        bound = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names:
                raise OpError(f"{self.name} has no input {k!r}; its inputs are {', '.join(names)}")
            if k in bound:
                raise OpError(f"{self.name}: input {k!r} given twice")
            bound[k] = v
        return bound

    def instance(self, bound: dict) -> dict:
        """The instance whose type arguments the tensors' dtypes give."""
        want = {}
        for i in self.inputs:
            param, value = i.get("type_param"), bound.get(i["name"])
            if param is None or value is None or not hasattr(value, "dtype"):
                continue
            name = next((k for k, v in TORCH_DTYPES.items() if torch_dtype(k) == value.dtype), str(value.dtype))
            if param in want and want[param] != name:
                raise OpError(f"{self.name}: {i['name']!r} is {value.dtype} but another input of type {param} is "
                              f"{TORCH_DTYPES.get(want[param], want[param])}")
            want[param] = name
        for inst in self.meta["instances"]:
            if all(inst["dtypes"].get(p) == d for p, d in want.items()):
                return inst
        have = ", ".join("/".join(f"{p}={d}" for p, d in inst["dtypes"].items()) for inst in self.meta["instances"])
        raise OpError(f"{self.name}: no instance for {', '.join(f'{p}={d}' for p, d in want.items())}; "
                      f"this package has {have}", )

    def dims(self, bound: dict, inst: dict) -> dict[str, int]:
        dims: dict[str, int] = {}
        for i in self.inputs:
            value = bound.get(i["name"])
            if i["kind"] != "tensor" or value is None:
                continue
            if len(value.shape) != len(i["shape"]):
                raise OpError(f"{self.name}: {i['name']!r} has {len(value.shape)} dims; the op takes {i['type']}")
            for k, (d, n) in enumerate(zip(i["shape"], value.shape)):
                if isinstance(d, int):
                    if d != n:
                        raise OpError(f"{self.name}: {i['name']!r} dim {k} is {n}; the op fixes it at {d}")
                    continue
                sym, offset = d
                if dims.setdefault(sym, n - offset) != n - offset:
                    raise OpError(f"{self.name}: {i['name']!r} dim {k} gives {sym}={n - offset}, but another "
                                  f"input gave {sym}={dims[sym]}")
        return dims

    def check(self, name: str, value, spec: dict, dtype, device):
        import torch

        if value is None:
            if not spec.get("optional"):
                raise OpError(f"{self.name}: missing tensor {name!r} ({spec['type']})")
            return device
        if not isinstance(value, torch.Tensor):
            raise OpError(f"{self.name}: {name!r} must be a torch tensor, not {type(value).__name__}")
        if value.dtype != dtype:
            raise OpError(f"{self.name}: {name!r} is {value.dtype}; this instance takes {dtype}")
        if value.device.type != "cuda":
            raise OpError(f"{self.name}: {name!r} is on {value.device}; kernels run on the GPU (move it with .cuda())")
        if device is not None and value.device != device:
            raise OpError(f"{self.name}: {name!r} is on {value.device} but the other tensors are on {device}")
        if not value.is_contiguous():
            raise OpError(f"{self.name}: {name!r} is not contiguous; call .contiguous() first")
        if value.data_ptr() % 16:
            raise OpError(f"{self.name}: {name!r} is not 16-byte aligned; pass a freshly allocated tensor")
        return value.device

    # --- call -----------------------------------------------------------------------------------
    def __call__(self, *args, out=None, **kwargs):
        if not kwargs:
            if self._native:
                hit = self._native.dispatch(self._launchers, args, out, _MISS)
                if hit is not _MISS:
                    return hit
        return self._call(self.bind(args, kwargs), out, None if kwargs else args)

    def _call(self, bound: dict, out, positional):
        import torch

        inst = self.instance(bound)
        device = None
        for i in self.inputs:
            if i["kind"] == "tensor":
                device = self.check(i["name"], bound.get(i["name"]), i, torch_dtype(inst["types"][i["name"]]), device)
        if device is None:
            raise OpError(f"{self.name}: no tensor input tells the device")
        dims = self.dims(bound, inst)
        index = device.index if device.index is not None else torch.cuda.current_device()
        kernel = self.kernel_for(inst, dims, index)
        shapes = {o["name"]: tuple(evaluate(d, dims) if isinstance(d, str) else d for d in o["shape"])
                  for o in self.outputs}
        outs = self.outputs_for(out, inst, shapes, device)
        prepared = self.prepare(kernel, inst, bound, dims, index)
        prepared.run(bound, outs)
        if positional is not None and self._native and prepared.can_be_native(positional, out, len(self.outputs)):
            self._launchers.insert(0, prepared.native(self._native, positional, out, shapes, inst))
            del self._launchers[16:]
        result = tuple(outs[o["name"]] for o in self.outputs)
        return result[0] if len(result) == 1 else result

    def kernel_for(self, inst: dict, dims: dict, index: int) -> dict:
        target = target_of_device(index)
        for k in inst["kernels"]:
            if k["target"].rstrip("a") == target and all(dims.get(s) == v for s, v in k["dims"].items()):
                return k
        built = "; ".join(f"{k['target']} at {', '.join(f'{s}={v}' for s, v in k['dims'].items()) or 'any size'}"
                          for k in inst["kernels"])
        raise OpError(f"{self.name}: this package has no kernel for {target} at "
                      f"{', '.join(f'{s}={dims[s]}' for s in sorted(dims))} (it has: {built}); rebuild it with "
                      f"kfc package --target {target}a --shape ...")

    def outputs_for(self, out, inst: dict, shapes: dict, device) -> dict:
        import torch

        given = {}
        if out is not None:
            given = dict(zip([o["name"] for o in self.outputs], out if isinstance(out, (tuple, list)) else (out,)))
        outs = {}
        for o in self.outputs:
            dtype = torch_dtype(inst["types"][o["name"]])
            if o["name"] in given:
                t = given[o["name"]]
                self.check(o["name"], t, o, dtype, device)
                if tuple(t.shape) != shapes[o["name"]]:
                    raise OpError(f"{self.name}: out {o['name']!r} is {tuple(t.shape)}, must be {shapes[o['name']]}")
                outs[o["name"]] = t
            else:
                outs[o["name"]] = torch.empty(shapes[o["name"]], dtype=dtype, device=device)
        return outs

    def prepare(self, kernel: dict, inst: dict, bound: dict, dims: dict, index: int) -> "Prepared":
        import torch

        key = (kernel["cubin"], tuple(sorted(dims.items())), index,  # which inputs are absent fixes the defaults
               tuple(bound.get(i["name"]) is None for i in self.inputs))
        with self._lock:
            if key in self._prepared:
                return self._prepared[key]
            if self._native is None:
                self._native = fastcall.module() or False
            launches = contract.kernels_of({"kernels": kernel["kernels"]}, self.name)
            maps = [p["name"] for launch in launches for p in launch["params"] if p["kind"] == "tensor_map"]
            if maps:  # encoding them needs cuda-python, which a package does not depend on
                raise OpError(f"{self.name}: its kernel reads {', '.join(map(repr, maps))} through TMA tensor maps; "
                              "packages cannot launch TMA kernels yet (call the op through kfc.load)")
            module_key = (kernel["cubin"], index)
            if module_key not in self._modules:
                context = launcher.primary_context(index)
                self._modules[module_key] = launcher.Module((self.root / kernel["cubin"]).read_bytes(),
                                                            launches[0]["name"], context)
            first = self._modules[module_key]
            stages, workspaces = [], {}
            for n, launch in enumerate(launches):
                module = first if n == 0 else first.sibling(launch["name"])
                grid = contract.prepare_function(launch, dims, module,
                                                 torch.cuda.get_device_properties(index).multi_processor_count)
                stages.append(Prepared(self, module, launch, grid, bound, dims, index))
                dims = contract.defined_dims(launch, dims, grid[0])
                for p in launch["params"]:
                    if p["kind"] == "workspace":
                        workspaces.setdefault(p["name"], contract.workspace_shape(p, dims))
            prepared = stages[0] if len(stages) == 1 else PreparedSequence(stages, workspaces, index)
            self._prepared[key] = prepared
            return prepared


class Prepared:
    """One kernel at one set of dims on one device: its argument slots and launch."""

    def __init__(self, op: Op, module, launch: dict, grid: tuple, bound: dict, dims: dict, index: int) -> None:
        self.params = launch["params"]
        types, self.kinds, self.fixed = [], [], {}
        for k, p in enumerate(self.params):
            if p["kind"] in ("tensor", "workspace"):
                types.append(ctypes.c_void_p)
                self.kinds.append(fastcall.KINDS["ptr"])
            elif p["kind"] == "scalar":
                types.append(CTYPES[p["ctype"]])
                self.kinds.append(fastcall.KINDS[p["ctype"]])
                if bound.get(p["name"]) is None:
                    self.fixed[k] = _default(op, p["name"], dims)
            else:
                types.append(ctypes.c_longlong)
                self.kinds.append(fastcall.KINDS["long long"])
                self.fixed[k] = int(dims[p["name"]])
        self.names = [i["name"] for i in op.inputs]
        self.launch = launcher.PreparedLaunch(module.function, launcher.primary_context(index), grid,
                                              tuple(launch["block"]), launch["cluster"][0],
                                              launch["smem_dynamic_bytes"], types, index, module.name)
        for k, v in self.fixed.items():
            self.launch.slots.values[k].value = v
        self.lock = threading.Lock()

    def run(self, bound: dict, outs: dict, spaces: dict | None = None) -> None:
        values = self.launch.slots.values
        with self.lock:
            for k, p in enumerate(self.params):
                if p["kind"] == "tensor":
                    t = outs.get(p["name"]) if p["is_output"] else bound.get(p["name"])
                    values[k].value = 0 if t is None else t.data_ptr()
                elif p["kind"] == "workspace":
                    values[k].value = spaces[p["name"]].data_ptr()
                elif p["kind"] == "scalar" and bound.get(p["name"]) is not None:
                    v = bound[p["name"]]
                    values[k].value = float(v) if "float" in p["ctype"] or "double" in p["ctype"] else int(v)
            c = self.launch.config
            if c.gridDimX and c.gridDimY and c.gridDimZ:
                self.launch.launch()

    def can_be_native(self, args: tuple, out, n_outputs: int) -> bool:
        """Whether the compiled launcher can serve this signature: it tells scalars apart by
        value, not from None (a default), and takes out= only as every output, each a tensor."""
        scalars = {self.names.index(p["name"]) for p in self.params if p["kind"] == "scalar"}
        if any(i < len(args) and args[i] is None for i in scalars):
            return False
        if out is None:
            return True
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return len(outs) == n_outputs and all(o is not None for o in outs)

    def native(self, module, args: tuple, out, shapes: dict, inst: dict):
        """This call's signature as a compiled launcher (fastcall.cpp)."""
        lib = launcher.libcuda()
        fixed, tensors, scalars, outputs = dict(self.fixed), [], [], []
        for k, p in enumerate(self.params):
            if p["kind"] == "tensor" and p["is_output"]:
                outputs.append((len(outputs), k, torch_dtype(inst["types"][p["name"]]), shapes[p["name"]],
                                self.launch.device_index))
            elif p["kind"] == "tensor":
                i = self.names.index(p["name"])
                if i >= len(args):
                    fixed[k] = 0
                elif args[i] is None:
                    tensors.append((i, k, None, (), -1))
                else:
                    tensors.append((i, k, args[i].dtype, tuple(args[i].shape), args[i].get_device()))
            elif p["kind"] == "scalar" and p["name"] in self.names and self.names.index(p["name"]) < len(args):
                scalars.append((self.names.index(p["name"]), k))
        config = self.launch.config
        return module.Launcher(
            launch=ctypes.cast(lib.cuLaunchKernelEx, ctypes.c_void_p).value,
            ctx_set=ctypes.cast(lib.cuCtxSetCurrent, ctypes.c_void_p).value, context=self.launch.context,
            function=self.launch.function, grid=(config.gridDimX, config.gridDimY, config.gridDimZ),
            block=(config.blockDimX, config.blockDimY, config.blockDimZ), cluster=self.launch.cluster,
            smem=config.sharedMemBytes, kinds=bytes(self.kinds), fixed=fixed, nargs=len(args),
            tensors=tensors, scalars=scalars, outputs=outputs, outputs_given=out is not None,
            stream_of=self.launch.stream_of, device=self.launch.device_index, on_error=self.launch.raise_error,
            miss=_MISS, name=self.launch.name)


class PreparedSequence:
    """An op of several kernels (a row kernel, then the kernel that adds its partial sums):
    the workspaces they share, allocated per call, and their launches in order."""

    def __init__(self, stages: list, workspaces: dict, index: int) -> None:
        self.stages, self.workspaces, self.index = stages, workspaces, index

    def run(self, bound: dict, outs: dict) -> None:
        import torch

        spaces = {name: torch.empty(shape, dtype=torch.float32, device=torch.device("cuda", self.index))
                  for name, shape in self.workspaces.items()}
        for stage in self.stages:
            stage.run(bound, outs, spaces)

    def can_be_native(self, args: tuple, out, n_outputs: int) -> bool:
        return False  # the compiled launcher launches one kernel


def _default(op: Op, name: str, dims: dict):
    spec = next(i for i in op.inputs if i["name"] == name)
    if "default" not in spec:
        raise OpError(f"{op.name}: missing scalar {name!r}")
    d = spec["default"]
    return evaluate(d, dims) if isinstance(d, str) else d


def register_torch_op(op: Op, namespace: str):
    """`op` as the torch custom op torch.ops.<namespace>.<op name>, with a fake."""
    import torch

    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define(op.name + op.meta["schema"])
    lib.impl(op.name, lambda *args: op(*args), "CUDA")

    def fake(*args):
        bound = op.bind(args, {})
        inst = op.instance(bound)
        dims = op.dims(bound, inst)
        device = next(v.device for v in bound.values() if isinstance(v, torch.Tensor))
        outs = tuple(torch.empty(tuple(evaluate(d, dims) if isinstance(d, str) else d for d in o["shape"]),
                                 dtype=torch_dtype(inst["types"][o["name"]]), device=device) for o in op.outputs)
        return outs[0] if len(outs) == 1 else outs

    torch.library.register_fake(f"{namespace}::{op.name}", fake, lib=lib)
    op._library = lib
    return getattr(getattr(torch.ops, namespace), op.name)
