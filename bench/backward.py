"""The run every backward-pass benchmark shares: for each shape, fresh inputs, kfc and its peers
checked against the reference and timed (bench.harness: eager do_bench, the headline, and CUDA-
graph replays), a table, ratios against one peer and their geometric mean, and a JSON result
with provenance under bench/results/. Each op (bench.rmsnorm_bwd, bench.layernorm_bwd) says
what its inputs, reference, bytes and peers are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import attrs

from . import harness
from .provenance import save
from .rows import TILE_PIPELINE
from .shapes import parse_shapes

ROOT = Path(__file__).resolve().parent.parent


@attrs.frozen
class BackwardBench:
    op: str                                  # the kernel, kernels/{op}.kfc, and the results' name
    shapes: list[tuple[int, int]]            # the default (M, N)
    make_inputs: Callable                    # (m, n, torch generator) -> the kernel's inputs
    reference: Callable                      # inputs -> the outputs in fp32
    bytes_per_call: Callable                 # inputs -> bytes moved once each
    peers: list[harness.Contender]           # timed beside kfc
    baseline: str                            # the peer kfc's ratios are against
    dtype: str                               # the dtypes, in words
    metric: str                              # what the TB/s count
    peer_packages: list[str] = attrs.field(factory=list)  # whose versions the provenance records


def kfc_contender(op: str, pipeline: str | None = None, name: str = "kfc") -> harness.Contender:
    def make():
        import kfc

        k = kfc.load(ROOT / "kernels" / f"{op}.kfc", pipeline=pipeline, kb=False)
        return lambda *inputs: k(*inputs)
    return harness.Contender(name, make)


def main(bench: BackwardBench, argv=None, doc: str = "") -> int:
    ap = argparse.ArgumentParser(prog=f"python -m bench.{bench.op}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="MxN,... (default: " + ",".join(f"{m}x{n}" for m, n in bench.shapes) + ")")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    ap.add_argument("--note", default="", help="a note stored with the result (e.g. the source tree)")
    ap.add_argument("--tile", action="append", default=[], metavar="OPTS",
                    help="also time kfc with tile{OPTS} in its default pipeline, e.g. cluster=8,threads=256 "
                         "(repeatable; reported beside the default, not as the headline)")
    ap.add_argument("--no-peers", action="store_true", help="time kfc and nothing else")
    args = ap.parse_args(argv)
    import torch

    shapes = parse_shapes(args.shapes) if args.shapes else bench.shapes
    gen = torch.Generator(device="cuda")
    contenders = [kfc_contender(bench.op)] + ([] if args.no_peers else list(bench.peers))
    contenders += [kfc_contender(bench.op, TILE_PIPELINE % t, f"kfc[{t}]") for t in args.tile]
    fns = {c.name: harness.safe(c.make) for c in contenders}
    rows: dict = {}
    for m, n in shapes:
        gen.manual_seed(n)
        first = bench.make_inputs(m, n, gen)
        per_call = bench.bytes_per_call(first)
        sets = [first] + [bench.make_inputs(m, n, gen) for _ in range(harness.rotation(per_call) - 1)]
        rows[(m, n)] = {}
        for c in contenders:
            fn = fns[c.name]
            rows[(m, n)][c.name] = harness.measure(c, fn, sets, bench.reference, 1e-2, per_call) if callable(fn) \
                else harness.Measurement(c.name, False, error=fn)
            print(f"{bench.op} {m}x{n} {c.name}: {rows[(m, n)][c.name]}", file=sys.stderr, flush=True)
        del sets, first
        torch.cuda.empty_cache()
    base = bench.baseline
    per_shape, eager, graph = [], [], []
    for shape in shapes:
        r = rows[shape]
        entry = {"M": shape[0], "N": shape[1], **{k: attrs.asdict(v) for k, v in r.items()}}
        if r["kfc"].ok and base in r and r[base].ok:
            entry[f"eager_ratio_vs_{base}"] = r["kfc"].eager_tbps / r[base].eager_tbps
            entry[f"graph_ratio_vs_{base}"] = r["kfc"].tbps / r[base].tbps
            eager.append(entry[f"eager_ratio_vs_{base}"])
            graph.append(entry[f"graph_ratio_vs_{base}"])
        per_shape.append(entry)
    prov = harness.provenance(bench.peer_packages)
    payload = {"op": bench.op, "dtype": bench.dtype, "metric": bench.metric,
               "timing": "eager: triton.testing.do_bench median, L2 flushed before each call (the headline); "
                         "graph: CUDA graph of rotating input sets beyond L2, median of 10 replays",
               "env": prov, "note": args.note, "shapes": per_shape,
               f"geomean_eager_ratio_vs_{base}": harness.geomean(eager) if eager else None,
               f"geomean_graph_ratio_vs_{base}": harness.geomean(graph) if graph else None}
    path = save(bench.op, payload, also=args.out)
    harness.print_table(f"{bench.op}: TB/s on {prov.get('gpu', '?')}", shapes, [c.name for c in contenders], rows)
    print(f"\nkfc / {base}, eager (graph): " + ", ".join(
        f"{s['M']}x{s['N']}:{s[f'eager_ratio_vs_{base}']:.3f} ({s[f'graph_ratio_vs_{base}']:.3f})"
        for s in per_shape if f"eager_ratio_vs_{base}" in s))
    if eager:
        print(f"geomean kfc / {base}: eager {harness.geomean(eager):.3f}, graph {harness.geomean(graph):.3f}")
    print(f"saved {path}")
    return 0
