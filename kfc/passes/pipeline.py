"""Pipeline strings: `canonicalize,tile{rows=2,vec=8},cluster{n=4},lower-ptx`.

`parse_pipeline` and `str(Pipeline)` are inverses on canonical text (options in declaration
order, defaults left out); any accepted text prints canonically.
"""

from __future__ import annotations

import difflib
import re

import attrs

from .base import PASSES, Pass, PassError, convert_option

_ITEM = re.compile(r"\s*([A-Za-z][\w-]*)\s*(\{([^{}]*)\})?\s*")


@attrs.frozen
class Pipeline:
    passes: tuple[Pass, ...] = ()

    def __str__(self) -> str:
        return ",".join(str(p) for p in self.passes)

    def __iter__(self):
        return iter(self.passes)

    def __len__(self) -> int:
        return len(self.passes)

    def __add__(self, other: "Pipeline") -> "Pipeline":
        return Pipeline(self.passes + other.passes)


def parse_user_pipeline(text: str) -> Pipeline:
    """A pipeline a user wrote (-p): its errors name the pipeline they are in."""
    try:
        return parse_pipeline(text)
    except PassError as e:
        raise PassError(f"in the pipeline {text.strip()!r}: {e.message}", e.span, e.hint) from None


def parse_pipeline(text: str) -> Pipeline:
    passes = []
    pos = 0
    text = text.strip()
    if not text:
        return Pipeline()
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if m is None or m.end() == pos:
            raise PassError(f"bad pipeline at column {pos + 1}: {text[pos:pos + 20]!r}",
                            hint='write passes separated by commas, options in braces: "canonicalize,tile{rows=2}"')
        name, opts = m.group(1), m.group(3)
        cls = PASSES.get(name)
        if cls is None:
            close = difflib.get_close_matches(name, list(PASSES), 1, 0.6)
            raise PassError(f"unknown pass {name!r}",
                            hint=(f"did you mean {close[0]}? " if close else "") + "`kfc passes` lists them")
        kwargs = {}
        if opts is not None and opts.strip():
            for item in opts.split(","):
                key, eq, value = item.partition("=")
                key, value = key.strip(), value.strip()
                if not eq or not key or not value:
                    raise PassError(f"bad option {item.strip()!r} for pass {name}", hint="options are key=value")
                if key in kwargs:
                    raise PassError(f"option {key} given twice for pass {name}")
                kwargs[key] = convert_option(cls, key, value)
        try:
            passes.append(cls(**kwargs))
        except PassError:
            raise
        except (TypeError, ValueError) as e:
            raise PassError(f"bad options for pass {name}: {e}", hint=f"its options: {cls.describe_options()}") from None
        pos = m.end()
        if pos < len(text):
            if text[pos] == "{" and "}" not in text[pos:]:
                raise PassError(f"bad pipeline at column {pos + 1}: {name}'s options open a brace that never closes",
                                hint=f'close it: "{name}{{key=value,...}}"')
            if text[pos] == "}":
                raise PassError(f"bad pipeline at column {pos + 1}: a closing brace with none open",
                                hint="options are in one pair of braces after the pass's name: \"tile{rows=2}\"")
            if text[pos] != ",":
                raise PassError(f"bad pipeline at column {pos + 1}: expected ',' before {text[pos:pos + 20]!r}",
                                hint='write passes separated by commas, options in braces: "canonicalize,tile{rows=2}"')
            pos += 1
            if pos >= len(text) or not text[pos:].strip():
                raise PassError("the pipeline ends with a comma")
    return Pipeline(tuple(passes))
