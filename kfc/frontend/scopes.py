"""Names in scope while lowering: the frames of the op body, its loops and branches, and the
rules for looking a name up (locals, parameters, dims) and assigning one."""

from __future__ import annotations

import difflib
from typing import Any

import attrs

from ..diagnostics import Span
from ..ir.core import Value
from ..ir.types import MemSpace
from .calls import BUILTIN_NAMES
from .values import Tensor


# names people reach for to write a non-finite value, which the language does not spell
NON_FINITE = frozenset({"nan", "inf", "infinity"})


@attrs.define
class Frame:
    """One scope. Loop bodies are frames whose assignments may not reach outer names."""

    kind: str  # "func" | "parallel" | "for"
    names: dict[str, Value] = attrs.Factory(dict)
    carried: tuple[str, ...] = ()
    assigned_at: dict[str, Span] = attrs.Factory(dict)
    indices: frozenset[str] = frozenset()  # the loop's index names: fixed for an iteration
    # a parallel loop's sums across its iterations: output name -> (contribution, statement)
    accumulated: dict[str, tuple[Value, Any]] = attrs.Factory(dict)


class ScopeLowering:
    """Looking names up and binding them, on the Lowerer's frames, parameters and dims."""

    def lookup(self, name: str, node):
        for frame in reversed(self.frames):
            if name in frame.names:
                v = frame.names[name]  # a scratch tensor is indexed as an argument is
                return Tensor(v) if isinstance(v, Value) and v.ttype.space is MemSpace.GLOBAL else v
        if name in self.params:
            v = self.params[name]
            if name in self.outputs:
                self.touch(name, node)
            return Tensor(v) if v.ttype.space is not MemSpace.REG else v
        if name in self.symbols:
            with self.b.at(self.span(node)):
                return self.b.dim(name)
        if name in self.size_vars:  # a size type parameter: the constant it is bound to
            return self.size_vars[name]
        hint = None
        known = [n for f in self.frames for n in f.names] + list(self.params) + list(self.symbols) + list(self.size_vars)
        close = [k for k in known if k.lower() == name.lower() or (len(name) > 2 and k.startswith(name[:3]))] \
            or difflib.get_close_matches(name, known, 1, 0.6)
        if name.lower() in NON_FINITE and name not in known:
            hint = ("the language has no NaN or infinity literal: mask with where(...), or start a max with the "
                    "dtype's lowest finite value, e.g. -3.0e38 for f32")
        elif close:
            hint = f"did you mean {close[0]}?"
        elif name in BUILTIN_NAMES:
            hint = f"{name} is a function; call it, e.g. {name}(...)"
        if hint is None:
            shown = list(dict.fromkeys(known))
            hint = "assign it before use" + (f"; in scope here: {', '.join(shown[:12])}" if shown else "") \
                + (", ..." if len(shown) > 12 else "")
        raise self.err(node, f"unknown name '{name}'", hint)

    def new_index(self, tok) -> str:
        """A loop index's name, refused where it would hide a name already in scope."""
        name = str(tok)
        what = ("a parameter" if name in self.params else "a dimension" if name in self.symbols
                else "an enclosing loop's index" if any(name in f.indices for f in self.frames)
                else "a value" if any(name in f.names for f in self.frames) else None)
        if what:
            raise self.err(tok, f"the loop index '{name}' already names {what}", "choose a new name for the index")
        return name

    def assign(self, name: str, value: Value, node) -> None:
        if name in self.params:
            if name in self.outputs:
                raise AssertionError("whole-tensor stores are handled by the caller")
            kind = "tensor" if self.params[name].ttype.space is not MemSpace.REG else "scalar"
            raise self.err(node, f"cannot assign to the input {kind} '{name}'; inputs are read-only",
                           "choose a new name for the value")
        if name in self.symbols:
            raise self.err(node, f"cannot assign to the dimension '{name}'",
                           "dimensions are fixed by the input shapes; choose a new name for the value")
        frame = self.frames[-1]
        if any(name in f.indices for f in self.frames):
            raise self.err(node, f"'{name}' is a loop index and cannot be assigned",
                           "choose a new name for the value")
        if name not in frame.names and frame.kind != "if":  # a branch may assign outer names: the if's results
            for outer in reversed(self.frames[:-1]):
                if name in outer.names:
                    if frame.kind == "for":
                        raise self.err(node, f"'{name}' is defined outside this loop and assigned inside it",
                                       f"to update it on every iteration, carry it: carry ({name})")
                    raise self.err(node, f"'{name}' is defined outside this parallel loop and cannot be "
                                         "reassigned inside it (iterations are independent)",
                                   "use a new name inside the loop")
        frame.names[name] = self.b.name_value(value, name)
        frame.assigned_at[name] = self.span(node)
