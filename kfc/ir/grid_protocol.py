"""The barrier check for tile programs on tensor cores: a static proof that a gpu.grid's
protocol of staged tiles, mbarrier arrays and warpgroup MMAs is followed by every program of
the grid, so a kernel that would deadlock or race never reaches codegen.

The protocol's state (each barrier's phase, arrivals and bytes; each stage's copies in flight;
the wgmma groups in flight and the stages they read; the threads' unfenced writes) depends
only on loop counters and constants, never on the data or the program id. So the check walks
a program once, in program order, evaluating only that arithmetic and running each protocol
op's own `advance` (the step the interpreter takes too, without the data). It proves for all
programs at once what the interpreter checks for the inputs it runs: every wait reached with
its arrivals counted and its announced bytes delivered, with the parity of the phase it waits
for; no stage refilled while a copy into it or a wgmma reading it is in flight; no wgmma
reading a stage that has not landed, or that the threads wrote unfenced; no staging slot of a
TMA store written while a store reads it, or stored unfenced; nothing in flight when a program
ends. A stage, parity or loop bound that depends on data or on the program id
is refused: the check cannot follow it.

A warp-specialised program (gpu.roles) runs its roles at once: the walk runs them as coroutines
(kfc.ir.mma_ops.schedule) under several seeded interleavings, so for one the check is a search
over schedules, not a proof over all of them. A persistent grid (one wave of CTAs looping over
the tiles) is walked as its CTA 0 taking one, two and three tiles.
"""

from __future__ import annotations

import numpy as np

from ..diagnostics import InterpretError, VerifyError
from .core import Op
from .interpreter import Interpreter
from .printer import Printer
from .mma_ops import (CopyStageOp, CtaBarrierOp, ExpectTxAtOp, FenceProxyAsyncOp, GridOp, MbarrierArrayOp,
                      MbarrierArriveOp, MbarrierWaitParityOp, RolesOp, SingleThreadOp, StagedTile, StagesAllocOp,
                      StageFragmentOp, Tcgen05CommitOp, Tcgen05MmaOp, TensorMemoryTile, TmaLoadOp, TmaStoreOp,
                      TmaStoreWaitOp, TmemAllocOp, TmemLoadOp, WgmmaOp, WgmmaWaitOp)
from .smem_ops import HazardError, value_name
from .tile_ops import ForOp, IfOp
from .types import MemSpace, TensorType

PROTOCOL_OPS = (ExpectTxAtOp, TmaLoadOp, CopyStageOp, FenceProxyAsyncOp, MbarrierWaitParityOp, MbarrierArriveOp,
                WgmmaOp, WgmmaWaitOp, CtaBarrierOp, Tcgen05MmaOp, Tcgen05CommitOp, TmemLoadOp, StageFragmentOp,
                TmaStoreOp, TmaStoreWaitOp)
FOLLOWED = (ForOp, IfOp, SingleThreadOp, RolesOp)  # control flow the walk enters (roles as coroutines)
# the seeded schedules the roles of a warp-specialised program are walked under: each an
# interleaving the GPU could take; the walk of one without roles takes no schedule
SCHEDULES = 4
# a persistent grid's CTAs differ only in how many tiles each computes: the walk follows CTA 0
# taking one, two and three in turn (the protocol's counters carried from tile to tile), and
# where several roles take the CTA's tiles in turn (pingpong consumers) as many more as there
# are such roles beyond the first, so that each takes two or more of its own
PERSISTENT_TILES = (1, 2, 3)
# what a protocol op's operands must be known for: the rest (tensors, maps, coordinates) it ignores
CONTROL_OPERANDS = {ExpectTxAtOp: (1,), TmaLoadOp: (3,), CopyStageOp: (2,), MbarrierWaitParityOp: (1, 2),
                    MbarrierArriveOp: (1,), Tcgen05MmaOp: (3,), Tcgen05CommitOp: (1,),
                    WgmmaOp: (3,), StageFragmentOp: (2,), TmaStoreOp: (2,), ForOp: (0, 1, 2), IfOp: (0,)}


class _Unknown:
    """A value the walk does not compute: data, a program id, anything derived from them."""

    def __repr__(self) -> str:
        return "unknown"


UNKNOWN = _Unknown()


def _is_scalar(t) -> bool:
    return isinstance(t, TensorType) and t.rank == 0 and not t.dtype.is_float and t.space is MemSpace.REG


class ProtocolWalk(Interpreter):
    """The interpreter's control flow over a grid's body, with only the protocol's state."""

    def exec_op(self, op: Op, env: dict):
        ins = [env.get(v, UNKNOWN) for v in op.operands]
        for i in CONTROL_OPERANDS.get(type(op), ()):
            if ins[i] is UNKNOWN:
                raise op.error(f"the barrier check cannot follow this program: operand {i} "
                               f"({value_name(op.operands[i])}) depends on data or on the program id",
                               "compute stages, parities and loop bounds from loop counters and constants")
        if isinstance(op, PROTOCOL_OPS):
            op.advance(self, ins)
            return [UNKNOWN] * len(op.results)
        if isinstance(op, FOLLOWED):
            return op.interpret(self, ins, env)
        if isinstance(op, StagesAllocOp):
            return [StagedTile(value_name(op.result), None)]
        if isinstance(op, TmemAllocOp):
            return [TensorMemoryTile(value_name(op.result), None)]
        if isinstance(op, MbarrierArrayOp):
            return op.interpret(self, ins, env)
        if any(isinstance(p, PROTOCOL_OPS + (StagesAllocOp, MbarrierArrayOp))
               for region in op.regions for p in region.walk()):
            raise op.error("the barrier check cannot follow the protocol into this op's regions",
                           "keep the protocol's ops in tile.for, tile.if and gpu.single_thread")
        if op.regions or UNKNOWN in ins or not all(_is_scalar(r.type) for r in op.results):
            return [UNKNOWN] * len(op.results)
        try:
            return op.interpret(self, ins, env)
        except InterpretError:
            return [UNKNOWN] * len(op.results)  # e.g. a dim not bound here: the walk does not need it


# the grids (as printed) this process has found sound: the verifier runs after every pass, and a
# pass that leaves the grid as it was need not have it walked again (a warp-specialised one takes
# SCHEDULES walks)
_SOUND: dict[str, None] = {}
SOUND_REMEMBERED = 64


def check_grid_protocol(grid: GridOp) -> None:
    """Raise a VerifyError at the first op of grid's body that breaks the protocol: in program
    order, or for a warp-specialised program under each of SCHEDULES interleavings of its roles."""
    printer = Printer()
    printer.print_op(grid, 0)
    key = "\n".join(printer.lines)
    if key in _SOUND:
        return
    _walk_grid(grid)
    _SOUND[key] = None
    if len(_SOUND) > SOUND_REMEMBERED:
        del _SOUND[next(iter(_SOUND))]


def _walk_grid(grid: GridOp) -> None:
    roles = [op for op in grid.body.ops if isinstance(op, RolesOp)]
    specialised = bool(roles)
    in_turn = max((len(r.regions) - 2 for r in roles), default=0)  # consumers beyond the first
    walked = PERSISTENT_TILES + tuple(range(PERSISTENT_TILES[-1] + 1, PERSISTENT_TILES[-1] + 1 + in_turn))
    for seed in range(SCHEDULES if specialised else 1):
        for tiles in walked if grid.persistent else (None,):
            walk = ProtocolWalk(None, {})
            walk.schedule_seed = seed
            walk.cta_warpgroups = grid.threads // 128
            # a cluster's CTAs run together: the walk follows the first cluster's
            envs = [{arg: UNKNOWN for arg in grid.body.args} for _ in range(grid.cluster)]
            if tiles is not None:  # CTA 0 of a wave that gives it `tiles` of the grid's tiles
                for rank, env in enumerate(envs):
                    env[grid.body.args[0]] = np.asarray(rank, dtype=np.int64)
                walk.ctas = -(-grid.tiles // tiles // grid.cluster) * grid.cluster
            try:
                grid.run_programs(walk, envs)
            except HazardError as e:
                where = [f"roles scheduled with seed {seed}"] if specialised else []
                where += [f"a CTA computing {-(-grid.tiles // walk.ctas)} tile(s)"] if tiles is not None else []
                raise VerifyError(e.message + (f" ({', '.join(where)})" if where else ""), e.span, e.hint) from None
