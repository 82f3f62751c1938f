"""Inputs for the front-end fuzzer: random row programs written as `.kfc` text (with a torch
reference that computes the same thing), and mutations of any `.kfc` text — truncation, token
deletion, duplication, swaps, replacement by keywords, names, dtypes, punctuation and extreme
numbers, a dropped section or check entry, and bytes that are not UTF-8."""

from __future__ import annotations

import re

import hypothesis.strategies as st

TOKEN = re.compile(r'\s+|#[^\n]*|"(?:[^"\\\n]|\\.)*"|[A-Za-z_]\w*|\d+\.\d+(?:[eE][+-]?\d+)?|\d+(?:[eE][+-]?\d+)?'
                   r"|\*\*|//|\.\.|<=|>=|==|!=|->|.", re.S)

VOCABULARY = [
    # keywords and the section words
    "op", "parallel", "for", "in", "step", "carry", "limit", "None", "true", "false", "check", "metric",
    "targets", "reference", "shapes", "tolerance", "seeds", "inputs", "bandwidth", "flops", "time",
    # names, including ones generated code uses
    "x", "y", "w", "M", "N", "K", "m", "n", "e", "i", "T", "float", "threadIdx", "kfc_t", "dim_M", "p_x",
    # dtypes and builtins
    "f32", "bf16", "f16", "f64", "i32", "i64", "i8", "bool", "e4m3", "index",
    "exp", "log", "sqrt", "rsqrt", "abs", "sum", "mean", "max", "min", "where", "dot", "iota", "cumsum",
    "reshape", "zeros", "tril", "sigmoid", "softplus", "uniform", "normal", "randint", "offsets",
    "sm_90a", "sm_100", "sm_80",
    # punctuation and operators
    "(", ")", "[", "]", "{", "}", ",", ":", "=", "..", "->", "+", "-", "*", "/", "//", "%", "**", "<", "<=",
    "==", "&", "|", "~", "?", ".", "<", ">", ";", "@", "$", "\\",
    # numbers: ordinary and extreme
    "0", "1", "2", "7", "-1", "3.5", "1e-6", "1e999", "99999999999999999999", "9223372036854775807",
    "4611686018427387904", "0.0", "1e308", "65536",
    # strings (harmless references)
    '"x"', '"x * 2"', '""', '"torch.zeros(1)"', '"x.sum(-1)"', '"kfc.reference.kda:kda_reference"',
    '"nosuch.module:f"', '"(x,"', '"exit(0)"',
]
EXTREME_NUMBERS = ["0", "-1", "1e999", "99999999999999999999", "4611686018427387905", "2", "100000", "-5000",
                   "1e-320", "nan"]


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


@st.composite
def mutated(draw, text: str) -> bytes:
    """`text` with one to three random mutations, as bytes (some are not UTF-8)."""
    toks = tokens(text)
    for _ in range(draw(st.integers(1, 3))):
        if not toks:
            toks = [draw(st.sampled_from(VOCABULARY))]
        kind = draw(st.sampled_from(["truncate", "delete", "duplicate", "swap", "replace", "insert", "number",
                                     "delete-span", "drop-section", "bytes"]))
        i = draw(st.integers(0, len(toks) - 1))
        if kind == "truncate":
            joined = "".join(toks)
            cut = draw(st.integers(0, len(joined)))
            toks = tokens(joined[:cut])
        elif kind == "delete":
            del toks[i]
        elif kind == "delete-span":
            j = draw(st.integers(i, min(len(toks), i + 12)))
            del toks[i:j]
        elif kind == "drop-section":  # a whole check block, check entry, metric or targets line
            joined = "".join(toks)
            parts = [m.span() for m in re.finditer(r"check \{.*?\n\}\n?|\n  \w+ = [^\n]*|metric [^\n]*|targets = [^\n]*",
                                                   joined, re.S)]
            if parts:
                a, b = draw(st.sampled_from(parts))
                toks = tokens(joined[:a] + joined[b:])
        elif kind == "duplicate":
            toks.insert(i, toks[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(toks) - 1))
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "replace":
            toks[i] = draw(st.sampled_from(VOCABULARY))
        elif kind == "insert":
            toks.insert(i, " " + draw(st.sampled_from(VOCABULARY)) + " ")
        elif kind == "number":
            numbers = [k for k, t in enumerate(toks) if re.fullmatch(r"\d[\d.eE+-]*", t)]
            if numbers:
                toks[draw(st.sampled_from(numbers))] = draw(st.sampled_from(EXTREME_NUMBERS))
        else:
            raw = "".join(toks).encode()
            at = draw(st.integers(0, len(raw)))
            junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\xe2\x80", "é".encode(), b"\t\r"]))
            return raw[:at] + junk + raw[at:]
    return "".join(toks).encode()


# --- random row programs with a matching torch reference ------------------------------------------

UNARY = {"exp": ("exp({})", "torch.exp({})"), "abs": ("abs({})", "torch.abs({})"),
         "sigmoid": ("sigmoid({})", "torch.sigmoid({})"), "tanh": ("tanh({})", "torch.tanh({})"),
         "neg": ("-({})", "-({})"), "sqrtabs": ("sqrt(abs({}) + 1.0)", "torch.sqrt(torch.abs({}) + 1.0)")}
BINARY = {"+": "+", "-": "-", "*": "*"}
REDUCE = {"sum": ("sum({})", "{}.sum(-1, keepdim=True)"), "mean": ("mean({})", "{}.mean(-1, keepdim=True)"),
          "max": ("max({})", "{}.amax(-1, keepdim=True)")}


@st.composite
def _expr(draw, leaves: list[tuple[str, str]], depth: int) -> tuple[str, str]:
    """(kfc text, torch text) of a row expression in f32."""
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(leaves))
    kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "const"]))
    if kind == "unary":
        k, t = draw(_expr(leaves, depth - 1))
        fk, ft = UNARY[draw(st.sampled_from(sorted(UNARY)))]
        return fk.format(k), ft.format(t)
    if kind == "reduce":
        k, t = draw(_expr(leaves, depth - 1))
        if "xr" not in k:  # reductions take rows
            k, t = f"({k} + xr)", f"({t} + xr)"
        fk, ft = REDUCE[draw(st.sampled_from(sorted(REDUCE)))]
        return f"({k} - {fk.format(k)})", f"({t} - {ft.format(t)})"
    if kind == "const":
        k, t = draw(_expr(leaves, depth - 1))
        c = draw(st.sampled_from(["0.5", "2.0", "1.0", "3.0"]))
        return f"({k} * {c})", f"({t} * {c})"
    (ka, ta), (kb, tb) = draw(_expr(leaves, depth - 1)), draw(_expr(leaves, depth - 1))
    op = draw(st.sampled_from(sorted(BINARY)))
    return f"({ka} {op} {kb})", f"({ta} {op} {tb})"


@st.composite
def row_programs(draw) -> str:
    """A row op over x [M, N] (a dtype of three) with an optional weight row and scalar."""
    dtype = draw(st.sampled_from(["f32", "bf16", "f16"]))
    with_w = draw(st.booleans())
    with_s = draw(st.booleans())
    params = [f"x: {dtype}[M, N]"] + (["w: f32[N]"] if with_w else []) + (["s: f32 = 1.5"] if with_s else [])
    leaves = [("xr", "xr")] + ([("w", "w")] if with_w else []) + ([("s", "s")] if with_s else [])
    k, t = draw(_expr(leaves, draw(st.integers(1, 4))))
    if "xr" not in k:  # the result is a row
        k, t = f"({k} + xr)", f"({t} + xr)"
    cast_k = f"{dtype}({k})" if dtype != "f32" else k
    tol = {"f32": 1e-4, "bf16": 3e-2, "f16": 5e-3}[dtype]
    m, n = draw(st.sampled_from([1, 3, 7])), draw(st.sampled_from([1, 7, 8, 33, 256]))
    return (f"op gen({', '.join(params)}) -> (y: {dtype}[M, N]) {{\n"
            f"  parallel m in 0..M {{\n"
            f"    xr = f32(x[m, :])\n"
            f"    y[m, :] = {cast_k}\n"
            f"  }}\n}}\n"
            f"check {{\n"
            f'  reference = "(lambda xr: ({t}).to(x.dtype))(x.float())"\n'
            f"  shapes = [{{M: {m}, N: {n}}}]\n"
            f"  tolerance = {{{dtype}: {tol}}}\n"
            f"}}\n")
