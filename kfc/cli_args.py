"""Command-line values, each checked against its declared range: an out-of-range value is an
error that names the allowed values, never a silent clamp or a later internal error. One parser
class for every `kfc` command, whose errors are one message and a hint."""

from __future__ import annotations

import argparse
import math
import re
import sys
from typing import Callable

from .check.sandbox import Limits
from .model.target import KNOWN

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DTYPE_HELP = "bind the op's type parameters, comma-separated: a dtype (T=f16) or a size (C=32), e.g. C=16,SD=bf16"
LISTED_OPTIONS = ("--dtype", "--shape")  # each takes NAME=VALUE pairs, comma-separated
MAX_SIZE = 2**62  # a dim's size; a tensor's bytes are checked against 64-bit offsets later


class _StoreOnce(argparse.Action):
    """A single-valued option given twice is an error, not "the last one wins"."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.dest in getattr(namespace, "_given", ()):
            several = f" (several as one comma-separated list: {option_string} A=..,B=..)" \
                if option_string in LISTED_OPTIONS else ""
            parser.error(f"argument {option_string}: given twice; give it once{several}")
        namespace._given = getattr(namespace, "_given", set()) | {self.dest}
        setattr(namespace, self.dest, values)


class KfcArgumentParser(argparse.ArgumentParser):
    """argparse with kfc's error form: `kfc COMMAND: error: what` and a hint, exit status 2;
    a single-valued option may be given once."""

    def add_argument(self, *args, **kwargs):
        if args and args[0].startswith("-") and kwargs.get("action") in (None, "store") and "nargs" not in kwargs:
            kwargs["action"] = _StoreOnce
        return super().add_argument(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse's hook
        sys.stderr.write(f"{self.prog}: error: {message}\nhint: `{self.prog} --help` lists every option with "
                         "its allowed values\n")
        sys.exit(2)


def assignments(text: str, what: str, example: str, check_value: Callable[[str, str], str | None]) -> dict[str, str]:
    """`A=1,B=2` as {A: "1", B: "2"}; each name once; `check_value(name, value)` returns a problem."""
    out: dict[str, str] = {}
    for part in text.split(","):
        name, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not name or not value:
            raise argparse.ArgumentTypeError(f"bad {what} {text!r}: write NAME=VALUE[,NAME=VALUE...], e.g. {example}")
        if not NAME.fullmatch(name):
            raise argparse.ArgumentTypeError(f"bad {what} {text!r}: {name!r} is not a name")
        if name in out:
            raise argparse.ArgumentTypeError(f"bad {what} {text!r}: {name} is given twice")
        problem = check_value(name, value)
        if problem:
            raise argparse.ArgumentTypeError(f"bad {what} {text!r}: {problem}")
        out[name] = value
    return out


def _size_problem(name: str, value: str) -> str | None:
    if not re.fullmatch(r"[0-9]+", value):
        return f"{name}={value}: a size is a whole number from 1 to 2**62"
    if not 1 <= int(value) <= MAX_SIZE:
        return f"{name}={value}: a size is from 1 to 2**62"
    return None


def shape(text: str) -> dict[str, int]:
    """`--shape M=4,N=7`: every size a whole number from 1 to 2**62, each dim once."""
    return {k: int(v) for k, v in assignments(text, "shape", "M=4,N=7", _size_problem).items()}


def dtypes(text: str) -> dict[str, str]:
    """`--dtype T=f16`: each type parameter once (the op says which dtypes or sizes it takes)."""
    from .ir.dtypes import DTYPE_NAMES  # lazy: pulls ml_dtypes (~2 s), kept off the parser's start-up

    def problem(name: str, value: str) -> str | None:
        if value in DTYPE_NAMES or value.isdigit():
            return None
        return f"{name}={value}: dtypes are {', '.join(DTYPE_NAMES)} (or a size, e.g. C=32)"

    return assignments(text, "--dtype", "T=f16", problem)


def int_in(lo: int, hi: int | None = None, what: str = "a whole number") -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            v = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{text} is out of range: allowed {_range(lo, hi)}")
        return v
    parse.__name__ = "integer"
    return parse


def float_in(lo: float, hi: float | None = None, lo_open: bool = True) -> Callable[[str], float]:
    """An argparse type: a finite number above lo (or at least lo when lo_open is False), at most hi."""
    def parse(text: str) -> float:
        try:
            v = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        bad_lo = v <= lo if lo_open else v < lo
        if not math.isfinite(v) or bad_lo or (hi is not None and v > hi):
            sign = ">" if lo_open else ">="
            raise argparse.ArgumentTypeError(f"{text} is out of range: allowed {sign} {lo:g}"
                                             + (f" and <= {hi:g}" if hi is not None else ""))
        return v
    parse.__name__ = "number"
    return parse


def _range(lo: int, hi: int | None) -> str:
    if hi == 2**63 - 1:
        return f"{lo} to 2**63 - 1"
    return f"{lo} to {hi}" if hi is not None else f"{lo} or more"


def target(text: str) -> str:
    """`--target`: one of the known targets (checked here so the error names them)."""
    t = text.strip().lower()
    if t not in KNOWN:
        raise argparse.ArgumentTypeError(f"unknown target {text!r}: targets are {', '.join(KNOWN)}")
    return t


def gpu_list(text: str) -> list[str] | None:
    """`--gpus 0,1`: distinct GPU indices; `--gpus all`: None, every visible GPU."""
    if text.strip().lower() == "all":
        return None
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not re.fullmatch(r"[0-9]+", p) for p in parts):
        raise argparse.ArgumentTypeError(f"bad --gpus {text!r}: write GPU indices, e.g. 0,1, or all")
    if len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(f"bad --gpus {text!r}: a GPU is listed twice")
    return parts


def gib(text: str) -> int:
    """A memory size in GiB (fractions allowed), as bytes: at least 1/16 GiB."""
    v = float_in(0.0625, 1 << 20, lo_open=False)(text)
    return int(v * (1 << 30))


def reference_limits(args):
    """The reference child's limits from --reference-timeout and --reference-memory (kfc check, kfc tune)."""
    return Limits(args.reference_timeout, args.reference_memory)
