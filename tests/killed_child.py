"""A child process that prints one integer per line as it commits records, killed with SIGKILL
once it has printed enough: what crash-safety tests start from."""

import signal
import subprocess
import sys


def run_and_kill(script: str, args: list[str], after: int) -> tuple[list[int], str]:
    """Run `python -c script *args`, SIGKILL it once it has printed `after` lines; return every
    integer it printed (those read before the kill, then the rest of its buffered output) and
    its stderr."""
    child = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    printed: list[int] = []
    try:
        while len(printed) < after:
            line = child.stdout.readline()
            assert line, f"the child ended on its own: {child.stderr.read()}"
            printed.append(int(line))
    finally:
        child.send_signal(signal.SIGKILL)
        rest, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    return printed + [int(x) for x in rest.split()], err
