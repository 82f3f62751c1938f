"""IR text round trips: print → parse → print is the identity, for random programs built with
the Builder, for every kernel in kernels/, and for hand-written edge cases; and the IR parser's
errors point into the text."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kfc.diagnostics import InterpretError, KfcError, VerifyError
from kfc.frontend import load_kfc
from kfc.ir import ALL, Builder, FuncOp, Layout, MemSpace, SymDim, TensorType, parse_ir, print_ir, scalar, tensor, verify
from kfc.ir.dtypes import DType
from kfc.ir.interpreter import run
from kfc.ir.specialize import specialize
from kfc.ir.tile_ops import CastOp, ConstOp, DimOp, LoadOp
from kfc.ir.types import bind_dim

from strategies import programs_and_sizes

ROOT = Path(__file__).resolve().parent.parent
KERNELS = sorted((ROOT / "kernels").glob("*.kfc"))


def roundtrip(func: FuncOp) -> tuple[str, FuncOp]:
    """Print, parse, print again; the two texts must agree and the parse must verify."""
    text = print_ir(func)
    again = parse_ir(text, "<roundtrip>")
    assert print_ir(again) == text
    verify(again)
    return text, again


def same_attr(a, b) -> bool:
    """Equal as IR attributes: same Python type, NaN equals NaN, -0.0 differs from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_attr(x, y) for x, y in zip(a, b))
    return a == b


def assert_same_program(f: FuncOp, g: FuncOp) -> None:
    """g is f rebuilt: the same ops with the same attributes and types, wired the same way."""
    vmap: dict[int, object] = {}

    def bind(xs, ys):
        assert len(xs) == len(ys)
        for x, y in zip(xs, ys):
            assert x.type == y.type, (x, y)
            vmap[id(x)] = y

    bind(f.args, g.args)
    assert f.sym_name == g.sym_name and f.num_outputs == g.num_outputs
    df, dg = dict(f.defaults), dict(g.defaults)
    assert df.keys() == dg.keys() and all(same_attr(df[k], dg[k]) for k in df), (df, dg)
    ops_f, ops_g = list(f.walk())[1:], list(g.walk())[1:]
    assert [o.NAME for o in ops_f] == [o.NAME for o in ops_g]
    for a, b in zip(ops_f, ops_g):
        assert all(vmap[id(x)] is y for x, y in zip(a.operands, b.operands)), a
        assert len(a.operands) == len(b.operands)
        fa, fb = a.attributes(), b.attributes()
        assert fa.keys() == fb.keys()
        for k in fa:
            assert same_attr(fa[k], fb[k]), (a, k, fa[k], fb[k])
        for ra, rb in zip(a.regions, b.regions):
            bind(ra.args, rb.args)
        bind(a.results, b.results)


# ---------------------------------------------------------------------------------------------
# property: random programs


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@pytest.mark.slow
@given(programs_and_sizes())
def test_random_programs_roundtrip(case):
    func, sizes = case
    verify(func)
    text, again = roundtrip(func)
    # the parse rebuilt the same program (attributes bit for bit), not merely the same text
    assert_same_program(func, again)

    spec = specialize(func, sizes)
    verify(spec)
    spec_text, spec_again = roundtrip(spec)
    assert_same_program(spec, spec_again)
    assert all(t.ttype.is_static for t in spec_again.args)
    assert not any(isinstance(op, DimOp) for op in spec_again.walk())
    assert not any(isinstance(d, str) for _, d in spec_again.defaults)
    # specialising the reparsed program gives the same text as specialising the original
    assert print_ir(specialize(again, sizes)) == spec_text


def _random_args(func: FuncOp, sizes: dict[str, int], rng: np.random.Generator) -> dict:
    args = {}
    for v in func.inputs:
        t = v.ttype
        if t.space is MemSpace.REG:  # scalars: given, or left to their defaults
            if func.default_of(v.name) is None or rng.random() < 0.5:
                args[v.name] = int(rng.integers(-3, 10)) if t.dtype.is_int else float(rng.standard_normal())
        elif not (t.optional and rng.random() < 0.3):
            shape = tuple(bind_dim(d, sizes) for d in t.shape)
            args[v.name] = (rng.standard_normal(shape) * 4).astype(t.dtype.np)
    return args


def _outcome(func: FuncOp, args: dict, sizes: dict):
    try:
        with np.errstate(all="ignore"):
            outs = run(func, args, dims=dict(sizes))
    except InterpretError as e:  # an index out of bounds, a division by zero: the same everywhere
        return ("error", e.message.split(":")[0])
    return {k: (v.astype(np.float64) if v.dtype.kind == "V" or v.dtype == DType.BF16.np else v) for k, v in outs.items()}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(programs_and_sizes(), st.integers(0, 2**32 - 1))
def test_reparsed_and_specialised_programs_compute_the_same(case, seed):
    func, sizes = case
    args = _random_args(func, sizes, np.random.default_rng(seed))
    want = _outcome(func, args, sizes)
    for other in (parse_ir(print_ir(func)), specialize(func, sizes)):
        got = _outcome(other, args, sizes)
        if isinstance(want, tuple) or isinstance(got, tuple):
            assert got == want
            continue
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


# ---------------------------------------------------------------------------------------------
# every kernel


@pytest.mark.parametrize("path", KERNELS, ids=[p.stem for p in KERNELS])
def test_kernel_roundtrip(path):
    spec = load_kfc(path)
    func = verify(spec.func)
    text, again = roundtrip(func)
    assert text.startswith(f"kfc.func @{func.sym_name}(")
    assert_same_program(func, again)
    # and each of its check shapes specialises to IR that verifies and round-trips
    shapes = spec.check.shapes if spec.check and spec.check.shapes else ({s: 3 for s in func.symbols},)
    for dims in shapes[:2]:
        dims = {s: dims[s] for s in func.symbols}
        s = verify(specialize(func, dims))
        stext, _ = roundtrip(s)
        assert all(t.ttype.is_static for t in s.args)
        for sym in func.symbols:
            assert f'tile.dim {{sym = "{sym}"}}' not in stext


def test_kernels_exist():
    assert len(KERNELS) >= 5


# ---------------------------------------------------------------------------------------------
# hand-written edge cases

EDGE = """\
kfc.func @edge(%x: f32[N + 1, 8] @global, %s: f16[4, 4] @shared #blocked<order = [1, 0], warps = 4, eps = 1e-06, name = "a>b">, %eps: f32 = 1e-06, %lo: f32 = -inf, %hi: f32 = inf, %z: f32 = nan, %k: i32 = -3, %big: f32 = 1e+30, %tiny: f32 = 5e-324, %scale: f32 = "N ** -0.5") -> (%y: f32[N + 1, 8] @global, %w: f32[N - 1] @global?) {
  %0 = tile.dim {sym = "N"} : () -> index
  %1 = tile.const {value = 0} : () -> index
  tile.parallel %1, %0 {
  ^(%i: index):
    %x.1 = tile.load %x, %i {index = ["i", ":"], other = -inf} : (f32[N + 1, 8] @global, index) -> f32[8]
    %2 = tile.const {value = -0.0} : () -> f32[8]
    %3 = tile.const {value = -7} : () -> i32
    %4 = tile.const {value = 1e-06} : () -> f32
    %5 = tile.cast %x.1 : (f32[8]) -> f32[8] #blocked<order = [0], warps = -2>
    %6 = tile.exp %5 : (f32[8] #blocked<order = [0], warps = -2>) -> f32[8] #blocked<order = [0], warps = -2>
    %7 = tile.tri {lower = false, k = -1} : () -> bool[4, 4]
    %8 = tile.load %s, %i, %1 {index = [":", "+2<"], other = nan} : (f16[4, 4] @shared #blocked<order = [1, 0], warps = 4, eps = 1e-06, name = "a>b">, index, index) -> f16[4, 2]
    tile.store %x.1, %y, %i {index = ["i", ":"]} : (f32[8], f32[N + 1, 8] @global, index) -> ()
  } : (index, index) -> ()
}
"""


def test_edge_case_text_roundtrips():
    func = verify(parse_ir(EDGE, "edge.kir"))
    assert print_ir(func) == EDGE
    defaults = dict(func.defaults)
    assert defaults["eps"] == 1e-06 and defaults["lo"] == -math.inf and defaults["hi"] == math.inf
    assert math.isnan(defaults["z"]) and defaults["k"] == -3 and defaults["tiny"] == 5e-324
    assert defaults["scale"] == "N ** -0.5"
    s = func.arg("s").ttype
    assert s.space is MemSpace.SHARED
    assert s.layout == Layout("blocked", (("order", (1, 0)), ("warps", 4), ("eps", 1e-06), ("name", "a>b")))
    assert func.arg("x").ttype.shape == (SymDim("N", 1), 8)
    assert func.arg("w").ttype.shape == (SymDim("N", -1),) and func.arg("w").ttype.optional
    consts = [op for op in func.walk() if isinstance(op, ConstOp)]
    neg_zero = [op.value for op in consts if isinstance(op.value, float) and op.value == 0.0]
    assert neg_zero and math.copysign(1.0, neg_zero[0]) == -1.0
    load = next(op for op in func.walk() if isinstance(op, LoadOp))
    assert load.other == -math.inf
    cast = next(op for op in func.walk() if isinstance(op, CastOp))
    assert cast.result.ttype.layout == Layout("blocked", (("order", (0,)), ("warps", -2)))
    # specialised, the string default becomes a number and N + 1 a literal
    spec = verify(specialize(func, {"N": 16}))
    text, _ = roundtrip(spec)
    assert "%scale: f32 = 0.25" in text and "f32[17, 8] @global" in text and "f32[15] @global?" in text


@pytest.mark.parametrize("value", [1e-06, -1e-06, 1e16, 1.5e-07, 0.1, 1 / 3, -2.5, 1e300, 5e-324, 100.0,
                                   math.inf, -math.inf, 0.0, -0.0])
def test_float_attributes_survive_every_bit(value):
    b = Builder()
    with b.func("f", inputs=[("a", scalar(DType.F64))], outputs=[("y", tensor(DType.F64, 2))],
                defaults={"a": value}) as f:
        a, y = f.args
        with b.parallel([(0, 1)]):
            b.store(b.const(value, DType.F64, [2]), y, [ALL])
    text, again = roundtrip(verify(f.op))
    const = next(op for op in again.walk() if isinstance(op, ConstOp) and op.result.ttype.dtype is DType.F64)
    for got in (const.value, dict(again.defaults)["a"]):
        assert isinstance(got, float)
        assert got == value and math.copysign(1.0, got) == math.copysign(1.0, value)


def test_nan_attribute():
    b = Builder()
    with b.func("f", inputs=[("x", tensor(DType.F32, 4))], outputs=[("y", tensor(DType.F32, 4))]) as f:
        x, y = f.args
        with b.parallel([(0, 1)]):
            b.store(b.load(x, [ALL], other=math.nan), y, [ALL])
    text, again = roundtrip(verify(f.op))
    assert "other = nan" in text
    assert math.isnan(next(op for op in again.walk() if isinstance(op, LoadOp)).other)


def test_names_are_made_unique():
    b = Builder()
    with b.func("f", inputs=[("x", tensor(DType.F32, 4))], outputs=[("y", tensor(DType.F32, 4))]) as f:
        x, y = f.args
        with b.parallel([(0, 2), (0, 3)], names=["i", "i"]):
            t = b.load(x, [ALL], name="x")
            t = b.unary("exp", t, name="x")
            t = b.unary("neg", t, name="x.1")
            t = b.binary("add", t, 1.0, name="x")
            b.store(t, y, [ALL])
    text, again = roundtrip(verify(f.op))
    assert "^(%i: index, %i.1: index):" in text
    assert "%x.1 = tile.load %x " in text
    assert "%x.2 = tile.exp %x.1 " in text
    # a source name that already looks suffixed gets a fresh suffix
    assert "%x.1.1 = tile.neg %x.2 " in text
    assert "%x.3 = tile.add %x.1.1, " in text
    assert len({v.name for v in again.args}) == 2


def test_shadowed_name_is_renamed_on_print():
    # the parser allows a region to reuse an outer name; the printer must keep names unique
    text = """\
kfc.func @f(%x: f32[4] @global) -> (%y: f32[4] @global) {
  %0 = tile.const {value = 0} : () -> index
  %1 = tile.const {value = 2} : () -> index
  tile.parallel %0, %1 {
  ^(%x.1: index):
    %x = tile.load %x {index = [":"]} : (f32[4] @global) -> f32[4]
    tile.store %x, %y {index = [":"]} : (f32[4], f32[4] @global) -> ()
  } : (index, index) -> ()
}
"""
    func = verify(parse_ir(text))
    printed = print_ir(func)
    assert "%x.2 = tile.load %x {" in printed
    assert "tile.store %x.2, %y" in printed
    roundtrip(func)


def test_optional_and_shared_types_roundtrip():
    t = TensorType(DType.BF16, (SymDim("M"), SymDim("K", 2), 64), MemSpace.SHARED,
                   Layout("swizzle", (("bytes", 128),)), optional=True)
    assert str(t) == "bf16[M, K + 2, 64] @shared #swizzle<bytes = 128>?"
    b = Builder()
    with b.func("f", inputs=[("a", t)], outputs=[("y", tensor(DType.BF16, SymDim("M"), 64))]) as f:
        a, y = f.args
        with b.parallel([(0, b.dim("M"))]) as (m,):
            b.store(b.load(a, [m, 0, ALL], other=1.5), y, [m, ALL])
    text, again = roundtrip(verify(f.op))
    assert again.arg("a").type == t


# ---------------------------------------------------------------------------------------------
# parser errors point into the text

GOOD = """\
kfc.func @f(%x: f32[4] @global) -> (%y: f32[4] @global) {
  %0 = tile.load %x {index = [":"]} : (f32[4] @global) -> f32[4]
  %1 = tile.exp %0 : (f32[4]) -> f32[4]
  tile.store %1, %y {index = [":"]} : (f32[4], f32[4] @global) -> ()
}
"""


def test_good_text_parses():
    assert print_ir(verify(parse_ir(GOOD))) == GOOD


def _parse_error(text: str) -> KfcError:
    with pytest.raises(KfcError) as info:
        verify(parse_ir(text, "bad.kir"))
    e = info.value
    assert e.span is not None, e
    assert e.span.file == "bad.kir"
    return e


def _locate(text: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """1-based line and column of the nth occurrence of needle."""
    pos = -1
    for _ in range(nth + 1):
        pos = text.index(needle, pos + 1)
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    return line, col


@pytest.mark.parametrize("case", ["undefined", "twice", "unknown_op", "unknown_attr", "operand_type"])
def test_parser_errors_have_spans(case):
    if case == "undefined":
        text = GOOD.replace("tile.exp %0", "tile.exp %nope")
        needle, nth, words = "%nope", 0, "undefined value %nope"
    elif case == "twice":
        text = GOOD.replace("%1 = tile.exp", "%0 = tile.exp").replace("tile.store %1", "tile.store %0")
        needle, nth, words = "%0 =", 1, "%0 is defined twice"
    elif case == "unknown_op":
        text = GOOD.replace("tile.exp", "tile.expp")
        needle, nth, words = "tile.expp", 0, "unknown op tile.expp"
    elif case == "unknown_attr":
        text = GOOD.replace('{index = [":"]} : (f32[4] @global) -> f32[4]',
                            '{index = [":"], bogus = 1} : (f32[4] @global) -> f32[4]')
        needle, nth, words = "%0 = tile.load", 0, "no attribute 'bogus'"
    else:
        text = GOOD.replace("tile.exp %0 : (f32[4])", "tile.exp %0 : (f16[4])")
        needle, nth, words = "%0 : (f16", 0, "operand %0 has type f32[4], but the signature says f16[4]"
    e = _parse_error(text)
    assert words in e.message
    line, col = _locate(text, needle, nth)
    assert (e.span.line, e.span.col) == (line, col), (e.span, line, col)
    rendered = e.render()
    assert rendered.startswith(f"bad.kir:{line}:{col}: error: ")
    assert text.splitlines()[line - 1] in rendered  # the offending line is shown


def test_unknown_attribute_span_covers_the_attribute():
    text = GOOD.replace('%1 = tile.exp %0 :', '%1 = tile.exp %0 {fast = true} :')
    e = _parse_error(text)
    line, col = _locate(text, "fast")
    assert e.span.line <= line <= e.span.end_line
    assert e.span.line < line or e.span.col <= col


@pytest.mark.parametrize("old,new,words", [
    ('{index = [":"]} : (f32[4] @global) -> f32[4]', '{index = ["j"]} : (f32[4] @global) -> f32[4]', "bad index entry"),
    ('{index = [":"]} : (f32[4] @global) -> f32[4]', ': (f32[4] @global) -> f32[4]', "tile.load needs the attribute index"),
    ("tile.exp %0 : (f32[4])", "tile.exp %0 : (f32[4], f32[4])", "1 operands but the signature lists 2"),
    ("%1 = tile.exp", "%1, %2 = tile.exp", "2 results named but the signature gives 1"),
    ("f32[4] @global) -> (%y", "f32[4] @local) -> (%y", "unknown memory space @local"),
    ("%x: f32[4]", "%x: f31[4]", "unknown dtype f31"),
])
def test_more_parser_errors_have_spans(old, new, words):
    text = GOOD.replace(old, new, 1)
    assert text != GOOD
    e = _parse_error(text)
    assert words in e.message, e.message
    line = next(i for i, (a, b) in enumerate(zip(GOOD.splitlines(), text.splitlines()), 1) if a != b)
    assert e.span.line == line


def test_syntax_error_has_span():
    text = GOOD.replace("-> f32[4]\n  %1", "-> f32[4\n  %1")
    e = _parse_error(text)
    assert "syntax error" in e.message
    assert e.span.line == 3


def test_parsed_ir_verifier_errors_point_into_the_text():
    # parses fine, but the result type disagrees with the op's typing rule
    text = GOOD.replace("%1 = tile.exp %0 : (f32[4]) -> f32[4]", "%1 = tile.exp %0 : (f32[4]) -> f32[8]")
    text = text.replace("tile.store %1, %y {index = [\":\"]} : (f32[4],", "tile.store %1, %y {index = [\":\"]} : (f32[8],")
    with pytest.raises(VerifyError) as info:
        verify(parse_ir(text, "bad.kir"))
    assert info.value.span.line == 3 and info.value.span.file == "bad.kir"


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm", "softmax"])
def test_a_compiled_kir_reads_back_in_kfc_opt(tmp_path, capsys, name):
    """kfc compile writes the final IR (gpu and ptx ops included); kfc opt reads it back to the
    same text, and so does kfc.ir alone in a fresh process (every dialect registers on import)."""
    import subprocess
    import sys

    from kfc.cli import main

    assert main(["compile", f"kernels/{name}.kfc", "--target", "sm_90a", "--shape", "N=1024",
                 "-o", str(tmp_path)]) == 0
    kir = tmp_path / f"{name}.kir"
    text = kir.read_text()
    assert "gpu.launch" in text and "ptx." in text
    capsys.readouterr()
    assert main(["opt", str(kir)]) == 0
    assert capsys.readouterr().out == text
    r = subprocess.run([sys.executable, "-c", "import sys; from kfc.ir import parse_ir, print_ir, verify; "
                        "t = open(sys.argv[1]).read(); assert print_ir(verify(parse_ir(t, sys.argv[1]))) == t; "
                        "assert 'kfc.passes' not in sys.modules", str(kir)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_layout_that_contradicts_its_launch_is_rejected(tmp_path, capsys):
    """Rewrite every #row of a compiled softmax to 256 threads under its 32-thread launch: the
    verifier says which op disagrees with the launch, where (codegen would map by the launch)."""
    from kfc.cli import main

    assert main(["compile", "kernels/softmax.kfc", "--target", "sm_90a", "--shape", "N=1024", "-o", str(tmp_path)]) == 0
    text = (tmp_path / "softmax.kir").read_text()
    assert "threads = 32}" in text and "#row<threads = 32," in text
    for old, new, what in [("#row<threads = 32,", "#row<threads = 256,", "threads = 256"),
                           ("vec = 8, cluster = 1>", "vec = 4, cluster = 1>", "vec = 4"),
                           ("#lanes<threads = 32, cluster = 1>", "#lanes<threads = 32, cluster = 2>", "cluster = 2")]:
        if old not in text:
            continue
        bad = tmp_path / "bad.kir"
        bad.write_text(text.replace(old, new))
        capsys.readouterr()
        assert main(["opt", str(bad)]) == 2
        err = capsys.readouterr().err
        assert f"says {what}, but the gpu.launch it is in has" in err and f"{bad}:" in err, err


def test_a_for_loop_whose_step_is_a_constant_zero_is_refused_by_the_verifier():
    """The .kfc front end refuses step 0; IR text reaches the passes without it, and a loop of
    step 0 would never end on the GPU."""
    text = """kfc.func @f(%x: f32[N] @global) -> (%y: f32[N] @global) {
  %0 = tile.const {value = 0} : () -> index
  %1 = tile.dim {sym = "N"} : () -> index
  %2 = tile.const {value = 0.0} : () -> f32
  %3 = tile.for %0, %1, %0, %2 {
  ^(%k: index, %a: f32):
    tile.yield %a : (f32) -> ()
  } : (index, index, index, f32) -> f32
}
"""
    with pytest.raises(VerifyError, match="step must be positive, not 0"):
        verify(parse_ir(text))


def test_a_scratch_tensor_roundtrips_and_is_refused_inside_a_loop():
    spec = load_kfc("examples/chunked_cumsum.kfc")
    text = print_ir(spec.func)
    assert "tile.scratch : () -> f32[B, NC, D] @global" in text and print_ir(verify(parse_ir(text))) == text
    inside = """kfc.func @f(%x: f32[N] @global) -> (%y: f32[N] @global) {
  %0 = tile.const {value = 0} : () -> index
  %1 = tile.dim {sym = "N"} : () -> index
  tile.parallel %0, %1 {
  ^(%i: index):
    %t = tile.scratch : () -> f32[N] @global
  } : (index, index) -> ()
}
"""
    with pytest.raises(VerifyError, match="top level"):
        verify(parse_ir(inside))


LOAD_SUM = """kfc.func @f(%x: f32[N] @global) -> (%y: f32[1] @global) {
  %0 = tile.load %x {index = [":"], other = 0.0} : (f32[N] @global) -> f32[N]
  %1 = tile.reduce %0 {kind = "sum", axes = [0]} : (f32[N]) -> f32
  %2 = tile.const {value = 0} : () -> index
  tile.store %1, %y, %2 {index = ["i"]} : (f32, f32[1] @global, index) -> ()
}
"""


@pytest.mark.parametrize("old, new, message", [
    ('other = 0.0', 'other = "x"', "other (what reads past the tensor give) must be a number, not 'x'"),
    ('kind = "sum"', 'kind = "median"', "tile.reduce: kind = 'median' is not one it takes"),
    ('{kind = "sum", axes = [0]} ', '', "tile.reduce needs the attributes kind, axes"),
])
def test_ir_attributes_are_refused_in_the_irs_words(old, new, message):
    """Attribute errors of IR text say which attribute and what it takes, not a Python
    constructor's complaint (ReduceOp.__init__() missing ...)."""
    assert old in LOAD_SUM
    with pytest.raises(KfcError) as info:
        verify(parse_ir(LOAD_SUM.replace(old, new, 1), "f.kir"))
    assert message in info.value.message and "__init__" not in info.value.message
    if "median" in new:
        assert info.value.hint == "kind takes one of sum, mean, max, min, prod"


def nested_loops(depth: int) -> str:
    """IR text of `depth` parallel loops of one iteration, each inside the last."""
    lines = ['kfc.func @f(%x: f32[N] @global) -> (%y: f32[N] @global) {', '  %z = tile.const {value = 0} : () -> index',
             '  %n = tile.const {value = 1} : () -> index']
    for k in range(depth):
        lines += [f"{'  ' * (k + 1)}tile.parallel %z, %n {{", f"{'  ' * (k + 1)}^(%i{k}: index):"]
    for k in reversed(range(depth)):
        lines.append(f"{'  ' * (k + 1)}}} : (index, index) -> ()")
    return "\n".join(lines + ["}"]) + "\n"


def test_regions_nested_past_the_verifiers_depth_are_refused_not_a_recursion_error():
    with pytest.raises(VerifyError, match="regions nest more than 256 levels deep"):
        verify(parse_ir(nested_loops(260)))


def test_a_launch_inside_a_launch_is_refused():
    text = """kfc.func @f(%x: f32[M] @global) -> (%y: f32[M] @global) {
  %0 = tile.dim {sym = "M"} : () -> index
  %1 = tile.const {value = 0} : () -> index
  gpu.launch %1, %0 {threads = 32} {
  ^(%m: index):
    gpu.launch %1, %0 {threads = 32} {
    ^(%q: index):
      %zz = tile.const {value = 1} : () -> index
    } : (index, index) -> ()
  } : (index, index) -> ()
}
"""
    with pytest.raises(VerifyError, match="a launch inside another launch or loop"):
        verify(parse_ir(text))


def test_the_interpreter_runs_regions_as_deep_as_the_verifier_takes():
    """250 nested loops of one iteration: the interpreter's few frames a level would pass
    Python's default recursion limit (a RecursionError before); it makes room while it runs."""
    f = verify(parse_ir(nested_loops(250)))
    assert run(f, {"x": np.zeros(4, np.float32)}, {"N": 4})["y"].shape == (4,)
