"""hoist-loads (kfc/passes/hoist_loads.py) and the tile emitter's one phase for an iteration's
loads: loads of tensors the op never writes move up to where their operands are defined, the
interpreter computes the same before and after, and the emitter stores them with one barrier."""

import numpy as np

from kfc.codegen import cuda
from kfc.codegen.cuda import generate_cuda
from kfc.codegen.tile_emitter import TileKernelEmitter
from kfc.frontend import parse_kfc
from kfc.ir.interpreter import run
from kfc.ir.specialize import specialize
from kfc.ir.tile_ops import DotOp, ForOp, LoadOp
from kfc.model.target import parse_target
from kfc.passes import PassContext, PassManager, parse_pipeline

# a carried state read by two products a step, its other operands loaded after the first product;
# `acc` is written and read back, so its load must stay where it is
CARRY = """
op carry(a: f32[N, 16, 32], b: f32[N, 16, 32], c: f32[N, 16, 32], s0: f32[32, 32])
        -> (y: f32[N, 16, 32], s: f32[32, 32], acc: f32[16, 32]) {
  parallel p in 0..1 {
    S = s0[:, :]
    for n in 0..N carry (S) {
      U = a[n, :, :] - dot(b[n, :, :], S)
      acc[:, :] = U
      y[n, :, :] = acc[:, :] * 2.0 + dot(c[n, :, :], S)
      S = S * 0.5 + dot(U, c[n, :, :], trans_a=true)
    }
    s[:, :] = S
  }
}
"""


# the same without acc: the tile emitter takes no load of a tensor after a store into it
PLAIN = (CARRY.replace(", acc: f32[16, 32])", ")").replace("      acc[:, :] = U\n", "")
         .replace("acc[:, :] * 2.0", "U * 2.0"))


def lowered(pipeline: str, dims=None, text=CARRY):
    spec = parse_kfc(text)
    func = specialize(spec.func, dims or {}) if dims else spec.func
    return PassManager(parse_pipeline(pipeline), PassContext(target=parse_target("sm_90a"))).run(func)


def loop_body(func):
    return next(op for op in func.walk() if isinstance(op, ForOp)).body.ops


def test_loads_of_tensors_never_written_move_to_the_top_of_their_block_in_order():
    before, after = (loop_body(lowered(p)) for p in ("canonicalize,cse,dce", "canonicalize,cse,dce,hoist-loads"))
    names = lambda ops: [op.operands[0].name for op in ops if isinstance(op, LoadOp)]  # noqa: E731
    assert names(before) == ["a", "b", "acc", "c"]
    loads = [i for i, op in enumerate(after) if isinstance(op, LoadOp)]
    first_dot = next(i for i, op in enumerate(after) if isinstance(op, DotOp))
    # a, b and c stand together before the first product, in their order; acc, which the loop
    # writes, stays after the store it must read
    assert names(after)[:3] == ["a", "b", "c"] and max(loads[:3]) < first_dot
    acc_load = next(i for i, op in enumerate(after) if isinstance(op, LoadOp) and op.operands[0].name == "acc")
    acc_store = next(i for i, op in enumerate(after) if op.NAME == "tile.store" and op.operands[1].name == "acc")
    assert acc_store < acc_load


def test_hoisting_changes_no_result():
    rng = np.random.default_rng(0)
    draw = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    args = dict(a=draw(3, 16, 32), b=draw(3, 16, 32) * 0.1, c=draw(3, 16, 32) * 0.1, s0=draw(32, 32))
    outs = [run(lowered(p), dict(args)) for p in ("canonicalize,cse,dce", "canonicalize,cse,dce,hoist-loads")]
    for name in ("y", "s", "acc"):
        np.testing.assert_array_equal(outs[0][name], outs[1][name])


def test_the_emitter_stores_an_iteration_s_loads_in_one_phase(monkeypatch):
    """With the loads first, b and c (each read by a product) are stored in one phase: a barrier
    fewer a step than stored a phase each, and than without hoist-loads (each phase taken as it
    is written: a later write continuing an earlier phase, kfc.codegen.tile_phases, would join
    them too)."""
    monkeypatch.setattr(cuda, "TILE_REOPEN_PHASES", False)
    func = lowered("canonicalize,cse,dce,hoist-loads", {"N": 3}, PLAIN)
    barriers = lambda code: code.split("for (long long", 1)[1].count("__syncthreads();")  # noqa: E731
    grouped = barriers(generate_cuda(func)[0])
    apart = barriers(TileKernelEmitter(func, "k", group_loads=False, reopen_phases=False).generate()[0])
    unhoisted = barriers(generate_cuda(lowered("canonicalize,cse,dce", {"N": 3}, PLAIN))[0])
    assert grouped == apart - 1 and grouped < unhoisted
