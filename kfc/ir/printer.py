"""IR to text. Every op prints in one generic form, so any op a pass invents prints and parses:

    %r = tile.reduce %sq {axes = [0], kind = "mean"} : (f32[N]) -> f32
    tile.for %lo, %hi, %step, %S0 {
    ^(%t: index, %S: f32[K, V]):
      ...
      tile.yield %S2 : (f32[K, V]) -> ()
    } : (index, index, index, f32[K, V]) -> f32[K, V]

Names come from the values' hints, made unique with a `.N` suffix (a `.` never appears in a
`.kfc` identifier, so a suffixed name cannot collide with a source name); values without a
hint are numbered. Attributes equal to their declared default are left out.
"""

from __future__ import annotations

import attrs

from .attributes import format_attr
from .core import Block, Op, Value
from .func import FuncOp


class _Namer:
    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.counter = 0

    def name(self, v: Value) -> str:
        key = id(v)
        if key in self.names:
            return self.names[key]
        if v.name:
            base = v.name
            cand = base
            n = 1
            while cand in self.used:
                cand = f"{base}.{n}"
                n += 1
        else:
            while str(self.counter) in self.used:
                self.counter += 1
            cand = str(self.counter)
            self.counter += 1
        self.used.add(cand)
        self.names[key] = cand
        return cand

    def ref(self, v: Value) -> str:
        """A use: the value must have been named at its definition."""
        if id(v) not in self.names:
            return f"%<undefined:{v.name or '?'}>"
        return "%" + self.names[id(v)]


def _attr_items(op: Op) -> list[tuple[str, object]]:
    items = []
    for f in op.attr_fields():
        value = getattr(op, f.name)
        if f.default is not attrs.NOTHING:
            default = f.default
            if f.converter is not None:
                try:
                    default = f.converter(default)
                except Exception:  # noqa: BLE001 - a default that does not convert is simply printed
                    pass
            if type(value) is type(default) and value == default:
                continue
        items.append((f.name, value))
    return items


def _types(vals) -> str:
    return ", ".join(str(v.type) for v in vals)


class Printer:
    def __init__(self, indent: str = "  ") -> None:
        self.indent = indent
        self.namer = _Namer()
        self.lines: list[str] = []

    def print_func(self, f: FuncOp) -> str:
        params = []
        defaults = dict(f.defaults)
        for v in f.inputs:
            s = f"%{self.namer.name(v)}: {v.type}"
            if v.name in defaults:
                s += f" = {format_attr(defaults[v.name])}"
            params.append(s)
        outs = [f"%{self.namer.name(v)}: {v.type}" for v in f.outputs]
        self.lines.append(f"kfc.func @{f.sym_name}({', '.join(params)}) -> ({', '.join(outs)}) {{")
        for op in f.body.ops:
            self.print_op(op, 1)
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def print_op(self, op: Op, depth: int) -> None:
        pad = self.indent * depth
        head = ""
        if op.results:
            head = ", ".join("%" + self.namer.name(r) for r in op.results) + " = "
        text = head + op.NAME
        if op.operands:
            text += " " + ", ".join(self.namer.ref(v) for v in op.operands)
        items = _attr_items(op)
        if items:
            text += " {" + ", ".join(f"{k} = {format_attr(v)}" for k, v in items) + "}"
        sig = f" : ({_types(op.operands)}) -> "
        sig += str(op.results[0].type) if len(op.results) == 1 else f"({_types(op.results)})"
        if not op.regions:
            self.lines.append(pad + text + sig)
            return
        for i, region in enumerate(op.regions):
            self.lines.append(pad + text + " {" if i == 0 else pad + "} {")
            self.print_block(region, depth)
        self.lines.append(pad + "}" + sig)

    def print_block(self, block: Block, depth: int) -> None:
        pad = self.indent * depth
        args = ", ".join(f"%{self.namer.name(a)}: {a.type}" for a in block.args)
        self.lines.append(f"{pad}^({args}):")
        for op in block.ops:
            self.print_op(op, depth + 1)


def print_ir(f: FuncOp) -> str:
    return Printer().print_func(f)
