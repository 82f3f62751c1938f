"""Load the lark grammars, from the source tree's `grammars/` or the installed package."""

from __future__ import annotations

import difflib
import functools
import re
from importlib import resources
from pathlib import Path

import lark

from .diagnostics import KfcError, Span

_SOURCE_DIR = Path(__file__).resolve().parent.parent / "grammars"


def grammar_text(name: str) -> str:
    path = _SOURCE_DIR / name
    if path.is_file():
        return path.read_text()
    return resources.files("kfc.grammars").joinpath(name).read_text()


@functools.cache
def lalr_parser(name: str, postlex=None) -> lark.Lark:
    """An LALR parser for the grammar file `name`, built once per process (and its tables cached
    on disk by lark, keyed by the grammar's hash, so a new process starts fast)."""
    options = dict(parser="lalr", lexer="contextual", propagate_positions=True, maybe_placeholders=True,
                   postlex=postlex)
    try:
        return lark.Lark(grammar_text(name), cache=True, **options)
    except OSError:  # an unwritable temp dir only costs the cache
        return lark.Lark(grammar_text(name), **options)


_FRIENDLY = {
    "NAME": "a name", "INT": "an integer", "NUMBER": "a number", "FLOAT": "a number",
    "SIGNED_INT": "an integer", "SIGNED_FLOAT": "a number", "STRING": "a string",
    "VALUE": "a %value", "OPNAME": "an op name", "$END": "the end of the file",
}


def describe_terminal(parser: lark.Lark, name: str) -> str:
    if name in _FRIENDLY:
        return _FRIENDLY[name]
    try:
        term = parser.get_terminal(name)
    except KeyError:
        return name.lower()
    if term.pattern.type == "str":
        return repr(term.pattern.value)
    return name.lower().replace("_", " ")


def _keyword_typo(parser: lark.Lark, before: str, here: str) -> str | None:
    """The keyword a statement's first word misspells (`paralel m in ...`): the word alone
    before the unexpected name, close to one of the grammar's keywords and not one itself."""
    m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s+", before)
    if not m or not re.match(r"[A-Za-z_]", here):
        return None
    keywords = [t.pattern.value for t in parser.terminals
                if t.pattern.type == "str" and re.fullmatch(r"[a-z]{2,}", t.pattern.value)]
    if m.group(1) in keywords:
        return None
    close = difflib.get_close_matches(m.group(1), keywords, 1, 0.6)
    return close[0] if close else None


def syntax_error(e: lark.exceptions.UnexpectedInput, parser: lark.Lark, file: str, text: str):
    """Turn a lark error into a KfcError pointing at the offending token."""
    # lark counts lines by "\n" alone; str.splitlines would also split at "\r" and others
    lines = text.split("\n")
    line = getattr(e, "line", None) or 1
    col = getattr(e, "column", None) or 1
    if line < 1:  # lark reports -1 at end of input
        line, col = len(lines), len(lines[-1]) + 1
    here = lines[line - 1][col - 1:] if line - 1 < len(lines) else ""
    expected = sorted({describe_terminal(parser, t) for t in (getattr(e, "expected", None) or getattr(e, "allowed", None) or [])})
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        ch = here[:1] or "?"
        msg = f"unexpected character {ch!r}"
        span = Span(file, line, col, line, col + 1)
    elif isinstance(e, lark.exceptions.UnexpectedEOF) or getattr(getattr(e, "token", None), "type", "") == "$END":
        msg = "unexpected end of file"
        # point just past the last thing written, not at the last token or a trailing blank line
        body = text.rstrip()
        line = body.count("\n") + 1
        col = len(body) - (body.rfind("\n") + 1) + 1
        span = Span(file, line, col, line, col + 1)
    else:
        tok = e.token
        shown = str(tok) if str(tok) else tok.type
        msg = f"unexpected {shown!r}"
        span = Span(file, line, col, getattr(tok, "end_line", line) or line,
                    getattr(tok, "end_column", col + len(shown)) or col + len(shown))
    hint = None
    if expected:
        shown = expected if len(expected) <= 8 else expected[:8] + ["..."]
        hint = "expected " + (shown[0] if len(shown) == 1 else "one of " + ", ".join(shown))
        if msg == "unexpected end of file" and "'}'" in expected:
            hint = "is a closing '}' missing? " + hint
    typo = _keyword_typo(parser, lines[line - 1][:col - 1] if line - 1 < len(lines) else "", here)
    if typo:
        hint = f"did you mean '{typo}'? " + (hint or "")
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        foreign = not any(re.match(t.pattern.to_regexp(), here) for t in parser.terminals)
        if foreign and ch in "\"'":
            msg = "unterminated string"
            hint = f"close it with {ch} on the same line (\"\"\"...\"\"\" may span lines)"
        elif foreign:
            hint = f"{ch!r} is not part of the language; remove or replace it" + (f" ({hint})" if hint else "")
    return KfcError(f"syntax error: {msg}", span, hint)


MAX_NESTING = 200  # levels: each call, parenthesis, index, block and operator; a chain `a + b + c ...` is one


def check_nesting(tree: lark.Tree, file: str, chains: frozenset[str] = frozenset(), limit: int = MAX_NESTING,
                  free: frozenset[str] = frozenset()) -> None:
    """Refuse input nested deeper than `limit` (iteratively: no recursion limit is ever met).
    A node of a left-associative chain kind whose first child has a chain kind too counts as
    the same level, so flat sums and products of any length pass; a node of a `free` kind (the
    grammar's wrappers: a call's argument list, an index, a statement around its block) adds
    no level of its own."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            m = node.meta
            span = None if getattr(m, "empty", True) else Span(file, m.line, m.column, m.end_line, m.end_column)
            raise KfcError(f"the text nests more than {limit} levels deep here (each call, parenthesis, index, block "
                           "and operator counts one); kfc reads no deeper", span,
                           "name intermediate values (t = ...) instead of nesting expressions this deeply")
        for i, child in enumerate(node.children):
            if isinstance(child, lark.Tree):
                same = (i == 0 and node.data in chains and child.data in chains) or child.data in free
                stack.append((child, depth if same else depth + 1))


def without(tree: lark.Tree, kind: str) -> lark.Tree:
    """The tree with every node of `kind` replaced by its only child (iteratively: parentheses
    count as nesting, then leave nothing behind for the lowering to walk)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for i, child in enumerate(node.children):
            while isinstance(child, lark.Tree) and child.data == kind:
                child = child.children[0]
            node.children[i] = child
            if isinstance(child, lark.Tree):
                stack.append(child)
    return tree
