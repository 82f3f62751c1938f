"""What a row program asks of a thread's instruction issue, per byte of its rows it moves: the
cost model stage-rows consults before it moves a row out of registers.

A row kernel is bound by memory while a thread issues few instructions per byte it moves, and
by issue once it issues many (the H200 moves 4.8 TB/s and issues about 0.9 T warp instructions
a second). Staging a row through shared
memory costs instructions as well as saving registers: each later stretch reads the row again
from shared memory and converts it again. Measured on the H100 (eager do_bench, 32768 x 4096
bf16, the default pipeline against the same without stage-rows): fp8 quantisation (an IEEE
division an element) ran 12% faster from registers at 32 bf16 a thread, int8 quantisation 7%,
a first crossing of a running sum 13%; rmsnorm, softmax and layernorm had been measured faster
staged on the H200 (stage_rows.DEFAULT_MIN_BYTES).

The weights are SASS instructions an element, read off ptxas's output for sm_90a: an IEEE f32
division is a reciprocal, five FMAs, a range check and its branch (10); expf is eight; the
approximate forms lower-ptx takes where the op's tolerance allows (ex2.approx, a product with a
reciprocal the row shares) one or two; a scan adds its element, shares each vector's total across the
warp in five shuffle steps, reads the warps' totals and adds its carry (about eight an element
at four elements a vector);
anything else elementwise, a load, a store and a reduction's step one; a broadcast none.
"""

from __future__ import annotations

from ..ir.tile_ops import BroadcastOp, ConstOp, LoadOp, ScanOp, StoreOp
from ..ir.gpu_ops import row_dependent
from ..ir.types import MemSpace, TensorType
from .lower_ptx import approximable
from .rows import body_ops

# instructions an element: IEEE forms, and the approximate forms lower-ptx may take
EXACT_WEIGHT = {"tile.div": 10, "tile.rem": 12, "tile.pow": 20, "tile.exp": 8, "tile.exp2": 4, "tile.log": 8,
                "tile.log2": 6, "tile.sqrt": 6, "tile.rsqrt": 4, "tile.sigmoid": 12, "tile.softplus": 18,
                "tile.tanh": 12}
APPROX_WEIGHT = {"tile.exp": 2, "tile.rsqrt": 1}
SCAN_WEIGHT = 8
# From this many instructions a byte of row moved a row program is bound by issue: its short rows
# (up to HEAVY_ROWS_UP_TO bytes, the lengths measured) stay in registers (instructions an element
# / bytes an element, bf16: fp8 quantisation 16/3, int8 19/3, a first crossing of f32 15/4 stay;
# swiglu 20/6, softmax 10/4, row statistics 5/2, rmsnorm 9/4, rmsnorm with a residual 14/8 and
# softmax's gradient 10/6 are staged as before). Longer rows are staged for their registers:
# rmsnorm, softmax and layernorm won 6-40% staged from 64 KB up (stage_rows).
ISSUE_HEAVY_PER_BYTE = 3.5
HEAVY_ROWS_UP_TO = 16 * 1024


def _row_tile(v) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.space is MemSpace.REG and t.rank >= 1


def row_bytes_per_element(body) -> int:
    """Bytes each element of the row moves through memory: the row tiles the program loads and
    stores at the row's index (a weight every row re-reads stays in cache)."""
    rows = row_dependent(body)
    total = 0
    for op in body_ops(body):
        if not any(v in rows for v in op.operands[1:]):
            continue
        if isinstance(op, LoadOp) and _row_tile(op.result):
            total += op.operands[0].ttype.dtype.itemsize
        elif isinstance(op, StoreOp) and _row_tile(op.operands[0]):
            total += op.operands[1].ttype.dtype.itemsize
    return max(1, total)


def issue_per_element(body, approximable) -> int:
    """The instructions a thread issues for each element of its row in `body` (a row loop's
    region, before tile maps it); `approximable(value)` says whether lower-ptx may compute a
    value approximately."""
    defs = {r: op for op in body_ops(body) for r in op.results}
    total = 0
    for op in body_ops(body):
        touched = [v for v in (*op.operands, *op.results) if _row_tile(v)]
        if not touched or isinstance(op, (BroadcastOp, ConstOp)):
            continue  # scalar work is done once a row; a broadcast or constant issues nothing
        name = op.NAME
        weight = EXACT_WEIGHT.get(name, 1)
        if isinstance(op, ScanOp):
            weight = SCAN_WEIGHT
        elif op.results and approximable(op.results[0]):
            if name in APPROX_WEIGHT:
                weight = APPROX_WEIGHT[name]
            elif name == "tile.div" and isinstance(defs.get(op.operands[1]), BroadcastOp) \
                    and not _row_tile(defs[op.operands[1]].operands[0]):
                weight = 1  # a product with the reciprocal of a value the row shares
        total += weight
    return total


def keeps_in_registers(heavy: bool, row_bytes: int) -> bool:
    """Whether stage-rows leaves a row of `row_bytes` in registers for a program bound by issue."""
    return heavy and row_bytes <= HEAVY_ROWS_UP_TO


def bound_by_issue(func, body, ctx) -> tuple[int, int, bool]:
    """The instructions an element of the row program `body` (a row loop's region in `func`)
    issues, the bytes it moves, and whether that makes it bound by issue (ISSUE_HEAVY_PER_BYTE)."""
    issue, moved = issue_per_element(body, approximable(func, ctx)), row_bytes_per_element(body)
    return issue, moved, issue / moved >= ISSUE_HEAVY_PER_BYTE
