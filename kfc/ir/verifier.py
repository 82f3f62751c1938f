"""The verifier: SSA scoping, per-op invariants, and function-level rules.

Every message carries the op's source span. Runs after the front end and after every pass.
"""

from __future__ import annotations

from ..diagnostics import VerifyError
from . import layouts
from .barriers import check_barriers
from .core import Block, Op
from .func import FuncOp
from .grid_protocol import check_grid_protocol
from .gpu_ops import LaunchOp
from .mma_ops import GridOp
from .tile_ops import BinaryOp, ConstOp, DimOp, ForOp, LoadOp, ParallelOp, ScratchOp, StoreOp, YieldOp
from .tile_ops.memory import index_operands
from .tile_ops.checks import check_operands, check_results
from .types import MemSpace, SymDim, TensorType, bare_type


def _dims_known(op: Op, t, symbols: set[str], what: str) -> None:
    if isinstance(t, TensorType):
        for d in t.shape:
            if isinstance(d, SymDim) and d.name not in symbols:
                raise op.error(f"{what} type {t} uses symbol {d.name!r}, which no argument of the function declares",
                               "shape symbols come from the signature")


def _layout_fits(op: Op, t, what: str) -> None:
    if isinstance(t, TensorType):
        try:
            problem = layouts.misfit(t)
        except ValueError as e:
            problem = str(e)
        if problem:
            raise op.error(f"{what} type {t}: {problem}")


def verify_op(op: Op) -> None:
    """The op's own invariants: its declared operand and result counts, then its verify_."""
    if op.OPERANDS is not None:
        check_operands(op, op.OPERANDS)
    if op.RESULTS is not None:
        check_results(op, op.RESULTS)
    op.verify_()


def verify(func: FuncOp) -> FuncOp:
    """Check `func`; raise VerifyError at the first problem, return it unchanged otherwise."""
    verify_op(func)
    _Verifier(func).run()
    return func


MAX_REGION_DEPTH = 256  # loops and branches inside one another: past the ~200 that .kfc text can nest


class _Verifier:
    def __init__(self, func: FuncOp) -> None:
        self.func = func
        self.symbols = set(func.symbols)
        self.inputs = {id(v) for v in func.inputs}
        self.outputs = {id(v) for v in func.outputs}
        self.tensors = {id(v) for v in func.args if v.ttype.space is not MemSpace.REG}
        self.constants: dict[int, object] = {}  # scalar constants' values, by result

    def run(self) -> None:
        for a in self.func.args:
            _layout_fits(self.func, a.type, f"argument %{a.name}")
        self.block(self.func.body, [set(id(a) for a in self.func.args)], owner=self.func)

    def block(self, block: Block, scopes: list[set[int]], owner: Op) -> None:
        if len(scopes) > MAX_REGION_DEPTH:  # the interpreter and passes recurse a few frames a level
            raise owner.error(f"regions nest more than {MAX_REGION_DEPTH} levels deep here",
                              "a program nests loops and branches a few levels deep; split this one")
        scope: set[int] = set(id(a) for a in block.args)
        scopes = scopes + [scope]
        for i, op in enumerate(block.ops):
            for v in op.operands:
                if not any(id(v) in s for s in scopes):
                    raise op.error(f"operand %{v.name or '?'} is not defined before this use",
                                   "every value must be defined above its use, in this region or an enclosing one")
            if op.has_trait("terminator"):
                if i != len(block.ops) - 1:
                    raise op.error("a terminator must be the last op of its block")
                if isinstance(op, YieldOp) and not (owner.has_trait("loop") or owner.has_trait("branch")):
                    raise op.error(f"tile.yield ends a loop's body or a branch, not a {owner.NAME} region")
            if isinstance(op, FuncOp):
                raise op.error("functions do not nest")
            if isinstance(op, (LaunchOp, GridOp)) and owner is not self.func:  # a kernel's launch is the function's
                raise op.error("a launch inside another launch or loop; a kernel is launched from the function's top "
                               "level", "move it to the top level of the function")
            if isinstance(op, ScratchOp):  # a tensor for the call: loads and stores may take it
                if owner is not self.func:
                    raise op.error("a scratch tensor is made at the function's top level, not inside a loop or branch")
                self.tensors.add(id(op.result))
                self.outputs.add(id(op.result))
            verify_op(op)
            inferred = op.infer_result_types([v.type for v in op.operands], op.attributes())
            if inferred is not None and [bare_type(r.type) for r in op.results] != [bare_type(t) for t in inferred]:
                got = ", ".join(str(r.type) for r in op.results)
                want = ", ".join(str(t) for t in inferred)
                raise op.error(f"result type {got} should be {want}")
            for r in op.results:
                _dims_known(op, r.type, self.symbols, "result")
                _layout_fits(op, r.type, "result")
                if id(r) in scope or any(id(r) in s for s in scopes):
                    raise op.error(f"value %{r.name or '?'} is defined twice")
            self.op_rules(op)
            for region in op.regions:
                for a in region.args:
                    _dims_known(op, a.type, self.symbols, "region argument")
                    _layout_fits(op, a.type, "region argument")
                self.block(region, scopes, owner=op)
            if isinstance(op, GridOp):
                check_grid_protocol(op)  # once its body is known to be well formed
            scope.update(id(r) for r in op.results)
        check_barriers(block)

    def op_rules(self, op: Op) -> None:
        if isinstance(op, ConstOp) and op.result.ttype.rank == 0:
            self.constants[id(op.result)] = op.value
        if isinstance(op, ForOp) and not self.constants.get(id(op.operands[2]), 1) > 0:
            raise op.error(f"step must be positive, not {self.constants[id(op.operands[2])]}: the loop would not end",
                           "count down by indexing from the end, e.g. hi - 1 - i")
        if isinstance(op, DimOp) and op.sym not in self.symbols:
            raise op.error(f"unknown shape symbol {op.sym!r}", f"the signature declares {sorted(self.symbols)}")
        if isinstance(op, LoadOp) and id(op.operands[0]) not in self.tensors and \
                op.operands[0].ttype.space is not MemSpace.SHARED:
            raise op.error("loads from a tensor that is not an argument of the function")
        if isinstance(op, StoreOp):
            target = op.operands[1]
            if id(target) in self.inputs:
                raise op.error(f"stores into the input %{target.name}; inputs are read-only",
                               "declare the tensor among the outputs after '->'")
            if id(target) not in self.outputs:
                raise op.error("stores into a tensor that is not an output of the function")


def _past(upper, dim, defs: dict) -> bool:
    """Whether a loop bound `upper` is provably past the extent `dim`: a constant beyond a fixed
    extent, or the dim plus a positive constant (`0..M + 1` over a dim of M)."""
    op = defs.get(id(upper))
    if isinstance(op, ConstOp):
        return isinstance(dim, int) and isinstance(op.value, int) and op.value > dim
    if isinstance(op, BinaryOp) and op.NAME == "tile.add":
        for a, b in (op.operands, op.operands[::-1]):
            da, db = defs.get(id(a)), defs.get(id(b))
            same = (isinstance(da, DimOp) and isinstance(dim, SymDim) and da.sym == dim.name) or (
                isinstance(da, ConstOp) and da.value == dim)
            if same and isinstance(db, ConstOp) and isinstance(db.value, int) and db.value > 0:
                return True
    return False


def check_loop_extents(func: FuncOp) -> FuncOp:
    """A parallel loop's index, a point index of a tensor, must not run provably past its dim
    (`parallel m in 0..M + 1` over x[M, N]): the row kernels do not test it, and the interpreter
    refuses it only when it runs. Checked of what users write (.kfc and IR files), not of every
    IR a pass or a test builds. Returns func."""
    defs = {id(r): op for op in func.walk() for r in op.results}
    for loop in func.walk():
        if not isinstance(loop, ParallelOp):
            continue
        bounds = dict(zip(loop.body.args, loop.uppers))
        for op in loop.walk():
            if not isinstance(op, (LoadOp, StoreOp)):
                continue
            tensor = op.operands[0 if isinstance(op, LoadOp) else 1]
            for k, (d, (ix, operands)) in enumerate(zip(tensor.ttype.shape, index_operands(op))):
                if ix.kind == "point" and operands[0] in bounds and _past(bounds[operands[0]], d, defs):
                    raise VerifyError(f"the parallel loop's index '{operands[0].name}' runs past dim {k} of "
                                      f"'{tensor.name}', which has {d} elements", op.loc,
                                      f"bound the loop by {d}: 0..{d}")
    return func


def check_scratch_use(func: FuncOp) -> FuncOp:
    """Each scratch tensor carries values from one parallel loop to a later one: it has a name of
    its own, a loop stores it, a later loop reads it, and no loop reads what it stores itself (its
    CTAs would read one another's stores in no order). Returns func."""
    loops = [op for op in func.body.ops if isinstance(op, ParallelOp)]
    seen: dict[str, Op] = {}
    for op in (op for op in func.body.ops if isinstance(op, ScratchOp)):
        v = op.result
        if v.name in seen:
            raise VerifyError(f"a second scratch tensor named '{v.name}'", op.loc, "give each its own name")
        seen[v.name] = op
        stored = [k for k, loop in enumerate(loops)
                  if any(isinstance(o, StoreOp) and o.operands[1] is v for o in loop.walk())]
        loads = [(k, o) for k, loop in enumerate(loops) for o in loop.walk()
                 if isinstance(o, LoadOp) and o.operands[0] is v]
        if not stored:
            raise VerifyError(f"the scratch tensor '{v.name}' is never stored", op.loc,
                              "store into it in one parallel loop and read it in a later one")
        if not loads:
            raise VerifyError(f"the scratch tensor '{v.name}' is stored but never read", op.loc,
                              "read it in a later parallel loop, or make it an output if the caller needs it")
        for k, load in loads:
            if k in stored or k < stored[0]:
                where = "in the parallel loop that stores it" if k in stored else "before any loop stores it"
                raise VerifyError(f"the scratch tensor '{v.name}' is read {where}", load.loc,
                                  "a scratch tensor carries values from one parallel loop to a later one: read it "
                                  "in a loop after the one that stores it, or keep the value in a name")
    return func


def check_as_written(func: FuncOp) -> FuncOp:
    """What a program a user wrote (.kfc or IR text) must also satisfy, beyond verify: the checks
    above, of mistakes that IR built by passes and tests cannot make. Returns func."""
    return check_scratch_use(check_loop_extents(func))
