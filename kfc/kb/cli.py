"""`kfc kb …`: read the knowledge base — best pipelines, candidates, runs, lessons — export it as
JSON and plot how searches converged. `add_commands(subparsers)` adds the `kb` command to the
`kfc` parser; every handler takes the parsed args and returns an exit status (0 ok, 1 nothing
found, 2 bad input via KfcError)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .. import cli_args
from ..diagnostics import KfcError, read_source
from ..files import write_atomically
from .database import default_path, reporting_damage
from .store import KnowledgeBase

KB_HELP = "the knowledge base: a file, or a postgresql:// URL (default: $KFC_KB, else ~/.cache/kfc/kb.sqlite)"

EXAMPLES = """\
examples:
  kfc kb best kernels/rmsnorm.kfc --target sm_90a --shape N=4096
  kfc kb show --op rmsnorm                   every candidate tried for rmsnorm
  kfc kb runs                                the searches, with their best results
  kfc kb lessons --op rmsnorm
  kfc kb export -o kb.json
  kfc kb plot -o convergence.png             best-so-far time against candidate number, per run
  kfc compile kernels/rmsnorm.kfc -p "$(kfc kb best kernels/rmsnorm.kfc --target sm_90a --shape N=4096 --pipeline-only)"
"""


def _sub(sub, name: str, help: str, description: str, example: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=description, epilog="example:\n  " + example,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kb", metavar="PATH|URL", default=None, help=KB_HELP)
    return p


def add_commands(subparsers) -> argparse.ArgumentParser:
    """Add `kfc kb` and its subcommands to the `kfc` parser's subparsers."""
    kb = subparsers.add_parser(
        "kb", help="query the knowledge base of tuning experiments",
        description="The knowledge base records every candidate pipeline the factory tried — op, target, shape, "
        "pipeline, proposer and rationale, how far it got, its error, registers, time and speedup — with the "
        "GPU, driver, toolchain and kfc commit of its run, and the lessons drawn from them. These commands read it.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = kb.add_subparsers(dest="kb_command", metavar="SUBCOMMAND")
    kb.set_defaults(run=lambda args: _print_help(kb))

    b = _sub(sub, "best", "the fastest timed pipeline for an op",
             "Print the fastest candidate that reached TIMED for an op, per target and shape (or for the one "
             "--target and --shape given). The op is a .kfc file or IR text (fingerprinted as kfc reads it), a "
             "16-hex-digit fingerprint, or an op name in the knowledge base. Exit status 1 when none is known.",
             "kfc kb best kernels/rmsnorm.kfc --target sm_90a --shape N=4096 --pipeline-only")
    b.add_argument("op", metavar="OP.kfc|FINGERPRINT|NAME", help="the op")
    b.add_argument("--target", type=cli_args.target, metavar="SM", help="only this target, e.g. sm_90a")
    b.add_argument("--shape", type=cli_args.shape, metavar="N=..", help="only this shape (every dim the run recorded)")
    b.add_argument("--dtype", type=cli_args.dtypes, metavar="T=f16", help="bind the .kfc file's type parameters: a dtype (T=f16) or a size (C=32)")
    b.add_argument("--pipeline-only", action="store_true",
                   help="print only the pipeline (exactly one target and shape must match)")
    b.set_defaults(run=reading(cmd_best))

    s = _sub(sub, "show", "a table of candidates: proposer, stage, time, speedup, pipeline",
             "List candidates, oldest first: id, run, proposer, the stage reached (pending: no outcome yet), "
             "median time, speedup over the default pipeline (back to back, and eagerly where timed so), the pipeline "
             "and the error.",
             "kfc kb show --run 3        or   kfc kb show --op rmsnorm --target sm_90a --limit 20")
    s.add_argument("--run", type=cli_args.int_in(1), dest="run_id", metavar="ID", help="only this run's candidates")
    s.add_argument("--op", metavar="NAME", help="only this op's (a name or a fingerprint)")
    s.add_argument("--target", type=cli_args.target, metavar="SM", help="only this target, e.g. sm_90a")
    s.add_argument("--limit", type=cli_args.int_in(1), metavar="N", help="only the newest N (1 or more)")
    s.set_defaults(run=reading(cmd_show))

    r = _sub(sub, "runs", "a table of runs: op, target, shape, policy, status, best",
             "List the tuning runs, oldest first, with their provenance and best result.",
             "kfc kb runs --op rmsnorm")
    r.add_argument("--op", metavar="NAME", help="only this op's runs (a name or a fingerprint)")
    r.set_defaults(run=reading(cmd_runs))

    le = _sub(sub, "lessons", "the lessons drawn from experiments",
              "List lessons: short texts written by a policy or a person, with the candidate ids behind them. "
              "With --op: that op's lessons and the general ones.",
              "kfc kb lessons --op rmsnorm")
    le.add_argument("--op", metavar="NAME", help="only lessons about this op (a name or a fingerprint)")
    le.set_defaults(run=reading(cmd_lessons))

    e = _sub(sub, "export", "everything as JSON",
             "Write every op, run, candidate, outcome and lesson as one JSON document (to stdout, or atomically "
             "to -o).", "kfc kb export -o kb.json")
    e.add_argument("-o", "--output", metavar="FILE", help="write here instead of to stdout")
    e.set_defaults(run=reading(cmd_export))

    pl = _sub(sub, "plot", "plot best-so-far against candidate number, one line per run",
              "Draw, for each run (all of them, or those given), the best time (or speedup) found so far against "
              "the number of candidates tried, one line per run with a legend. Writes a PNG atomically.",
              "kfc kb plot --run 3 --run 4 --metric speedup -o convergence.png")
    pl.add_argument("--run", type=cli_args.int_in(1), action="append", dest="run_ids", metavar="ID",
                    help="plot this run (repeatable; default all)")
    pl.add_argument("--op", metavar="NAME", help="only this op's runs (a name or a fingerprint)")
    pl.add_argument("--metric", choices=("time", "speedup"), default="time",
                    help="best median time in µs (default), or best speedup over the default pipeline")
    pl.add_argument("-o", "--output", metavar="FILE.png", required=True, help="the PNG to write")
    pl.set_defaults(run=reading(cmd_plot))
    return kb


def reading(command):
    """A kb command whose knowledge base SQLite finds damaged (a torn page) ends in one clear error."""
    def run(args) -> int:
        with reporting_damage(args.kb or default_path()):
            return command(args)
    return run


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


# --- helpers -------------------------------------------------------------------------------------


def _open(args):
    return KnowledgeBase(args.kb, create=False)


def _console():
    from rich.console import Console  # lazy: rich (~0.1 s), off kfc --help

    return Console(width=None if sys.stdout.isatty() else 200)


def _fmt_shape(shape: dict[str, int] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (shape or {}).items())


def _fmt(x: Any, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _ops_named(kb, name: str | None) -> list[dict[str, Any]] | None:
    """None when no filter; else the ops whose name or fingerprint is `name` (KfcError if none)."""
    if name is None:
        return None
    ops = kb.ops(name)
    if not ops:
        op = kb.op_by_fingerprint(name.lower())
        ops = [op] if op else []
    if not ops:
        known = sorted({o["name"] for o in kb.ops()})
        raise KfcError(f"no op {name!r} in the knowledge base {kb.path}",
                       hint=f"it knows {', '.join(known)}" if known else "it is empty")
    return ops


def _resolve_op(kb, text: str, dtypes) -> list[dict[str, Any]]:
    from .fingerprint import is_fingerprint, op_fingerprint  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

    if Path(text).is_file():
        from ..frontend import instances, load_func, load_kfc, looks_like_ir  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

        if dtypes or looks_like_ir(read_source(text)):
            funcs = [load_func(text, dtypes)[0]]
        else:  # every instance of the op's type parameters
            funcs = [inst.func for inst in instances(load_kfc(text))]
        fps = [op_fingerprint(f) for f in funcs]
        ops = [op for op in map(kb.op_by_fingerprint, fps) if op is not None]
        if not ops:
            raise _NotFound(f"{funcs[0].sym_name} from {text} (fingerprint {', '.join(fps)}) is not in the "
                            f"knowledge base {kb.path}")
        return ops
    if is_fingerprint(text):
        op = kb.op_by_fingerprint(text.lower())
        if op is None:
            raise _NotFound(f"no op with fingerprint {text} in the knowledge base {kb.path}")
        return [op]
    ops = kb.ops(text)
    if not ops:
        raise KfcError(f"{text!r} is neither a file, an op fingerprint, nor an op in the knowledge base {kb.path}",
                       hint="give a .kfc file, a 16-hex-digit fingerprint, or a name `kfc kb runs` lists")
    return ops


class _NotFound(Exception):
    """Nothing to report: exit status 1 with a message on stderr."""


# --- commands ------------------------------------------------------------------------------------


def cmd_best(args) -> int:
    from rich.table import Table  # lazy: rich (~0.1 s), off kfc --help

    with _open(args) as kb:
        try:
            ops = _resolve_op(kb, args.op, args.dtype)
        except _NotFound as e:
            print(f"kfc: {e}", file=sys.stderr)
            return 1
        best: dict[tuple, dict[str, Any]] = {}
        for op in ops:
            for c in kb.candidates(op_id=op["id"], target=args.target, shape=args.shape):
                if c["stage"] != "timed" or c["median_us"] is None:
                    continue
                key = (op["id"], c["target"], json.dumps(c["shape"], sort_keys=True))
                if key not in best or c["median_us"] < best[key]["median_us"]:
                    best[key] = c
    if not best:
        where = " ".join(x for x in (args.target, _fmt_shape(args.shape)) if x)
        print(f"kfc: no timed candidate for {args.op}" + (f" at {where}" if where else ""), file=sys.stderr)
        return 1
    rows = [best[k] for k in sorted(best)]
    if args.pipeline_only:
        if len(rows) > 1:
            listed = "; ".join(f"{c['target']} {_fmt_shape(c['shape'])}" for c in rows[:6])
            raise KfcError(f"{len(rows)} targets/shapes have a best pipeline for {args.op}: {listed}",
                           hint="choose one with --target and --shape")
        print(rows[0]["pipeline"])
        return 0
    table = Table(title=f"kfc kb best {args.op}")
    for col, just in (("op", "left"), ("target", "left"), ("shape", "left"), ("candidate", "right"),
                      ("run", "right"), ("median µs", "right"), ("speedup", "right"), ("pipeline", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for c in rows:
        table.add_row(c["op_name"], c["target"], _fmt_shape(c["shape"]), str(c["id"]), _fmt(c["run_id"], "d"),
                      _fmt(c["median_us"], ".2f"), _fmt(c["speedup"], ".3f") + ("×" if c["speedup"] else ""),
                      c["pipeline"])
    _console().print(table)
    return 0


def cmd_show(args) -> int:
    from rich.markup import escape  # lazy: rich (~0.1 s), off kfc --help
    from rich.table import Table  # lazy: rich (~0.1 s), off kfc --help

    with _open(args) as kb:
        if args.run_id is not None and not any(r["id"] == args.run_id for r in kb.runs()):
            raise KfcError(f"no run {args.run_id} in the knowledge base {kb.path}", hint="`kfc kb runs` lists them")
        ops = _ops_named(kb, args.op)
        rows = []
        for op_id in ([o["id"] for o in ops] if ops is not None else [None]):
            rows += kb.candidates(op_id=op_id, run_id=args.run_id, target=args.target)
    rows.sort(key=lambda c: c["id"])
    if args.limit is not None:
        rows = rows[-args.limit:] if args.limit > 0 else []
    if not rows:
        print("no candidates match")
        return 0
    table = Table(title=f"kfc kb show: {len(rows)} candidate{'s' * (len(rows) != 1)}")
    for col, just in (("id", "right"), ("run", "right"), ("op", "left"), ("proposer", "left"), ("stage", "left"),
                      ("median µs", "right"), ("speedup", "right"), ("eager µs", "right"), ("eager speedup", "right"),
                      ("pipeline", "left"), ("error", "left")):
        table.add_column(col, justify=just, overflow="fold")
    colour = {"timed": "green", None: "yellow"}
    for c in rows:
        stage = c["stage"] or "pending"
        error = (c["error"] or "").splitlines()[0][:80] if c["error"] else ""
        table.add_row(str(c["id"]), _fmt(c["run_id"], "d"), c["op_name"], escape(c["proposer"] or ""),
                      f"[{colour.get(c['stage'], 'red')}]{stage}[/]", _fmt(c["median_us"], ".2f"),
                      _fmt(c["speedup"], ".3f"), _fmt(c["eager_us"], ".2f"), _fmt(c["eager_speedup"], ".3f"),
                      escape(c["pipeline"]), escape(error))
    _console().print(table)
    return 0


def cmd_runs(args) -> int:
    from rich.markup import escape  # lazy: rich (~0.1 s), off kfc --help
    from rich.table import Table  # lazy: rich (~0.1 s), off kfc --help

    with _open(args) as kb:
        ops = _ops_named(kb, args.op)
        runs = []
        for op_id in ([o["id"] for o in ops] if ops is not None else [None]):
            runs += kb.runs(op_id)
    runs.sort(key=lambda r: r["id"])
    if not runs:
        print("no runs")
        return 0
    table = Table(title=f"kfc kb runs: {len(runs)}")
    for col in ("id", "op", "target", "shape", "policy", "budget", "status", "tried", "timed", "best µs",
                "best speedup", "gpu", "started (UTC)"):
        table.add_column(col, overflow="fold")
    for r in runs:
        table.add_row(str(r["id"]), r["op_name"], r["target"], _fmt_shape(r["shape"]), escape(r["policy"]),
                      _fmt(r["budget"], "d"), r["status"], str(r["candidates"]), str(r["timed"]),
                      _fmt(r["best_us"], ".2f"), _fmt(r["best_speedup"], ".3f"), escape(r["gpu"] or ""),
                      r["started_utc"][:19])
    _console().print(table)
    return 0


def cmd_lessons(args) -> int:
    from rich.markup import escape  # lazy: rich (~0.1 s), off kfc --help
    from rich.table import Table  # lazy: rich (~0.1 s), off kfc --help

    with _open(args) as kb:
        ops = _ops_named(kb, args.op)
        seen: dict[int, dict[str, Any]] = {}
        for op_id in ([o["id"] for o in ops] if ops is not None else [None]):
            for lesson in kb.lessons(op_id):
                seen[lesson["id"]] = lesson
    lessons = [seen[k] for k in sorted(seen)]
    if not lessons:
        print("no lessons")
        return 0
    table = Table(title=f"kfc kb lessons: {len(lessons)}")
    for col in ("id", "op", "author", "lesson", "evidence"):
        table.add_column(col, overflow="fold")
    for lesson in lessons:
        table.add_row(str(lesson["id"]), lesson["op_name"] or "(all)", escape(lesson["author"]),
                      escape(lesson["text"]), ", ".join(str(i) for i in lesson["evidence"]))
    _console().print(table)
    return 0


def cmd_export(args) -> int:
    with _open(args) as kb:
        data = kb.export()
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    if args.output:
        write_atomically(Path(args.output), text.encode())
        print(f"wrote {args.output}: {len(data['ops'])} ops, {len(data['runs'])} runs, "
              f"{len(data['candidates'])} candidates, {len(data['lessons'])} lessons", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def convergence(candidates: list[dict[str, Any]], metric: str = "time") -> list[float | None]:
    """Best-so-far after each candidate (in order): the lowest timed median µs, or the highest
    timed speedup; None until the first timed candidate."""
    out: list[float | None] = []
    best = None
    for c in candidates:
        v = c.get("median_us") if metric == "time" else c.get("speedup")
        if c.get("stage") == "timed" and v is not None and (
                best is None or (v < best if metric == "time" else v > best)):
            best = v
        out.append(best)
    return out


def cmd_plot(args) -> int:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib (~1 s), only kfc kb plot
    from matplotlib.figure import Figure  # lazy: matplotlib (~1 s), only kfc kb plot
    from matplotlib.ticker import MaxNLocator  # lazy: matplotlib (~1 s), only kfc kb plot

    with _open(args) as kb:
        all_runs = {r["id"]: r for r in kb.runs()}
        if args.run_ids:
            missing = [i for i in args.run_ids if i not in all_runs]
            if missing:
                raise KfcError(f"no run {missing[0]} in the knowledge base {kb.path}", hint="`kfc kb runs` lists them")
            runs = [all_runs[i] for i in dict.fromkeys(args.run_ids)]
        else:
            runs = list(all_runs.values())
        ops = _ops_named(kb, args.op)
        if ops is not None:
            ids = {o["id"] for o in ops}
            runs = [r for r in runs if r["op_id"] in ids]
        if not runs:
            raise KfcError(f"no runs to plot in the knowledge base {kb.path}",
                           hint="run `kfc tune` first, or check --run/--op against `kfc kb runs`")
        series = [(r, convergence(kb.candidates(run_id=r["id"]), args.metric)) for r in runs]

    fig = Figure(figsize=(9, 5.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for r, ys in series:
        label = f"run {r['id']}: {r['op_name']} {r['target']} {_fmt_shape(r['shape'])} ({r['policy'] or '?'})"
        if not any(y is not None for y in ys):
            label += " — nothing timed"
        xs = list(range(1, len(ys) + 1))
        ax.plot(xs, [float("nan") if y is None else y for y in ys], drawstyle="steps-post", marker=".",
                markersize=3, linewidth=1.5, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("candidates tried")
    ax.set_ylabel("best median time so far (µs)" if args.metric == "time" else "best speedup so far (×)")
    ax.set_title("kfc tuning: best so far per run")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    write_atomically(Path(args.output), writer=lambda tmp: fig.savefig(tmp, format="png"))
    print(f"wrote {args.output} ({len(series)} run{'s' * (len(series) != 1)})", file=sys.stderr)
    return 0
