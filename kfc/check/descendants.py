"""The processes a reference started, however they detached: the reference's child process
makes itself their subreaper (Linux's PR_SET_CHILD_SUBREAPER), so a grandchild that double-forks
and leaves the session (setsid) is re-parented to it instead of to init and stays in its tree,
where the child, when its work ends, and the parent, when it kills the child, end them all."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (Linux; False elsewhere)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process /proc shows."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # the command name is in parentheses and may hold spaces: the fields follow the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, nearest first."""
    children: dict[int, list[int]] = {}
    for p, parent in _parents().items():
        children.setdefault(parent, []).append(p)
    out, frontier = [], [pid]
    while frontier:
        nxt = [c for p in frontier for c in children.get(p, ())]
        out += nxt
        frontier = nxt
    return out


def kill_descendants(pid: int) -> int:
    """SIGKILL everything below `pid` (twice over: a process may fork while the first pass runs);
    how many were signalled."""
    killed = 0
    for _ in range(2):
        for p in descendants(pid):
            try:
                os.kill(p, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed
