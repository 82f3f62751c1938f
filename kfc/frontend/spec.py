"""The whole `.kfc` file as data: the op (as tile IR), its check block, metric and targets."""

from __future__ import annotations

import ast
import difflib
import functools
import itertools
import re
from pathlib import Path
from typing import Any

import attrs
import lark

from ..check.generators import GENERATORS
from ..diagnostics import KfcError, read_source, register_source
from ..grammar_files import check_nesting, lalr_parser, syntax_error, without
from ..ir import constexpr
from ..ir.dtypes import DTYPE_NAMES, parse_dtype
from ..ir.func import FuncOp
from ..ir.specialize import check_dims
from ..ir.types import MemSpace
from ..model.spec import CheckSpec, GeneratorSpec, MetricSpec, OpSpec
from .expressions import NESTING_CHAINS, NESTING_FREE
from .lower import Lowerer, span_of

GRAMMAR = "kfc.lark"
METRICS = ("time", "bandwidth", "flops")
TARGETS = ("sm_90", "sm_90a", "sm_100", "sm_100a")
CHECK_KEYS = {
    "reference": "a torch expression over the inputs, or \"module:function\"",
    "shapes": "a list of {DIM: size} dicts, one per case",
    "tolerance": "{dtype: relative tolerance}",
    "seeds": "a list of integer seeds",
    "inputs": "{input: generator(...)} to draw inputs other than from normal()",
    "exact_reference": "\"cpu\" or \"device\": where the reference runs for exact outputs on a GPU (default cpu)",
}
EXACT_REFERENCES = ("cpu", "device")
def instantiate(spec: OpSpec, dtypes: dict[str, str]) -> OpSpec:
    """The same op with other type arguments."""
    return parse_kfc(spec.text, spec.path, {**spec.dtypes, **dtypes})


def instances(spec: OpSpec) -> list[OpSpec]:
    """Every combination of the type parameters' dtypes; a size parameter (a chunk, say: a
    configuration, not a type) keeps the size the spec is bound to."""
    dtyped = [(n, opts) for n, opts in spec.type_params if not opts[0].isdigit()]
    if not dtyped:
        return [spec]
    names = [n for n, _ in dtyped]
    return [instantiate(spec, dict(zip(names, combo)))
            for combo in itertools.product(*(opts for _, opts in dtyped))]


@functools.lru_cache(maxsize=64)
def syntax_tree(text: str, file: str) -> lark.Tree:
    """The parse tree of a .kfc text, its nesting checked and its parentheses gone. Kept for the
    texts parsed last: an op is parsed again for each binding of its type parameters, and the
    lowering only reads the tree."""
    parser = lalr_parser(GRAMMAR)
    try:
        tree = parser.parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise syntax_error(e, parser, file, text) from None
    except lark.exceptions.VisitError as e:  # pragma: no cover - no callbacks are registered
        raise KfcError(str(e.orig_exc), None) from None
    check_nesting(tree, file, NESTING_CHAINS, free=NESTING_FREE)
    return without(tree, "paren")


def parse_kfc(text: str, file: str = "<kfc>", dtypes: dict[str, str] | None = None) -> OpSpec:
    register_source(file, text)
    op_node, *sections = syntax_tree(text, file).children
    lowerer = Lowerer(file, text, dtypes)
    func = lowerer.lower_op(op_node)
    spec = _Sections(file, func, dict(lowerer.size_vars)).build(sections)
    return attrs.evolve(spec, type_params=tuple(lowerer.type_params),
                        dtypes={**{n: str(d) for n, d in lowerer.type_vars.items()},
                                **{n: str(v) for n, v in lowerer.size_vars.items()}},
                        typed_params=dict(lowerer.typed_params), text=text)


def load_kfc(path: str | Path, dtypes: dict[str, str] | None = None) -> OpSpec:
    text = read_source(path)
    if looks_like_ir(text):
        raise KfcError(f"{path} is IR text (it starts with kfc.func), not a .kfc op description",
                       hint="this command needs the op's .kfc source (with its check block); only kfc opt reads "
                            "IR text")
    return parse_kfc(text, str(path), dtypes)


def looks_like_ir(text: str) -> bool:
    """IR text starts (after comments) with `kfc.func`; `.kfc` source with `op`."""
    body = re.sub(r"(//|#)[^\n]*", "", text).lstrip()
    return body.startswith("kfc.func")


class _Sections:
    def __init__(self, file: str, func: FuncOp, sizes: dict[str, int] | None = None) -> None:
        self.file = file
        self.func = func
        self.symbols = set(func.symbols)
        self.sizes = sizes or {}  # size type parameters: their bound values stand in the metric

    def err(self, node, message: str, hint: str | None = None) -> KfcError:
        return KfcError(message, span_of(self.file, node), hint)

    def string(self, tok) -> str:
        return _string(tok, self.file)

    def build(self, sections) -> OpSpec:
        check, metric, targets = None, MetricSpec(), ()
        seen: dict[str, Any] = {}
        for s in sections:
            if s.data in seen:
                raise self.err(s, f"a second {s.data.replace('_section', '')} section",
                               "merge it into the first one")
            seen[s.data] = s
            if s.data == "check_section":
                check = self.check(s)
            elif s.data == "metric_section":
                metric = self.metric(s)
            else:
                targets = self.targets(s)
        return OpSpec(self.func, self.file, check, metric, targets)

    # --- metric and targets -------------------------------------------------------------------
    def metric(self, node) -> MetricSpec:
        name, formula = node.children
        if str(name) not in METRICS:
            raise self.err(name, f"unknown metric '{name}'", f"metrics are {', '.join(METRICS)}")
        text = None
        if formula is not None:
            text = self.string(formula)
            for n, v in self.sizes.items():
                text = re.sub(rf"\b{n}\b", str(v), text)
            try:
                unknown = constexpr.symbols_of(text) - self.symbols
            except constexpr.ConstExprError as e:
                raise self.err(formula, str(e)) from None
            if unknown:
                raise self.err(formula, f"the formula uses {sorted(unknown)[0]}, which is not a dimension of the op",
                               f"write it over the op's dimensions: {', '.join(self.func.symbols) or 'none'}")
        elif str(name) == "flops":
            raise self.err(node, "metric flops needs a formula for the operation count", 'e.g. metric flops = "2 * M * N * K"')
        return MetricSpec(str(name), text)

    def targets(self, node) -> tuple[str, ...]:
        out = []
        for tok in node.children:
            if str(tok) not in TARGETS:
                raise self.err(tok, f"unknown target '{tok}'", f"targets are {', '.join(TARGETS)}")
            if str(tok) in out:
                raise self.err(tok, f"target '{tok}' is listed twice", "list each target once")
            out.append(str(tok))
        return tuple(out)

    # --- check --------------------------------------------------------------------------------
    def check(self, node) -> CheckSpec:
        fields: dict[str, Any] = {}
        for entry in node.children:
            key, value = entry.children
            k = str(key)
            if k not in CHECK_KEYS:
                close = difflib.get_close_matches(k, list(CHECK_KEYS), 1, 0.6)
                raise self.err(key, f"unknown check key '{k}'",
                               (f"did you mean {close[0]}? " if close else "") + "check keys are " + ", ".join(CHECK_KEYS))
            if k in fields:
                raise self.err(key, f"check key '{k}' is given twice")
            fields[k] = getattr(self, "check_" + k)(value)
        if "reference" in fields:
            fields["reference"], fields["reference_span"] = fields["reference"]
        return CheckSpec(**fields, span=span_of(self.file, node))

    def check_reference(self, node):
        if node.data != "c_string":
            raise self.err(node, "reference must be a string", 'e.g. reference = "torch.softmax(x.float(), -1)"')
        text = self.string(node.children[0])
        span = span_of(self.file, node)
        spec = CheckSpec(reference=text)
        if not spec.reference_is_function:
            try:
                compile(text, "<reference>", "eval")  # compiled only: it runs where a command says so
            except SyntaxError as e:
                raise KfcError(f"the reference is not a valid Python expression: {e.msg}", span,
                               "write a torch expression over the input names, or \"package.module:function\"") from None
            except (ValueError, RecursionError, MemoryError, OverflowError) as e:
                raise KfcError(f"the reference is not a valid Python expression ({type(e).__name__}: {e})", span,
                               "write a torch expression over the input names, or \"package.module:function\"") from None
        return text, span

    def check_shapes(self, node):
        if node.data != "c_list" or not [c for c in node.children if c is not None]:
            raise self.err(node, "shapes must be a non-empty list of {DIM: size} dicts", "e.g. [{M: 4, N: 7}]")
        out = []
        for case in node.children:
            if case is None:
                continue
            if case.data != "c_dict":
                raise self.err(case, "each shape is a {DIM: size} dict", "e.g. {M: 4, N: 7}")
            d: dict[str, int] = {}
            for pair in case.children:
                if pair is None:
                    continue
                k, v = pair.children
                name = self.string(k) if k.type == "STRING" else str(k)
                if name not in self.symbols:
                    raise self.err(k, f"'{name}' is not a dimension of {self.func.sym_name}",
                                   f"its dimensions are {', '.join(self.func.symbols) or 'none'}")
                if name in d:
                    raise self.err(k, f"dimension '{name}' is given twice")
                if v.data != "c_int" or int(v.children[0]) < 1:
                    raise self.err(v, f"the size of {name} must be a positive integer")
                d[name] = int(v.children[0])
            missing = [s for s in self.func.symbols if s not in d]
            if missing:
                raise self.err(case, f"this shape does not give {', '.join(missing)}",
                               f"every case sizes all dimensions: {', '.join(self.func.symbols)}")
            check_dims(self.func, d, f"check shape {len(out)}")
            out.append(d)
        return tuple(out)

    def check_tolerance(self, node):
        if node.data != "c_dict":
            raise self.err(node, "tolerance must be a {dtype: number} dict", "e.g. {bf16: 1e-2, f32: 1e-5}")
        out = {}
        for pair in node.children:
            if pair is None:
                continue
            k, v = pair.children
            name = self.string(k) if k.type == "STRING" else str(k)
            if parse_dtype(name) is None:
                close = difflib.get_close_matches(name, list(DTYPE_NAMES), 1, 0.5)
                raise self.err(k, f"unknown dtype '{name}' in tolerance",
                               (f"did you mean {close[0]}? " if close else "") + f"dtypes are {', '.join(DTYPE_NAMES)}")
            if v.data not in ("c_int", "c_float"):
                raise self.err(v, f"the tolerance for {name} must be a non-negative number")
            out[name] = float(v.children[0])
        return out

    def check_exact_reference(self, node):
        text = self.string(node.children[0]) if node.data == "c_string" else None
        if text not in EXACT_REFERENCES:
            raise self.err(node, "exact_reference must be \"cpu\" or \"device\"",
                           "\"cpu\" (the default) makes torch on the CPU the authority for integer, bool and fp8 "
                           "outputs wherever kfc runs the reference; \"device\" runs it beside the kernel")
        return text

    def check_seeds(self, node):
        if node.data != "c_list":
            raise self.err(node, "seeds must be a list of integers", "e.g. [0, 1, 2]")
        seeds = []
        for c in node.children:
            if c is None:
                continue
            if c.data != "c_int":
                raise self.err(c, "a seed must be a non-negative integer")
            seeds.append(int(c.children[0]))
        if not seeds:
            raise self.err(node, "seeds is empty")
        return tuple(seeds)

    def check_inputs(self, node):
        if node.data != "c_dict":
            raise self.err(node, "inputs must be a {input: generator(...)} dict", "e.g. {g: logsigmoid()}")
        inputs = {v.name: v for v in self.func.inputs if v.ttype.space is not MemSpace.REG}
        out = {}
        for pair in node.children:
            if pair is None:
                continue
            k, v = pair.children
            name = self.string(k) if k.type == "STRING" else str(k)
            if name not in inputs:
                raise self.err(k, f"'{name}' is not a tensor input of {self.func.sym_name}",
                               f"its tensor inputs are {', '.join(inputs)}")
            if name in out:
                raise self.err(k, f"input '{name}' is given two generators",
                               "keep one: each input is drawn by one generator")
            if v.data == "c_name":
                gname, args = str(v.children[0]), []
            elif v.data == "c_call":
                gname, *args = v.children
                gname = str(gname)
                args = [a for a in args if a is not None]
            else:
                raise self.err(v, "a generator is a name or a call", "e.g. uniform(0, 1)")
            gen = GENERATORS.get(gname)
            if gen is None:
                raise self.err(v, f"unknown generator '{gname}'", f"generators are {', '.join(GENERATORS)}")
            values = tuple(self.gen_arg(a) for a in args)
            problem = gen.check_args(values, inputs[name].ttype, self.symbols)
            if problem:
                raise self.err(v, f"{gname}: {problem}", gen.usage)
            out[name] = GeneratorSpec(gname, values, span_of(self.file, v))
        return out

    def gen_arg(self, node):
        kinds = {"c_int": lambda c: int(c.children[0]), "c_float": lambda c: float(c.children[0]),
                 "c_neg_int": lambda c: -int(c.children[0]), "c_neg_float": lambda c: -float(c.children[0]),
                 "c_true": lambda c: True, "c_false": lambda c: False, "c_name": lambda c: str(c.children[0])}
        if node.data not in kinds:
            raise self.err(node, "generator arguments are numbers or dimension names")
        value = kinds[node.data](node)
        if node.data == "c_name" and value not in self.symbols:
            raise self.err(node, f"'{value}' is not a dimension of {self.func.sym_name}")
        return value


def _string(tok, file: str) -> str:
    try:
        return ast.literal_eval(str(tok))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise KfcError(f"this string does not read: {getattr(e, 'msg', None) or e}", span_of(file, tok),
                       "write a plain string; backslash escapes follow Python's rules") from None
