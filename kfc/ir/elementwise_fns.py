"""The numpy functions behind the elementwise ops' interpretation (kfc.ir.tile_ops): each unary,
binary and comparison op's name to what it computes on arrays of its compute dtype."""

from __future__ import annotations

from typing import Callable

import numpy as np


def _sigmoid(x):
    e = np.exp(-np.abs(x))  # never overflows; keeps relative precision for x << 0
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _rsqrt(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(x)


def _rcp(x):
    with np.errstate(divide="ignore"):
        return 1.0 / x


def _not(x):
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


UNARY_FNS: dict[str, Callable] = {
    "neg": np.negative, "abs": np.abs, "not": _not, "exp": np.exp, "exp2": np.exp2, "log": np.log,
    "log2": np.log2, "sqrt": np.sqrt, "rsqrt": _rsqrt, "rcp": _rcp, "sigmoid": _sigmoid,
    "softplus": lambda x: np.logaddexp(np.zeros_like(x), x), "tanh": np.tanh,
    "round": np.rint,  # half to even, as torch.round
}


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        if np.any(b == 0):
            raise ZeroDivisionError("integer division by zero")
        return np.floor_divide(a, b)
    return np.true_divide(a, b)


def _rem(a, b):
    if np.issubdtype(a.dtype, np.integer) and np.any(b == 0):
        raise ZeroDivisionError("integer remainder by zero")
    return np.mod(a, b)


def _logical(fn_bool, fn_int):
    return lambda a, b: fn_bool(a, b) if a.dtype == np.bool_ else fn_int(a, b)


BINARY_FNS: dict[str, Callable] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "rem": _rem,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
    "and": _logical(np.logical_and, np.bitwise_and), "or": _logical(np.logical_or, np.bitwise_or),
    "xor": _logical(np.logical_xor, np.bitwise_xor),
}
CMP_FNS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
           "eq": np.equal, "ne": np.not_equal}
