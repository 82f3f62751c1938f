"""Emission rules for tile programs on tensor cores (kfc.ir.mma_ops), written through the grid
emitter (kfc.codegen.grid_emitter): the grid's program ids, tensor maps, staged tiles, mbarrier
arrays, TMA loads and their waits, wgmma and its waits, and the store of a fragment tile.

One elected thread (kfc_tid 0) announces a stage's bytes and issues its TMA loads; every thread
waits on the stage's barrier. A wgmma is issued by every warpgroup on its own 64 rows of A."""

from __future__ import annotations

from ..ir import layouts
from ..ir.core import walk_block
from ..ir.dtypes import DType
from ..ir.mma_ops import ClusterRankOp
from ..ir.mma_ops import CHUNK_BYTES, CopyStageOp, CtaBarrierOp, CtasOp, ExpectTxAtOp, FenceProxyAsyncOp, GridOp
from ..ir.mma_ops import TileCoordsOp
from ..ir.mma_ops import MbarrierArrayOp, MbarrierArriveOp, MbarrierWaitParityOp, RolesOp
from ..ir.mma_ops.roles import REGISTER_FILE
from ..ir.mma_ops import LoadColumnsOp, SingleThreadOp, StagesAllocOp, StoreTileOp, TensorMapOp, TmaLoadOp
from ..ir.mma_ops import WgmmaOp, WgmmaWaitOp
from . import float16, ptx
from .c_names import C_TYPES, c_dim, c_tensor_map
from .errors import CodegenError
from .rules import rule

MBARRIER_BYTES = 8
# a 128-byte swizzle repeats every 8 rows of 128 bytes: the stride between groups of 8 rows
SWIZZLE_PERIOD = 8 * CHUNK_BYTES


@rule(GridOp)
def emit_grid(em, op: GridOp) -> None:
    """Program ids from blockIdx.x: programs numbered in groups of `group` rows of the first grid
    dim, column by column within a group, so CTAs running together share A's and B's tiles in L2."""
    em.emit("const int kfc_tid = threadIdx.x;")
    em.emit("const int kfc_wg = kfc_tid / 128;  // this thread's warpgroup")
    if op.persistent:
        em.emit(f"const long long {em.name(op.body.args[0])} = blockIdx.x;  // this CTA of one wave")
    elif op.grid and len(op.grid) == 2:
        _raster(em, "blockIdx.x", *op.grid, op.group, *(em.name(a) for a in op.body.args))
    else:
        rest = "blockIdx.x"
        for arg, g in zip(reversed(op.body.args), reversed(op.grid)):
            em.emit(f"const long long {em.name(arg)} = ({rest}) % {g};")
            rest = f"({rest}) / {g}"
    em.emit("extern __shared__ __align__(1024) unsigned char kfc_smem[];")
    em.emit(f"const unsigned kfc_smem_base = ({ptx.smem_addr('kfc_smem[0]')} + 1023u) & ~1023u;")
    for inner in op.body.ops:
        if op.cluster > 1 and isinstance(inner, RolesOp):
            _cluster_sync(em, "every CTA's mbarriers are initialised before a peer's copy or arrival reaches them")
            em.emit_op(inner)
            _cluster_sync(em, "no CTA exits while a peer may still arrive on its mbarriers")
        else:
            em.emit_op(inner)


def _cluster_sync(em, why: str) -> None:
    em.emit(f"{ptx.cluster_arrive()}  // {why}")
    em.emit(ptx.cluster_wait())


def _raster(em, t: str, gm: int, gn: int, group: int, pm: str, pn: str) -> None:
    """(pm, pn) of program t (kfc.ir.mma_ops.raster): rows of programs in groups of `group`,
    column by column within a group."""
    per_group = group * gn
    em.emit(f"const long long {pm}_first = ({t}) / {per_group} * {group};")
    em.emit(f"const long long {pm}_rows = min({gm} - {pm}_first, (long long){group});")
    em.emit(f"const long long {pm} = {pm}_first + ({t}) % {per_group} % {pm}_rows;")
    em.emit(f"const long long {pn} = ({t}) % {per_group} / {pm}_rows;")


@rule(CtasOp)
def emit_ctas(em, op: CtasOp) -> None:
    em.emit(f"const long long {em.name(op.result)} = gridDim.x;")


@rule(TileCoordsOp)
def emit_tile_coords(em, op: TileCoordsOp) -> None:
    _raster(em, em.name(op.operands[0]), *op.grid, op.group, *(em.name(r) for r in op.results))


@rule(TensorMapOp)
def emit_tensor_map(em, op: TensorMapOp) -> None:
    em.names[op.result] = c_tensor_map(op.operands[0].name)


@rule(StagesAllocOp)
def emit_stages(em, op: StagesAllocOp) -> None:
    offset = em.alloc_dynamic(op.nbytes)
    em.emit(f"const unsigned {em.name(op.result)} = kfc_smem_base + {offset}u;  // {op.result.type}")


@rule(MbarrierArrayOp)
def emit_mbarrier_array(em, op: MbarrierArrayOp) -> None:
    n = op.result.ttype.shape[0]
    var = em.fresh("kfc_bars")
    em.smem_decls.append(f"__shared__ __align__(8) unsigned long long {var}[{n}];")
    em.smem_static += n * MBARRIER_BYTES
    name = em.name(op.result)
    em.emit(f"const unsigned {name} = {ptx.smem_addr(f'{var}[0]')};")
    em.emit("if (kfc_tid == 0) {")
    em.emit(f"  for (int s = 0; s < {n}; ++s) {ptx.mbarrier_init(f'{name} + {MBARRIER_BYTES} * s', op.arrivals)}")
    em.emit(f"  {ptx.fence_mbarrier_init()}")
    em.emit("  kfc_fence_proxy_async();")
    em.emit("}")
    em.emit("__syncthreads();")


def barrier_at(em, bars, stage) -> str:
    """The shared address of bars[stage] (the tcgen05 and TMA-store rules use it too)."""
    return f"({em.name(bars)} + {MBARRIER_BYTES}u * (unsigned)({em.name(stage)}))"


def stage_bytes(t) -> int:
    """The bytes of one stage (or staging slot) of a staged tile dtype[stages, chunks, rows, cols]."""
    return t.shape[1] * t.shape[2] * t.shape[3] * t.dtype.itemsize


@rule(SingleThreadOp)
def emit_single_thread(em, op: SingleThreadOp) -> None:
    """One branch around everything the thread issues: a branch per op between a wgmma and its
    wait makes ptxas serialise the wgmmas (its C7514 warning)."""
    em.emit("if (kfc_tid == 0) {")
    em.indent += 1
    em.single_thread += 1
    for inner in op.body.ops:
        em.emit_op(inner)
    em.single_thread -= 1
    em.indent -= 1
    em.emit("}")


@rule(RolesOp)
def emit_roles(em, op: RolesOp) -> None:
    """A branch per role on the thread's warpgroup; inside it kfc_tid and kfc_wg count from the
    role's first warpgroup (every rule reads them), and setmaxnreg sets the role's register
    budget: down for a role given fewer registers than the kernel was built with, up for more."""
    built = REGISTER_FILE // em.launch.threads // 8 * 8  # what __launch_bounds__(threads, 1) leaves a thread
    for k, (region, count) in enumerate(zip(op.regions, op.warpgroups)):
        first = op.first_warpgroup(k)
        head = "if" if k == 0 else "} else if"
        em.emit(f"{head} (kfc_wg >= {first} && kfc_wg < {first + count}) {{  // role {k}: {count} warpgroup(s)")
        em.indent += 1
        em.emit(f"const int kfc_tid = (int)threadIdx.x - {128 * first};")
        em.emit("const int kfc_wg = kfc_tid / 128;")
        if op.registers:
            em.emit(ptx.setmaxnreg(op.registers[k], increase=op.registers[k] > built))
        em.role = region
        for inner in region.ops:
            em.emit_op(inner)
        em.role = None
        em.indent -= 1
    em.emit("}")


@rule(MbarrierArriveOp)
def emit_mbarrier_arrive(em, op: MbarrierArriveOp) -> None:
    """Lane 0 of every warp arrives, once the warp's lanes are all here (each lane's own wait on
    its wgmma groups has returned)."""
    em.emit("__syncwarp();")
    if op.cluster:  # on the barrier at the same offset in every CTA of the cluster, this one's included
        em.emit(f"if ((kfc_tid & 31) == 0) for (unsigned r = 0; r < {em.launch.cluster}u; ++r) "
                f"kfc_mbarrier_arrive_cluster({barrier_at(em, *op.operands)}, r);")
        return
    em.emit(f"if ((kfc_tid & 31) == 0) {ptx.mbarrier_arrive(barrier_at(em, *op.operands))}")


def check_issuer(em, op) -> None:
    if not em.single_thread:
        raise CodegenError(f"{op.NAME} is issued by one thread: it belongs in a gpu.single_thread region", op.loc)


@rule(ExpectTxAtOp)
def emit_expect_tx_at(em, op: ExpectTxAtOp) -> None:
    check_issuer(em, op)
    em.emit(ptx.mbarrier_arrive_expect_tx(barrier_at(em, *op.operands), op.bytes))


@rule(TmaLoadOp)
def emit_tma_load(em, op: TmaLoadOp) -> None:
    tmap, tile, bars, stage, row, col = op.operands
    t = tile.ttype
    chunk_bytes = t.shape[2] * t.shape[3] * t.dtype.itemsize
    dst = (f"{em.name(tile)} + (unsigned)({em.name(stage)}) * {stage_bytes(t)}u + {op.chunk * chunk_bytes}u")
    check_issuer(em, op)
    if op.multicast:  # into the same offset of every CTA of the cluster, each CTA's barrier counting the bytes
        ctas = (1 << em.launch.cluster) - 1
        em.emit(f"kfc_tma_load_2d_multicast({dst}, &{em.name(tmap)}, (int)({em.name(col)}), "
                f"(int)({em.name(row)}), {barrier_at(em, bars, stage)}, (unsigned short){ctas});")
        return
    em.emit(f"kfc_tma_load_2d({dst}, &{em.name(tmap)}, (int)({em.name(col)}), "
            f"(int)({em.name(row)}), {barrier_at(em, bars, stage)});")


@rule(ClusterRankOp)
def emit_cluster_rank(em, op: ClusterRankOp) -> None:
    em.emit(f"const long long {em.name(op.result)} = {ptx.cluster_ctarank()};")


@rule(CopyStageOp)
def emit_copy_stage(em, op: CopyStageOp) -> None:
    """Element (r, c) of the tile (its columns across every chunk) from the tensor, zero past its
    bounds, stored where the 128-byte swizzle puts it: 16-byte unit u of row r of a chunk lands
    at unit u ^ (r % 8). Consecutive threads read consecutive elements of the tensor: along c,
    or along r where the tensor holds the operand transposed."""
    src, tile, stage, row, col = op.operands
    t = tile.ttype
    if t.dtype.itemsize != 2:
        raise CodegenError(f"{op.NAME} copies 16-bit elements (the operands wgmma takes), not {t.dtype}", op.loc)
    chunks, rows, per_chunk = t.shape[1:]
    width = chunks * per_chunk
    dims = [c_dim(d.name) if not isinstance(d, int) else str(d) for d in src.ttype.shape]
    n_rows, n_cols = reversed(dims) if op.transpose else dims
    at = f"gc * {dims[1]} + gr" if op.transpose else f"gr * {dims[1]} + gc"
    em.emit("{")
    em.emit(f"  const unsigned kfc_dst = {em.name(tile)} + (unsigned)({em.name(stage)}) * {stage_bytes(t)}u;")
    em.emit(f"  const unsigned short* kfc_src = reinterpret_cast<const unsigned short*>({em.name(src)});")
    em.emit(f"  for (int e = kfc_tid; e < {rows * width}; e += {em.launch.threads}) {{")
    em.emit(f"    const int r = e % {rows}, c = e / {rows};" if op.transpose else
            f"    const int r = e / {width}, c = e % {width};")
    em.emit(f"    const long long gr = {em.name(row)} + r, gc = {em.name(col)} + c;")
    em.emit(f"    const unsigned short v = gr < {n_rows} && gc < {n_cols} ? kfc_src[{at}] : 0;")
    em.emit(f"    const unsigned b = (unsigned)(c % {per_chunk}) * 2u;")
    em.emit(f"    const unsigned a = kfc_dst + (unsigned)(c / {per_chunk}) * {rows * CHUNK_BYTES}u + "
            f"(unsigned)r * {CHUNK_BYTES}u + ((((b >> 4) ^ ((unsigned)r & 7u)) << 4) | (b & 15u));")
    em.emit('    asm volatile("st.shared.b16 [%0], %1;" :: "r"(a), "h"(v) : "memory");')
    em.emit("  }")
    em.emit("}")


@rule(FenceProxyAsyncOp)
def emit_fence_proxy_async(em, op: FenceProxyAsyncOp) -> None:
    em.emit(ptx.fence_proxy_async_shared())


@rule(MbarrierWaitParityOp)
def emit_wait_parity(em, op: MbarrierWaitParityOp) -> None:
    bars, stage, parity = op.operands
    em.emit(ptx.mbarrier_wait_parity(barrier_at(em, bars, stage), f"(unsigned)({em.name(parity)})"))


@rule(WgmmaOp)
def emit_wgmma(em, op: WgmmaOp) -> None:
    """Per 16 columns of K, one wgmma.m64nNk16 per 64-row piece of each warpgroup's rows: A's
    descriptor at the piece's rows of the chunk holding those columns (K-major), B's at those
    rows of K of every N chunk (N-major, chunks `leading` bytes apart). The accumulator is
    updated in place when nothing else reads the value it held."""
    acc, a, b, stage = op.operands
    ta, tb = a.ttype, b.ttype
    bm, bn = op.result.ttype.shape
    pieces = layouts.of(op.result.ttype.layout).pieces
    bk = ta.shape[1] * ta.shape[3]
    per_chunk = ta.shape[3]
    a_chunk = ta.shape[2] * CHUNK_BYTES
    b_chunk = tb.shape[2] * CHUNK_BYTES
    dtype = "bf16" if ta.dtype is DType.BF16 else "f16"
    fns = []
    for piece in range(pieces):
        fn, text = ptx.wgmma_function(bn, dtype, trans_b=True, pieces=pieces, piece=piece)
        em.device_functions[fn] = text
        fns.append(fn)
    if em.used_after(acc, op) or acc in em.inline:  # an inlined start (a constant) has no registers to update
        n = em.declare(op.result)
        em.loop(f"{n}[i] = {em.elem(acc, 'i')};")
    else:
        n = em.names[op.result] = em.name(acc)
    s = em.name(stage)
    em.emit("{")
    em.emit(f"  const unsigned kfc_a = {em.name(a)} + (unsigned)({s}) * {stage_bytes(ta)}u + "
            f"kfc_wg * {pieces * layouts.WGMMA_M * CHUNK_BYTES}u;")
    em.emit(f"  const unsigned kfc_b = {em.name(b)} + (unsigned)({s}) * {stage_bytes(tb)}u;")
    em.emit("  kfc_wgmma_fence();")
    em.emit("  #pragma unroll")
    em.emit(f"  for (int kk = 0; kk < {bk // 16}; ++kk) {{")
    a_addr = (f"kfc_a + (kk * 16 / {per_chunk}) * {a_chunk}u + (kk * 16 % {per_chunk}) * {ta.dtype.itemsize}u")
    b_addr = f"kfc_b + kk * {16 * CHUNK_BYTES}u"
    for piece, fn in enumerate(fns):
        at = f" + {piece * layouts.WGMMA_M * CHUNK_BYTES}u" if piece else ""
        em.emit(f"    {fn}({n}, kfc_wgmma_desc({a_addr}{at}, 16u, {SWIZZLE_PERIOD}u), "
                f"kfc_wgmma_desc({b_addr}, {b_chunk}u, {SWIZZLE_PERIOD}u), 1);")
    em.emit("  }")
    em.emit("  kfc_wgmma_commit();")
    em.emit("}")


@rule(WgmmaWaitOp)
def emit_wgmma_wait(em, op: WgmmaWaitOp) -> None:
    em.emit(ptx.wgmma_wait(op.pending))
    # the accumulators the retired wgmmas wrote (those of this role: another role's are not in
    # scope): no read of them may move above the wait
    ops = walk_block(em.role) if em.role is not None else em.launch.walk()
    for acc in sorted({em.name(w.result) for w in ops if isinstance(w, WgmmaOp)}):
        em.emit(ptx.fence_registers(acc, em.EV))


@rule(CtaBarrierOp)
def emit_cta_barrier(em, op: CtaBarrierOp) -> None:
    em.emit(ptx.bar_sync(0))


@rule(LoadColumnsOp)
def emit_load_columns(em, op: LoadColumnsOp) -> None:
    """Each register the vector's element at its column (the layout's), zero past the end, read
    where it is used: an array of it beside the accumulator's spills at 256 columns."""
    vec, col0 = op.operands
    frag = layouts.of(op.result.ttype.layout)
    n = vec.ttype.shape[0]
    extent = str(n) if isinstance(n, int) else c_dim(n.name)
    zero = em.from_float("0.0f", vec.ttype.dtype)
    p, c0 = em.name(vec), em.name(col0)
    given = f"{p} != nullptr && " if vec.ttype.optional else ""  # an optional vector left out reads as zeros

    def element(i: str) -> str:
        c = f"({c0} + {frag.col_c(i, 'kfc_tid')})"
        d = vec.ttype.dtype
        if d in float16.TYPE:  # __ldg has no overload for kfc's 16-bit float types: read their bits
            read = f"{float16.FROM_BITS[d]}(__ldg(reinterpret_cast<const unsigned short*>(&{p}[{c}])))"
        else:
            read = f"__ldg(&{p}[{c}])"
        return f"({given}{c} < {extent} ? {read} : {zero})"

    em.inline[op.result] = element


@rule(StoreTileOp)
def emit_store_tile(em, op: StoreTileOp) -> None:
    """Each thread stores its registers where the layout places them, masked by the tensor's
    bounds; adjacent column pairs as one store where the row's length keeps them aligned."""
    value, tensor, row0, col0 = op.operands
    frag = layouts.of(value.ttype.layout)
    rows, cols = (c_dim(d.name) if not isinstance(d, int) else str(d) for d in tensor.ttype.shape)
    n_cols = tensor.ttype.shape[1]
    dt = tensor.ttype.dtype
    ct = C_TYPES[dt]
    p = em.name(tensor)
    r0, c0 = em.name(row0), em.name(col0)
    paired = isinstance(n_cols, int) and n_cols % 2 == 0 and dt in (DType.BF16, DType.F16, DType.F32)
    pair_t = {**float16.PAIR, DType.F32: "float2"}.get(dt)
    em.emit("#pragma unroll")
    em.emit(f"for (int i = 0; i < {em.EV}; i += 2) {{")
    em.emit(f"  const long long r = {r0} + {frag.row_c('i', 'kfc_tid')};")
    em.emit(f"  const long long c = {c0} + {frag.col_c('i', 'kfc_tid')};")
    with em.register_locals() as lets:
        v0, v1 = em.elem(value, "i"), em.elem(value, "i + 1")
    for line in lets:
        em.emit("  " + line)
    if paired:
        em.emit(f"  if (r < {rows} && c < {cols}) {{ {pair_t} w; w.x = {v0}; w.y = {v1}; "
                f"*reinterpret_cast<{pair_t}*>(&{p}[r * {cols} + c]) = w; }}")
    else:
        em.emit(f"  if (r < {rows} && c < {cols}) {p}[r * {cols} + c] = ({ct})({v0});")
        em.emit(f"  if (r < {rows} && c + 1 < {cols}) {p}[r * {cols} + c + 1] = ({ct})({v1});")
    em.emit("}")
