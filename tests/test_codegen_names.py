"""Names in generated code never collide: ops whose inputs, scalars, outputs, locals, dims and op
name are C++ keywords, CUDA built-ins, kfc's generated names and loop counters compile, and their
code is the code of the same op with plain names, but for the prefixed names (so a user's name
enters the C++ only as `p_NAME`, `dim_NAME` or `kfc_kernel_NAME`). The GPU test runs them."""

import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from kfc.codegen.cuda import c_dim, c_kernel, c_param
from kfc.compile import compile_op
from kfc.frontend import parse_kfc
from kfc.model.target import parse_target

from hostile_names import NEUTRAL, cases, source

pytestmark = pytest.mark.xdist_group("codegen_names")  # on one pytest-xdist worker: it compiles its cases once

CASES = cases()


def _compile(job):
    cid, names = job
    nm = {**NEUTRAL, **names}
    spec = parse_kfc(source(cid, names), f"<{cid}>")
    return (cid, tuple(sorted(names.items()))), compile_op(spec, parse_target("sm_90a"), shape={nm["n"]: 8})


@pytest.fixture(scope="module")
def compiled():
    jobs = [(cid, names) for cid, names in CASES] + [(cid, {}) for cid in {c for c, _ in CASES}]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(pool.map(_compile, jobs))


def _renamed(cu: str, names: dict[str, str]) -> str:
    """The code with the prefixed user names replaced by the neutral ones of their roles."""
    nm = {**NEUTRAL, **names}
    subs = {c_kernel(nm["op"]): c_kernel(NEUTRAL["op"])}
    for role in ("x", "s", "y", "g"):
        subs[c_param(nm[role])] = c_param(NEUTRAL[role])
    for role in ("m", "n"):
        subs[c_dim(nm[role])] = c_dim(NEUTRAL[role])
    return re.sub(r"\b(" + "|".join(map(re.escape, subs)) + r")\b", lambda m: subs[m.group(1)], cu)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_user_names_enter_the_code_only_prefixed(case, compiled):
    cid, names = case
    hostile = compiled[(cid, tuple(sorted(names.items())))]
    plain = compiled[(cid, ())]
    assert hostile.kernel.cubin[:4] == b"\x7fELF"
    assert _renamed(hostile.kernel.cu, names) == plain.kernel.cu
    nm = {**NEUTRAL, **names}
    func = parse_kfc(source(cid, names), f"<{cid}>").func
    assert hostile.plan.kernel == c_kernel(func.sym_name)
    assert [p.name for p in hostile.plan.params] == [v.name for v in func.args] + [nm["m"]]


def test_the_launch_plan_binds_parameters_by_their_op_names(compiled):
    r = compiled[("norm", tuple(sorted(dict(CASES)["norm"].items())))]
    assert [(p.name, p.kind, p.cname) for p in r.plan.params] == [
        ("e", "tensor", "p_e"), ("w", "tensor", "p_w"), ("i", "scalar", "p_i"), ("float", "tensor", "p_float"),
        ("threadIdx", "dim", "dim_threadIdx")]
