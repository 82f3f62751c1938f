"""This checkout's kfc against an earlier one, in one run on one GPU: the ops of bench.ops at
the shapes asked, each called by keyword on its default pipeline, outputs checked before timing
as bench.ops checks them, and the device's copy of as many bytes timed beside them.

    python -m bench.ab --export REV DIR       # here: the earlier kfc (git archive REV) into DIR
    python -m bench.ab --base DIR [--ops fp8_quant,...] [--shapes 32768x4096,...] [--out FILE]

The GPU machine has no git history, so the earlier kfc travels as a folder (kfc/ and grammars/
of REV, and the commit's name in DIR/REV). Each side runs in its own process, the earlier one
first, with the earlier package ahead on the path; a wrong result fails the run. Eager:
triton.testing.do_bench median, L2 flushed (bench.harness.time_eager); `ratio` = earlier time /
this time, above 1 where this checkout is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from . import ops as bench_ops
from .provenance import save

ROOT = Path(__file__).resolve().parent.parent


def export(rev: str, into: Path) -> None:
    """The earlier kfc's package and grammars into `into`, with the commit's name."""
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kfc", "grammars"], stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as t:
            t.extractall(into, filter="data")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], capture_output=True, text=True, check=True)
    (into / "REV").write_text(commit.stdout.strip() + "\n")


def side(names: list[str], shapes: list[tuple[int, int]]) -> list[dict]:
    """Time the named ops with whichever kfc this process imports."""
    import torch

    import kfc

    from . import harness

    rows = []
    for op in bench_ops.select(names):
        kernel = kfc.load(ROOT / op.path, kb=False)
        for m, n in shapes:
            case = bench_ops.prepare(op, m, n, torch.bfloat16)
            if case is None:
                continue
            inputs, moved = case.inputs, case.moved
            problem = case.wrong(kernel(**inputs))
            if problem:
                raise AssertionError(f"{op.name} {m}x{n} with {kfc.__file__}: wrong: {problem}")
            us = harness.time_eager(lambda: kernel(**inputs), ())
            src = torch.empty(moved // 4, device="cuda")
            dst = torch.empty_like(src)
            copy_us = harness.time_eager(lambda: dst.copy_(src), ())
            rows.append({"op": op.name, "M": m, "N": n, "bytes": moved, "us": us,
                         "of_copy": copy_us / (2 * us)})  # the copy moves the bytes twice (read, write)
            print(f"{Path(kfc.__file__).parent}: {op.name} {m}x{n} {us:.1f} µs", file=sys.stderr, flush=True)
            del case, inputs, src, dst
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", nargs=2, metavar=("REV", "DIR"), help="write the earlier kfc of REV into DIR")
    ap.add_argument("--base", type=Path, help="the folder --export wrote")
    ap.add_argument("--ops", help="a comma-separated subset of bench.ops (default: all)")
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in bench_ops.SHAPES), help="MxN,...")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)  # one side, rows as JSON on stdout
    args = ap.parse_args(argv)
    try:
        names = [o.name for o in bench_ops.select(args.ops.split(",") if args.ops else None)]
    except ValueError as e:
        ap.error(str(e))
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.export:
        export(args.export[0], Path(args.export[1]))
        return 0
    if args.side:
        print(json.dumps(side(names, shapes)))
        return 0
    if args.base is None or not (args.base / "kfc").is_dir():
        ap.error("--base DIR: a folder `python -m bench.ab --export REV DIR` wrote")

    def run(path_first: list[Path]) -> list[dict]:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(p) for p in path_first] + [str(ROOT)] + [os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "bench.ab", "--side", "--ops", ",".join(names), "--shapes", args.shapes]
        # `-m` puts the working folder first on the path: the side's own kfc must be found there
        out = subprocess.run(cmd, env=env, cwd=str(path_first[0] if path_first else ROOT), stdout=subprocess.PIPE,
                             text=True, check=True)
        return json.loads(out.stdout)

    base, this = run([args.base.resolve()]), run([])
    rows = []
    for b, t in zip(base, this):
        rows.append({"op": t["op"], "M": t["M"], "N": t["N"], "bytes": t["bytes"], "base_us": b["us"],
                     "us": t["us"], "ratio": b["us"] / t["us"], "base_of_copy": b["of_copy"], "of_copy": t["of_copy"]})
    from .harness import provenance

    rev = (args.base / "REV").read_text().strip() if (args.base / "REV").exists() else str(args.base)
    path = save("ab", {"base": rev, "dtype": "bf16", "call": "kfc by keyword, default pipeline",
                       "timing": "eager: triton.testing.do_bench median, L2 flushed; ratio = base time / this time",
                       "env": provenance([]), "shapes": rows}, also=args.out)
    print(f"saved {path}")
    print(f"{'op':>16} {'M x N':>14} {'base µs':>9} {'µs':>9} {'ratio':>6} {'copy':>5}")
    for r in rows:
        print(f"{r['op']:>16} {r['M']:>6}x{r['N']:<7} {r['base_us']:9.1f} {r['us']:9.1f} {r['ratio']:6.2f} "
              f"{r['of_copy']:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
