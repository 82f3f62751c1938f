"""Fewer barriers in a tile kernel (kfc.codegen.tile_emitter): writes that do not depend on each
other share one CTA-wide phase.

Every phase ends with a barrier, so that what it wrote is seen by the phases after it and what
it read is not overwritten before every thread has read it. Such writes need none between them:

- tiles stored at one time (the pending tiles an op needs) of which none reads another: each
  writes a buffer of its own, new in this phase, and reads only buffers written before it, which
  the arena keeps alive through the phase (two decayed copies of k in KDA's prepare kernel);
- stores of tiles into distinct tensors, one after another: they write no shared memory and no
  element twice, and the tile emitter takes no kernel that loads a tensor it writes
  (tile_program_problem), so no thread's access can race another's (KDA's prepare kernel stores
  u, qg, kg and aqk in one phase);
- a reduction written a warp an output and the elementwise tile that alone reads it: the warp
  writes that tile from its sum, and the sum is never stored (the reciprocals of q's and k's
  norms).

And a loop stores before it only the pending tiles it reads, so that the others are stored
beside later ones (KDA's dt_bias beside q and k).

A write that reads nothing the last phase wrote continues that phase (reopen_for): its barrier
is taken back. The last phase must have written only buffers new in it (or tensors): the arena
then keeps the new write's buffers apart from every buffer that phase touched, so no thread
overwrites what another still reads. A carried tile updated in place may continue a phase that
did not read it (each phase's reads are recorded). KDA's prepare kernel: the norms of q and k
and the gates in one phase, the gates' sum beside their scan, β beside the decayed copies of q
and k, e^G beside the triangular inverse; its recurrence: the state's update beside the store
of o. What each thread computes is unchanged; only barriers go.
"""

from __future__ import annotations

from ..ir.core import Op, Value
from ..ir.tile_ops import StoreOp
from .tile_mma import DEFERRED_MMA
from .tile_plan import POINTWISE_OPS, warp_reduction

BARRIER = "__syncthreads();"


class TilePhases:
    """Mixed into TileKernelEmitter: written through its plan, pending, inline, buffers, arena,
    lines and phases."""

    def independent_groups(self, todo: list[Value]) -> list[list[Value]]:
        """The pending tiles todo (in the order they are to be stored) cut into runs in which no
        tile reads another; a product (stored its own way) is a run of its own."""
        groups: list[list[Value]] = []
        for v in todo:
            alone = self.pending.get(v) is DEFERRED_MMA
            if groups and self.join_phases and not alone and self.pending.get(groups[-1][0]) is not DEFERRED_MMA \
                    and not any(self.reads(v, u) for u in groups[-1]):
                groups[-1].append(v)
            else:
                groups.append([v])
        return groups

    def reads(self, v: Value, u: Value) -> bool:
        """Whether tile v's elements read tile u (through tiles written where they are read)."""
        return u in self.reached(self.plan.owner[v].operands)

    def store_group(self, group: list[Value]) -> None:
        """Independent pending tiles, each into a buffer of its own, in one phase."""
        group = [v for v in group if v in self.pending]  # not written already (from a product's accumulators)
        if not group:
            return
        self.reopen_for([x for v in group for x in self.plan.owner[v].operands])
        self.begin_phase()
        for v in group:
            expr, op = self.pending.pop(v), self.plan.owner.get(v)
            if op is not None and op.results == (v,) and warp_reduction(op):
                self.emit_warp_reduce(op, own_phase=False)
                continue
            buf = self.rounded_buffer(v)
            self.arena.touch(buf, self.step)
            self.write_buffer(buf, expr, v)
            self.buffers[v] = buf
        self.end_phase(reopenable=True)

    # --- a phase continued -----------------------------------------------------------------
    def reopen_for(self, reads, in_place=()) -> bool:
        """Continue the last phase (take its barrier back) for a write about to begin whose
        elements read these values (through tiles written where they are read) and that writes
        new buffers, or the buffers in_place (a carried tile updated in place), where the last
        phase may be continued, nothing has been written since, it wrote none of what the write
        reads and read none of what it writes in place. Whether it was; the next begin_phase
        then continues it."""
        if not (self.join_phases and self.reopen_phases) or self.in_phase or self.reopenable is None:
            return False
        end, step, read = self.reopenable
        if end != len(self.lines) or step != self.step or self.lines[-1].strip() != BARRIER:
            return False
        if any(self.buffers[u].first == step for u in self.reached(reads) if u in self.buffers):
            return False
        if any(b.name in read for b in in_place):
            return False
        self.lines.pop()
        self.in_phase = self.reopened = True
        self.reopenable = None
        return True

    # --- a tile written by the reduction it reads --------------------------------------------
    def store_in_reduction(self, op: Op, expr_of_idx) -> bool:
        """Store op's tile (to be stored now) in the epilogue of the one pending reduction it
        reads, written a warp an output, where nothing else reads that reduction and op's tile
        has its shape (rsqrt(sum(q * q) + eps): the norm is never stored, a phase less). Whether
        it was."""
        if not self.join_phases:
            return False
        pending = [v for v in self.pending_read(op) if self.pending.get(v) is not DEFERRED_MMA]
        if len(pending) != 1:
            return False
        red = pending[0]
        owner = self.plan.owner.get(red)
        if not (owner is not None and owner.results == (red,) and warp_reduction(owner)
                and tuple(red.ttype.shape) == tuple(op.result.ttype.shape) and self.only_feeds(red, op)):
            return False
        del self.pending[red]
        self.flush_for(list(owner.operands) + list(op.operands))
        self.reopen_for(list(owner.operands) + list(op.operands))
        self.emit_warp_reduce(owner, epilogue=(op.result, expr_of_idx))
        return True

    def reductions_kept_for(self, op: Op) -> list[Value]:
        """The pending reductions, written a warp an output, that elementwise op reads at its
        own indices (through elementwise tiles written where read): left pending, so that a tile
        they feed may be stored in their epilogue."""
        if not (self.join_phases and isinstance(op, POINTWISE_OPS) and len(op.results) == 1):
            return []
        return [v for v in self.pending_read(op) if self.pending[v] is not DEFERRED_MMA
                and self.plan.owner.get(v) is not None and warp_reduction(self.plan.owner[v])
                and v.ttype.shape == op.result.ttype.shape and self.elementwise_from(v, op)]

    def elementwise_from(self, v: Value, op: Op) -> bool:
        """Whether op reads v only through elementwise ops of v's shape."""
        for x in op.operands:
            if x is v:
                continue
            owner = self.plan.owner.get(x)
            if x in self.inline and owner is not None and self.reads(x, v) and not (
                    isinstance(owner, POINTWISE_OPS) and x.ttype.shape == v.ttype.shape
                    and self.elementwise_from(v, owner)):
                return False
        return True

    def pending_read(self, op: Op) -> list[Value]:
        """The pending tiles op's elements read (through tiles written where they are read)."""
        return [v for v in self.reached(op.operands) if v in self.pending]

    def only_feeds(self, v: Value, op: Op) -> bool:
        """Whether every read of v is by op, or by tiles written where they are read that only
        feed op, all elementwise (no view moves an element to another index)."""
        for u in self.plan.uses.get(v, ()):
            if u is op:
                continue
            if not (isinstance(u, POINTWISE_OPS) and len(u.results) == 1
                    and u.result.ttype.shape == v.ttype.shape and self.only_feeds(u.result, op)):
                return False
        return isinstance(op, POINTWISE_OPS)

    # --- stores that share a phase --------------------------------------------------------------
    def joins_last_store(self, op: StoreOp) -> bool:
        """Whether this store may run in the phase of the stores written just before it (nothing
        written between), into a tensor none of them writes. If so the barrier that ended that
        phase is taken back, and the caller continues it."""
        tensor = op.operands[1]
        last = self.last_store
        if not self.join_phases or last is None or last[0] != len(self.lines) or self.lines[-1].strip() != BARRIER:
            return False
        if tensor in last[1]:
            return False
        self.lines.pop()
        self.in_phase = True
        return True

    def close_store_phase(self, op: StoreOp, joined: bool) -> None:
        """End a store's phase, remembering it for the next store to join."""
        self.end_phase(reopenable=True)
        tensors = (self.last_store[1] if joined else frozenset()) | {op.operands[1]}
        self.last_store = (len(self.lines), tensors)

    def touches(self, v: Value, arg: Value) -> bool:
        """Whether v's inline expression reads the carried tile arg."""
        if v is arg:
            return True
        if v not in self.inline or v not in self.plan.owner:
            return False
        return any(self.touches(o, arg) for o in self.plan.owner[v].operands)

    def pointwise(self, v: Value, arg: Value) -> bool:
        """Whether v's inline expression reads arg only at the element it computes."""
        if v is arg or v not in self.inline or v not in self.plan.owner:
            return True
        op = self.plan.owner[v]
        if isinstance(op, POINTWISE_OPS):
            return all(self.pointwise(o, arg) for o in op.operands)
        return not self.touches(v, arg)
