"""tile: map a row program's parallel loop onto the GPU.

Options (0 means: choose from the row length and dtypes):
  rows        rows per CTA (each row gets `threads` threads; a CTA has rows · threads threads);
              at most, fitted to 1024 threads per CTA
  threads     threads per row, a power of two
  vec         elements per thread per access (16-byte accesses for the narrowest dtype at 8 x bf16);
              at most: halved until it divides the row length
  cluster     CTAs per row, joined in a thread-block cluster (sm_90+); long rows need it to fit
              in registers
  persistent  a grid of about one wave of CTAs striding over the rows, instead of one CTA per
              row batch (always, for a loop whose results sum across rows)
  stages      rows staged through shared memory: 1, each row's copy waited for in its own
              iteration; 2, the next row's copy issued while this row computes (twice the shared
              memory, a persistent grid); 0 chooses (TWO_STAGES_FROM)
  ctas_per_sm CTAs that must share an SM (the minimum of __launch_bounds__): it sets the registers
              a thread may take, 65536 / (ctas_per_sm x threads a CTA); 0 chooses (SMALL_TWO_STAGES)
  sums        where a thread keeps its part of sums across rows between rows: registers,
              shared memory, or auto: shared memory when the rows stay in registers and each
              thread holds SHARED_SUMS_FROM elements or more of them

The loop becomes a `gpu.launch` with those numbers and every row tile gets the `#row` layout.
Semantics do not change.
"""

from __future__ import annotations

import math

import attrs

from ..ir.core import Block, Value
from ..ir.func import FuncOp
from ..ir.gpu_ops import LaunchOp, row_layout
from ..ir.rewrite import ValueMap
from ..ir.smem_ops import MbarrierAllocOp, SmemAllocOp, copies_not_indexed_by_row
from ..ir.multiples import known_multiple
from ..ir.tile_ops import ConstOp, ForOp, IfOp, LoadOp, ReduceOp, ScanOp, StoreOp, index_operands
from ..ir.types import MemSpace, TensorType
from ..model.target import LARGEST_CLUSTER, ROW_CTA_THREADS, ROW_KERNEL_STATIC_SMEM
from .base import Pass, PassError, define_pass, option
from .rows import body_ops, find_row_loop, narrowest_load, only_summed, row_length

# Bytes of each row a thread holds: enough independent 16-byte loads in flight to cover memory
# latency, few enough registers to keep CTAs resident. Measured on the H200 (python -m
# bench.rmsnorm --sweep, also softmax and layernorm; bf16; bench/results/*-sweep-*.json):
# 64 bytes (32 bf16) per thread were best or within 3% up to rows of 16 KB, 128 bytes beyond;
# one CTA per row beat splitting the row across a cluster until the row no longer fits 512
# threads at that size.
SMALL_ROW_BYTES = 16 * 1024
BYTES_PER_THREAD_SMALL = 64
BYTES_PER_THREAD = 128
BLOCK_THREADS = 256
WARP = 32
# at most this many threads per row when choosing; longer rows take a cluster instead
AUTO_MAX_THREADS = ROW_CTA_THREADS
# Hopper and Blackwell run clusters of up to 16 CTAs once the kernel allows non-portable sizes
MAX_CLUSTER = LARGEST_CLUSTER
# A row staged through shared memory (stage-rows) is split across a cluster so that each CTA
# holds at most this much of it, in 256 to 512 threads of about 32 elements each: three CTAs
# then share an SM and overlap one another's copies and arithmetic. Measured on the H200 (bf16
# rmsnorm, rows of 4096 to 262144, clusters of 1 to 16 CTAs of 128 to 512 threads, eager
# do_bench; bench/results/stage_sweep-20261201T1352Z.json): 64 KB in 512 threads was best or
# within 1% from rows of 32768 up, 32 elements a thread below that; 32 KB per CTA lost up to 11%
# (rows of 32768).
STAGED_BYTES_PER_CTA = 64 * 1024
STAGED_ELEMS_PER_THREAD = 32
STAGED_THREADS = (256, 512)
# A row split across a cluster is split finer once CTAs start cheaply (a relaxed cluster arrive
# after the mbarrier inits; a release arrive had each CTA wait on a GPU-wide membar): 32 KB per
# CTA in 256 threads, while that takes at most 8 CTAs (a cluster of 16 must find a whole GPC
# free at once). Measured on the H200 (bf16, eager do_bench, kfc alone; bench/results/
# staged_split_sweep-20261202T0735Z.json), against 64 KB in 512 threads at rows of 32768, 65536
# and 131072: layernorm +17%, +3%, +8%; softmax +2%, +1%, 0; rmsnorm 0, +1%, +3%. At rows of
# 262144 (16 CTAs) softmax lost 3% and rmsnorm 1%. Measured with one staged row (not x and dy of
# softmax_bwd, nor x and the residual), so taken for one.
SPLIT_BYTES_PER_CTA = 32 * 1024
SPLIT_THREADS = 256
SPLIT_MAX_CLUSTER = 8
# A thread's share of a row lives in registers (255 at most): beyond this many elements it
# spills, and the fully unrolled code takes nvcc minutes to build. Refused before codegen.
MAX_ELEMS_PER_THREAD = 128
# Sums across rows (a weight gradient) add an f32 accumulator per element a thread holds. With
# the rows in registers too, 32 elements a thread of two input rows plus the sums spill at 512
# threads (rmsnorm_bwd at rows of 262143, sm_90a ptxas): from there the sums live in shared memory,
# as do more than that many accumulators of several sums (layernorm_bwd's dw and db at rows of
# 200000: 25 elements a thread, 50 accumulators, spilled) where shared memory has room for them.
SHARED_SUMS_FROM = 32
# With staged rows, the sums' registers bound how many CTAs share an SM. Measured on the H200
# (bf16 rmsnorm_bwd, eager do_bench, python -m bench.rmsnorm_bwd --tile ...; bench/results/
# rmsnorm_bwd-sweep-*.json): staging at most 32 KB per CTA in 256 threads of 32 elements, the
# sums in shared memory, beat the forward's 64 KB in 512 threads by 13% (rows of 16384), 38%
# (65536) and 41% (131072); rows of 262144 need 64 KB per CTA even in a cluster of 16, and there
# the sums did better in registers (1.30 against 1.21 TB/s).
STAGED_BYTES_PER_CTA_WITH_SUMS = 32 * 1024
# A second stage (the next row's copy issued while this row computes) doubles a CTA's shared
# memory, so it pays only where one CTA per SM is all that fits anyway. Measured on the H200
# (eager do_bench, tile{stages=2} against one stage; bench/results/stages_sweep-20261201T1705Z.json):
# rmsnorm_bwd at rows of 262144 (64 KB per CTA and sums in registers: one CTA per SM) gained 25%;
# every other shape lost, the forward kernels 8-60% at rows of 16384 to 262144, where three CTAs
# of one stage shared an SM.
TWO_STAGES_FROM = 64 * 1024
# Small staged rows of a loop with sums across rows take two stages as well, in three CTAs an SM
# (85 registers a thread). Measured on the H200 (bf16 rmsnorm_bwd, eager do_bench, 256 threads,
# sums in registers): at rows of 4096 (16 KB a CTA) one stage gave 3.39 TB/s, two stages 3.52
# (ptxas took 64 registers, four CTAs an SM), two stages in three CTAs an SM 3.75 (72
# registers), in two 3.75, in four 3.54; one stage in three CTAs an SM 3.06. At rows of 16384
# and longer (32 KB a CTA and more) one stage and ptxas's own choice stayed best. Measured with
# one sum; layernorm_bwd's two (dw and db, rows of 4096) spilled in 80 registers, so it is not
# taken for more.
SMALL_TWO_STAGES = 16 * 1024
SMALL_TWO_STAGES_CTAS = 3
STATIC_SMEM_MARGIN = ROW_KERNEL_STATIC_SMEM
# a loop that only sums its rows (a column sum): one vector a thread, a CTA of up to 1024
# threads a row (32768 x 16384 bf16 on the H200: 0.89 of the copy bandwidth at 1024 threads,
# 0.83 at 512 or 256), and a cluster a row where a thread's share would be more than this many sums
SUMMED_VECTORS = 1
SUMMED_MAX_PER_THREAD = 32


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1))))


def choose(n: int, min_itemsize: int, rows: int, threads: int, vec: int, cluster: int, has_cluster: bool,
           row_inputs: int = 1, staged_bytes: int = 0, sums: bool = False, staged_rows: int = 1,
           load_itemsize: int = 0):
    """Fill in the options left at 0 and fit the given ones to the row: `vec` is halved until
    it divides n, `rows` shrinks to fit 1024 threads (and to 1 when a cluster holds a row).
    `row_inputs` rows of input live in registers at once (x and dy in a backward pass): each
    thread then holds a proportionally smaller share of the row, so they fit as one does.
    `staged_bytes` of each row sit in shared memory (stage-rows): the cluster is sized so each
    CTA holds at most STAGED_BYTES_PER_CTA of them (STAGED_BYTES_PER_CTA_WITH_SUMS when the loop
    also sums across rows; SPLIT_BYTES_PER_CTA for `staged_rows` = 1 without sums). A thread's
    share is counted in bytes of the narrowest row it loads (`load_itemsize`, else the narrowest
    tensor): a narrower output (fp8 codes of bf16 rows) sets the vector width of its stores, not
    how much a thread holds (32 bf16 a thread quantised to fp8 ran 11% faster than 64 on the
    H100, 32768 x 4096)."""
    if vec == 0:
        vec = max(1, 16 // min_itemsize)
    while n % vec:
        vec //= 2
    held = load_itemsize or min_itemsize
    row_bytes = n * held
    per_thread = max(vec, (BYTES_PER_THREAD_SMALL if row_bytes <= SMALL_ROW_BYTES else BYTES_PER_THREAD)
                     // held // _pow2_ceil(max(1, row_inputs)))
    if vec == 1 and row_bytes > SMALL_ROW_BYTES:
        # an odd row moves element by element, each with its address and bounds test: half
        # the share fits (argmax by iota, bf16 rows of 65537: 33 elements a thread spilled at
        # 512 threads, 17 did not)
        per_thread = max(1, per_thread // 2)
    split_threads = 0  # a staged row split finely across a cluster: its threads a CTA
    if cluster == 0:
        cluster = 1
        split = _pow2_ceil(math.ceil(staged_bytes / SPLIT_BYTES_PER_CTA))
        if has_cluster and staged_bytes and not sums and staged_rows == 1 and 1 < split <= SPLIT_MAX_CLUSTER:
            cluster, split_threads = split, SPLIT_THREADS
        elif has_cluster and staged_bytes:
            budget = STAGED_BYTES_PER_CTA_WITH_SUMS if sums else STAGED_BYTES_PER_CTA
            cluster = min(MAX_CLUSTER, _pow2_ceil(math.ceil(staged_bytes / budget)))
        elif has_cluster:
            cluster = min(MAX_CLUSTER, _pow2_ceil(math.ceil(n / (AUTO_MAX_THREADS * per_thread))))
            # a row that does not split evenly adds a bounds predicate per chunk: with the share
            # near the budget that is what spills (a vocabulary of 128256), so halve the share
            share = n / (AUTO_MAX_THREADS * cluster)
            if cluster > 1 and n % (AUTO_MAX_THREADS * cluster * vec) and share > per_thread * 3 / 4:
                cluster = min(MAX_CLUSTER, cluster * 2)
    if threads == 0 and staged_bytes:
        per_cta = math.ceil(n / cluster)
        threads = split_threads or min(STAGED_THREADS[1], max(STAGED_THREADS[0],
                                                              _pow2_ceil(math.ceil(per_cta / STAGED_ELEMS_PER_THREAD))))
        threads = min(threads, max(WARP, _pow2_ceil(math.ceil(per_cta / vec))))  # no thread without a chunk
    if threads == 0:
        per_cta = math.ceil(n / cluster)
        # at least a warp per row while the row has a warp's worth of vectors
        threads = max(min(WARP, _pow2_ceil(math.ceil(per_cta / vec))), _pow2_ceil(math.ceil(per_cta / per_thread)))
        # 1024 threads leave 64 registers each: enough for one row's share, not for two
        threads = min(AUTO_MAX_THREADS if cluster < MAX_CLUSTER or row_inputs > 1 else 1024, threads)
    if cluster > 1:  # a cluster holds one row, of at least a warp per CTA
        rows, threads = 1, max(threads, WARP)
    if rows == 0:
        rows = max(1, BLOCK_THREADS // threads)
    rows = max(1, min(rows, 1024 // threads))
    if threads < WARP:  # rows of fewer than 32 threads pack whole warps
        per_warp = WARP // threads
        rows = max(per_warp, rows // per_warp * per_warp)
    return rows, threads, vec, cluster


def summing_threads(n: int, itemsize: int, threads: int, vec: int, cluster: int, has_cluster: bool) -> tuple[int, int]:
    """Threads and cluster for a loop that only adds its rows into sums (a column sum), where
    not given: a row's vectors spread over CTAs of up to 1024 threads, SUMMED_VECTORS a thread,
    a cluster only where one CTA's threads would hold more than SUMMED_MAX_PER_THREAD sums each
    (1024 threads have 64 registers a thread); choose() does the rest."""
    if vec == 0:
        vec = max(1, 16 // itemsize)
    while n % vec:
        vec //= 2
    if cluster == 0:
        cluster = min(MAX_CLUSTER, _pow2_ceil(math.ceil(n / (1024 * SUMMED_MAX_PER_THREAD)))) if has_cluster else 1
    if threads == 0:
        threads = min(1024, max(WARP, _pow2_ceil(math.ceil(n / (cluster * SUMMED_VECTORS * vec)))))
    return threads, cluster


def auto_sums(per_thread: int, sums: int, rows: int, threads: int, staged_bytes: float, smem: int) -> str:
    """Where a CTA of `rows` x `threads` keeps `sums` accumulators of `per_thread` elements each,
    next to the `staged_bytes` of each row it holds in shared memory (see SHARED_SUMS_FROM)."""
    if not sums or per_thread < SHARED_SUMS_FROM and per_thread * sums <= SHARED_SUMS_FROM:
        return "registers"
    fits = rows * (staged_bytes + 4 * sums * threads * per_thread) + STATIC_SMEM_MARGIN <= smem
    if per_thread * sums > SHARED_SUMS_FROM:  # more accumulators than registers hold
        return "shared" if fits else "registers"
    return "shared" if fits and staged_bytes <= STAGED_BYTES_PER_CTA_WITH_SUMS else "registers"


def auto_stages(cta_bytes: int, sums: int, room: int) -> tuple[int, int]:
    """Copies of each staged buffer, and the CTAs that must share an SM (0: as ptxas chooses),
    where two of a CTA's `cta_bytes` fit in the `room` of shared memory it has (a CTA's static
    shared memory aside) beside `sums` sums across rows; see TWO_STAGES_FROM and SMALL_TWO_STAGES."""
    if not sums or 2 * cta_bytes + STATIC_SMEM_MARGIN > room:
        return 1, 0
    if cta_bytes >= TWO_STAGES_FROM:
        return 2, 0
    if cta_bytes <= SMALL_TWO_STAGES and sums == 1:
        return 2, SMALL_TWO_STAGES_CTAS
    return 1, 0


def slice_starts(op) -> list:
    """The start operands of the slices a load or store takes (`x[m, k:k+1024]`: k)."""
    return [operands[0] for ix, operands in index_operands(op) if ix.kind == "slice"]


def per_row_inputs(loop) -> int:
    """How many distinct tensors the loop loads a whole row of, indexed by the row (x, dy; not
    a weight shared by every row)."""
    row = loop.body.args[0]
    seen = set()
    for op in body_ops(loop.body):
        if isinstance(op, LoadOp) and op.result.ttype.rank == 1 and row in op.operands[1:]:
            seen.add(op.operands[0])
    return max(1, len(seen))


@define_pass("tile", "map the row loop onto CTAs, threads, vectors and clusters")
class Tile(Pass):
    rows: int = option(0, lo=0, hi=1024)
    threads: int = option(0, lo=0, hi=1024, pow2=True)
    vec: int = option(0, lo=0, hi=16, pow2=True)
    cluster: int = option(0, lo=0, hi=MAX_CLUSTER, pow2=True)
    persistent: bool = option(False, choices=(False, True))
    sums: str = option("auto", choices=("auto", "registers", "shared"))
    stages: int = option(0, lo=0, hi=2)
    ctas_per_sm: int = option(0, lo=0, hi=32)

    def required_features(self) -> frozenset[str]:
        return frozenset({"cluster", "dsmem", "mbarrier"}) if self.cluster > 1 else frozenset()

    # What keeps a row in one CTA, by kind of op: what it is, why it takes no cluster, and why a
    # CTA then holds one row (None: it may hold several). A for loop's threads run the same
    # iterations, a reduction in its body or a branch synchronising them; a scan's carries cross
    # the CTA's warps through shared memory.
    ONE_CTA = {
        "for": ("a for loop in the row loop", "a chunked row runs in one CTA", "each CTA runs one row's iterations"),
        "if": ("a reduction inside an if", "a branch that synchronises runs in one CTA",
               "each CTA takes one row's branch"),
        "scan": ("a scan in the row loop", "a scanned row runs in one CTA", None),
    }

    def check_one_cta(self, fors: list, synced: list, scans: list) -> bool:
        """Refuse a cluster, or several rows a CTA, for a row that must stay in one CTA; whether
        the row must."""
        for kind, found in (("for", fors), ("if", synced), ("scan", scans)):
            what, no_cluster, no_rows = self.ONE_CTA[kind]
            if found and self.cluster > 1:
                raise PassError(f"tile: cluster={self.cluster} with {what}: {no_cluster}", found[0].loc,
                                "leave cluster at 0 (one CTA a row)")
            if found and no_rows and self.rows > 1:
                raise PassError(f"tile: rows={self.rows} with {what}: {no_rows}", found[0].loc,
                                "leave rows at 0 (one row a CTA)")
        return bool(fors or synced or scans)

    def fit_for_loops(self, func, loop, fors: list, ops: list, n: int, itemsize: int) -> tuple[int, int]:
        """Rows per CTA and the vector width for a row loop that holds `for` loops (a row read
        in chunks of n): one CTA a row (every thread of a CTA runs the same iterations, since a
        reduction in the body synchronises them), and vectors that never straddle the end of
        the tensor a chunk is sliced from nor start off its alignment."""
        # constants from anywhere, index arithmetic from the loop's body
        defs = {op.result: op for op in func.body.ops if isinstance(op, ConstOp) and op.results}
        defs.update({op.result: op for op in ops if len(op.results) == 1})
        index_of = {f.body.args[0]: f for f in fors}

        def multiple(v) -> int:
            return known_multiple(v, defs.get, index_of.get)

        multiples = [n]
        for f in fors:
            multiples.append(multiple(f.body.args[0]))
        for op in ops:
            if isinstance(op, (LoadOp, StoreOp)) and slice_starts(op):
                t = (op.operands[0] if isinstance(op, LoadOp) else op.operands[1]).ttype
                last = t.shape[-1]
                multiples.append(last if isinstance(last, int) else 1)
                multiples.extend(multiple(v) for v in slice_starts(op))
                if any(ix.limit for ix in op.index):
                    multiples.append(1)  # a limit: no alignment known
        vec = self.vec or max(1, 16 // itemsize)
        while vec > 1 and any(m % vec for m in multiples):
            vec //= 2
        return 1, vec

    def run(self, func: FuncOp, ctx) -> FuncOp:
        loop = find_row_loop(func)
        n = row_length(loop, func)
        ops = body_ops(loop.body)
        tensors = [op.operands[0] if isinstance(op, LoadOp) else op.operands[1]
                   for op in ops if isinstance(op, (LoadOp, StoreOp))]
        itemsizes = [t.ttype.dtype.itemsize for t in tensors if t.ttype.rank >= 1] or [4]
        def row_of(op):  # the tensor a row load or store moves, else None
            tile = op.result if isinstance(op, LoadOp) else op.operands[0] if isinstance(op, StoreOp) else None
            return None if tile is None or tile.ttype.rank == 0 else op.operands[0 if isinstance(op, LoadOp) else 1]

        wide = next((op for op in ops if row_of(op) is not None and row_of(op).ttype.dtype.itemsize > 4), None)
        if wide is not None:  # the row accesses move 4-byte words (kfc.codegen.memory_rules); the passes' sums are f32
            t = row_of(wide).ttype
            raise PassError(f"rows of {t.dtype} are not supported yet: a row kernel moves and sums elements of at "
                            "most 4 bytes", wide.loc, "convert the tensor to f32 (or i32) before calling the op")
        buffers = [op for op in loop.body.ops if isinstance(op, SmemAllocOp)]
        staged = sum(op.result.ttype.numel() * op.result.ttype.dtype.itemsize for op in buffers)
        fors = [op for op in ops if isinstance(op, ForOp)]
        scans = [op for op in ops if isinstance(op, ScanOp)]
        # a branch that synchronises the row's threads (a reduction, a scan) must be taken by
        # all of a CTA's threads or none: one row a CTA, in whole warps
        synced = [op for op in ops if isinstance(op, IfOp) and
                  any(isinstance(o, (ReduceOp, ScanOp, ForOp)) for r in op.regions for o in body_ops(r))]
        one_cta = self.check_one_cta(fors, synced, scans)
        want_rows, want_vec = self.rows, self.vec
        if fors:
            want_rows, want_vec = self.fit_for_loops(func, loop, fors, ops, n, min(itemsizes))
        one_row = bool(fors or synced)
        if synced:
            want_rows = 1
        want_threads, want_cluster = self.threads, self.cluster
        summing = only_summed(loop) and not staged and not fors
        if summing:
            want_threads, want_cluster = summing_threads(n, min(itemsizes), self.threads, want_vec, self.cluster,
                                                         ctx.target.has("cluster") and not one_cta)
        rows, threads, vec, cluster = choose(n, min(itemsizes), want_rows, want_threads, want_vec, want_cluster,
                                             ctx.target.has("cluster") and not one_cta,
                                             per_row_inputs(loop), staged, bool(loop.results), len(buffers),
                                             narrowest_load(loop.body))
        if one_row and rows > 1:  # a short row: one a CTA all the same, in a warp at least
            rows, threads = 1, max(threads, WARP)
        for name, value in (("threads", threads), ("vec", vec), ("cluster", cluster), ("rows", rows)):
            if value < 1 or value & (value - 1) and name != "rows":
                raise PassError(f"tile: {name}={value} must be a positive power of two", loop.loc)
        if cluster > 1 and not ctx.target.has("cluster"):
            raise PassError(f"tile: cluster={cluster} needs thread-block clusters, which {ctx.target} lacks", loop.loc)
        per_thread = vec * math.ceil(n / (vec * threads * cluster))
        if per_thread > MAX_ELEMS_PER_THREAD:
            longest = 1024 * (1 if one_cta else MAX_CLUSTER) * MAX_ELEMS_PER_THREAD
            if n > longest:
                hint = f"a row kernel holds rows of up to {longest} elements in registers" + (
                    " (a row with a scan, a for loop or a reducing branch stays in one CTA; read it in chunks "
                    "with a for loop, or run chunk-rows and flatten-branches, as the default pipeline does)"
                    if one_cta else "")
            else:
                hint = (f"use more threads: threads >= {math.ceil(n / MAX_ELEMS_PER_THREAD)}" if one_cta else
                        f"use more threads or a cluster: threads x cluster >= {math.ceil(n / MAX_ELEMS_PER_THREAD)}")
            raise PassError(f"tile: {threads} thread(s) x {cluster} CTA(s) per row of {n} leaves {per_thread} elements "
                            f"per thread; at most {MAX_ELEMS_PER_THREAD} fit in registers", loop.loc, hint=hint)
        layout = row_layout(threads, vec, cluster)
        vmap = ValueMap()

        def retype(v: Value) -> Value:
            t = v.type
            if isinstance(t, TensorType) and t.space is MemSpace.REG and t.rank == 1:
                nv = Value(attrs.evolve(t, layout=layout), v.name)
                vmap.map(v, nv)
                return nv
            return v

        row = Value(loop.body.args[0].type, loop.body.args[0].name)
        vmap.map(loop.body.args[0], row)
        sums_in = self.sums if self.sums != "auto" else "registers" if summing and per_thread <= SUMMED_MAX_PER_THREAD \
            else auto_sums(per_thread, len(loop.results), rows, threads, staged / cluster, ctx.target.smem_per_block)
        sums_bytes = 4 * len(loop.results) * rows * threads * per_thread if sums_in == "shared" else 0
        stages, ctas_per_sm = 1, 0
        if staged and self.stages:
            stages = self.stages
        elif staged and not copies_not_indexed_by_row(loop.body):
            stages, ctas_per_sm = auto_stages(rows * staged // cluster, len(loop.results),
                                              ctx.target.smem_per_block - sums_bytes)
        ctas_per_sm = self.ctas_per_sm or ctas_per_sm
        def retype_block(block: Block) -> Block:
            args = tuple(retype(a) for a in block.args)
            out = []
            for op in block.ops:
                new = attrs.evolve(op, operands=tuple(vmap[v] for v in op.operands),
                                   regions=tuple(retype_block(r) for r in op.regions),
                                   results=tuple(retype(r) for r in op.results))
                if isinstance(new, MbarrierAllocOp):
                    new = attrs.evolve(new, stages=stages)
                out.append(new)
            return Block(args, tuple(out))

        body = retype_block(Block((), loop.body.ops)).ops
        # sums across rows are kept per row slot of a CTA: a persistent grid keeps their number
        # to about a wave of CTAs, whatever the row count; and the row a copy runs ahead to is
        # the CTA's next row, so a grid of two stages strides too
        persistent = self.persistent or bool(loop.results) or stages > 1
        try:
            launch = LaunchOp(operands=loop.operands, results=loop.results, regions=(Block((row,), tuple(body)),),
                              loc=loop.loc, rows_per_cta=rows, threads=threads, vec=vec, cluster=cluster,
                              persistent=persistent, reduce=loop.reduce, sums_in=sums_in,
                              min_ctas_per_sm=ctas_per_sm)
            launch.verify_()
        except Exception as e:
            raise PassError(f"tile: {getattr(e, 'message', e)}", loop.loc) from None
        ops = tuple(launch if op is loop else op for op in func.body.ops)
        ctx.note(self, f"row {n}: {rows} row(s)/CTA x {threads} threads, vec {vec}, cluster {cluster}"
                       f"{', persistent' if persistent else ''}{f', {stages} stages' if stages > 1 else ''}"
                       f"{f', sums across rows in {sums_in}' if loop.results else ''}")
        return attrs.evolve(func, regions=(Block(func.body.args, ops),))
