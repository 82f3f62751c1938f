"""The second phase of a sum across rows (a `gpu.launch` with results, e.g. a norm's weight
gradient): a kernel that adds up the row kernel's partials, column by column, in a fixed order.

The row kernel leaves one partial row per row slot of its persistent grid in a workspace
(`kfc_ws<k>`, f32[groups, N]). Here each CTA takes 32 columns: its 8 warps each add every 8th
partial in turn, then warp 0 adds the 8 results in warp order, applies what the op does with
the sum (a cast) and stores it. The order depends only on the number of partials, which a
given GPU fixes, so repeated runs give identical bits and no float atomics are needed.
"""

from __future__ import annotations

import attrs

from ..ir.core import Op, Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.tile_ops import CastOp, StoreOp
from ..ir.types import MemSpace
from .c_names import C_TYPES, KernelParam, c_dim, c_param, from_float

COLUMNS = 32      # columns per CTA: a warp reads 128 contiguous bytes of a partial
PARTS = 8         # warps per CTA, each adding every PARTS-th partial
GROUPS_DIM = "kfc_groups"  # the number of partials; the row kernel's launch defines it


def workspace_name(k: int) -> str:
    return f"kfc_ws{k}"


@attrs.frozen
class RowSums:
    """The ops after the row launch that use its results: how each stored output is made."""

    stores: tuple[tuple[StoreOp, tuple[Op, ...], int], ...]  # (store, casts on the way, result index)
    n: int


def plan_row_sums(func: FuncOp, launch, n: int, error) -> RowSums:
    """What the function body does with the launch's sums after it: casts, then whole-tensor
    stores into outputs. Anything else is refused (`error(message, loc, hint)`)."""
    position = func.body.ops.index(launch)
    made: dict[Value, tuple[int, tuple[Op, ...]]] = {r: (k, ()) for k, r in enumerate(launch.results)}
    stores = []
    for op in func.body.ops[position + 1:]:
        if not any(v in made for v in op.operands):
            raise error(f"{op.NAME} after the row loop: only what uses the loop's sums may follow it", op.loc,
                        "compute it inside the parallel loop")
        if isinstance(op, CastOp):
            k, casts = made[op.operands[0]]
            made[op.result] = (k, casts + (op,))
        elif isinstance(op, StoreOp) and op.operands[0] in made:
            t = op.operands[1].ttype
            if [ix.kind for ix in op.index] != ["all"] * t.rank or t.rank != 1 or t.shape[0] != n:
                raise error(f"a sum across rows is stored whole into a tensor of the row's length {n}, not into "
                            f"{t}", op.loc)
            k, casts = made[op.operands[0]]
            stores.append((op, casts, k))
        else:
            raise error(f"{op.NAME} of a sum across rows: the code generator casts and stores such sums only",
                        op.loc, "store the sum into an output (out[:] += ...), and compute with it in another op")
    return RowSums(tuple(stores), n)


def workspace_params(results: int, n: int) -> list[KernelParam]:
    """The row kernel's partials, one workspace of [groups, n] f32 per sum."""
    return [KernelParam(workspace_name(k), "workspace", "float", "f32", is_output=True, shape=(GROUPS_DIM, str(n)))
            for k in range(results)]


def _outputs(sums: RowSums) -> list[Value]:
    """The tensors the sums are stored into, in the order of their first store."""
    out: list[Value] = []
    for store, _, _ in sums.stores:
        if store.operands[1] not in out:
            out.append(store.operands[1])
    return out


def contract(sums: RowSums, kernel_name: str, results: int) -> dict:
    """The phase-two kernel's entry in the launch contract."""
    outputs = [KernelParam(t.name, "tensor", C_TYPES[t.ttype.dtype], str(t.ttype.dtype), False, True)
               for t in _outputs(sums)]
    params = [*workspace_params(results, sums.n), *outputs, KernelParam(GROUPS_DIM, "dim", "long long", "index")]
    return {"name": kernel_name, "grid": [grid_x(sums.n), "1", "1"], "block": [COLUMNS * PARTS, 1, 1],
            "cluster": [1, 1, 1], "smem_static_bytes": 4 * results * COLUMNS * PARTS, "smem_dynamic_bytes": 0,
            "persistent": False, "params": [p.contract() for p in params]}


def emit_row_sums(sums: RowSums, kernel_name: str, results: int) -> str:
    """The CUDA C++ of the phase-two kernel."""
    n = sums.n
    outputs = _outputs(sums)
    sig = [f"const float* __restrict__ {workspace_name(k)}" for k in range(results)]
    sig += [f"{C_TYPES[t.ttype.dtype]}* __restrict__ {c_param(t.name)}" for t in outputs]
    sig.append(f"long long {c_dim(GROUPS_DIM)}")
    lines = [
        f'extern "C" __global__ void __launch_bounds__({COLUMNS * PARTS}) {kernel_name}({", ".join(sig)}) {{',
        f"  __shared__ float kfc_part[{results}][{PARTS}][{COLUMNS}];",
        f"  const int kfc_c = threadIdx.x % {COLUMNS}, kfc_q = threadIdx.x / {COLUMNS};",
        f"  const long long kfc_j = (long long)blockIdx.x * {COLUMNS} + kfc_c;",
        f"  const bool kfc_in = kfc_j < {n}LL;",
    ]
    for k in range(results):
        ws = workspace_name(k)
        lines += [
            f"  float kfc_s{k} = 0.0f;",
            "  if (kfc_in) {",
            "    #pragma unroll 4",
            f"    for (long long g = kfc_q; g < {c_dim(GROUPS_DIM)}; g += {PARTS}) "
            f"kfc_s{k} += {ws}[g * {n}LL + kfc_j];",
            "  }",
            f"  kfc_part[{k}][kfc_q][kfc_c] = kfc_s{k};",
        ]
    lines += ["  __syncthreads();", "  if (kfc_q != 0 || !kfc_in) return;"]
    for k in range(results):
        lines += [f"  float kfc_t{k} = kfc_part[{k}][0][kfc_c];",
                  "  #pragma unroll",
                  f"  for (int q = 1; q < {PARTS}; ++q) kfc_t{k} += kfc_part[{k}][q][kfc_c];"]
    for store, casts, k in sums.stores:
        expr = f"kfc_t{k}"
        dtype = DType.F32
        for cast in casts:
            dtype = cast.result.ttype.dtype
            if not dtype.is_float:
                raise ValueError(f"a sum across rows cast to {dtype}")
            expr = from_float(expr, dtype)
        target = store.operands[1]
        if target.ttype.space is not MemSpace.GLOBAL or dtype is not target.ttype.dtype:
            raise ValueError(f"a sum across rows stored as {dtype} into {target.ttype}")
        lines.append(f"  {c_param(target.name)}[kfc_j] = {expr};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def grid_x(n: int) -> str:
    return str(-(-n // COLUMNS))
