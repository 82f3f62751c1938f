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

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..codegen.cuda import switches as codegen_switches
from ..codegen.toolchain import find_toolchain
from ..compile import build_advised, compile_op, fixed_dims
from ..diagnostics import GpuUnavailable, KfcError
from ..frontend.spec import instantiate, load_kfc
from ..model.spec import OpSpec
from ..ir import constexpr
from ..ir.dtypes import dtype_of_torch
from ..ir.printer import print_ir
from ..ir.signature import bind_dims, output_shape
from ..ir.types import MemSpace
from ..passes import default_pipelines
from ..model.target import Target, parse_target
from ..ops import register
from . import cache, calls, contract, fastcall, launcher
from .calls import MISS, PreparedCall, call_signature, out_signature, remember


def spec_key(spec: OpSpec) -> tuple:
    return tuple(sorted(spec.dtypes.items()))


def current_target() -> Target:
    import torch  # lazy: torch, seconds cold (importtime: 14.6 s here); kfc.runtime imports without it

    if not torch.cuda.is_available():
        raise GpuUnavailable("no CUDA GPU is visible", hint="pass target= to compile without running")
    major, minor = torch.cuda.get_device_capability()
    sm = major * 10 + minor
    if sm not in (90, 100):
        raise KfcError(f"this GPU is sm_{sm}; kfc targets Hopper (sm_90) and Blackwell (sm_100)")
    return Target(sm, True)


class KfcKernel:
    def __init__(self, spec: OpSpec, target: str | Target | None = None, pipeline: str | None = None,
                 advisor=None) -> None:
        self.spec = spec
        # (func, target name, dims) -> a recorded pipeline to start from (kfc.kb.advice.Advice) or
        # None; consulted where no pipeline is given. What it advised, by fixed dims: self.advised
        self.advisor = advisor
        self.advised: dict[tuple, Any] = {}
        self.func = spec.func
        self._instances: dict[tuple, OpSpec] = {spec_key(spec): spec}
        self._kernels: dict[tuple, KfcKernel] = {}
        self._target = parse_target(target) if isinstance(target, str) else target
        self.pipeline = pipeline
        self._loaded: dict[tuple, tuple[launcher.Module, dict]] = {}
        self._lock = threading.Lock()
        self._native = _UNRESOLVED  # the compiled fast path, None for the ctypes one below; built on first launch
        self._launchers: list = []  # the compiled fast path's prepared signatures, newest first
        self._fast: dict[tuple, PreparedCall] = {}
        self._keyword_plans: dict[tuple, Any] = {}  # (positional count, keyword set) -> calls.keyword_plan
        self._last_keywords: tuple = (-1, frozenset(), None)  # the last form seen: checked without building a key

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
        return calls.bind(self.name, self.func.input_names, args, kwargs)

    def check_tensor(self, name: str, value, t, device) -> None:
        calls.check_tensor(self.name, name, value, t.dtype.torch, t.optional, str(t), device,
                           f"{t.dtype} ({t.dtype.torch})")

    # --- compile ------------------------------------------------------------------------------
    def kernel_for(self, dims: dict[str, int], device_index: int):
        fixed = fixed_dims(self.func, dims)
        memo = (tuple(sorted(fixed.items())), device_index)
        with self._lock:
            if memo not in self._loaded:
                cubin, report = self._compile(dims, memo[0])
                name = contract.kernels_of(report, self.name)[0]["name"]
                module = launcher.Module(cubin, name, launcher.primary_context(device_index))
                self._loaded[memo] = (module, report)
            return self._loaded[memo]

    def prebuild(self, shapes: list[dict[str, int]], workers: int | None = None) -> list[str]:
        """Compile this instance's kernels at these dims (its type parameters as bound, else as
        the spec defaults them) into the JIT cache, several at a time (nvcc runs in processes of
        its own), so that the first calls only load them: a benchmark that compiles as it goes
        leaves the GPU idle through every build. Returns what could not be built, one line each;
        the first call at those dims raises the same error."""

        def build(dims):
            try:
                self._compile(dims, tuple(sorted(fixed_dims(self.func, dims).items())))
                return None
            except KfcError as e:
                return f"{self.name} at {dims}: {e.message.splitlines()[0]}"

        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            return [p for p in pool.map(build, shapes) if p]

    def _compile(self, dims: dict[str, int], fixed: tuple):
        """The cubin and report at `dims`: from the advisor's record where it gives one that
        compiles for this op (saying so on stderr), else from the pipeline given or the default."""
        if self.pipeline is None and self.advisor is not None:
            advice = self.advisor(self.func, self.target.name, dims)
            if advice is not None:
                built, said, used = build_advised(advice, lambda p: cached_compile(self.spec, self.target, p, dims))
                if used is not None:
                    self.advised[fixed] = used
                print(f"kfc: {self.name} at {', '.join(f'{k}={v}' for k, v in fixed)}: {said}", file=sys.stderr)
                return built
        return cached_compile(self.spec, self.target, self.pipeline, dims)

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
        return self._instance(want)

    def instance_named(self, dtypes: dict[str, str]) -> "KfcKernel":
        """The kernel instantiated with these type parameters' values (T="bf16"); the op's other
        type parameters, and any name it does not have, left as they are."""
        params = dict(self.spec.type_params)
        return self._instance({**self.spec.dtypes, **{k: v for k, v in dtypes.items() if k in params}})

    def _instance(self, want: dict[str, str]) -> "KfcKernel":
        if not self.spec.type_params:
            return self
        key = tuple(sorted(want.items()))
        if key not in self._instances:
            self._instances[key] = instantiate(self.spec, want)
        spec = self._instances[key]
        if spec is self.spec:
            return self
        inst = self._kernels.get(key)
        if inst is None:
            inst = KfcKernel(spec, self._target, self.pipeline, self.advisor)
            inst._native = self._native
            self._kernels[key] = inst
        return inst

    # --- call ---------------------------------------------------------------------------------
    def __call__(self, *args, out=None, **kwargs):
        if kwargs:  # a keyword call is the positional call it equals: the same fast path
            n, names, plan = self._last_keywords
            if n != len(args) or kwargs.keys() != names:
                plan = self._keyword_plan(len(args), frozenset(kwargs))
            if plan is not None:
                args, kwargs = plan(args, kwargs), {}
        if not kwargs:
            native = self._native
            fast = native.dispatch(self._launchers, args, out, MISS) if native else MISS
            if fast is MISS:  # a signature the compiled launcher does not serve (several kernels)
                fast = self._fast_call(args, out)
            if fast is not MISS:
                return fast
        bound = self.bind(args, kwargs)
        inst = self.instance_for(bound)
        if inst is not self:
            result = inst(*args, out=out, **kwargs)
            if self._native is _UNRESOLVED:  # the instance chose the launcher on its first launch
                self._native = inst._native
            if not kwargs:  # the instance's prepared calls serve this signature from here on
                key = (call_signature(args), out_signature(out))
                if key in inst._fast:
                    self._fast[key] = inst._fast[key]
                for known in inst._launchers:
                    if known not in self._launchers:
                        remember(self._launchers, known)
            return result
        return self._call(bound, out, args if not kwargs else None)

    def _keyword_plan(self, n_positional: int, names: frozenset):
        """The plan of a call form (calls.keyword_plan), made once per form and kept as the last."""
        key = (n_positional, names)
        if key not in self._keyword_plans:
            self._keyword_plans[key] = calls.keyword_plan(self.func.input_names, self._gap_fillers(), n_positional,
                                                          tuple(names))
        self._last_keywords = (n_positional, names, self._keyword_plans[key])
        return self._keyword_plans[key]

    def _gap_fillers(self) -> dict[str, Any]:
        """What an input left out before a later keyword means: an optional tensor None, a
        scalar its default where that is a number (one that depends on dims is computed at
        binding, so such a call keeps the full path)."""
        out = {}
        for v in self.func.inputs:
            if v.ttype.space is not MemSpace.REG:
                if v.ttype.optional:
                    out[v.name] = None
            elif isinstance(d := self.func.default_of(v.name), (bool, int, float)):
                out[v.name] = d
        return out

    def _fast_call(self, args: tuple, out):
        """A call whose signature was seen before: check contiguity and alignment, allocate
        the outputs, fill the argument slots, launch. MISS when the signature is new (or a
        check fails: the full path then says what is wrong)."""
        key = (call_signature(args), out_signature(out))
        prepared = self._fast.get(key)
        if prepared is None:
            return MISS
        return prepared.call(args, out)

    def _call(self, bound: dict[str, Any], out, positional: tuple | None = None):
        import torch  # lazy: torch, seconds cold (importtime: 14.6 s here); kfc.runtime imports without it

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
                remember(self._launchers, call.native(self._native, positional, out))
            else:
                self._fast[(call_signature(positional), out_signature(out))] = call
        result = tuple(outs[v.name] for v in func.outputs)
        return result[0] if len(result) == 1 else result

    def outputs(self, out, dims, device) -> dict[str, Any]:
        types = {v.name: v.ttype for v in self.func.outputs}
        return calls.make_outputs(self.name, self._output_specs(dims), out, device,
                                  lambda name, o: self.check_tensor(name, o, types[name], device))

    def _output_specs(self, dims: dict) -> list:
        return [(v.name, output_shape(v.ttype, dims), v.ttype.dtype.torch) for v in self.func.outputs]

    def prepare(self, loaded: launcher.Module, report: dict, bound: dict, dims: dict, device_index: int,
                outputs_given: bool) -> PreparedCall:
        """Everything about a launch that its signature fixes (see kfc.runtime.calls.prepare)."""
        return calls.prepare(self.name, loaded, contract.kernels_of(report, self.name), self.func.input_names, bound,
                             dims, device_index, self._output_specs(dims), self._default, outputs_given)

    def _default(self, name: str, dims: dict):
        value = self.func.default_of(name)
        return constexpr.evaluate(value, dims) if isinstance(value, str) else value

    # --- torch integration --------------------------------------------------------------------
    def as_torch_op(self, name: str | None = None):
        """This kernel as the torch custom op torch.ops.kfc.<name> (see kfc.ops)."""
        return register(self, name)


class _Unresolved:
    """The launcher not chosen yet (falsy, so a call takes the ctypes fast path, misses, and
    the full path chooses)."""

    def __bool__(self) -> bool:
        return False


_UNRESOLVED = _Unresolved()



def kernel_cache_key(spec: OpSpec, target: Target, pipeline: str | None, dims: dict[str, int]) -> str:
    """The JIT cache's key for `spec` built with `pipeline` at `dims`."""
    fixed = fixed_dims(spec.func, dims)
    return cache.cache_key(print_ir(spec.func), pipeline or f"default: {default_pipelines()}", target.name, fixed,
                           find_toolchain().version_text,
                           codegen_switches())


def cached_compile(spec: OpSpec, target: Target, pipeline: str | None, dims: dict[str, int]):
    """The cubin and report for `spec` at `dims`, from the JIT cache or compiled into it."""
    key = kernel_cache_key(spec, target, pipeline, dims)
    hit = cache.lookup(key)
    if hit is not None:
        return hit
    result = compile_op(spec, target, pipeline, shape=dims)
    cache.store(key, result.kernel.cubin, result.report)
    return result.kernel.cubin, result.report


def load(path: str | Path, target: str | None = None, pipeline: str | None = None, advisor=None,
         bind: dict[str, str | int] | None = None) -> KfcKernel:
    """Load a .kfc file as a callable kernel (`advisor`: see KfcKernel; `bind`: type parameters
    given their value, e.g. a size {"C": 32}; a dtype parameter follows the tensors passed)."""
    return KfcKernel(load_kfc(path, {k: str(v) for k, v in (bind or {}).items()}), target, pipeline, advisor)
