"""Resources against the target's limits, from the numbers ptxas reports for the kernel."""

from __future__ import annotations

from ..diagnostics import KfcError
from ..model.target import Target
from .cuda import LaunchPlan
from .toolchain import PtxasReport


class ResourceError(KfcError):
    pass


def check_resources(plan: LaunchPlan, report: PtxasReport, target: Target, what: str,
                    smaller: dict[str, int] | None = None) -> None:
    """Raise with the numbers when the kernel cannot launch as planned on the target; `smaller`,
    the next smaller size each of the op's size parameters offers (a chunk bound to 64 of
    64 | 32 | 16: C = 32), names what to bind instead."""
    if plan.block > 1024:
        raise ResourceError(f"{what}: {plan.block} threads per CTA; {target} allows 1024",
                            hint="use fewer rows per CTA or fewer threads per row")
    regs = report.registers * plan.block
    if regs > target.regs_per_sm:
        raise ResourceError(f"{what}: {report.registers} registers x {plan.block} threads = {regs} registers per CTA; "
                            f"an SM of {target} has {target.regs_per_sm}",
                            hint="use fewer threads per CTA, or fewer elements per thread")
    for kernel in (plan, *getattr(plan, "later", ())):  # a tile program's kernels, a loop each
        if report.smem_bytes + kernel.smem_dynamic > target.smem_per_block and getattr(kernel, "shared_tiles", ""):
            raise ResourceError(f"{what}: its tiles need {kernel.smem_dynamic} bytes of shared memory at once; "
                                f"{target} allows {target.smem_per_block} per CTA ({kernel.shared_tiles})",
                                hint=smaller_tiles(smaller or {}))
    smem = report.smem_bytes + plan.smem_dynamic
    if smem > target.smem_per_block:
        raise ResourceError(f"{what}: {smem} bytes of shared memory per CTA ({report.smem_bytes} static, "
                            f"{plan.smem_dynamic} for staged rows); {target} allows {target.smem_per_block}",
                            hint="use fewer rows per CTA, or split staged rows over a larger cluster")
    if plan.cluster > 16:
        raise ResourceError(f"{what}: a cluster of {plan.cluster} CTAs; {target} allows 16 (8 portable)")


def smaller_tiles(smaller: dict[str, int]) -> str:
    """What to change when a tile kernel's tiles do not fit in shared memory: a size parameter
    bound smaller where the op offers one (`--dtype C=32`), else smaller dims."""
    if smaller:
        return (f"bind a smaller size parameter ({', '.join(f'--dtype {n}={v}' for n, v in smaller.items())}) "
                "or compile for smaller dims (--shape)")
    return "compile for smaller dims (--shape), or tile the op's loop over smaller slices"
