"""What both kernel emitters (the row emitter, kfc.codegen.emitter, and the grid emitter,
kfc.codegen.grid_emitter) write through: fresh C names, a value's name, indented lines, and an
op written by its emission rule (kfc.codegen.rules)."""

from __future__ import annotations

from ..ir.core import Op, Value
from .errors import CodegenError
from .rules import rule_for


class CodeWriter:
    """The emitters give `span` (the elements of a row value a thread holds), `declare` (a
    value's C declaration) and `kind` (a value's form: "row", or a scalar form)."""

    names: dict[Value, str]
    int_constants: dict[Value, int]  # the integer constants written so far, by value (emit_const)
    lines: list[str]
    indent: int
    counter: int

    def fresh(self, hint: str = "v") -> str:
        self.counter += 1
        return f"{hint}{self.counter}"

    def name(self, v: Value) -> str:
        if v not in self.names:
            self.names[v] = self.fresh()
        return self.names[v]

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def emit_op(self, op: Op) -> None:
        """Write op through its emission rule."""
        emit = rule_for(op)
        if emit is None:
            raise CodegenError(f"codegen has no rule for {op.NAME}", op.loc,
                               "this op must be lowered by a pass before codegen")
        emit(self, op)

    def loop(self, body: str) -> None:
        """`body` for each element i a thread holds of a row value."""
        self.emit("#pragma unroll")
        self.emit(f"for (int i = 0; i < {self.span}; ++i) {{ {body} }}")

    def assign(self, op: Op, expr_of_i) -> None:
        """Result = f(element i) over a row, or once for scalars/lanes."""
        r = op.result
        n = self.declare(r)
        if self.kind(r) == "row":
            self.loop(f"{n}[i] = {expr_of_i('i')};")
        else:
            self.emit(f"{n} = {expr_of_i(None)};")
