"""What the pass tests share: the shipped row kernels specialised as `kfc compile` does, and a
pipeline run with its context."""

from kfc.frontend import load_kfc
from kfc.ir import verify
from kfc.ir.func import FuncOp
from kfc.ir.specialize import specialize
from kfc.passes import PassContext, PassManager, parse_pipeline
from kfc.model.target import Target, parse_target

SM90A = parse_target("sm_90a")


def kernel(name: str, n: int, dtype: str = "bf16"):
    """A row kernel specialised to row length n (the row count stays symbolic), as kfc compile does."""
    spec = load_kfc(f"kernels/{name}.kfc", {"T": dtype})
    return spec, verify(specialize(spec.func, {"N": n}, partial=True))


def run_pipeline(func: FuncOp, text: str, target: Target = SM90A, **ctx_kwargs):
    ctx = PassContext(target, **ctx_kwargs)
    return PassManager(parse_pipeline(text), ctx).run(func), ctx


def ops_of(func: FuncOp, cls) -> list:
    return [op for op in func.walk() if isinstance(op, cls)]
