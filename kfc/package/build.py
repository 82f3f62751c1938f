"""`kfc package`: one op as a standalone, pip-installable Python package that needs torch but
not kfc.

    DIR/pyproject.toml                 the package `kfc-<op>`, module `kfc_<op>`
    DIR/README.md, DIR/report.json     pipelines, provenance, what the knowledge base measured
    DIR/src/kfc_<op>/__init__.py       `<op>(...)`, and torch.ops.kfc_<op>.<op> with a fake
    DIR/src/kfc_<op>/op.json           the op's signature, instances and launch contracts
    DIR/src/kfc_<op>/kernels/...       per instance, target and fixed dims: .cu, .ptx, .cubin
    DIR/src/kfc_<op>/op.kfc            the source it was built from
    DIR/src/kfc_<op>/{_op,calls,launcher,fastcall,contract}.py, fastcall.cpp   the runtime (from kfc)
    DIR/tests/test_<op>.py             the check block's cases against its reference (GPU), and
                                       what runs without one (CPU)
    DIR/bench/bench_<op>.py            eager and CUDA-graph timing

Kernels are built for every instance of the op's type parameters, every --target and every
--shape (the fixed dims; the row count stays a run-time argument). Without --shape, the
fixed dims of every case in the check block.
"""

from __future__ import annotations

import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from ..compile import build_advised, choose_dims, compile_op, fixed_dims, prepare_output_dir
from ..diagnostics import KfcError
from ..files import write_atomically
from ..frontend.spec import instances as spec_instances, load_kfc
from ..ir.specialize import check_dims
from ..ir.types import MemSpace
from ..kb.fingerprint import op_fingerprint
from ..kb.postgres import is_url
from ..kb.store import KnowledgeBase
from ..model.spec import OpSpec
from ..model.target import Target
from ..model.version import __version__
from ..ops import schema
from ..provenance import git_commit
from ..runtime.kernel import KfcKernel

HERE = Path(__file__).resolve().parent
RUNTIME = HERE.parent / "runtime"
# kfc's runtime modules a package ships (self-contained: the standard library, ctypes and torch)
RUNTIME_FILES = ("calls.py", "launcher.py", "fastcall.py", "fastcall.cpp", "contract.py")


def module_name(spec: OpSpec) -> str:
    return f"kfc_{spec.name}"


def fixed_shapes(spec: OpSpec, shapes: list[dict[str, int]]) -> list[dict[str, int]]:
    """The fixed dims to build: the given ones, else every check case's (row dims dropped)."""
    if not shapes:
        if spec.check is None or not spec.check.shapes:
            raise KfcError(f"{spec.path}: no --shape given and the op has no check block to take shapes from",
                           spec.func.loc, hint="pass --shape N=4096 (the fixed dims; repeat for more)")
        shapes = [dict(s) for s in spec.check.shapes]
    else:  # a bad --shape is refused before anything is built or said to be building
        for s in shapes:
            choose_dims(spec, s)
            check_dims(spec.func, s, "--shape")
    out = []
    for s in shapes:
        fixed = fixed_dims(spec.func, s)
        if fixed not in out:
            out.append(fixed)
    return out


def _shape_json(t) -> list:
    return [d if isinstance(d, int) else [d.name, d.offset] for d in t.shape]


def _shape_expr(t) -> list:
    return [d if isinstance(d, int) else str(d) for d in t.shape]


def describe(spec: OpSpec) -> tuple[list, list]:
    """The op's inputs and outputs as op.json lists them."""
    func = spec.func
    inputs, outputs = [], []
    for v in func.inputs:
        t = v.ttype
        entry = {"name": v.name, "type": str(t), "type_param": spec.typed_params.get(v.name)}
        if t.space is MemSpace.REG:
            entry["kind"] = "scalar"
            default = func.default_of(v.name)
            if default is not None:
                entry["default"] = default
        else:
            entry.update(kind="tensor", shape=_shape_json(t), optional=t.optional)
        inputs.append(entry)
    for v in func.outputs:
        outputs.append({"name": v.name, "type": str(v.ttype), "shape": _shape_expr(v.ttype),
                        "type_param": spec.typed_params.get(v.name)})
    return inputs, outputs


def dims_key(dims: dict[str, int]) -> str:
    return "_".join(f"{k}{v}" for k, v in sorted(dims.items())) or "any"


def build_package(path: str | Path, targets: list[Target], shapes: list[dict[str, int]], out_dir: Path,
                  pipeline: str | None = None, kb_path: Path | None = None,
                  progress: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
                  advise: Callable | None = None) -> Path:
    """Build and write the package. Where no pipeline is given, `advise(func, target name, dims)`
    (kfc.kb.advice) may name a record to start from, as kfc compile and kfc.load do; each kernel's
    report says which."""
    spec = load_kfc(path)
    fixed = fixed_shapes(spec, shapes)
    instances = spec_instances(spec)
    prepare_output_dir(out_dir)
    if any(out_dir.iterdir()):
        raise KfcError(f"the output folder {out_dir} is not empty; kfc package writes a whole package there",
                       hint="give -o a new or empty folder")
    mod = module_name(spec)
    pkg = out_dir / "src" / mod
    jobs = [(inst, t, dims) for inst in instances for t in targets for dims in fixed]
    progress(f"kfc package: building {len(jobs)} kernel(s) of {spec.name}: {len(instances)} instance(s) x "
             f"{len(targets)} target(s) x {len(fixed)} shape(s)")

    def build(job):
        inst, target, dims = job
        advice = advise(inst.func, target.name, choose_dims(inst, dims)) if advise and pipeline is None else None
        if advice is None:
            return job, compile_op(inst, target, pipeline, shape=dims), None, None
        result, said, used = build_advised(advice, lambda p: compile_op(inst, target, p, shape=dims))
        return job, result, said, used

    results = []
    with ThreadPoolExecutor(max_workers=4) as pool:
        for k, ((inst, target, dims), result, said, used) in enumerate(pool.map(build, jobs), 1):
            progress(f"  [{k}/{len(jobs)}] {inst.instance_name} {target.name} {dims_key(dims)}: "
                     f"{result.report['ptxas']['registers']} registers" + (f"; {said}" if said else ""))
            results.append((inst, target, dims, result, used))
    inputs, outputs = describe(spec)
    meta_instances = {}
    report_kernels = []
    kb_best = _knowledge(kb_path, instances, targets, op_fingerprint)
    for inst, target, dims, result, used in results:
        rel = Path("kernels") / inst.instance_name / target.name / dims_key(dims)
        for suffix, data in ((".cubin", result.kernel.cubin), (".ptx", result.kernel.ptx.encode()),
                             (".cu", result.kernel.cu.encode())):
            write_atomically(pkg / rel.with_suffix(suffix), data)
        entry = meta_instances.setdefault(inst.instance_name, {
            "name": inst.instance_name, "dtypes": dict(inst.dtypes),
            "types": {v.name: str(v.ttype.dtype) for v in inst.func.args if v.ttype.space is not MemSpace.REG},
            "kernels": []})
        entry["kernels"].append({"target": target.name, "dims": dims, "cubin": str(rel.with_suffix(".cubin")),
                                 "kernels": result.report["kernels"]})
        report_kernels.append({"instance": inst.instance_name, "target": target.name, "dims": dims,
                               "pipeline": result.pipeline,
                               "advised": used.describe() if used else None, "ptxas": result.report["ptxas"],
                               "knowledge_base": kb_best.get((inst.instance_name, target.name, dims_key(dims)))})
    op_schema = schema(KfcKernel(spec))
    meta = {"op": spec.name, "signature": spec.name + op_schema, "schema": op_schema, "inputs": inputs, "outputs": outputs,
            "instances": list(meta_instances.values()), "kfc_version": __version__}
    write_atomically(pkg / "op.json", (json.dumps(meta, indent=1) + "\n").encode())
    write_atomically(pkg / "op.kfc", Path(path).read_bytes())
    for name in RUNTIME_FILES:
        shutil.copyfile(RUNTIME / name, pkg / name)
    shutil.copyfile(HERE / "standalone.py", pkg / "_op.py")
    write_atomically(pkg / "__init__.py", _init(spec, mod).encode())
    write_atomically(out_dir / "pyproject.toml", _pyproject(spec, mod).encode())
    checks = _check_cases(spec, fixed)
    checks["reference"] = _vendor_reference(checks.get("reference"), checks.get("reference_is_function"), pkg, mod)
    write_atomically(pkg / "checks.json", (json.dumps(checks, indent=1) + "\n").encode())
    for template, dest in (("package_tests.py", out_dir / "tests" / f"test_{spec.name}.py"),
                           ("package_bench.py", out_dir / "bench" / f"bench_{spec.name}.py")):
        write_atomically(dest, (HERE / template).read_text().replace("__KFC_MODULE__", mod).encode())
    report = {"op": spec.name, "source": str(path), "kfc_version": __version__, "kfc_commit": git_commit(),
              "targets": [t.name for t in targets], "shapes": fixed, "kernels": report_kernels,
              "knowledge_base": str(kb_path) if kb_path else None}
    write_atomically(out_dir / "report.json", (json.dumps(report, indent=1) + "\n").encode())
    write_atomically(out_dir / "README.md", _readme(spec, mod, report).encode())
    progress(f"kfc package: wrote {out_dir} (pip install {out_dir})")
    return out_dir


def _knowledge(kb_path, instances, targets, fingerprint) -> dict:
    """Per (instance, target, fixed dims): the knowledge base's fastest timed pipeline there."""
    if kb_path is None or not (is_url(str(kb_path)) or Path(kb_path).exists()):
        return {}
    out = {}
    kb = KnowledgeBase(kb_path, create=False)
    try:
        for inst in instances:
            op = kb.op_by_fingerprint(fingerprint(inst.func))
            if op is None:
                continue
            for t in targets:
                for row in kb.candidates(op_id=op["id"], target=t.name):
                    if row.get("stage") != "timed" or row.get("median_us") is None:
                        continue
                    shape = row["shape"] if isinstance(row["shape"], dict) else json.loads(row["shape"])
                    key = (inst.instance_name, t.name, dims_key(fixed_dims(inst.func, shape)))
                    best = out.get(key)
                    if best is None or row["median_us"] < best["median_us"]:
                        out[key] = {"shape": shape, "pipeline": row["pipeline"], "median_us": row["median_us"],
                                    "bytes_moved": row.get("bytes_moved"), "gpu": row.get("gpu"),
                                    "candidate": row["id"]}
    finally:
        kb.close()
    return out


def _vendor_reference(reference: str | None, is_function: bool, pkg: Path, mod: str) -> str | None:
    """A reference function from kfc.reference is copied into the package (which has no kfc);
    the reference then names the copy."""
    if not reference or not is_function or not reference.startswith("kfc.reference."):
        return reference
    module, fn = reference.split(":")
    source = HERE.parent / "reference" / (module.rsplit(".", 1)[1] + ".py")
    shutil.copyfile(source, pkg / f"reference_{source.stem}.py")
    return f"{mod}.reference_{source.stem}:{fn}"


def _check_cases(spec: OpSpec, fixed: list[dict[str, int]]) -> dict:
    """The check block's cases whose fixed dims were built, for the package's tests."""
    check = spec.check
    if check is None:
        return {"reference": None, "cases": []}
    cases = [dict(s) for s in check.shapes if fixed_dims(spec.func, s) in fixed]
    return {"reference": check.reference, "reference_is_function": check.reference_is_function,
            "tolerance": {d: check.tolerance_for(d) for d in ("bf16", "f16", "f32", "f64")},
            "inputs": {k: [g.name, list(g.args)] for k, g in dict(check.inputs).items()},
            "seeds": list(check.seeds), "cases": cases}


def _init(spec: OpSpec, mod: str) -> str:
    return f'''"""{spec.name}, built by kfc {__version__} from op.kfc (see README.md and report.json).

    from {mod} import {spec.name}
    outputs = {spec.name}(...)             # or torch.ops.{mod}.{spec.name}(...)
"""

from pathlib import Path as _Path

from ._op import Op as _Op, OpError, register_torch_op as _register

{spec.name} = _Op(_Path(__file__).resolve().parent)
torch_op = _register({spec.name}, "{mod}")

__all__ = ["{spec.name}", "torch_op", "OpError"]
'''


def _pyproject(spec: OpSpec, mod: str) -> str:
    return f'''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{mod.replace('_', '-')}"
version = "{__version__}"
description = "{spec.name} for NVIDIA GPUs, built by kfc (the kernel factory compiler)"
requires-python = ">=3.10"
dependencies = ["torch>=2.4"]

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
"{mod}" = ["op.json", "checks.json", "op.kfc", "fastcall.cpp", "kernels/**/*"]

[tool.pytest.ini_options]
markers = ["gpu: needs an NVIDIA GPU"]
'''


def _readme(spec: OpSpec, mod: str, report: dict) -> str:
    lines = [f"# {mod}: {spec.name}, built by kfc", "",
             f"Built by kfc {report['kfc_version']} (commit {report['kfc_commit']}) from `op.kfc` "
             f"for {', '.join(report['targets'])} at {', '.join(dims_key(s) for s in report['shapes'])}. "
             "Needs torch and an NVIDIA GPU of a packaged target; not kfc.", "",
             "    pip install .", f"    python -c 'import {mod}; print({mod}.{spec.name})'",
             "    pytest tests              # on a GPU; the CPU part runs anywhere",
             f"    python bench/bench_{spec.name}.py", "",
             "| instance | target | dims | registers | pipeline | knowledge base |", "|---|---|---|---|---|---|"]
    for k in report["kernels"]:
        kb = k["knowledge_base"]
        kb_text = f"{kb['median_us']:.2f} us at {kb['shape']} ({kb['gpu'] or '?'})" if kb else "no record"
        lines.append(f"| {k['instance']} | {k['target']} | {dims_key(k['dims'])} | {k['ptxas']['registers']} | "
                     f"`{k['pipeline']}` | {kb_text} |")
    lines += ["", "Blackwell (sm_100a) kernels are proven by kfc's interpreter and ptxas; whether they were "
              "run on a B200 is what the knowledge base column says.", ""]
    return "\n".join(lines)
