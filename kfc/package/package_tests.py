"""Tests of a package `kfc package` wrote (copied into its tests/ folder).

Without a GPU: the package imports nothing from kfc, every kernel is a cubin, the torch op's
fake gives every output's shape and dtype on meta tensors, and bad inputs get one clear
OpError. On a GPU (marked gpu): the op's check-block cases whose fixed dims were packaged, for
every instance, on fresh random inputs with NaN-poisoned outputs, against the check block's
reference by kfc's tolerance rule.
"""

import importlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

MODULE = "__KFC_MODULE__"
pkg = importlib.import_module(MODULE)
op = getattr(pkg, pkg.__all__[0])
ROOT = Path(pkg.__file__).resolve().parent
META = json.loads((ROOT / "op.json").read_text())
CHECKS = json.loads((ROOT / "checks.json").read_text())
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64,
          "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
          "i32": torch.int32, "i64": torch.int64, "i8": torch.int8, "u8": torch.uint8, "bool": torch.bool}


def shape_of(spec: dict, dims: dict) -> tuple:
    return tuple(d if isinstance(d, int) else dims[d[0]] + d[1] for d in spec["shape"])


def out_shape(spec: dict, dims: dict) -> tuple:
    return tuple(d if isinstance(d, int) else int(eval(d, {}, dict(dims))) for d in spec["shape"])  # noqa: S307


def test_the_package_needs_no_kfc():
    assert not [m for m in sys.modules if m == "kfc" or m.startswith("kfc.")]


def test_every_kernel_is_a_cubin():
    kernels = [k for inst in META["instances"] for k in inst["kernels"]]
    assert kernels
    for k in kernels:
        assert (ROOT / k["cubin"]).read_bytes()[:4] == b"\x7fELF", k["cubin"]
        assert (ROOT / k["cubin"]).with_suffix(".ptx").is_file()


def dims_of_first_case(inst: dict) -> dict:
    k = inst["kernels"][0]
    case = next((c for c in CHECKS["cases"] if all(c.get(s) == v for s, v in k["dims"].items())), None)
    dims = dict(case) if case else {}
    dims.update(k["dims"])
    for i in META["inputs"]:
        for d in i.get("shape", []):
            if not isinstance(d, int):
                dims.setdefault(d[0], 3)
    return dims


def test_the_fake_gives_every_output():
    for inst in META["instances"]:
        dims = dims_of_first_case(inst)
        args = []
        for i in META["inputs"]:
            if i["kind"] == "tensor":
                args.append(torch.empty(shape_of(i, dims), dtype=DTYPES[inst["types"][i["name"]]], device="meta"))
            else:
                args.append(i.get("default", 1.0) if not isinstance(i.get("default"), str) else 1.0)
        got = pkg.torch_op(*args)
        got = got if isinstance(got, tuple) else (got,)
        for o, t in zip(META["outputs"], got):
            assert tuple(t.shape) == out_shape(o, dims) and t.dtype == DTYPES[inst["types"][o["name"]]]


def test_bad_inputs_get_one_clear_error():
    inst = META["instances"][0]
    dims = dims_of_first_case(inst)
    tensors = [i for i in META["inputs"] if i["kind"] == "tensor"]
    cpu = [torch.ones(shape_of(i, dims), dtype=DTYPES[inst["types"][i["name"]]]) for i in tensors]
    with pytest.raises(pkg.OpError, match="kernels run on the GPU|no instance"):
        op(*cpu)
    with pytest.raises(pkg.OpError, match="takes"):
        op(*cpu, *([None] * (len(META["inputs"]) + 1)))


# --- on the GPU ----------------------------------------------------------------------------------

def draw(name: str, args: list, shape: tuple, dims: dict, gen: torch.Generator) -> torch.Tensor:
    a = [dims[v] if isinstance(v, str) else v for v in args]
    if name == "normal":
        mean, std = (a + [0.0, 1.0][len(a):])[:2]
        return torch.randn(shape, generator=gen, dtype=torch.float64) * std + mean
    if name == "uniform":
        lo, hi = (a + [0.0, 1.0][len(a):])[:2]
        return torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    if name in ("sigmoid", "logsigmoid", "logsigmoid_resets"):
        mean, std, p, value = (a + [0.0, 1.0, 0.02, -1e5][len(a):])[:4]
        x = torch.randn(shape, generator=gen, dtype=torch.float64) * std + mean
        if name == "logsigmoid_resets":
            resets = torch.rand(shape, generator=gen, dtype=torch.float64) < p
            return torch.where(resets, value, torch.nn.functional.logsigmoid(x))
        return torch.sigmoid(x) if name == "sigmoid" else torch.nn.functional.logsigmoid(x)
    if name == "softmax":
        std = a[0] if a else 1.0
        return torch.softmax(torch.randn(shape, generator=gen, dtype=torch.float64) * std, -1)
    if name == "unit":
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
        return x / x.norm(dim=-1, keepdim=True)
    if name == "randint":
        lo, hi = (a + [0, 100][len(a):])[:2]
        return torch.randint(lo, hi, shape, generator=gen)
    pytest.fail(f"the packaged tests cannot draw {name}(...) inputs")


def reference(inputs: dict, dims: dict):
    text = CHECKS["reference"]
    if CHECKS["reference_is_function"]:
        mod, fn = text.split(":")
        return getattr(importlib.import_module(mod), fn)(**inputs)
    return eval(text, {"torch": torch, "F": F, "math": math, **dims, **inputs})  # noqa: S307


def matches(out: torch.Tensor, ref: torch.Tensor, tol: float) -> str:
    """kfc's tolerance rule: finite where the reference is, relative RMSE and every element
    within tol * (|ref| + rms(ref))."""
    out, ref = out.double(), ref.double()
    if out.shape != ref.shape:
        return f"shape {tuple(out.shape)}, reference {tuple(ref.shape)}"
    finite = torch.isfinite(ref)
    if (~torch.isfinite(out) & finite).any():
        return "not finite where the reference is (unwritten?)"
    rms = ref[finite].pow(2).mean().sqrt() if finite.any() else torch.tensor(0.0, dtype=torch.float64)
    err = (out - ref)[finite]
    rel = float(err.pow(2).mean().sqrt() / rms.clamp_min(1e-300)) if err.numel() else 0.0
    worst = float((err.abs() / (ref[finite].abs() + rms).clamp_min(1e-300)).max()) if err.numel() else 0.0
    return "" if rel <= tol and worst <= tol else f"rel RMSE {rel:.3g}, worst {worst:.3g} (tol {tol})"


CASES = [(inst["name"], case, seed) for inst in META["instances"] for case in CHECKS["cases"]
         for seed in CHECKS["seeds"] + [12345]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA GPU visible: the packaged kernels run on one (these cases run where one is)")
@pytest.mark.parametrize("instance,case,seed", CASES, ids=[f"{i}-{c}-{s}" for i, c, s in CASES])
def test_check_case_on_the_gpu(instance, case, seed):
    inst = next(i for i in META["instances"] if i["name"] == instance)
    gen = torch.Generator().manual_seed(seed)
    inputs, args = {}, []
    for i in META["inputs"]:
        if i["kind"] == "tensor":
            name, gargs = CHECKS["inputs"].get(i["name"], ["normal", []])
            t = draw(name, gargs, shape_of(i, case), case, gen).to(DTYPES[inst["types"][i["name"]]])
            inputs[i["name"]] = t.cuda()
        else:
            d = i.get("default")
            inputs[i["name"]] = eval(d, {}, dict(case)) if isinstance(d, str) else d  # noqa: S307
        args.append(inputs[i["name"]])
    outs = [torch.full(out_shape(o, case), float("nan"), device="cuda").to(DTYPES[inst["types"][o["name"]]])
            for o in META["outputs"]]
    got = op(*args, out=outs if len(outs) > 1 else outs[0])
    got = got if isinstance(got, tuple) else (got,)
    ref = reference({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}, case)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for o, g, r in zip(META["outputs"], got, ref):
        tol = CHECKS["tolerance"].get(inst["types"][o["name"]], 1e-5)
        problem = matches(g.cpu(), r, tol)
        assert not problem, f"{o['name']}: {problem}"
