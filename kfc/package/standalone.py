"""The runtime of a package `kfc package` writes: calls one op's prebuilt cubins from torch,
without kfc. Self-contained (the standard library and torch, plus kfc's runtime modules
calls.py, launcher.py, fastcall.py and contract.py copied beside it, which bind, check, prepare
and launch a call the same way as kfc's own runtime); `kfc package` copies this file into the
package as _op.py. What is here is what a packaged op adds: reading op.json, picking the
instance and the kernel, and the torch custom op.

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

import json
import threading
from pathlib import Path

import torch

from . import calls, contract, fastcall, launcher
from .calls import MISS, CallError as OpError
from .contract import evaluate

TORCH_DTYPES = calls.TORCH_NAMES  # kfc's dtype names as torch's


def torch_dtype(name: str):
    return getattr(torch, TORCH_DTYPES[name])


def target_of_device(index: int) -> str:
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
        self._prepared: dict[tuple, calls.PreparedCall] = {}
        self._native = None
        self._launchers: list = []  # the compiled launcher's prepared signatures, newest first
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<kfc-packaged op {self.name}: {self.meta['signature']}>"

    # --- binding --------------------------------------------------------------------------------
    def bind(self, args: tuple, kwargs: dict) -> dict:
        return calls.bind(self.name, [i["name"] for i in self.inputs], args, kwargs)

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
        return calls.check_tensor(self.name, name, value, dtype, spec.get("optional", False), spec["type"], device)

    # --- call -----------------------------------------------------------------------------------
    def __call__(self, *args, out=None, **kwargs):
        if not kwargs:
            if self._native:
                hit = self._native.dispatch(self._launchers, args, out, MISS)
                if hit is not MISS:
                    return hit
        return self._call(self.bind(args, kwargs), out, None if kwargs else args)

    def _call(self, bound: dict, out, positional):
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
        shapes = self.output_shapes(dims)
        outs = self.outputs_for(out, inst, shapes, device)
        prepared = self.prepare(kernel, inst, bound, dims, index, out is not None)
        prepared.run_bound(bound, outs)
        if positional is not None and self._native and prepared.can_be_native(positional, out):
            calls.remember(self._launchers, prepared.native(self._native, positional, out))
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
        specs = [(o["name"], shapes[o["name"]], torch_dtype(inst["types"][o["name"]])) for o in self.outputs]
        by_name = {o["name"]: (o, dtype) for o, (_, _, dtype) in zip(self.outputs, specs)}
        return calls.make_outputs(self.name, specs, out, device,
                                  lambda name, t: self.check(name, t, by_name[name][0], by_name[name][1], device))

    def prepare(self, kernel: dict, inst: dict, bound: dict, dims: dict, index: int,
                outputs_given: bool = False) -> calls.PreparedCall:
        key = (kernel["cubin"], tuple(sorted(dims.items())), index,  # which inputs are absent fixes the defaults
               tuple(bound.get(i["name"]) is None for i in self.inputs), outputs_given)
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
                self._modules[module_key] = launcher.Module((self.root / kernel["cubin"]).read_bytes(),
                                                            launches[0]["name"], launcher.primary_context(index))
            shapes = self.output_shapes(dims)
            outputs = [(o["name"], shapes[o["name"]], torch_dtype(inst["types"][o["name"]])) for o in self.outputs]
            prepared = calls.prepare(self.name, self._modules[module_key], launches, [i["name"] for i in self.inputs],
                                     bound, dims, index, outputs, self.default, outputs_given)
            self._prepared[key] = prepared
            return prepared

    def output_shapes(self, dims: dict) -> dict[str, tuple]:
        return {o["name"]: tuple(evaluate(d, dims) if isinstance(d, str) else d for d in o["shape"])
                for o in self.outputs}

    def default(self, name: str, dims: dict):
        """A scalar's default at these dims (None without one)."""
        d = next(i for i in self.inputs if i["name"] == name).get("default")
        return evaluate(d, dims) if isinstance(d, str) else d


def register_torch_op(op: Op, namespace: str):
    """`op` as the torch custom op torch.ops.<namespace>.<op name>, with a fake."""
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define(op.name + op.meta["schema"])
    lib.impl(op.name, lambda *args: op(*args), "CUDA")

    def fake(*args):
        bound = op.bind(args, {})
        inst = op.instance(bound)
        dims = op.dims(bound, inst)
        device = next(v.device for v in bound.values() if isinstance(v, torch.Tensor))
        shapes = op.output_shapes(dims)
        outs = tuple(torch.empty(shapes[o["name"]], dtype=torch_dtype(inst["types"][o["name"]]), device=device)
                     for o in op.outputs)
        return outs[0] if len(outs) == 1 else outs

    torch.library.register_fake(f"{namespace}::{op.name}", fake, lib=lib)
    op._library = lib
    return getattr(getattr(torch.ops, namespace), op.name)
