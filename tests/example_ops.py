"""The ops of examples/, one or more per kind of program beyond a straight row (for loops over
chunks with carried values, scans along a row, branches), by name, for the CPU and GPU tests."""

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
OPS = {p.stem: p.read_text() for p in sorted(EXAMPLES.glob("*.kfc"))}
CHUNKED = ("rowsum_chunked", "rmsnorm_chunked", "fold", "segsum", "group_max_sum")
