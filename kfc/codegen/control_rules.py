"""Emission rules for sequential control flow inside a row: `tile.for` and `tile.if`."""

from __future__ import annotations

from ..ir.core import Value, walk_block
from ..ir.tile_ops import ConstOp, ForOp, IfOp
from . import ptx
from .c_names import C_TYPES
from .errors import CodegenError
from .rules import rule, synchronises


@rule(ForOp)
def emit_for(em, op: ForOp) -> None:
    """for (k = lo; k < hi; k += step) over the body, its carried values in variables the
    body's arguments and the loop's results share. Every thread of the CTA runs every
    iteration (tile gives a CTA one row), so reductions in the body synchronise as they
    do in the row loop; their shared slots alternate per iteration with kfc_phase."""
    lo, hi, step = (em.name(v) for v in op.operands[:3])
    step_op = next((o for o in walk_block(em.launch.body) if o.results and o.results[0] is op.operands[2]),
                   None)
    if isinstance(step_op, ConstOp) and step_op.value <= 0:
        raise CodegenError(f"a for loop's step must be positive, not {step_op.value}", op.loc)
    body = op.body
    carried = []
    for init, arg, res in zip(op.inits, body.args[1:], op.results):
        n = em.declare(res)
        copy_value(em, n, res, init)
        em.names[arg] = n
        carried.append((n, res))
    k = em.fresh("kfc_k")
    em.names[body.args[0]] = k
    if not isinstance(step_op, ConstOp):
        em.emit(f"if ((long long)({step}) <= 0) __trap();  // a step the interpreter refuses: never loop forever")
    em.emit(f"for (long long {k} = (long long)({lo}); {k} < (long long)({hi}); {k} += (long long)({step})) {{")
    em.indent += 1
    for inner in body.ops[:-1]:
        em.emit_op(inner)
    # the next carried values, all read before any is written (one may feed another)
    nexts = []
    for (n, res), y in zip(carried, body.ops[-1].operands):
        if em.name(y) == n:
            continue  # updated in place (a wgmma's accumulator): nothing to carry over
        t = em.fresh("kfc_next")
        emit_declare_like(em, t, res)
        copy_value(em, t, res, y)
        nexts.append((n, t, res))
    for n, t, res in nexts:
        if em.kind(res) == "row":
            em.loop(f"{n}[i] = {t}[i];")
        else:
            em.emit(f"{n} = {t};")
    # A step that synchronises the CTA through shared slots (at any depth of the body, in a
    # branch or an inner loop too) alternates its slots with kfc_phase from one iteration to
    # the next; after the loop a barrier ends every thread's reads of them, so whatever runs
    # next (the next row, the enclosing loop's next iteration) may write them in any phase.
    synced = any(synchronises(o) for o in walk_block(body))
    if synced:
        em.emit("kfc_phase ^= 1;")
    em.indent -= 1
    em.emit("}")
    if synced:
        em.emit(ptx.bar_sync(0))


@rule(IfOp)
def emit_if(em, op: IfOp) -> None:
    """if (c) { then } else { else }, each branch ending with the results' values. The
    condition is a scalar every thread of the row computes alike; where a branch holds a
    reduction, tile gives each CTA one row, so a CTA takes one branch as a whole."""
    results = [(em.declare(r), r) for r in op.results]
    for k, region in enumerate(op.regions):
        em.emit(f"if ({em.name(op.operands[0])}) {{" if k == 0 else "} else {")
        em.indent += 1
        for inner in region.ops[:-1]:
            em.emit_op(inner)
        for (n, r), y in zip(results, region.ops[-1].operands):
            copy_value(em, n, r, y)
        em.indent -= 1
    em.emit("}")


def emit_declare_like(em, name: str, v: Value) -> None:
    ct = C_TYPES[v.ttype.dtype]
    em.emit(f"{ct} {name}[{em.EV}];" if em.kind(v) == "row" else f"{ct} {name};")


def copy_value(em, name: str, like: Value, src: Value) -> None:
    if em.kind(like) == "row":
        em.loop(f"{name}[i] = {em.elem(src, 'i')};")
    else:
        em.emit(f"{name} = {em.name(src)};")
