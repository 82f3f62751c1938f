"""The barrier check: a static proof, per block, that the shared-memory protocol of
kfc.ir.smem_ops is followed, so a program that would deadlock or race never reaches codegen.

In program order, for every mbarrier: each wait is reached with all its arrivals counted (an
announcement or a copy that arrives) and the announced bytes equal to the bytes of the copies
that complete bytes on it; no arrival overshoots a phase. For
every buffer: it is read only after the copy into it was waited for, and never copied into
while an earlier copy is in flight; every copy is waited for before the block ends. The
interpreter checks the same dynamically (kfc.ir.smem_ops), for the inputs it runs.
"""

from __future__ import annotations

import attrs

from .core import Block, Value
from . import smem_ops as m
from .smem_ops import CopyAsyncOp, ExpectTxOp, MbarrierAllocOp, MbarrierWaitOp, SmemAllocOp, copy_bytes
from .tile_ops import LoadOp
from .types import TensorType


name = m.value_name


@attrs.define
class _Phase:
    arrivals: int
    arrived: int = 0
    announced: int = 0
    delivered: int = 0
    copies: list = attrs.Factory(list)   # the buffers whose copies land in this phase

    def arrive(self, op, bar: Value) -> None:
        if self.arrived == self.arrivals:
            raise op.error(m.overshoot(name(bar), self.arrivals))
        self.arrived += 1


def check_barriers(block: Block) -> None:
    """Raise a VerifyError at the first op that breaks the protocol."""
    phases: dict[Value, _Phase] = {}
    in_flight: dict[Value, Value] = {}    # buffer -> the barrier its copy lands on
    written: set[Value] = set()
    allocs: dict[Value, object] = {}
    for op in block.ops:
        if isinstance(op, MbarrierAllocOp):
            phases[op.result] = _Phase(op.arrivals)
            allocs[op.result] = op
        elif isinstance(op, SmemAllocOp):
            allocs[op.result] = op
        elif isinstance(op, ExpectTxOp):
            bar = op.operands[0]
            p = phases.get(bar)
            if p is None:
                raise op.error(f"{name(bar)} is not an mbarrier allocated in this block")
            p.arrive(op, bar)
            p.announced += op.bytes
        elif isinstance(op, CopyAsyncOp):
            buf, bar = op.operands[1], op.operands[2]
            p = phases.get(bar)
            if p is None:
                raise op.error(f"{name(bar)} is not an mbarrier allocated in this block")
            if buf not in allocs:
                raise op.error(f"{name(buf)} is not a buffer allocated in this block")
            if buf in in_flight:
                raise op.error(m.copy_over_in_flight(name(buf), name(in_flight[buf])), m.HINT_WAIT_BEFORE_REUSE)
            t: TensorType = buf.ttype
            if not t.is_static:
                raise op.error(f"the buffer {t} needs a static shape to count its bytes", "specialise the dims first")
            if op.ARRIVES:
                p.arrive(op, bar)
            else:
                p.delivered += copy_bytes(t)
            p.copies.append(buf)
            in_flight[buf] = bar
        elif isinstance(op, MbarrierWaitOp):
            bar = op.operands[0]
            p = phases.get(bar)
            if p is None:
                raise op.error(f"{name(bar)} is not an mbarrier allocated in this block")
            if p.arrived < p.arrivals:
                raise op.error(m.missing_arrivals(name(bar), p.arrivals, p.arrived), m.HINT_ANNOUNCE)
            if p.delivered != p.announced:
                raise op.error(m.wrong_bytes(name(bar), p.announced, p.delivered), m.HINT_BYTES)
            for buf in p.copies:
                in_flight.pop(buf, None)
                written.add(buf)
            phases[bar] = _Phase(p.arrivals)
        elif isinstance(op, LoadOp) and op.operands[0] in allocs:
            buf = op.operands[0]
            if buf in in_flight:
                raise op.error(m.read_in_flight(name(buf), name(in_flight[buf])), m.HINT_WAIT_BEFORE_READ)
            if buf not in written:
                raise op.error(f"reads {name(buf)}, which nothing was copied into: it holds garbage")
    for buf, bar in in_flight.items():
        raise allocs[buf].error(m.never_waited(name(buf), name(bar)), m.HINT_WAIT_BEFORE_END)
