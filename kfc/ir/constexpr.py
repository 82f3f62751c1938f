"""Constant expressions over shape symbols, e.g. a default `scale = K ** -0.5`.

Evaluated with Python's own parser, restricted to numbers, symbol names, arithmetic and a few
math functions, so nothing but arithmetic can run.
"""

from __future__ import annotations

import ast
import math
import operator

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: lambda a, b: power(a, b),
}
_FUNCS = {
    "sqrt": math.sqrt, "rsqrt": lambda x: 1.0 / math.sqrt(x), "exp": math.exp, "log": math.log,
    "min": min, "max": max, "abs": abs, "f32": float, "f64": float, "float": float, "int": int,
}


class ConstExprError(ValueError):
    pass


def symbols_of(text: str) -> set[str]:  # ast.walk is iterative: any depth
    tree = _parse(text)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in _FUNCS}


MAX_TEXT = 4096      # characters of one constant expression
INT_LIMIT = 2**63    # integers stay 64-bit: a result beyond is an error, not a huge number


def evaluate(text: str, env: dict[str, int | float]) -> int | float:
    try:
        return _eval(_parse(text).body, env)
    except (ZeroDivisionError, OverflowError, ValueError, TypeError) as e:
        if isinstance(e, ConstExprError):
            raise
        # float overflow's text is an errno tuple, (34, 'Numerical result out of range')
        why = "its value is too large for any float type" if isinstance(e, OverflowError) else str(e)
        raise ConstExprError(f"{_short(text)!r} cannot be evaluated: {why}") from None
    except RecursionError:
        raise ConstExprError(f"{_short(text)!r} is nested too deeply to evaluate") from None


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _parse(text: str) -> ast.Expression:
    if len(text) > MAX_TEXT:
        raise ConstExprError(f"a constant expression of {len(text)} characters is longer than the "
                             f"{MAX_TEXT} kfc reads")
    try:
        return ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ConstExprError(f"not a constant expression: {_short(text)!r} ({e.msg})") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise ConstExprError(f"not a constant expression: {_short(text)!r} ({type(e).__name__})") from None


def power(a, b):
    """a ** b, refusing integer powers that would leave 64 bits (before computing them)."""
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and b > 0 and abs(a) > 1:
        if b * (abs(a).bit_length() - 1) >= 63:
            raise OverflowError(f"{a} ** {b} does not fit in 64 bits")
    return checked(a ** b)


def checked(v):
    """An integer result within 64 bits (floats overflow to errors of their own)."""
    if isinstance(v, int) and not isinstance(v, bool) and not -INT_LIMIT <= v < INT_LIMIT:
        raise OverflowError("the result does not fit in 64 bits")
    if isinstance(v, complex):
        raise ValueError("the result is complex")
    return v


def _eval(node, env):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ConstExprError(f"unknown name {node.id!r} in a constant expression")
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return checked(_BINOPS[type(node.op)](_eval(node.left, env), _eval(node.right, env)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, env)
        return -v if isinstance(node.op, ast.USub) else v
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and not node.keywords):
        return _FUNCS[node.func.id](*[_eval(a, env) for a in node.args])
    raise ConstExprError(f"not allowed in a constant expression: {ast.unparse(node)!r}")
