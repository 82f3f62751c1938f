"""Every PTX instruction kfc emits, in one place, as inline-asm templates.

Each function returns a C++ statement (or expression) string; operands are C++ expressions.
Golden tests pin the exact text. Facts (operand order, qualifiers) are from the PTX ISA:
- `cvt.rn.bf16x2.f32 d, a, b` puts a in the upper half of d and b in the lower; so does
  `cvt.rn.satfinite.e4m3x2.f32` (upper and lower byte; .satfinite is required from f32: a
  finite or infinite value beyond the format's largest becomes the largest, so e5m2's overflow
  to infinity, as torch rounds it, and NaN's sign are set apart); `cvt.rn.f16x2.e4m3x2 d, a`
  widens a's lower byte into d's lower half;
- `shfl.sync.bfly.b32 d, a, lane_mask, clamp, membermask`: with clamp 0x1f the xor stays within
  the warp; a butterfly over the low bits stays within aligned lane groups;
- `shfl.sync.up/down/idx.b32 d, a, b, c, membermask`: c packs a segment mask (bits 12:8, 32 -
  width for segments of `width` lanes) and a clamp (bits 4:0); .up reads lane - b and keeps the
  lane's own value below its segment's first lane, .down reads lane + b up to the clamp (the
  segment's last lane), .idx reads lane b of the segment;
- `st.async` to a peer CTA's shared memory completes `bytes` of transaction count on the peer's
  mbarrier; `mapa` turns a local shared address into the same variable's address in CTA `rank`;
- `barrier.cluster.arrive.release` / `wait.acquire` order shared-memory traffic across the cluster;
  `fence.mbarrier_init.release.cluster` then a `.relaxed` arrive publishes mbarrier inits.
"""

from __future__ import annotations

import re

# cache hint -> the ld / st qualifier string
LD_HINTS = {"": "", "cs": ".cs", "lu": ".lu", "nc_na": ".nc.L1::no_allocate", "evict_last": ".L1::evict_last"}
ST_HINTS = {"": "", "cs": ".cs", "lu": "", "nc_na": "", "evict_last": ".L1::evict_last"}

_WORD_TYPES = {4: "b32", 2: "b16", 1: "b8"}


def _regs(n: int, first: int = 0) -> str:
    return ", ".join(f"%{i}" for i in range(first, first + n))


def _vector_load(space: str, words: list[str], addr: str, addr_constraint: str, pred: str | None,
                 word_bytes: int) -> str:
    """ld.{space} of len(words) words into the given lvalues (which keep their prior value where
    `pred` is false). One instruction: .v2/.v4 when > 1."""
    n = len(words)
    vec = f".v{n}" if n > 1 else ""
    typ = _WORD_TYPES[word_bytes]
    dst = "{" + _regs(n) + "}" if n > 1 else "%0"
    con = "r" if word_bytes == 4 else "h"  # a byte travels in a 16-bit register
    outs = ", ".join(f'"+{con}"({w})' for w in words)
    if pred is None:
        return f'asm volatile("ld.{space}{vec}.{typ} {dst}, [%{n}];" : {outs} : "{addr_constraint}"({addr}));'
    return (f'asm volatile("{{\\n .reg .pred p;\\n setp.ne.b32 p, %{n + 1}, 0;\\n'
            f' @p ld.{space}{vec}.{typ} {dst}, [%{n}];\\n}}" : {outs} : "{addr_constraint}"({addr}), '
            f'"r"((int)({pred})));')


def ld_global(words: list[str], addr: str, pred: str | None, hint: str = "", word_bytes: int = 4) -> str:
    """Load len(words) words of `word_bytes` each from global `addr` (a pointer)."""
    return _vector_load(f"global{LD_HINTS[hint]}", words, addr, "l", pred, word_bytes)


def st_global(words: list[str], addr: str, pred: str | None, hint: str = "", word_bytes: int = 4) -> str:
    n = len(words)
    vec = f".v{n}" if n > 1 else ""
    typ = _WORD_TYPES[word_bytes]
    src = "{" + _regs(n, 1) + "}" if n > 1 else "%1"
    con = "r" if word_bytes == 4 else "h"
    ins = ", ".join(f'"{con}"({w})' for w in words)
    if pred is None:
        return f'asm volatile("st.global{ST_HINTS[hint]}{vec}.{typ} [%0], {src};" :: "l"({addr}), {ins} : "memory");'
    return (f'asm volatile("{{\\n .reg .pred p;\\n setp.ne.b32 p, %{n + 1}, 0;\\n'
            f' @p st.global{ST_HINTS[hint]}{vec}.{typ} [%0], {src};\\n}}" :: "l"({addr}), {ins}, "r"((int)({pred})) : "memory");')


def ld_shared(words: list[str], addr_u32: str, pred: str | None, word_bytes: int = 4) -> str:
    """Load len(words) words from shared `addr_u32` (a 32-bit shared-window address)."""
    return _vector_load("shared", words, addr_u32, "r", pred, word_bytes)


def cp_async_bulk_to_shared(dst_u32: str, src: str, nbytes: str, mbar_u32: str) -> str:
    """Copy `nbytes` (a multiple of 16; both addresses 16-byte aligned) from global `src` into
    this CTA's shared memory in the background; the bytes complete on the mbarrier."""
    return (f'asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" '
            f':: "r"({dst_u32}), "l"({src}), "r"({nbytes}), "r"({mbar_u32}) : "memory");')


def cp_async_to_shared(dst_u32: str, src: str, nbytes: int) -> str:
    """Copy `nbytes` (4, 8 or 16, both addresses aligned to it) from global `src` into this
    CTA's shared memory in the background, this thread's copy (cp.async); 16-byte copies skip
    L1 (.cg), smaller ones cannot (.ca)."""
    cache = "cg" if nbytes == 16 else "ca"
    return (f'asm volatile("cp.async.{cache}.shared.global [%0], [%1], {nbytes};" '
            f':: "r"({dst_u32}), "l"({src}) : "memory");')


def cp_async_mbarrier_arrive(mbar_u32: str) -> str:
    """Arrive on the mbarrier once this thread's earlier cp.async copies have landed; the
    arrival is one of those its init counted (.noinc)."""
    return f'asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"({mbar_u32}) : "memory");'


def fence_proxy_async_shared() -> str:
    """Order this thread's earlier shared-memory accesses (and those a barrier made visible to
    it) before later accesses of the async proxy (bulk copies)."""
    return 'asm volatile("fence.proxy.async.shared::cta;" ::: "memory");'


def shfl_bfly(value: str, lane_mask: int) -> str:
    """An expression: `value` from the lane whose index differs in the bits of lane_mask."""
    return f"kfc_shfl_bfly({value}, {lane_mask})"


def _segment_c(width: int, idx: bool) -> int:
    """shfl.sync's c operand for segments of `width` lanes: the segment mask in bits 12:8 and,
    for .idx and .down, the clamp 0x1f (the segment's last lane; for .up the clamp is 0: a
    source below the segment's first lane is out of range and the lane keeps its own value)."""
    return ((32 - width) << 8) | (0x1F if idx else 0)


def shfl_up(value: str, delta: int, width: int, ctype: str) -> str:
    """An expression: `value` from the lane `delta` below this one in its segment of `width`
    lanes (this lane's own where that lies below the segment; shfl.sync.up.b32)."""
    return f"kfc_shfl_up_{_SHFL_SUFFIX[ctype]}({value}, {delta}, {_segment_c(width, False)})"


def shfl_down(value: str, delta: int, width: int, ctype: str) -> str:
    """An expression: `value` from the lane `delta` above this one in its segment of `width`
    lanes (this lane's own where that lies past the segment; shfl.sync.down.b32)."""
    return f"kfc_shfl_down_{_SHFL_SUFFIX[ctype]}({value}, {delta}, {_segment_c(width, True)})"


def shfl_idx(value: str, lane: int, width: int, ctype: str) -> str:
    """An expression: `value` from lane `lane` of this lane's segment of `width` lanes."""
    return f"kfc_shfl_idx_{_SHFL_SUFFIX[ctype]}({value}, {lane}, {_segment_c(width, True)})"


_SHFL_SUFFIX = {"float": "f32", "int": "s32"}


def bar_sync(barrier: int = 0) -> str:
    return f'asm volatile("bar.sync {barrier};" ::: "memory");'


def bar_sync_threads(barrier: str, threads: int) -> str:
    """Named barrier `barrier` (an expression: 1.. for a warpgroup of its own) for `threads` threads."""
    return f'asm volatile("bar.sync %0, {threads};" :: "r"({barrier}) : "memory");'


def bulk_wait_read(pending: int) -> str:
    """Until at most `pending` of this thread's bulk groups still read shared memory."""
    return f'asm volatile("cp.async.bulk.wait_group.read {pending};" ::: "memory");'


def st_shared_f32(addr_u32: str, value: str) -> str:
    return f'asm volatile("st.shared.f32 [%0], %1;" :: "r"({addr_u32}), "f"({value}) : "memory");'


def ld_shared_f32(addr_u32: str) -> str:
    return f"kfc_ld_shared_f32({addr_u32})"


def smem_addr(lvalue: str) -> str:
    return f"(unsigned)__cvta_generic_to_shared(&{lvalue})"


def rsqrt_approx(x: str) -> str:
    return f"kfc_rsqrt_approx({x})"


def ex2_approx(x: str) -> str:
    return f"kfc_ex2_approx({x})"


def rcp_approx(x: str) -> str:
    return f"kfc_rcp_approx({x})"


def tanh_approx(x: str) -> str:
    return f"kfc_tanh_approx({x})"


def max_nan(a: str, b: str) -> str:
    """max that propagates NaN, as numpy's maximum does."""
    return f"kfc_max_nan({a}, {b})"


def min_nan(a: str, b: str) -> str:
    return f"kfc_min_nan({a}, {b})"


def cvt_pack(hi: str, lo: str, dtype: str) -> str:
    """Round two floats into one 32-bit register of two 16-bit values (lo in the low half)."""
    return f"kfc_cvt_pack_{dtype}({hi}, {lo})"


def cluster_ctarank() -> str:
    return "kfc_cluster_ctarank()"


def mapa(addr_u32: str, rank: str) -> str:
    return f"kfc_mapa({addr_u32}, {rank})"


def st_async_f32(remote_addr: str, value: str, remote_mbar: str) -> str:
    return (f'asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" '
            f':: "r"({remote_addr}), "r"(__float_as_uint({value})), "r"({remote_mbar}) : "memory");')


def mbarrier_init(mbar_u32: str, count: int) -> str:
    return f'asm volatile("mbarrier.init.shared::cta.b64 [%0], {count};" :: "r"({mbar_u32}) : "memory");'


def fence_mbarrier_init() -> str:
    return 'asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");'


def mbarrier_arrive_expect_tx(mbar_u32: str, nbytes: int) -> str:
    return (f'asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], {nbytes};" '
            f':: "r"({mbar_u32}) : "memory");')


def mbarrier_arrive_expect_tx_var(mbar_u32: str, nbytes: str) -> str:
    """Arrive and announce a byte count computed at run time."""
    return (f'asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" '
            f':: "r"({mbar_u32}), "r"({nbytes}) : "memory");')


def mbarrier_arrive(mbar_u32: str) -> str:
    return f'asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"({mbar_u32}) : "memory");'


def mbarrier_wait_parity(mbar_u32: str, parity: str) -> str:
    """Spin until the mbarrier's phase with the given parity has completed."""
    return (f'asm volatile("{{\\n .reg .pred done;\\n waitloop:\\n'
            f' mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\\n @!done bra waitloop;\\n}}" '
            f':: "r"({mbar_u32}), "r"({parity}) : "memory");')


def cluster_arrive(relaxed: bool = False) -> str:
    """Arrive on the cluster barrier. A release arrive orders every prior access of the thread,
    global stores included (SASS: MEMBAR.ALL.GPU, then ERRBAR, which waits for them); relaxed
    orders none, which suffices after `fence.mbarrier_init.release.cluster`."""
    sem = "relaxed" if relaxed else "release"
    return f'asm volatile("barrier.cluster.arrive.{sem}.aligned;" ::: "memory");'


def cluster_wait() -> str:
    return 'asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");'


# Device functions for the instructions used as expressions (the last six: the segmented shuffles
# of scans); a .cu holds those its code calls (device_functions_used), once each, at its top.
PRELUDE = r"""
static __device__ __forceinline__ float kfc_shfl_bfly(float v, int lane_mask) {
  float r; asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(lane_mask)); return r;
}
static __device__ __forceinline__ float kfc_ld_shared_f32(unsigned addr) {
  float r; asm volatile("ld.shared.f32 %0, [%1];" : "=f"(r) : "r"(addr) : "memory"); return r;
}
static __device__ __forceinline__ float kfc_rsqrt_approx(float x) {
  float r; asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}
static __device__ __forceinline__ float kfc_ex2_approx(float x) {
  float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}
static __device__ __forceinline__ float kfc_rcp_approx(float x) {
  float r; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}
static __device__ __forceinline__ float kfc_tanh_approx(float x) {
  float r; asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}
static __device__ __forceinline__ float kfc_max_nan(float a, float b) {
  float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
static __device__ __forceinline__ float kfc_min_nan(float a, float b) {
  float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r;
}
static __device__ __forceinline__ unsigned kfc_tf32_bits(float x) {
  unsigned r; asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
static __device__ __forceinline__ float kfc_round_tf32(float x) {
  return __uint_as_float(kfc_tf32_bits(x));
}
static __device__ __forceinline__ unsigned kfc_tf32_lo(float x) {
  return kfc_tf32_bits(x - kfc_round_tf32(x));
}
static __device__ __forceinline__ void kfc_mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void kfc_mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ void kfc_mma_f16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ float kfc_round_bf16(float x) {
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x)); return __uint_as_float((unsigned)h << 16);
}
static __device__ __forceinline__ unsigned kfc_cvt_pack_bf16(float hi, float lo) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
static __device__ __forceinline__ unsigned kfc_cvt_pack_f16(float hi, float lo) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
static __device__ __forceinline__ float kfc_e4m3_to_f32(unsigned char b) {
  unsigned w; asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(w) : "h"((unsigned short)b));
  return kfc_f16_to_f32(kfc_f16_of_bits((unsigned short)(w & 0xffffu)));
}
static __device__ __forceinline__ float kfc_e5m2_to_f32(unsigned char b) {
  return kfc_f16_to_f32(kfc_f16_of_bits((unsigned short)(b << 8)));
}
static __device__ __forceinline__ unsigned char kfc_f32_to_e4m3(float x) {
  unsigned short h; asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(0.0f), "f"(x));
  const unsigned sign = __float_as_uint(x) >> 24 & 0x80u;
  return (unsigned char)(x != x ? sign | 0x7fu : h & 0xffu);
}
static __device__ __forceinline__ unsigned char kfc_f32_to_e5m2(float x) {
  unsigned short h; asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(h) : "f"(0.0f), "f"(x));
  const unsigned sign = __float_as_uint(x) >> 24 & 0x80u;
  return (unsigned char)(x != x ? sign | 0x7fu : fabsf(x) >= 61440.0f ? sign | 0x7cu : h & 0xffu);
}
static __device__ __forceinline__ unsigned kfc_cluster_ctarank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
static __device__ __forceinline__ unsigned kfc_mapa(unsigned addr, unsigned rank) {
  unsigned r; asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank)); return r;
}
static __device__ __forceinline__ float kfc_shfl_up_f32(float v, int delta, int c) {
  float r; asm volatile("shfl.sync.up.b32 %0, %1, %2, %3, 0xffffffff;" : "=f"(r) : "f"(v), "r"(delta), "r"(c)); return r;
}
static __device__ __forceinline__ int kfc_shfl_up_s32(int v, int delta, int c) {
  int r; asm volatile("shfl.sync.up.b32 %0, %1, %2, %3, 0xffffffff;" : "=r"(r) : "r"(v), "r"(delta), "r"(c)); return r;
}
static __device__ __forceinline__ float kfc_shfl_down_f32(float v, int delta, int c) {
  float r; asm volatile("shfl.sync.down.b32 %0, %1, %2, %3, 0xffffffff;" : "=f"(r) : "f"(v), "r"(delta), "r"(c)); return r;
}
static __device__ __forceinline__ int kfc_shfl_down_s32(int v, int delta, int c) {
  int r; asm volatile("shfl.sync.down.b32 %0, %1, %2, %3, 0xffffffff;" : "=r"(r) : "r"(v), "r"(delta), "r"(c)); return r;
}
static __device__ __forceinline__ float kfc_shfl_idx_f32(float v, int lane, int c) {
  float r; asm volatile("shfl.sync.idx.b32 %0, %1, %2, %3, 0xffffffff;" : "=f"(r) : "f"(v), "r"(lane), "r"(c)); return r;
}
static __device__ __forceinline__ int kfc_shfl_idx_s32(int v, int lane, int c) {
  int r; asm volatile("shfl.sync.idx.b32 %0, %1, %2, %3, 0xffffffff;" : "=r"(r) : "r"(v), "r"(lane), "r"(c)); return r;
}
"""

_DEFINITION = re.compile(r"^static __device__ __forceinline__ [\w ]+? (kfc_\w+)\(", re.M)


def definitions(text: str) -> dict[str, str]:
    """The device functions of `text` (one `static __device__` definition after another), by name."""
    starts = [(m.start(), m.group(1)) for m in _DEFINITION.finditer(text)]
    ends = [s for s, _ in starts[1:]] + [len(text)]
    return {name: text[start:end] for (start, name), end in zip(starts, ends)}


DEVICE_FUNCTIONS = definitions(PRELUDE.lstrip("\n"))


_CALL = re.compile(r"\b(\w+)\(")  # a name followed by "(": a call or a definition


def device_functions_used(code: str, functions: dict[str, str] = DEVICE_FUNCTIONS) -> str:
    """The definitions of the `functions` that `code` calls, and those they call in turn, in
    their order (a helper is defined before the helpers that call it): no unused helper text in
    a kernel's source. Each text is read once for all its calls (a search per helper over a long
    kernel's source cost the suite tens of seconds)."""
    used: set[str] = set()
    texts = [code]
    while texts:
        for name in set(_CALL.findall(texts.pop())) - used:
            if name in functions:
                used.add(name)
                body = functions[name]
                texts.append(body[body.index("{"):])  # its body: the calls it makes
    return "".join(text for name, text in functions.items() if name in used)


# --- TMA and warpgroup MMA (Hopper, sm_90a) ---------------------------------------------------
# Facts from the PTX ISA: a tensor copy's coordinates run innermost dim first; its tensor map
# operand is the generic address of a __grid_constant__ parameter. A wgmma shared-memory
# descriptor holds the start address >> 4 in bits 0-13, the leading-dimension byte offset >> 4 in
# 16-29, the stride byte offset >> 4 in 32-45 and the swizzle in 62-63 (1: 128 bytes). For a
# K-major operand with the 128-byte swizzle the stride offset is the 1024 bytes between groups of
# 8 rows (the leading offset is unused); for an MN-major one the leading offset is the distance
# between 64-element chunks of MN and the stride offset the 1024 bytes between groups of 8 rows of K.
TENSOR_MAP_TYPE = "struct __align__(64) kfc_tensor_map { unsigned long long words[16]; };\n"

# kfc_tma_store_2d_part: a box of a store whose next box's kfc_tma_store_2d commits both as one
# bulk group (a warpgroup holding two 64-row pieces of a tile)
MMA_PRELUDE = r"""
static __device__ __forceinline__ void kfc_tma_load_2d(unsigned dst, const void* map, int inner, int outer, unsigned mbar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(dst), "l"(map), "r"(inner), "r"(outer), "r"(mbar) : "memory");
}
static __device__ __forceinline__ void kfc_tma_load_2d_multicast(unsigned dst, const void* map, int inner, int outer,
                                                                 unsigned mbar, unsigned short ctas) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(dst), "l"(map), "r"(inner), "r"(outer), "r"(mbar), "h"(ctas) : "memory");
}
static __device__ __forceinline__ void kfc_mbarrier_arrive_cluster(unsigned mbar, unsigned rank) {
  // An arrival on CTA `rank`'s barrier at the offset of `mbar`, with the default .release.cta: what it
  // orders (a consumer's wgmma reads of a stage, retired by wgmma.wait_group) is this CTA's own. A
  // .release.cluster arrival fences at cluster scope (a MEMBAR each: the cluster GEMM ran 2.5x slower).
  asm volatile("{\n .reg .b32 remote;\n mapa.shared::cluster.u32 remote, %0, %1;\n"
               " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}"
               :: "r"(mbar), "r"(rank) : "memory");
}
static __device__ __forceinline__ void kfc_tma_store_2d_part(const void* map, unsigned src, int inner, int outer) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
               :: "l"(map), "r"(src), "r"(inner), "r"(outer) : "memory");
}
static __device__ __forceinline__ void kfc_tma_store_2d(const void* map, unsigned src, int inner, int outer) {
  kfc_tma_store_2d_part(map, src, inner, outer);
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
static __device__ __forceinline__ unsigned long long kfc_wgmma_desc(unsigned addr, unsigned leading, unsigned stride) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(leading >> 4) << 16) |
         ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}
static __device__ __forceinline__ void kfc_wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
static __device__ __forceinline__ void kfc_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
static __device__ __forceinline__ void kfc_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
static __device__ __forceinline__ unsigned long long kfc_umma_desc(unsigned addr, unsigned leading, unsigned stride) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(leading >> 4) << 16) |
         ((unsigned long long)(stride >> 4) << 32) | (1ull << 46) | (2ull << 61);
}
static __device__ __forceinline__ void kfc_umma(unsigned tmem, unsigned long long a, unsigned long long b, unsigned idesc, int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\ntcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}"
               :: "r"(tmem), "l"(a), "l"(b), "r"(idesc), "r"(accumulate) : "memory");
}
static __device__ __forceinline__ void kfc_umma_commit(unsigned mbar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];" :: "r"(mbar) : "memory");
}
static __device__ __forceinline__ void kfc_tcgen05_fence_before() {
  asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory");
}
static __device__ __forceinline__ void kfc_tcgen05_fence_after() {
  asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory");
}
"""
MMA_FUNCTIONS = definitions(MMA_PRELUDE.lstrip("\n"))

# --- tcgen05 (Blackwell, sm_100a) -------------------------------------------------------------
# Facts from the PTX ISA and CuTe's UMMA descriptors (cute/arch/mma_sm100_desc.hpp): the
# shared-memory descriptor is the wgmma one with bit 46 set (a fixed version field) and the
# layout in bits 61-63 (2: the 128-byte swizzle). The kind::f16 instruction descriptor holds the
# accumulator format in bits 4-5 (1: f32), A's and B's in 7-9 and 10-12 (0: f16, 1: bf16), B
# MN-major in bit 16, N >> 3 in bits 17-22 and M >> 4 in bits 24-28. Tensor memory addresses
# hold the lane in bits 16-31 and the column in 0-15; warp w of a warpgroup reads lanes
# 32 (w % 4) onwards. tcgen05.alloc and tcgen05.dealloc are run by one whole warp, the same one.


def umma_instruction_descriptor(m: int, n: int, dtype: str) -> int:
    """tcgen05.mma kind::f16's instruction descriptor: f32 accumulator, A K-major, B MN-major."""
    fmt = {"f16": 0, "bf16": 1}[dtype]
    return (1 << 4) | (fmt << 7) | (fmt << 10) | (1 << 16) | ((n >> 3) << 17) | ((m >> 4) << 24)


def tmem_alloc(slot_u32: str, columns: int) -> str:
    return (f'asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], {columns};" '
            f':: "r"({slot_u32}) : "memory"); '
            'asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;" ::: "memory");')


def tmem_dealloc(address: str, columns: int) -> str:
    return f'asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, {columns};" :: "r"({address}) : "memory");'


def tmem_load_32(dst: str, address: str) -> str:
    """32 columns of this thread's lane into dst[0..31] (tcgen05.ld .32x32b.x32), waited for."""
    regs = ", ".join(f"%{i}" for i in range(32))
    outs = ", ".join(f'"=r"({dst}_bits[{i}])' for i in range(32))
    # the load and its wait in one statement: nothing reads the registers before the wait
    return (f"unsigned {dst}_bits[32];\n"
            f'asm volatile("tcgen05.ld.sync.aligned.32x32b.x32.b32 {{{regs}}}, [%32];\\n'
            f'tcgen05.wait::ld.sync.aligned;" : {outs} : "r"({address}) : "memory");\n'
            f"for (int i = 0; i < 32; ++i) {dst}[i] = __uint_as_float({dst}_bits[i]);")


def setmaxnreg(registers: int, increase: bool) -> str:
    """This warpgroup's threads' register budget becomes `registers` (warp specialisation: the
    producer gives registers back to the pool, the consumers take them)."""
    return f'asm volatile("setmaxnreg.{"inc" if increase else "dec"}.sync.aligned.u32 {registers};");'


def wgmma_wait(pending: int) -> str:
    return f'asm volatile("wgmma.wait_group.sync.aligned {pending};" ::: "memory");'


def wgmma_function(n: int, dtype: str, trans_b: bool, pieces: int = 1, piece: int = 0) -> tuple[str, str]:
    """(name, definition) of the device function issuing one wgmma.m64n{n}k16 with f32
    accumulators in place (scale-d a predicate: 0 discards what they held), A and B from
    shared-memory descriptors. The accumulators are d[n / 2], or with `pieces` (a warpgroup
    holding several 64-row pieces, #wgmma_acc) piece `piece`'s registers of d[pieces * n / 2]:
    each group of four from 4 * (pieces * k + piece)."""
    name = f"kfc_wgmma_m64n{n}k16_{dtype}{'_tb' if trans_b else ''}" + (f"_p{pieces}_{piece}" if pieces > 1 else "")
    regs = n // 2
    acc = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{(i // 4 * pieces + piece) * 4 + i % 4}])' for i in range(regs))
    text = (f"static __device__ __forceinline__ void {name}(float (&d)[{regs * pieces}], unsigned long long a, "
            f"unsigned long long b, int scale_d) {{\n"
            f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"\n'
            f'               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype} {{{acc}}}, %{regs}, '
            f'%{regs + 1}, p, 1, 1, 0, {int(trans_b)};\\n}}"\n'
            f'               : {outs}\n               : "l"(a), "l"(b), "r"(scale_d));\n}}\n')
    return name, text


def fence_registers(array: str, n: int) -> str:
    """Keep the compiler from moving reads or writes of a register array across this point (an
    accumulator an asynchronous wgmma writes)."""
    return f'for (int i = 0; i < {n}; ++i) asm volatile("" : "+f"({array}[i]) :: "memory");'
