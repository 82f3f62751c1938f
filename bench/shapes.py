"""The row shapes the benchmarks run at, and how a command line names them."""

from __future__ import annotations

# QuACK's benchmark shapes (M rows of N elements)
QUACK_SHAPES = [(32768, 1 << k) for k in range(8, 17)] + [(16384, 131072), (8192, 262144)]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'32768x4096,16384x65536' -> [(32768, 4096), (16384, 65536)]."""
    out = []
    for s in text.split(","):
        m, n = (int(v) for v in s.strip().split("x"))
        out.append((m, n))
    return out
