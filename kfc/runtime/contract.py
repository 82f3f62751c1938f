"""The launch contract: what `kfc compile` writes into report.json under "kernels" and what a
runtime needs to launch an op, read the same way by kfc's runtime and by the packages `kfc
package` writes (it is copied into them; the standard library only).

Each entry of "kernels", launched in order:

    name                 the kernel's symbol in the cubin
    grid                 [x, y, z]: integer expressions of the dims (+ - * // %, min, max)
    block, cluster       [x, y, z]
    smem_dynamic_bytes   dynamic shared memory (the runtime raises the kernel's limit past 48 KB)
    persistent           the grid's x is capped at one wave of clusters
    params               in order: tensor (a pointer), scalar (a C value), dim (a long long),
                         workspace (a pointer to global memory the runtime allocates for the
                         call, f32 of its "shape": expressions of the dims), tensor_map (a
                         128-byte CUtensorMap by value, `const __grid_constant__`, that the
                         runtime encodes per call from the op's tensor "name", which may also
                         be a tensor param: rank 2, [rows, cols] row-major with unit stride on
                         cols; "box" is [box_rows, box_cols], outer first; "swizzle" is 0, 32,
                         64 or 128 bytes; reads past the tensor's bounds give zeros); other
                         kinds are refused by this runtime, by name
    defines              optional: dims this kernel's launch fixes for the kernels after it,
                         expressions of the dims and kfc_grid_x (its grid's x, once capped)
    min_ctas_per_sm      optional: the CTAs an SM the kernel was compiled to hold (the minimum
                         of its __launch_bounds__); for reports, the launch does not read it

An op whose rows also sum across rows (a weight gradient) launches a row kernel that leaves
partials in a workspace, then a kernel that adds them up.
"""

from __future__ import annotations

import ast
import operator

try:
    from ..diagnostics import KfcError as ContractError
except ImportError:  # vendored into a package `kfc package` wrote, which runs without kfc
    class ContractError(ValueError):
        def __init__(self, message: str, hint: str | None = None) -> None:
            super().__init__(f"{message}; {hint}" if hint else message)

PARAM_KINDS = ("tensor", "scalar", "dim", "workspace", "tensor_map")
DEFAULT_SMEM_LIMIT = 48 * 1024  # shared memory a kernel may take without raising its limit


def needs_smem_opt_in(launch: dict) -> bool:
    """Whether the kernel's static and dynamic shared memory together pass the default limit,
    so its dynamic part must be allowed explicitly before it launches."""
    dynamic = launch["smem_dynamic_bytes"]
    return bool(dynamic) and dynamic + launch.get("smem_static_bytes", 0) > DEFAULT_SMEM_LIMIT

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod}
_FUNCS = {"min": min, "max": max}


def evaluate(expr: str, dims: dict[str, int]) -> int:
    """An integer expression over the dims (no eval: the syntax tree is walked)."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id in dims:
            return int(dims[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS \
                and node.args and not node.keywords:
            return _FUNCS[node.func.id](*(ev(a) for a in node.args))
        raise ContractError(f"the launch contract's expression {expr!r} uses {ast.dump(node)[:60]}, which a "
                            "runtime does not evaluate")
    try:
        return ev(ast.parse(expr, mode="eval"))
    except SyntaxError:
        raise ContractError(f"the launch contract's expression {expr!r} does not parse") from None
    except ZeroDivisionError:
        raise ContractError(f"the launch contract's expression {expr!r} divides by zero at {dims}") from None


def kernels_of(report: dict, what: str) -> list[dict]:
    """The kernels of an op's contract in launch order, checked for what this runtime launches."""
    kernels = report.get("kernels")
    if not kernels:
        raise ContractError(f"{what}: its report has no launch contract (compiled by an older kfc?)",
                            hint="recompile it")
    for kernel in kernels:
        for p in kernel["params"]:
            if p["kind"] not in PARAM_KINDS:
                raise ContractError(f"{what}: its kernel takes a {p['kind']} parameter ({p['name']}), which this "
                                    "runtime cannot pass yet")
    return kernels


def single_kernel(report: dict, what: str) -> dict:
    """The one kernel of an op's contract (for a runtime that launches ops of one kernel)."""
    kernels = kernels_of(report, what)
    if len(kernels) != 1:
        raise ContractError(f"{what} compiles to {len(kernels)} kernels; this runtime launches ops of one kernel",
                            hint="call it through kfc.load, which launches them in order")
    return kernels[0]


def defined_dims(kernel: dict, dims: dict[str, int], grid_x: int) -> dict[str, int]:
    """The dims with those the kernel's launch defines for the kernels after it."""
    out = dict(dims)
    for name, expr in kernel.get("defines", {}).items():
        out[name] = evaluate(expr, {**dims, "kfc_grid_x": grid_x})
    return out


def workspace_shape(param: dict, dims: dict[str, int]) -> tuple[int, ...]:
    return tuple(max(0, evaluate(e, dims)) for e in param["shape"])


def prepare_function(kernel: dict, dims: dict[str, int], function, sm_count: int) -> tuple[int, int, int]:
    """Allow on the loaded `function` what its launch needs (dynamic shared memory past 48 KB and
    clusters past 8, before the occupancy query that counts them) and return its grid, a
    persistent kernel's capped at one wave: the clusters the GPU holds at once, or for single
    CTAs the `sm_count` SMs times the CTAs an SM holds (`function`: a launcher.Module)."""
    cluster, block, smem = kernel["cluster"][0], kernel["block"], kernel["smem_dynamic_bytes"]
    if needs_smem_opt_in(kernel):
        function.allow_dynamic_smem(smem)
    if cluster > 8:
        function.allow_large_clusters()
    wave = None
    threads = block[0] * block[1] * block[2]
    if kernel["persistent"] and cluster > 1:
        wave = function.max_active_clusters(threads, smem, cluster)
    elif kernel["persistent"]:
        wave = sm_count * max(1, function.max_active_blocks(threads, smem))
    return grid(kernel, dims, wave)


def grid(kernel: dict, dims: dict[str, int], clusters_per_wave: int | None = None) -> tuple[int, int, int]:
    """The grid for these dims; a persistent kernel's x capped at `clusters_per_wave` clusters."""
    gx, gy, gz = (max(0, evaluate(e, dims)) for e in kernel["grid"])
    if kernel.get("persistent") and clusters_per_wave and gx:
        c = kernel["cluster"][0]
        gx = min(gx, max(1, clusters_per_wave) * c)
    return gx, gy, gz
