"""GPU targets and the features passes may require of them.

`sm_90`/`sm_90a` are Hopper, `sm_100`/`sm_100a` Blackwell. Arch-specific instructions (wgmma,
setmaxnreg, tcgen05) exist only on the `a` variants; `--target sm_100` is compiled for sm_100a
when the kernel uses such an instruction (the report says so), else for sm_100.
"""

from __future__ import annotations

import attrs

from ..diagnostics import KfcError

SMEM_PER_BLOCK = 227 * 1024  # the dynamic shared memory a CTA may have on sm_90 and sm_100
SMEM_PER_SM = 228 * 1024  # an SM's, shared by its CTAs, each of which also takes SMEM_PER_CTA_RESERVED
SMEM_PER_CTA_RESERVED = 1024

# feature -> (minimum sm, needs the arch-specific 'a' variant, exact sm families that have it)
_FEATURES = {
    "mbarrier": (80, False, None),
    "cp_async": (80, False, None),
    "bf16": (80, False, None),
    "cluster": (90, False, None),
    "dsmem": (90, False, None),
    "tma": (90, False, None),
    "fence_proxy_async": (90, False, None),
    "wgmma": (90, True, {90}),
    "setmaxnreg": (90, True, {90, 100}),
    "tcgen05": (100, True, {100}),
}
KNOWN = ("sm_90", "sm_90a", "sm_100", "sm_100a")
# SMs of each family's data-centre part (H100 SXM and H200: 132; B200: 148): what a model of a
# kernel's waves divides its CTAs by where no GPU is at hand
SMS = {90: 132, 100: 148}
# CTAs in a cluster launched with the non-portable cluster size attribute (Hopper, Blackwell)
LARGEST_CLUSTER = 16
# Threads resident on one SM at once (Hopper, Blackwell): what CTAs that must share an SM share
SM_THREADS = 2048
# The most threads a row kernel's CTA takes when the passes choose: at 1024 a thread has 64
# registers (65536 an SM), too few for a share of 64 fp32 row elements (ptxas spills).
ROW_CTA_THREADS = 512
# The static shared memory a row kernel keeps beside its staged rows and sums: reduction slots
# and barriers.
ROW_KERNEL_STATIC_SMEM = 4 * 1024


def needs_arch_specific(feature: str) -> bool:
    """Whether the feature's instructions exist only on a family's 'a' variant (sm_90a, sm_100a)."""
    return _FEATURES[feature][1]


@attrs.frozen
class Target:
    sm: int
    arch_specific: bool  # the 'a' variant

    @property
    def name(self) -> str:
        return f"sm_{self.sm}{'a' if self.arch_specific else ''}"

    @property
    def family(self) -> str:
        return {90: "Hopper", 100: "Blackwell"}.get(self.sm, f"sm_{self.sm}")

    @property
    def smem_per_block(self) -> int:
        return SMEM_PER_BLOCK

    @property
    def sm_count(self) -> int:
        return SMS.get(self.sm, 132)

    @property
    def regs_per_sm(self) -> int:
        return 65536

    @property
    def max_cluster(self) -> int:
        return 8  # portable cluster size

    def has(self, feature: str) -> bool:
        """Whether the chip family has the feature; a plain target (sm_100) that uses an
        arch-specific one is compiled for its 'a' variant."""
        lo, _, families = _FEATURES[feature]
        return self.sm >= lo and (families is None or self.sm in families)

    def features(self) -> frozenset[str]:
        return frozenset(f for f in _FEATURES if self.has(f))

    def __str__(self) -> str:
        return self.name


def parse_target(text: str) -> Target:
    t = text.strip().lower()
    if t not in KNOWN:
        raise KfcError(f"unknown target {text!r}", hint=f"targets are {', '.join(KNOWN)} (Hopper sm_90*, Blackwell sm_100*)")
    return Target(int(t[3:].rstrip("a")), t.endswith("a"))
