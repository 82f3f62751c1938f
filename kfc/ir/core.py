"""The IR's building blocks: SSA values, blocks, and the frozen op base class.

IR objects never change after construction: a pass builds new ops (see kfc.ir.rewrite). Values
compare by identity. An op class is declared with `define_op` (its name, traits and operand and
result counts) and declares its attributes as attrs fields; everything else an op has
(operands, results, regions, the source span) lives on this base class, so the generic printer
and parser handle every op the same way:

    @define_op("tile.broadcast", traits={"pure"}, operands=1, results=1)
    class BroadcastOp(Op):
        def verify_(self) -> None:  # what the counts do not say
            ...
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterable, Iterator

import attrs

from ..diagnostics import Span, VerifyError
from .types import TensorType, Type


@attrs.frozen(eq=False)
class Value:
    """An SSA value. `name` is a hint for printing; identity is the object."""

    type: Type
    name: str | None = None
    loc: Span | None = None  # where a function argument's type is written (for errors about its dims)

    @property
    def ttype(self) -> TensorType:
        assert isinstance(self.type, TensorType), self.type
        return self.type

    def __repr__(self) -> str:
        return f"<Value %{self.name or '?'}: {self.type}>"


@attrs.frozen(eq=False)
class Block:
    """A single-block region: arguments and a straight-line list of ops."""

    args: tuple[Value, ...] = attrs.field(default=(), converter=tuple)
    ops: tuple["Op", ...] = attrs.field(default=(), converter=tuple)


OP_REGISTRY: dict[str, type["Op"]] = {}

_BASE_FIELDS = ("operands", "results", "regions", "loc")

_INHERIT: Any = object()  # a count define_op is not given: the one the op's base class declares


def define_op(name: str, *, traits: Iterable[str] | None = None, operands: int | None = _INHERIT,
              results: int | None = _INHERIT) -> Callable[[type["Op"]], type["Op"]]:
    """Declare an op class: set its NAME, TRAITS and operand and result counts (None: not fixed,
    its verify_ checks them; the verifier checks fixed ones before verify_), make it a frozen
    attrs class, and register it under `name` (in declaration order; a name taken raises).
    Traits and counts left out are those of the class it derives from, as for one that
    refines another op."""

    def declare(cls: type["Op"]) -> type["Op"]:
        if name in OP_REGISTRY:
            raise ValueError(f"op {name} registered twice")
        cls = attrs.frozen(eq=False, kw_only=True)(cls)
        cls.NAME = name
        if traits is not None:
            cls.TRAITS = frozenset(traits)
        if operands is not _INHERIT:
            cls.OPERANDS = operands
        if results is not _INHERIT:
            cls.RESULTS = results
        OP_REGISTRY[name] = cls
        return cls

    return declare


@attrs.frozen(eq=False, kw_only=True)
class Op:
    NAME: ClassVar[str] = ""
    # pure: no side effects; elementwise: acts per element; terminator: ends a block;
    # loop: owns a region that runs many times; writes_memory: stores to a tensor
    TRAITS: ClassVar[frozenset[str]] = frozenset()
    # The op this one refines (a pass's lowering of it, same semantics, more decided): ptx.ld
    # refines tile.load. A pass that rewrites tile.load asks `LoadOp.unrefined(op)`.
    REFINES: ClassVar[type["Op"] | None] = None
    # how many operands and results the op takes, None where that varies (see define_op)
    OPERANDS: ClassVar[int | None] = None
    RESULTS: ClassVar[int | None] = None

    operands: tuple[Value, ...] = attrs.field(default=(), converter=tuple)
    results: tuple[Value, ...] = attrs.field(default=(), converter=tuple)
    regions: tuple[Block, ...] = attrs.field(default=(), converter=tuple)
    loc: Span | None = None

    # --- schema -------------------------------------------------------------------------
    @classmethod
    def attr_fields(cls) -> list[attrs.Attribute]:
        return [f for f in attrs.fields(cls) if f.name not in _BASE_FIELDS]

    def attributes(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in self.attr_fields()}

    @classmethod
    def infer_result_types(cls, operand_types: list[Type], attributes: dict[str, Any]) -> list[Type] | None:
        """Result types implied by operands and attributes, or None when the op's result
        type is a free choice (a constant's, a cast's). Builders use it; the verifier
        checks parsed IR against it."""
        return None

    def verify_(self) -> None:
        """Op-specific invariants beyond the declared counts; raise through `self.error`."""

    @classmethod
    def unrefined(cls, op: "Op") -> bool:
        """Whether `op` is this kind of op as no pass has refined it yet: an instance of `cls`,
        and no class between its own and `cls` declares that it refines another."""
        if not isinstance(op, cls):
            return False
        return not any(c.__dict__.get("REFINES") for c in type(op).__mro__ if c is not cls and issubclass(c, cls))

    # --- conveniences -------------------------------------------------------------------
    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"{self.NAME} has {len(self.results)} results")
        return self.results[0]

    def has_trait(self, trait: str) -> bool:
        return trait in self.TRAITS

    def error(self, message: str, hint: str | None = None) -> VerifyError:
        return VerifyError(f"{self.NAME}: {message}", self.loc, hint)

    def walk(self) -> Iterator["Op"]:
        """This op, then every op nested in its regions, in program order."""
        yield self
        for region in self.regions:
            for op in region.ops:
                yield from op.walk()

    def evolve(self, **changes) -> "Op":
        return attrs.evolve(self, **changes)

    def operand_types(self) -> list[TensorType]:
        return [v.type for v in self.operands]

    def __repr__(self) -> str:
        return f"<{self.NAME} at {self.loc}>"


def walk_block(block: Block) -> Iterator[Op]:
    for op in block.ops:
        yield from op.walk()
