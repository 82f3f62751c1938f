"""Random input generators named in a check block's `inputs = {...}`.

Every generator draws fresh values from the given numpy Generator; none ever returns all
zeros (zeros hide unwritten outputs and wrong indexing).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import attrs
import numpy as np

from ..ir.dtypes import DType
from ..ir.types import TensorType


@attrs.frozen
class Generator:
    name: str
    usage: str
    fn: Callable[..., np.ndarray]
    max_args: int
    wants: str = "float"  # float | int | any
    min_args: int = 0  # the arguments without a default (offsets' TOTAL)

    def check_args(self, args: tuple[Any, ...], t: TensorType, symbols: set[str]) -> str | None:
        if len(args) < self.min_args:
            return f"needs at least {self.min_args} argument(s), got {len(args)}"
        if len(args) > self.max_args:
            return f"takes at most {self.max_args} argument(s), got {len(args)}"
        for a in args:
            if isinstance(a, bool) or (isinstance(a, float) and not math.isfinite(a)):
                return f"its arguments are finite numbers or dimension names, not {a!r}"
        numbers = [a for a in args if not isinstance(a, str)]
        if self.name in ("uniform", "randint") and len(numbers) == 2 and not numbers[0] < numbers[1]:
            return f"needs lo < hi, got lo={numbers[0]}, hi={numbers[1]}"
        if self.name in ("normal", "logsigmoid", "sigmoid", "logsigmoid_resets") and len(args) >= 2 \
                and not isinstance(args[1], str) and not args[1] > 0:
            return f"needs a positive std, got {args[1]}"
        if self.name == "logsigmoid_resets" and len(args) >= 3 and not isinstance(args[2], str) \
                and not 0 <= args[2] <= 1:
            return f"needs a fraction p in [0, 1], got {args[2]}"
        if self.name == "logsigmoid_resets" and len(args) == 4 and not isinstance(args[3], str) and args[3] > 0:
            return f"sets a log-space decay, <= 0, not {args[3]}"
        if self.name == "softmax" and args and not isinstance(args[0], str) and not args[0] > 0:
            return f"needs a positive std, got {args[0]}"
        if self.name == "randint" and any(isinstance(a, float) for a in args):
            return "draws integers: its bounds are integers"
        if self.name == "offsets" and args and not isinstance(args[0], str) and args[0] < 0:
            return f"needs a total of 0 or more, got {args[0]}"
        if self.wants == "float" and not t.dtype.is_float:
            return f"draws floating-point values but the input is {t.dtype}"
        if self.wants == "int" and not t.dtype.is_int:
            return f"draws integers but the input is {t.dtype}"
        if self.name == "offsets" and t.rank != 1:
            return f"makes a 1-D offsets tensor but the input has {t.rank} dims"
        return None

    def draw(self, rng: np.random.Generator, shape: tuple[int, ...], dtype: DType, dims: dict[str, int],
             args: tuple[Any, ...]) -> np.ndarray:
        """Fresh values; ValueError (with what is wrong) where the arguments, once the dims are
        known, do not make sense (randint(N, 8) at N = 9)."""
        resolved = tuple(dims[a] if isinstance(a, str) else a for a in args)
        problem = self.check_args(resolved, TensorType(dtype, shape), set())
        if problem:
            raise ValueError(f"{self.name}{resolved}: {problem}")
        out = np.asarray(self.fn(rng, shape, *resolved))
        return out.astype(dtype.np)


def _normal(rng, shape, mean=0.0, std=1.0):
    return rng.normal(mean, std, size=shape)


def _uniform(rng, shape, lo=0.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape)


def _logsigmoid(rng, shape, mean=0.0, std=1.0):
    x = rng.normal(mean, std, size=shape)
    return -np.logaddexp(0.0, -x)  # log(sigmoid(x)) <= 0: a decay in log space


def _logsigmoid_resets(rng, shape, mean=0.0, std=1.0, p=0.02, value=-1e5):
    """logsigmoid(mean, std) with a fraction p of the entries `value`: a gate that wipes what it
    decays (-1e5 is exp(-1e5) = 0 in any float type)."""
    out = _logsigmoid(rng, shape, mean, std)
    out[rng.random(size=shape) < p] = value
    return out


def _sigmoid(rng, shape, mean=0.0, std=1.0):
    return 1.0 / (1.0 + np.exp(-rng.normal(mean, std, size=shape)))


def _unit(rng, shape):
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _softmax(rng, shape, std=1.0):
    x = rng.normal(0.0, std, size=shape)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _randint(rng, shape, lo=0, hi=100):
    return rng.integers(lo, hi, size=shape)


def _offsets(rng, shape, total):
    """Sorted sequence boundaries 0 = o[0] <= ... <= o[n] = total for n = shape[0] - 1
    sequences, with lengths spread unevenly (and non-empty whenever total allows)."""
    n = shape[0] - 1
    if n < 1:
        return np.zeros(shape, dtype=np.int64)
    if total >= n:
        cuts = np.sort(rng.choice(np.arange(1, total), size=n - 1, replace=False)) if n > 1 else np.array([], int)
    else:
        cuts = np.sort(rng.integers(0, total + 1, size=n - 1))
    return np.concatenate([[0], cuts, [total]])


GENERATORS: dict[str, Generator] = {g.name: g for g in [
    Generator("normal", "normal(mean=0, std=1)", _normal, 2),
    Generator("uniform", "uniform(lo=0, hi=1)", _uniform, 2),
    Generator("logsigmoid", "logsigmoid(mean=0, std=1): log(sigmoid(normal(mean, std))), a log-space decay <= 0",
              _logsigmoid, 2),
    Generator("logsigmoid_resets", "logsigmoid_resets(mean=0, std=1, p=0.02, value=-1e5): logsigmoid(mean, std) "
              "with a fraction p of the entries set to value, a reset gate", _logsigmoid_resets, 4),
    Generator("sigmoid", "sigmoid(mean=0, std=1): sigmoid(normal(mean, std)), in (0, 1)", _sigmoid, 2),
    Generator("softmax", "softmax(std=1): rows of softmax(normal(0, std)) along the last dim, each summing to 1",
              _softmax, 1),
    Generator("unit", "unit(): normal rows scaled to unit L2 norm along the last dim", _unit, 0),
    Generator("randint", "randint(lo=0, hi=100): integers in [lo, hi)", _randint, 2, wants="int"),
    Generator("offsets", "offsets(TOTAL): cu_seqlens-style boundaries from 0 to TOTAL", _offsets, 1, wants="int",
              min_args=1),
]}


def default_generator(t: TensorType) -> tuple[str, tuple]:
    if t.dtype.is_float:
        return "normal", ()
    if t.dtype.is_bool:
        return "bool", ()
    return "randint", (0, 100)


def draw_default(rng: np.random.Generator, t: TensorType, shape: tuple[int, ...]) -> np.ndarray:
    if t.dtype.is_bool:
        return rng.random(size=shape) < 0.5
    name, args = default_generator(t)
    return GENERATORS[name].draw(rng, shape, t.dtype, {}, args)
