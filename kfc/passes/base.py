"""What a pass is: a frozen attrs class whose fields are its typed options, declared with its
name, a one-line summary and the target features it needs (e.g. {"cluster"}):

    @define_pass("tile", "map the row loop onto CTAs, threads and vectors", requires=set())
    class Tile(Pass):
        rows: int = option(0, lo=0, hi=1024)
        def run(self, func, ctx): ...      # returns a new FuncOp

Options print and parse losslessly as `tile{rows=2,vec=8}`; only options that differ from their
default are printed. Each option declares its allowed values with `option(...)`: a value outside
them is refused with a message that names them (in a pipeline string and in Python alike).
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar, Iterable

import attrs

from ..diagnostics import InternalError, KfcError
from ..ir.func import FuncOp
from .context import PassContext

PASSES: dict[str, type["Pass"]] = {}


def register_pass(cls: type["Pass"]) -> type["Pass"]:
    """Add a pass class (already an attrs class) to the registry under its NAME."""
    if cls.NAME in PASSES:
        raise ValueError(f"pass {cls.NAME} registered twice")
    PASSES[cls.NAME] = cls
    return cls


def define_pass(name: str, summary: str, requires: Iterable[str] = ()):
    """Declare a pass: its name (as pipelines spell it), what it does in a line (`kfc passes`
    prints it), the target features it needs; the class becomes a frozen attrs class whose
    fields are its options, and is registered."""

    def declare(cls: type["Pass"]) -> type["Pass"]:
        cls.NAME, cls.SUMMARY, cls.REQUIRES = name, summary, frozenset(requires)
        return register_pass(attrs.frozen(cls))

    return declare


class PassError(KfcError):
    """A pass cannot apply (wrong IR, wrong target, bad options)."""


class PassCrashed(PassError, InternalError):
    """A pass raised something other than a KfcError: a bug in the pass."""


@attrs.frozen
class OptionRange:
    """The values an option takes: listed `choices`, or integers from `lo` to `hi`, optionally
    only 0 (choose automatically) and powers of two."""

    choices: tuple | None = None
    lo: int | None = None
    hi: int | None = None
    pow2: bool = False        # a power of two (or 0 when lo is 0: chosen by the pass)

    def allows(self, v) -> bool:
        if self.choices is not None:
            return v in self.choices
        if isinstance(v, bool) or not isinstance(v, int):
            return False
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            return False
        return not self.pow2 or v == 0 or v & (v - 1) == 0

    def values(self) -> tuple | None:
        """Every allowed value, when they are few enough to list."""
        if self.choices is not None:
            return self.choices
        if self.pow2 and self.lo is not None and self.hi is not None:
            out = [0] if self.lo == 0 else []
            out += [1 << k for k in range(self.hi.bit_length()) if max(self.lo, 1) <= 1 << k <= self.hi]
            return tuple(out)
        return None

    def describe(self) -> str:
        listed = self.values()
        if listed is not None:
            return "|".join(format_option(v) for v in listed)
        return f"{self.lo if self.lo is not None else '...'}..{self.hi if self.hi is not None else ''}"


def option(default, *, choices=None, lo: int | None = None, hi: int | None = None, pow2: bool = False):
    """A pass option with its allowed values (an attrs field whose validator enforces them)."""
    allowed = OptionRange(tuple(choices) if choices is not None else None, lo, hi, pow2)

    def validate(instance, attribute, value) -> None:
        if not allowed.allows(value):
            raise PassError(f"{type(instance).NAME}: {attribute.name}={format_option(value)} is not allowed",
                            hint=f"{attribute.name} takes {allowed.describe()}")

    return attrs.field(default=default, validator=validate, metadata={"range": allowed})


def option_range(field: attrs.Attribute) -> OptionRange | None:
    return field.metadata.get("range")


@attrs.frozen
class Pass:
    NAME: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""
    REQUIRES: ClassVar[frozenset[str]] = frozenset()

    def run(self, func: FuncOp, ctx: "PassContext") -> FuncOp:
        raise NotImplementedError(f"pass {self.NAME} does not implement run()")

    def required_features(self) -> frozenset[str]:
        """Target features this pass needs with these options (some depend on an option)."""
        return self.REQUIRES

    def spill_hint(self) -> str | None:
        """What to change in this pass's options when its kernel spills registers; None where
        the pass has no say in a thread's registers."""
        return None

    # --- options ----------------------------------------------------------------------------
    @classmethod
    def option_fields(cls) -> list[attrs.Attribute]:
        return list(attrs.fields(cls))

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in self.option_fields()}

    def non_default_options(self) -> dict[str, Any]:
        out = {}
        for f in self.option_fields():
            v = getattr(self, f.name)
            if f.default is attrs.NOTHING or v != f.default:
                out[f.name] = v
        return out

    def __str__(self) -> str:
        opts = self.non_default_options()
        if not opts:
            return self.NAME
        return self.NAME + "{" + ",".join(f"{k}={format_option(v)}" for k, v in opts.items()) + "}"

    @classmethod
    def describe_options(cls) -> str:
        parts = []
        for f in cls.option_fields():
            default = "" if f.default is attrs.NOTHING else f"={format_option(f.default)}"
            allowed = option_range(f)
            kind = allowed.describe() if allowed else ("true|false" if f.type in (bool, "bool") else _type_name(f.type))
            parts.append(f"{f.name}: {kind}{default}")
        return ", ".join(parts)


def format_option(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, enum.Enum):
        return str(v.value)
    return str(v)


def _type_name(t) -> str:
    return getattr(t, "__name__", str(t))


def convert_option(cls: type[Pass], name: str, text: str):
    """Turn an option's text into its field's type, or raise PassError saying what is allowed."""
    attrs.resolve_types(cls)  # `from __future__ import annotations` leaves field types as strings
    field = {f.name: f for f in attrs.fields(cls)}.get(name)
    if field is None:
        known = ", ".join(f.name for f in attrs.fields(cls)) or "none"
        raise PassError(f"pass {cls.NAME} has no option {name!r}", hint=f"its options are: {known}")
    t = field.type
    try:
        if t is bool:
            if text not in ("true", "false"):
                raise ValueError("expected true or false")
            value = text == "true"
        elif t is int:
            try:
                value = int(text)
            except ValueError:
                raise ValueError("not a whole number") from None
        elif t is float:
            try:
                value = float(text)
            except ValueError:
                raise ValueError("not a number") from None
        elif isinstance(t, type) and issubclass(t, enum.Enum):
            value = t(text)
        else:
            value = text
    except ValueError as e:
        allowed = f" ({', '.join(m.value for m in t)})" if isinstance(t, type) and issubclass(t, enum.Enum) else ""
        known = option_range(field)
        raise PassError(f"bad value {text!r} for {cls.NAME}'s option {name} ({_type_name(t)}){allowed}: {e}",
                        hint=f"{name} takes {known.describe()}" if known else None) from None
    return value
