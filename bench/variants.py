"""kfc's row ops on variants of their default pipeline, in one run on one GPU: which pass option
would pay, before a rule is changed.

    python -m bench.variants --variant NAME=PASS{OPTIONS}[+PASS{OPTIONS}...] [--variant ...]
                             [--ops scale_shift,softmax,...] [--shapes 32768x4096,65536x1024] [--out FILE]

A variant is the default row pipeline with the named passes' options set, e.g.
HINT0='lower-ptx{stream=none,store=none}', T128='tile{threads=128}',
NS='stage-rows{min_bytes=1073741824}' (no staging), P_T128='tile{persistent=true,threads=128}'.
Each op of bench.ops (bf16, called by keyword) runs its default pipeline ("D") and every variant;
every kernel is built first, at once; each output is checked against the op's formula before it
is timed (a wrong or refused variant is reported in its cell, never timed), then timed eagerly
(triton.testing.do_bench, median, L2 flushed before each call). A device copy of as many bytes is
timed beside. The table prints the default's time over each variant's (> 1: the variant is faster).
"""

from __future__ import annotations

import argparse
import sys

from . import harness
from .ops import ROOT, SHAPES, prepare, select
from .provenance import save


def variant_pipeline(base: str, options: str) -> str:
    """`base` with the passes named in `options` ("tile{threads=128}+lower-ptx{store=none}")
    given those options; ValueError for a pass `base` does not run or an unparsable variant."""
    from kfc.passes import parse_pipeline  # lazy: kfc.ir ~2 s; --help stays light

    names = base.split(",")
    for part in options.split("+"):
        name, brace, rest = part.strip().partition("{")
        if not brace or not rest.endswith("}") or name not in names:
            raise ValueError(f"{part!r}: give PASS{{OPTION=VALUE,...}} for a pass of {base}")
        names = [f"{name}{{{rest[:-1]}}}" if n.partition("{")[0] == name else n for n in names]
    pipeline = ",".join(names)
    parse_pipeline(pipeline)  # an option the pass lacks or a value out of its range: said now
    return pipeline


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.variants", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=PASS{OPTIONS}",
                    help="a variant of the default row pipeline (repeatable)")
    ap.add_argument("--ops", help="a comma-separated subset of bench.ops' ops (default: all)")
    ap.add_argument("--shapes", default="32768x4096,65536x1024", help="MxN,... (default: %(default)s)")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    args = ap.parse_args(argv)
    from kfc.diagnostics import KfcError
    from kfc.passes import ROW_PIPELINE

    variants = {}
    for text in args.variant:
        name, eq, options = text.partition("=")
        try:
            if not eq or not name or name == "D":
                raise ValueError(f"{text!r}: give NAME=PASS{{OPTIONS}} (NAME not D, the default)")
            variants[name] = variant_pipeline(ROW_PIPELINE, options)
        except (ValueError, KfcError) as e:
            ap.error(str(e))
    try:
        ops = select(args.ops.split(",") if args.ops else None)
    except ValueError as e:
        ap.error(str(e))
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    import torch
    import triton

    import kfc

    pipelines = {"D": None, **variants}
    kernels = {(op.name, v): kfc.load(ROOT / op.path, pipeline=p, kb=False).instance_named({"T": "bf16"})
               for op in ops for v, p in pipelines.items()}
    harness.prebuild([(k, [{"M": m, "N": n} for m, n in shapes if n <= op.max_n])
                      for op in ops for (name, _), k in kernels.items() if name == op.name])
    rows = []
    for op in ops:
        for m, n in shapes:
            case = prepare(op, m, n, torch.bfloat16)
            if case is None:
                continue
            src = torch.empty(case.moved // 4, device="cuda")
            dst = torch.empty_like(src)
            row = {"op": op.name, "M": m, "N": n,
                   "copy_us": triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") * 1e3}
            for v in pipelines:
                k = kernels[op.name, v]
                try:
                    bad = case.wrong(k(**case.inputs))
                    row[v] = f"WRONG {bad}" if bad else harness.time_eager(lambda: k(**case.inputs), ())
                except Exception as e:  # noqa: BLE001 - a refused or failing variant is a cell, not the run's end
                    row[v] = "ERROR " + str(e).splitlines()[0][:160]
            rows.append(row)
            print(f"{op.name} {m}x{n}: " + ", ".join(f"{v} {row[v]:.1f}" if isinstance(row[v], float) else
                                                     f"{v} {row[v][:40]}" for v in pipelines), file=sys.stderr)
            del case, src, dst
            torch.cuda.empty_cache()
    payload = {"ops": [o.name for o in ops], "dtype": "bf16", "call": "kfc by keyword",
               "variants": {"D": "the default row pipeline", **variants},
               "metric": "eager us: triton.testing.do_bench median, L2 flushed; copy_us: a device copy of the bytes "
                         "the op moves", "env": harness.provenance([]), "shapes": rows}
    path = save("variants", payload, also=args.out)
    print(f"saved {path}")
    print(f"{'op':>16} {'M x N':>12} {'D us':>8} {'D/copy':>6} " + " ".join(f"{v:>8}" for v in variants))
    for r in rows:
        d = r["D"]
        cells = [f"{d / r[v]:8.3f}" if isinstance(r[v], float) and isinstance(d, float) else f"{str(r[v])[:8]:>8}"
                 for v in variants]
        head = f"{d:8.1f} {r['copy_us'] / d:6.2f}" if isinstance(d, float) else f"{str(d)[:15]:>15}"
        print(f"{r['op']:>16} {r['M']:>5}x{r['N']:<6} {head} " + " ".join(cells))
    print("cells: the default's time / the variant's (> 1: the variant is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
