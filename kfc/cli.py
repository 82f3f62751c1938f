"""The `kfc` command line.

Exit status: 0 success; 1 a check ran and failed; 2 bad input (a message with file:line:col);
3 an internal error (set KFC_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .model.version import __version__
from . import cli_args
from .check.sandbox import DEFAULT_TIMEOUT_S, default_memory_bytes
from .cli_args import KfcArgumentParser, float_in, gib, int_in
from .diagnostics import InternalError, KfcError
from .factory.cli import add_tune_command
from .files import write_atomically
from .kb.cli import add_commands as add_kb_commands
from .kb.database import reporting_damage
from .kb.store import KnowledgeBase, default_path
from .model.target import parse_target

EXAMPLES = """\
examples:
  kfc compile kernels/rmsnorm.kfc --target sm_100    .cu, .ptx, .cubin and report.json (no GPU needed)
  kfc check kernels/rmsnorm.kfc              prove the op against its reference on the CPU
  kfc check kernels/kda_fwd.kfc --seed 7     replay one seed
  kfc opt kernels/softmax.kfc                print its tile IR
  kfc opt kernels/softmax.kfc -o sm.kir      ... into a file; `kfc opt sm.kir` reads it back
  kfc package kernels/rmsnorm.kfc --shape N=4096 -o dist/rmsnorm    a pip-installable package (no kfc needed)

exit status: 0 ok, 1 a check failed, 2 bad input, 3 internal error (KFC_DEBUG=1 shows the traceback)
"""


def build_parser() -> argparse.ArgumentParser:
    p = KfcArgumentParser(
        prog="kfc", description="kfc, the kernel factory compiler: turns a .kfc op description into a "
        "typed tile IR, proves it against its reference, and (with a GPU toolchain) into kernels.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"kfc {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser(
        "check", help="run the op in the IR interpreter and its reference on random inputs; compare",
        description="Specialise the op on each shape of its check block (scaled down where huge, unless "
        "--full), draw fresh random inputs for each seed (the block's seeds plus one new seed per run), "
        "run the IR interpreter with NaN-poisoned outputs and the torch reference, and compare every "
        "output: relative RMSE within the dtype's tolerance, every element within tol·(|ref| + rms(ref)), "
        "no unwritten element, inputs unchanged. Ops with optional inputs run with them given and absent. "
        "The IR after the passes kfc compile would run (-p, else the default) at each shape is run and "
        "compared too (rows marked 'final'); where it departs and the op as written does not, the first "
        "pass whose IR departs is named.",
        epilog="example:\n  kfc check kernels/kda_fwd.kfc --seed 7 --shape N=2,T=100,H=1,K=16,V=16",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("file", help="a .kfc file with a check block")
    c.add_argument("--seed", type=int_in(0, 2**63 - 1), action="append", metavar="N",
                   help="use this seed (0 to 2**63-1) instead of the block's seeds and a fresh one (repeatable)")
    c.add_argument("--shape", type=cli_args.shape, action="append", metavar="M=..,N=..",
                   help="check this shape instead of the block's (repeatable)")
    c.add_argument("--full", action="store_true", help="do not scale huge shapes down (slow)")
    c.add_argument("--dtype", type=cli_args.dtypes, metavar="T=f16",
                   help="check only this instance of the op's type parameters (default: every combination of "
                        "their dtypes, sizes such as C=16 at their first)")
    c.add_argument("--first", action="store_true",
                   help="check only the op's first instance (every type parameter at its first option)")
    c.add_argument("--budget", type=int_in(1), default=None, metavar="ELEMS",
                   help="scale a case down until its tensors hold at most this many elements (default 1048576)")
    c.add_argument("--target", type=cli_args.target, default=None, metavar="SM",
                   help="the target whose pipeline's final IR is checked; default: the file's first target, else sm_90a")
    c.add_argument("-p", "--pipeline", metavar="PIPELINE",
                   help="check the final IR of these passes (default: the pipeline kfc compile runs)")
    c.add_argument("--source-only", action="store_true", help="check the op as written only, not its final IR")
    _add_reference_flags(c)
    c.set_defaults(run=cmd_check)

    o = sub.add_parser(
        "opt", help="parse and verify an op, print its tile IR",
        description="Read a .kfc file or IR text (as this command prints it), verify it, and print the IR. "
        "The printed IR reads back to the same text.",
        epilog="example:\n  kfc opt kernels/kda_fwd.kfc -o kda.kir && kfc opt kda.kir",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    o.add_argument("file", help="a .kfc file or IR text")
    o.add_argument("-o", "--output", metavar="PATH", help="write the IR here instead of to stdout")
    o.add_argument("--dtype", type=cli_args.dtypes, metavar="T=f16", help=cli_args.DTYPE_HELP)
    o.add_argument("--shape", type=cli_args.shape, metavar="M=..,N=..",
                   help="specialise: bind these dims to sizes (the others stay symbolic)")
    o.add_argument("-p", "--pipeline", metavar="PIPELINE",
                   help='run these passes first, e.g. "canonicalize,cse,dce" (see kfc passes)')
    _add_pass_flags(o)
    o.set_defaults(run=cmd_opt)

    k = sub.add_parser(
        "compile", help="compile an op to CUDA C++ with inline PTX, PTX, a cubin and report.json",
        description="Specialise every dim but the row count (from --shape, else the check block's first shape), "
        "run the pipeline (-p, else the default for the kind of op) with the verifier after every pass, emit CUDA "
        "C++ with inline PTX, and build it with nvcc/ptxas. Writes NAME.cu, NAME.ptx, NAME.cubin, NAME.kir (the "
        "final IR) and report.json (registers, spills, shared memory, launch shape, timings) to -o. "
        "No GPU is needed. Blackwell (sm_100a) output is proven by ptxas only unless run on a B200.",
        epilog="examples:\n  kfc compile kernels/rmsnorm.kfc --target sm_100\n"
               "  kfc compile kernels/softmax.kfc --target sm_90a --shape N=65536 --dtype T=f16 -o out/softmax\n"
               '  kfc compile kernels/rmsnorm.kfc -p "canonicalize,tile{threads=512,vec=4},lower-reductions,lower-ptx" '
               "--verify-each --print-ir-after-all",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    k.add_argument("file", help="a .kfc file")
    k.add_argument("--target", type=cli_args.target, default=None, metavar="SM",
                   help="sm_90, sm_90a (Hopper), sm_100, sm_100a (Blackwell); default: the file's first target, "
                        "else sm_90a")
    k.add_argument("-p", "--pipeline", metavar="PIPELINE", help="the passes to run (default: by kind of op)")
    k.add_argument("--shape", type=cli_args.shape, metavar="N=..", help="sizes for the dims (all but the row count)")
    k.add_argument("--dtype", type=cli_args.dtypes, metavar="T=f16", help=cli_args.DTYPE_HELP)
    k.add_argument("-o", "--output", metavar="DIR", help="output folder (default kfc-out/NAME-TARGET)")
    k.add_argument("--allow-spills", action="store_true", help="accept a kernel that spills registers")
    k.add_argument("--from-kb", action="store_true",
                   help="use the fastest pipeline the knowledge base records for this op, target and shape")
    k.add_argument("--kb", metavar="PATH|URL",
                   help="a knowledge base (a file, or postgresql://...; default: $KFC_KB, else ~/.cache/kfc/kb.sqlite, "
                        "where it exists): for --from-kb; or, without -p, to start from its nearest record that beat "
                        "its op's default by 5%% as a user calls it: this op's own tunes, else the most alike op's, "
                        "at the nearest shape (kfc.kb.advice)")
    k.add_argument("--no-kb", action="store_true", help="compile the default pipeline, whatever a knowledge base holds")
    _add_pass_flags(k)
    k.set_defaults(run=cmd_compile)

    w = sub.add_parser(
        "warm", help="compile kernels into the JIT cache ahead of time (for a GPU machine to reuse)",
        description="Compile every instance of the ops' type parameters for each --shape into the JIT cache "
        "(KFC_CACHE_DIR, default ~/.cache/kfc), in parallel, so that a later kfc.load(...) call on a GPU finds "
        "them compiled.",
        epilog="example:\n  KFC_CACHE_DIR=.kfc-cache kfc warm kernels/rmsnorm.kfc --target sm_90a --shape N=256 --shape N=4096",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("files", nargs="+", help=".kfc files")
    w.add_argument("--target", type=cli_args.target, default="sm_90a", metavar="SM",
                   help="sm_90, sm_90a, sm_100, sm_100a (default sm_90a)")
    w.add_argument("--shape", type=cli_args.shape, action="append", required=True, metavar="N=..")
    w.add_argument("-p", "--pipeline", action="append", metavar="PIPELINE",
                   help="pipelines to build (repeatable; default: the default pipeline)")
    w.add_argument("-j", "--jobs", type=int_in(1, 1024), default=os.cpu_count() or 1,
                   help="parallel compiles (1 to 1024; default: the CPU count)")
    w.set_defaults(run=cmd_warm)

    pk = sub.add_parser(
        "package", help="write an op as a standalone pip-installable package (torch, no kfc)",
        description="Build the op's kernels for every instance of its type parameters, every --target and every "
        "--shape (the fixed dims; the row count stays free; default: the check block's shapes), and write a "
        "Python package to -o: the CUDA source, PTX and cubins, a launcher, the torch custom op with a fake, "
        "the check block's cases as tests, a benchmark and a report (pipelines, provenance, and what the "
        "knowledge base measured). It needs torch and a GPU of a packaged target, not kfc. Blackwell kernels "
        "are proven by the interpreter and ptxas unless the knowledge base shows a B200 run.",
        epilog="example:\n  kfc package kernels/rmsnorm.kfc --target sm_90a --target sm_100a --shape N=4096 "
               "-o dist/rmsnorm\n  pip install dist/rmsnorm && pytest dist/rmsnorm/tests",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    pk.add_argument("file", help="a .kfc file")
    pk.add_argument("--target", type=cli_args.target, action="append", metavar="SM",
                    help="sm_90a, sm_100a, ... (repeatable; default: the file's targets, else sm_90a)")
    pk.add_argument("--shape", type=cli_args.shape, action="append", metavar="N=..",
                    help="fixed dims to build (repeatable; default: every shape of the check block)")
    pk.add_argument("-p", "--pipeline", metavar="PIPELINE", help="the passes to run (default: the knowledge "
                    "base's advice, else by kind of op)")
    pk.add_argument("-o", "--output", required=True, metavar="DIR", help="a new or empty folder for the package")
    pk.add_argument("--kb", metavar="PATH|URL", help="the knowledge base to start from, as kfc compile does "
                    "without -p (its nearest record that beat its op's default by 5%% as a user calls it), and "
                    "whose measurements the report shows (default: $KFC_KB, else ~/.cache/kfc/kb.sqlite, when it "
                    "exists)")
    pk.add_argument("--no-kb", action="store_true", help="build the default pipeline (or -p's) without "
                    "consulting any knowledge base")
    pk.set_defaults(run=cmd_package)

    add_tune_command(sub, cli_args.shape, cli_args.dtypes, _add_reference_flags)

    add_kb_commands(sub)

    ps = sub.add_parser("passes", help="list the passes and their options")
    ps.set_defaults(run=cmd_passes)
    return p


def _add_reference_flags(p) -> None:
    p.add_argument("--reference-timeout", type=float_in(0.0, 86400.0), default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"stop a reference call that runs longer (default {DEFAULT_TIMEOUT_S:g} s). The reference is "
                        "Python code, run with your rights in a child process")
    p.add_argument("--reference-memory", type=gib, default=default_memory_bytes(), metavar="GIB",
                   help=f"stop a reference that uses more memory than this beyond what its process holds at "
                        f"its start (default half of this machine's: {default_memory_bytes() / (1 << 30):.3g})")


def _add_pass_flags(p) -> None:
    p.add_argument("--verify-each", action="store_true",
                   help="run the interpreter before and after every pass on random inputs; reject a pass that "
                        "changes the results")
    p.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass (to stderr)")
    p.add_argument("--print-ir-before", action="append", default=[], metavar="PASS",
                   help="print the IR before each run of this pass (repeatable)")
    p.add_argument("--timing", action="store_true", help="print the time each pass took")


# --- commands ----------------------------------------------------------------------------------


def cmd_opt(args) -> int:
    from .frontend import load_func  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .ir.printer import print_ir  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .ir.specialize import specialize  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .ir.verifier import verify  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

    func, spec = load_func(args.file, args.dtype)
    if args.shape:
        unknown = sorted(set(args.shape) - set(func.symbols))
        if unknown:
            raise KfcError(f"--shape names {unknown[0]}, which is not a dimension of {func.sym_name}",
                           hint=f"its dimensions are {', '.join(func.symbols) or 'none'}")
        func = verify(specialize(func, args.shape, partial=True, where="--shape"))
    given = [f for f, on in (("--verify-each", args.verify_each), ("--print-ir-after-all", args.print_ir_after_all),
                             ("--print-ir-before", args.print_ir_before), ("--timing", args.timing)) if on]
    if given and args.pipeline is None:
        raise KfcError(f"{given[0]} instruments a pipeline, and kfc opt runs none without -p",
                       hint='give the passes to run, e.g. -p "canonicalize,cse,dce"')
    if args.pipeline is not None:
        from .passes import PassContext, PassManager, VerifyEach, parse_user_pipeline  # lazy: kfc.ir ~2 s; -p only

        verify_each = None
        if args.verify_each:
            dims = dict(spec.check.shapes[0]) if spec is not None and spec.check and spec.check.shapes else {}
            dims.update(args.shape or {})
            unbound = [d for d in func.symbols if d not in dims]
            if unbound:
                raise KfcError(f"--verify-each runs the interpreter, which needs a size for {', '.join(unbound)}",
                               hint=f"pass --shape {','.join(f'{d}=8' for d in unbound)} (small sizes run fast)")
            verify_each = VerifyEach({k: min(v, 64) for k, v in dims.items()}, spec.check if spec else None)
        ctx = PassContext(parse_target("sm_90a"), check=spec.check if spec else None, verify_each=verify_each,
                          print_ir_after_all=args.print_ir_after_all,
                          print_ir_before=frozenset(args.print_ir_before), timing=args.timing)
        func = PassManager(parse_user_pipeline(args.pipeline), ctx).run(func)
    text = print_ir(func)
    if args.output:
        out = Path(args.output)
        if out.exists() and out.resolve() == Path(args.file).resolve():
            raise KfcError(f"-o {out} is the input file; writing the IR there would replace it",
                           hint="give -o another path, e.g. -o out.kir")
        if out.is_dir():
            raise KfcError(f"-o {out} is a folder; kfc opt writes one file", hint="give -o a file path, e.g. -o out.kir")
        write_atomically(out, text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_check(args) -> int:
    from rich.console import Console  # lazy: rich (~0.1 s), only kfc check prints a table
    from rich.table import Table  # lazy: rich (~0.1 s), only kfc check prints a table

    from .check.runner import DEFAULT_BUDGET, SOURCE_DEPARTS, check_op  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .frontend import instances as spec_instances, load_kfc  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .ir.specialize import check_dims  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .proof import stages_by_shape  # lazy: kfc.compile, kfc.passes ~2 s; off kfc --help

    spec = load_kfc(args.file, args.dtype)
    if spec.check is None:
        raise KfcError(f"{spec.name} has no check block: kfc check has nothing to compare with", spec.func.loc,
                       'add check { reference = "..." shapes = [{...}] } after the op')
    if args.shape:
        for s in args.shape:
            missing = [d for d in spec.func.symbols if d not in s]
            unknown = sorted(set(s) - set(spec.func.symbols))
            if unknown or missing:
                raise KfcError(f"--shape must size exactly the dims {', '.join(spec.func.symbols)}",
                               hint=f"unknown: {unknown}, missing: {missing}")
            check_dims(spec.func, s, "--shape")  # as a check block's shapes are: no tensor past 2**63 - 1 bytes
    console = Console(width=None if sys.stdout.isatty() else 140)
    err = Console(stderr=True)
    started = time.perf_counter()
    status = err.status(f"checking {spec.name}…") if err.is_terminal else None
    done = {"n": 0}

    def progress(res):
        done["n"] += 1
        if status is not None:
            status.update(f"checking {spec.name}: case {res.case + 1}, {res.variant}, seed {res.seed} "
                          f"({done['n']} outputs compared)")

    if status is not None:
        status.start()
    instances = [spec] if args.dtype or args.first else spec_instances(spec)
    target = parse_target(args.target or (spec.targets[0] if spec.targets else "sm_90a"))
    if args.pipeline is not None:
        from .passes import parse_user_pipeline  # lazy: kfc.passes pulls kfc.ir ~2 s; -p only

        parse_user_pipeline(args.pipeline)  # a -p that does not parse is an error, not a note
    not_compiled: dict[str, str] = {}  # instance -> why it has no final IR (kfc compile refuses it)

    def stages_for(inst):
        lowered = stages_by_shape(inst, target, args.pipeline)

        def at(dims):
            got = lowered(dims)
            if hasattr(got, "reason"):
                not_compiled.setdefault(inst.instance_name, got.reason)
            return got
        return None if args.source_only else at

    try:
        results = []
        for inst in instances:
            results += check_op(inst, seeds=args.seed, full=args.full, budget=args.budget or DEFAULT_BUDGET,
                                shapes=args.shape, on_result=progress, limits=cli_args.reference_limits(args),
                                stages_at=stages_for(inst))
    finally:
        if status is not None:
            status.stop()
    table = Table(title=f"kfc check {args.file}: {spec.name} (interpreter vs reference)")
    several = len(instances) > 1
    for col, just in ([("op", "left")] if several else []) + [("case", "right"), ("shape", "left"), ("IR", "left"),
                      ("variant", "left"), ("seed", "right"),
                      ("output", "left"), ("max abs err", "right"), ("rel RMSE", "right"), ("tol", "right"),
                      ("", "left")]:
        table.add_column(col, justify=just)
    for r in results:
        shape = ", ".join(f"{k}={v}" for k, v in r.dims.items())
        if r.scaled_from:
            shape += " (scaled)"
        verdict = "[green]ok[/]" if r.ok else f"[red]FAIL[/] {r.note}"
        table.add_row(*([r.instance] if several else []), str(r.case), shape, r.ir, r.variant, str(r.seed), f"{r.output}: {r.dtype}", f"{r.max_abs:.3g}",
                      f"{r.rel_rmse:.3g}", f"{r.tol:g}", verdict)
    console.print(table)
    failed = [r for r in results if not r.ok]
    took = time.perf_counter() - started
    scaled = {r.case: r.scaled_from for r in results if r.scaled_from}
    for ci, orig in scaled.items():
        console.print(f"case {ci}: scaled down from " + ", ".join(f"{k}={v}" for k, v in orig.items())
                      + " (pass --full to run it as written)")
    departed = sorted({r.note.split("first departs: ")[1] for r in failed
                       if r.ir == "final" and "first departs: " in r.note})
    for where in departed:
        if where == SOURCE_DEPARTS:  # no pass to blame: the op as written or the reference is wrong
            console.print("the op as written departs from the reference too (the `source` rows): the passes did "
                          "not cause it; check the reference and the op's formula")
        else:
            console.print(f"the final IR departs from the reference; first departs: {where}")
    for name, why in not_compiled.items():
        console.print(f"final IR of {name} not checked: {why}")
    if failed:
        console.print(f"[red]FAILED[/]: {len(failed)} of {len(results)} output comparisons ({took:.1f} s). "
                      f"Replay with --seed {failed[0].seed}.")
        return 1
    console.print(f"[green]passed[/]: {len(results)} output comparisons over {len(set(r.case for r in results))} "
                  f"shape(s) in {took:.1f} s")
    return 0


def refuse_kb_with_no_kb(args) -> None:
    """kfc compile's and kfc package's --kb KB and --no-kb ask for opposite things."""
    if args.no_kb and args.kb:
        raise KfcError("give either --kb or --no-kb, not both", hint="--kb KB reads that knowledge base; --no-kb none")


def cmd_compile(args) -> int:
    from .compile import build_advised, check_output_dir  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .compile import compile_op, write_outputs  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .frontend import load_kfc  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

    spec = load_kfc(args.file, args.dtype)
    target = parse_target(args.target or (spec.targets[0] if spec.targets else "sm_90a"))
    pipeline = args.pipeline
    refuse_kb_with_no_kb(args)
    if args.from_kb:
        if args.no_kb:
            raise KfcError("give either --from-kb or --no-kb, not both", hint="--from-kb compiles the fastest "
                           "pipeline the knowledge base records; --no-kb the default pipeline")
        if pipeline:
            raise KfcError("give either -p or --from-kb, not both", hint="-p PIPELINE compiles that pipeline; "
                           "--from-kb the fastest one the knowledge base records")
        pipeline = best_recorded_pipeline(spec, target, args.shape, args.kb)
    out_dir = Path(args.output or f"kfc-out/{spec.instance_name}-{target.name}")
    check_output_dir(out_dir)  # before the work: a bad -o fails at once

    def build(p):
        return compile_op(spec, target, p, args.shape, verify_each=args.verify_each,
                          print_ir_after_all=args.print_ir_after_all, print_ir_before=args.print_ir_before,
                          timing=args.timing, allow_spills=args.allow_spills)

    advice = None
    if pipeline is None and not args.no_kb:
        from .compile import choose_dims  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
        from .kb.advice import advise_from  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

        advice = advise_from(args.kb, spec.func, target.name, choose_dims(spec, args.shape))
    if advice is not None:
        result, said, _ = build_advised(advice, build)
        print(said)
    else:
        result = build(pipeline)
    rep = result.kernel.report
    written = write_outputs(result, out_dir)
    dims = ", ".join(f"{k}={v}" for k, v in result.dims.items()) or "none"
    dyn = ", ".join(result.dynamic_dims) or "none"
    print(f"{spec.instance_name} for {target.name} ({target.family}), compiled as {result.arch}: "
          f"dims {dims}; run-time dims {dyn}")
    print(f"  pipeline  {result.pipeline}")
    print(f"  launch    {result.plan.describe()}")
    for later in getattr(result.plan, "later", ()):  # a tile program's later loops, a kernel each
        print(f"  then      {later.kernel}: {later.describe()}")
    for follower in result.plan.contracts()[1:] if not hasattr(result.plan, "later") else ():  # sums across rows
        print(f"  then      {follower['name']}: the row kernel's partial sums added in a fixed order")
    print(f"  ptxas     {rep.registers} registers, {rep.spills} spill bytes, {rep.smem_bytes} B shared, "
          f"{rep.stack_bytes} B stack")
    approx = result.report["approximations"]
    if approx:  # each rewrite that may move a result within the tolerance, where it applies
        print(f"  approx    {len(approx)}: " + "; ".join(f"{a['what']} at {a['at']}" for a in approx))
    print(f"  time      {result.report['seconds']['passes'] * 1e3:.1f} ms passes, "
          f"{result.report['seconds']['nvcc_ptxas']:.2f} s nvcc+ptxas")
    ignored = [f"{k}={v}" for k, v in (args.shape or {}).items() if k in result.dynamic_dims]
    if ignored:  # the row count, or a dim the parallel loop's bounds read: the launch sizes the grid by it
        print(f"  note      --shape {','.join(ignored)} not fixed: a run-time dim, which each call passes")
    if target.sm == 100:
        print("  note      Blackwell output is proven by ptxas only unless run on a B200")
    for path in written:
        print(f"  wrote     {path}")
    return 0


def best_recorded_pipeline(spec, target, shape, kb_path) -> str:
    """The fastest timed pipeline recorded for this op instance and target at this shape (the
    shape it was tuned at: --shape, else the check block's first shape)."""
    from .compile import choose_dims  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .kb.fingerprint import op_fingerprint  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

    dims = choose_dims(spec, shape)
    kb = KnowledgeBase(kb_path)
    try:
        with reporting_damage(kb_path or default_path()):
            best = kb.best_by_fingerprint(op_fingerprint(spec.func), target.name, dims)
    finally:
        kb.close()
    if best is None:
        raise KfcError(f"the knowledge base has no timed pipeline for {spec.instance_name} on {target} at "
                       f"{', '.join(f'{k}={v}' for k, v in dims.items())}",
                       hint=f"tune it first: kfc tune {spec.path} --target {target} "
                            f"--shape {','.join(f'{k}={v}' for k, v in dims.items())}")
    print(f"from the knowledge base: candidate {best.candidate_id}, {best.outcome.median_us:.1f} us: "
          f"{best.proposal.pipeline}")
    return best.proposal.pipeline


def cmd_package(args) -> int:
    from .frontend import load_kfc  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .package.build import build_package  # lazy: pulls kfc.runtime, kfc.ir, ml_dtypes ~2 s; off kfc --help

    refuse_kb_with_no_kb(args)
    names = args.target or load_kfc(args.file).targets or ("sm_90a",)
    targets = [parse_target(t) for t in dict.fromkeys(names)]
    advise = None
    if not args.no_kb and not args.pipeline:
        from .kb.advice import advise_from  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

        advise = functools.partial(advise_from, args.kb)
    build_package(args.file, targets, args.shape or [], Path(args.output), args.pipeline,
                  None if args.no_kb else args.kb or default_path(), advise=advise)
    return 0


def cmd_warm(args) -> int:
    from .compile import build_advised  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .frontend import instances as spec_instances, load_kfc  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from .kb.advice import advise_by_default  # lazy: as above
    from .runtime.cache import writable_cache_dir  # lazy: beside cached_compile's import
    from .runtime.kernel import cached_compile  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

    target = parse_target(args.target)
    writable_cache_dir()  # before any work: a file where the cache folder should be is one error
    jobs = []
    for f in args.files:
        for inst in spec_instances(load_kfc(f)):
            for shape in args.shape:
                for pipe in args.pipeline or [None]:
                    jobs.append((inst, shape, pipe))
    started = time.perf_counter()
    failures = []

    def build(job):
        inst, shape, pipe = job
        try:  # what kfc.load compiles: the default knowledge base's advice where it gives one
            advice = advise_by_default(inst.func, target.name, shape) if pipe is None else None
            if advice is not None:
                build_advised(advice, lambda p: cached_compile(inst, target, p, shape))
            else:
                cached_compile(inst, target, pipe, shape)
            return None
        except KfcError as e:
            return f"{inst.instance_name} {shape} {pipe or 'default'}: {e.message.splitlines()[0]}"

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for i, problem in enumerate(pool.map(build, jobs), 1):
            if problem:
                failures.append(problem)
            print(f"\r{i}/{len(jobs)} kernels", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    for f in failures:
        print(f"failed: {f}", file=sys.stderr)
    print(f"{len(jobs) - len(failures)} of {len(jobs)} kernels in the cache for {target} "
          f"({time.perf_counter() - started:.1f} s)")
    return 1 if failures else 0


def cmd_passes(args) -> int:
    from .passes import (  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
        MATMUL_PIPELINE, PASSES, ROW_PIPELINE, SKINNY_MATMUL_PIPELINE, SKINNY_ROWS, TILE_PIPELINE)

    for name, cls in sorted(PASSES.items()):
        needs = f"  [needs {', '.join(sorted(cls.REQUIRES))}]" if cls.REQUIRES else ""
        print(f"{name:18} {cls.SUMMARY}{needs}")
        opts = cls.describe_options()
        if opts:
            print(f"{'':18} options: {opts}")
    print(f"\ndefault pipeline for row ops: {ROW_PIPELINE}")
    print(f"default pipeline for matrix products: {MATMUL_PIPELINE}")
    print(f"  ... of at most {SKINNY_ROWS} rows on wgmma (sm_90a): {SKINNY_MATMUL_PIPELINE}")
    print(f"default pipeline for other tile programs: {TILE_PIPELINE} (without tf32-dots where its products "
          "would not fit in shared memory)")
    return 0


@functools.lru_cache(maxsize=1)
def _parser() -> argparse.ArgumentParser:
    """The parser, built once a process (18 ms): parsing keeps nothing in it, so a process that
    calls main many times (the fuzz tests, a session driving kfc in-process) reuses it."""
    return build_parser()


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a bad option (its message is printed)
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except KfcError as e:
        print(e.render(), file=sys.stderr)
        return 3 if isinstance(e, InternalError) else 2
    except KeyboardInterrupt:
        print("kfc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - the last line of defence: no traceback for users
        if os.environ.get("KFC_DEBUG"):
            raise
        print(f"kfc: internal error: {type(e).__name__}: {e}\n"
              "hint: this is a bug in kfc; rerun with KFC_DEBUG=1 for the traceback and report it",
              file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
