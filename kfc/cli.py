"""The `kfc` command line.

Exit status: 0 success; 1 a check ran and failed; 2 bad input (a message with file:line:col);
3 an internal error (set KFC_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import __version__
from .diagnostics import KfcError

EXAMPLES = """\
examples:
  kfc check kernels/rmsnorm.kfc              prove the op against its reference on the CPU
  kfc check kernels/kda_fwd.kfc --seed 7     replay one seed
  kfc opt kernels/softmax.kfc                print its tile IR
  kfc opt kernels/softmax.kfc -o sm.kir      ... into a file; `kfc opt sm.kir` reads it back

exit status: 0 ok, 1 a check failed, 2 bad input, 3 internal error (KFC_DEBUG=1 shows the traceback)
"""


def _parse_shape(text: str) -> dict[str, int]:
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if not name.strip() or not value.strip().isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"bad shape {text!r}: write NAME=SIZE[,NAME=SIZE...], e.g. M=4,N=7")
        out[name.strip()] = int(value)
    return out


def _parse_dtypes(text: str) -> dict[str, str]:
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if not name.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"bad --dtype {text!r}: write PARAM=DTYPE[,...], e.g. T=f16")
        out[name.strip()] = value.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
        "no unwritten element, inputs unchanged. Ops with optional inputs run with them given and absent.",
        epilog="example:\n  kfc check kernels/kda_fwd.kfc --seed 7 --shape N=2,T=100,H=1,K=16,V=16",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("file", help="a .kfc file with a check block")
    c.add_argument("--seed", type=int, action="append", metavar="N",
                   help="use this seed instead of the block's seeds and a fresh one (repeatable)")
    c.add_argument("--shape", type=_parse_shape, action="append", metavar="M=..,N=..",
                   help="check this shape instead of the block's (repeatable)")
    c.add_argument("--full", action="store_true", help="do not scale huge shapes down (slow)")
    c.add_argument("--dtype", type=_parse_dtypes, metavar="T=f16",
                   help="check only this instance of the op's type parameters (default: every combination)")
    c.add_argument("--budget", type=int, default=None, metavar="ELEMS",
                   help="scale a case down until its tensors hold at most this many elements (default 1048576)")
    c.set_defaults(run=cmd_check)

    o = sub.add_parser(
        "opt", help="parse and verify an op, print its tile IR",
        description="Read a .kfc file or IR text (as this command prints it), verify it, and print the IR. "
        "The printed IR reads back to the same text.",
        epilog="example:\n  kfc opt kernels/kda_fwd.kfc -o kda.kir && kfc opt kda.kir",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    o.add_argument("file", help="a .kfc file or IR text")
    o.add_argument("-o", "--output", metavar="PATH", help="write the IR here instead of to stdout")
    o.add_argument("--dtype", type=_parse_dtypes, metavar="T=f16", help="bind the op's type parameters")
    o.add_argument("--shape", type=_parse_shape, metavar="M=..,N=..",
                   help="specialise: bind these dims to sizes (all dims of the op)")
    o.set_defaults(run=cmd_opt)
    return p


# --- commands ----------------------------------------------------------------------------------


def cmd_opt(args) -> int:
    from .frontend import load_func
    from .ir.printer import print_ir
    from .ir.specialize import specialize
    from .ir.verifier import verify

    func, _ = load_func(args.file, args.dtype)
    if args.shape:
        unknown = sorted(set(args.shape) - set(func.symbols))
        if unknown:
            raise KfcError(f"--shape names {unknown[0]}, which is not a dimension of {func.sym_name}",
                           hint=f"its dimensions are {', '.join(func.symbols) or 'none'}")
        func = verify(specialize(func, args.shape))
    text = print_ir(func)
    if args.output:
        _write_atomically(Path(args.output), text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_check(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from .check.runner import DEFAULT_BUDGET, check_op
    from .frontend import load_kfc

    spec = load_kfc(args.file, args.dtype)
    if spec.check is None:
        raise KfcError(f"{args.file} has no check block", hint='add check { reference = "..." shapes = [{...}] }')
    if args.shape:
        for s in args.shape:
            missing = [d for d in spec.func.symbols if d not in s]
            unknown = sorted(set(s) - set(spec.func.symbols))
            if unknown or missing:
                raise KfcError(f"--shape must size exactly the dims {', '.join(spec.func.symbols)}",
                               hint=f"unknown: {unknown}, missing: {missing}")
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
    instances = [spec] if args.dtype else spec.instances()
    try:
        results = []
        for inst in instances:
            results += check_op(inst, seeds=args.seed, full=args.full, budget=args.budget or DEFAULT_BUDGET,
                                shapes=args.shape, on_result=progress)
    finally:
        if status is not None:
            status.stop()
    table = Table(title=f"kfc check {args.file}: {spec.name} (interpreter vs reference)")
    several = len(instances) > 1
    for col, just in ([("op", "left")] if several else []) + [("case", "right"), ("shape", "left"), ("variant", "left"), ("seed", "right"),
                      ("output", "left"), ("max abs err", "right"), ("rel RMSE", "right"), ("tol", "right"),
                      ("", "left")]:
        table.add_column(col, justify=just)
    for r in results:
        shape = ", ".join(f"{k}={v}" for k, v in r.dims.items())
        if r.scaled_from:
            shape += " (scaled)"
        verdict = "[green]ok[/]" if r.ok else f"[red]FAIL[/] {r.note}"
        table.add_row(*([r.instance] if several else []), str(r.case), shape, r.variant, str(r.seed), f"{r.output}: {r.dtype}", f"{r.max_abs:.3g}",
                      f"{r.rel_rmse:.3g}", f"{r.tol:g}", verdict)
    console.print(table)
    failed = [r for r in results if not r.ok]
    took = time.perf_counter() - started
    scaled = {r.case: r.scaled_from for r in results if r.scaled_from}
    for ci, orig in scaled.items():
        console.print(f"case {ci}: scaled down from " + ", ".join(f"{k}={v}" for k, v in orig.items())
                      + " (pass --full to run it as written)")
    if failed:
        console.print(f"[red]FAILED[/]: {len(failed)} of {len(results)} output comparisons ({took:.1f} s). "
                      f"Replay with --seed {failed[0].seed}.")
        return 1
    console.print(f"[green]passed[/]: {len(results)} output comparisons over {len(set(r.case for r in results))} "
                  f"shape(s) in {took:.1f} s")
    return 0


def _write_atomically(path: Path, text: str) -> None:
    """Write through a temporary file so an interrupted run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args)
    except KfcError as e:
        print(e.render(), file=sys.stderr)
        return 2
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
