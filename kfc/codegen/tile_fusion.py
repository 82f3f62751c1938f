"""One loop for the CTA-wide loops of a phase of a tile kernel (kfc.codegen.tile_emitter).

A phase writes each tile in a loop of its own over the CTA's threads (TileWrites.cta_loop). Where
several loops of the same few iterations follow one another with no barrier between them, they
become one loop whose body holds every loop's reads and computation first and every loop's
writes last. The index arithmetic of an element is then written once for all of them, and the
compiler may read a shared buffer once where two loops read it: it cannot move a read of shared
memory above a write to it, which in separate loops sits between the two reads. KDA's prepare
kernel reads k, G and Gend/2 in three loops writing three decayed copies of k and q, and stores
u, qg and kg in three loops at the same (row, column) addresses.

It changes no result: loops with no barrier between them are those of one phase, and the tile
emitter puts in one phase only writes of which none reads what another writes (TilePhases). A
later loop is still kept apart where moving its reads above an earlier loop's writes would
reorder two statements naming one buffer, tensor or register array of which either assigns it
(`crosses`): a write and a read of what it writes, or a read of a prefetch's registers (in a
store's writes) and the loop filling them for the next iteration.
"""

from __future__ import annotations

import re

import attrs

FUSED_AT_MOST = 4  # loops in one: the values of each live until the writes at the end
# buffers (kfc_s), registers (kfc_pf, kfc_x, ...), tensors (p_), not the 16-bit types: a loop's own
# names are fresh
_NAMES = re.compile(r"\b(?!kfc_b?f16\b)(?:kfc_[a-z]+\d+|p_\w+)\b")
_HEADER = re.compile(r"for \(int (\w+) = 0; \1 < (\d+); \+\+\1\) \{$")


@attrs.frozen
class CtaLoop:
    """A CTA-wide loop of a fixed count of iterations, as emitted: lines[start] is its
    `#pragma unroll`, lines[start + 1] its header, lines[end - 1] its closing brace, and the last
    `writes` lines of its body its writes to memory (all of them)."""

    start: int
    end: int
    writes: int

    def body(self, lines: list[str]) -> list[str]:
        return lines[self.start + 2:self.end - 1]

    def reads(self, lines: list[str]) -> list[str]:
        body = self.body(lines)
        return body[:len(body) - self.writes]

    def header(self, lines: list[str]) -> tuple[str, int]:
        """Its iteration variable and count."""
        found = _HEADER.search(lines[self.start + 1].strip())
        if found is None:
            raise ValueError(f"not a CTA-wide loop's header: {lines[self.start + 1]!r}")
        return found.group(1), int(found.group(2))

    def writes_of(self, lines: list[str]) -> list[str]:
        body = self.body(lines)
        return body[len(body) - self.writes:]


def named(statements: list[str]) -> set[str]:
    return {n for line in statements for n in _NAMES.findall(line)}


def assigned(statements: list[str]) -> set[str]:
    """The names left of an assignment in these statements (a guard's names too: more, not fewer)."""
    return {n for line in statements for part in line.split(";") for n in _NAMES.findall(part.partition(" = ")[0])}


def crosses(earlier: list[CtaLoop], later: CtaLoop, lines: list[str]) -> bool:
    """Whether moving the later loop's reads above the earlier loops' writes reorders two
    statements that name one thing of which either assigns it."""
    writes = [x for loop in earlier for x in loop.writes_of(lines)]
    reads = later.reads(lines)
    return bool(assigned(writes) & named(reads)) or bool(named(writes) & assigned(reads))


def runs(lines: list[str], loops: list[CtaLoop]) -> list[list[CtaLoop]]:
    """The loops cut into runs to fuse: each loop beginning where the one before ends, of the
    same count, none `crosses` the run before it, at most FUSED_AT_MOST a run."""
    out: list[list[CtaLoop]] = []
    for loop in sorted(loops, key=lambda x: x.start):
        last = out[-1] if out else None
        if (last is not None and last[-1].end == loop.start and len(last) < FUSED_AT_MOST
                and last[0].header(lines)[1] == loop.header(lines)[1] and not crosses(last, loop, lines)):
            last.append(loop)
        else:
            out.append([loop])
    return [run for run in out if len(run) > 1]


def fuse_loops(lines: list[str], loops: list[CtaLoop]) -> list[str]:
    """The kernel's lines with each run of loops (`runs`) written as one loop: the first loop's
    header, each loop's reads in order (a later loop's variable named as the first's), then each
    loop's writes in order."""
    out = list(lines)
    for run in sorted(runs(lines, loops), key=lambda r: -r[0].start):  # the last first: indices stay
        var = run[0].header(lines)[0]
        first_line = lines[run[0].start + 2]
        indent = first_line[:len(first_line) - len(first_line.lstrip())]
        body: list[str] = []
        for k, loop in enumerate(run):
            if k:
                body.append(f"{indent}const int {loop.header(lines)[0]} = {var};")
            body += loop.reads(lines)
        for loop in run:
            body += loop.writes_of(lines)
        first, last = run[0], run[-1]
        out[first.start:last.end] = lines[first.start:first.start + 2] + body + [lines[last.end - 1]]
    return out
