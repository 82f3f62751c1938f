"""The `.kfc` front end: lark grammar (grammars/kfc.lark) to typed tile IR plus requirements."""

from __future__ import annotations

from pathlib import Path

from ..diagnostics import KfcError, read_source
from ..ir.func import FuncOp
from ..ir.parser import parse_ir
from ..ir.verifier import check_as_written, verify
from ..model.spec import OpSpec
from .spec import instances, instantiate, load_kfc, looks_like_ir, parse_kfc

__all__ = ["instances", "instantiate", "load_kfc", "parse_kfc", "load_func", "looks_like_ir"]


def load_func(path: str | Path, dtypes: dict[str, str] | None = None) -> tuple[FuncOp, OpSpec | None]:
    """Read a `.kfc` file or IR text; return the verified function and, for `.kfc`, its spec."""
    text = read_source(path, "a .kfc file or IR text")
    if looks_like_ir(text):
        if dtypes:
            raise KfcError("--dtype applies to .kfc files; IR text has its types fixed")
        return check_as_written(verify(parse_ir(text, str(path)))), None
    spec = parse_kfc(text, str(path), dtypes)
    return spec.func, spec
