"""`kfc tune`: the factory's command (the loop itself is kfc.factory.tune)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import cli_args
from ..cli_args import float_in, int_in
from ..diagnostics import GpuUnavailable, KfcError
from ..files import write_atomically
from ..kb.store import KnowledgeBase
from ..model.target import parse_target


def add_tune_command(subparsers, parse_shape, parse_dtypes, add_reference_flags) -> argparse.ArgumentParser:
    """Add `kfc tune` to the `kfc` parser's subparsers (the shape, dtype and reference-limit
    options are the CLI's)."""
    t = subparsers.add_parser(
        "tune", help="search pass pipelines on the GPU; every candidate gated, timed and recorded",
        description="Rounds of propose -> apply passes (verified) -> compile (in parallel on the CPU cores) -> gate "
        "on the GPU (outputs poisoned and checked over several seeds, value ranges and unseen shapes; inputs "
        "unchanged; deterministic; timed by CUDA events over inputs rotated beyond L2; a time below the memory "
        "roofline re-measured in a fresh process) -> record in the knowledge base -> update the policy. The default "
        "pipeline is timed first as the baseline. Ctrl-C loses nothing recorded; the same command resumes. Ends by "
        "writing the best kernel (.cu/.ptx/.cubin/report.json) and tune.json for each shape.",
        epilog="examples:\n  kfc tune kernels/rmsnorm.kfc --target sm_90a --budget 32\n"
               "  kfc tune kernels/softmax.kfc --shape M=32768,N=16384 --shape M=16384,N=65536 --kb kb.sqlite\n"
               "  kfc tune kernels/gemm.kfc --shape M=4096,N=4096,K=4096 --shape M=16,N=8192,K=8192 --budget 16\n"
               "  kfc tune kernels/rmsnorm.kfc --ray auto --budget 256       # on every GPU of a Ray cluster\n"
               "  kfc compile kernels/rmsnorm.kfc --from-kb --shape N=4096     # reuse the best recorded pipeline",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("file", help="a .kfc file of a row op or a matrix product (kernels/gemm.kfc: tiles, stages, "
                   "producer warpgroup, persistent tiles)")
    t.add_argument("--target", type=cli_args.target, default="sm_90a", metavar="SM",
                   help="sm_90, sm_90a, sm_100, sm_100a (the GPU must be of its family; default sm_90a)")
    t.add_argument("--budget", type=int_in(1, 100000), default=32,
                   help="candidates per shape, the baseline not counted (1 to 100000; default 32)")
    t.add_argument("--shape", type=parse_shape, action="append", metavar="M=..,N=..",
                   help="a shape to tune at (repeatable; default: the check block's first shape)")
    t.add_argument("--dtype", type=parse_dtypes, metavar="T=bf16", help=cli_args.DTYPE_HELP)
    t.add_argument("--policy", choices=["search", "claude"], default="search",
                   help="search: offline, the knowledge base as prior (default); claude: needs ANTHROPIC_API_KEY")
    t.add_argument("--kb", metavar="PATH|URL", help="the knowledge base: a file, or postgresql://... for one a team "
                   "shares (default $KFC_KB or ~/.cache/kfc/kb.sqlite)")
    t.add_argument("--gpus", type=cli_args.gpu_list, metavar="LIST",
                   help="GPUs of this machine to use: indices, e.g. 0,1, or all (the default: every visible GPU), "
                        "one worker process each")
    t.add_argument("--ray", metavar="ADDRESS",
                   help="use the GPUs of the Ray cluster at ADDRESS (auto: the one this machine is in) instead of "
                        "this machine's; needs pip install 'kfc[cluster]'")
    t.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0, help="the search policy's random seed (0 or more)")
    t.add_argument("--timeout", type=float_in(0.0, 86400.0), default=300.0,
                   help="seconds before a candidate counts as hung (default 300)")
    add_reference_flags(t)
    t.add_argument("-o", "--output", metavar="DIR", help="where the best kernels go (default kfc-out/tune)")
    t.set_defaults(run=cmd_tune)

    return t


def cmd_tune(args) -> int:
    from rich.console import Console  # lazy: rich (~0.1 s), off kfc --help
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # lazy: rich.progress (~0.2 s), off kfc --help

    from ..compile import choose_dims, compile_op, write_outputs  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help
    from ..frontend import load_kfc  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

    if args.ray is not None and args.gpus:
        raise KfcError("give either --ray or --gpus, not both",
                       hint="--ray ADDRESS uses every GPU of the Ray cluster; --gpus LIST picks GPUs of this machine")
    spec = load_kfc(args.file, args.dtype)
    target = parse_target(args.target)
    shapes = [choose_dims(spec, s) for s in (args.shape or [None])]
    policy = _policy(args)
    evaluator = _evaluator(args)
    try:
        kb = KnowledgeBase(args.kb)
    except BaseException:
        evaluator.close()
        raise
    console = Console()
    out_root = Path(args.output or "kfc-out/tune")
    results = []
    try:
        for dims in shapes:
            label = ",".join(f"{k}={v}" for k, v in dims.items())
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console, transient=False) as bar:
                task = bar.add_task(f"{spec.instance_name} {label}: baseline", total=args.budget)

                def progress(trial, best, done, task=task, bar=bar, label=label):
                    b = f"best {best.outcome.median_us:.1f} us" if best else "nothing timed yet"
                    bar.update(task, completed=done, description=f"{spec.instance_name} {label}: {b}")

                from .tune import tune  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

                r = tune(spec, target, dims, args.budget, policy, kb, evaluator, on_trial=progress)
            results.append(r)
            _report_shape(console, r, target)
            if r.best is not None:
                kernel = compile_op(spec, target, r.best.proposal.pipeline, dims)
                d = out_root / f"{spec.instance_name}-{target.name}-{label.replace(',', '-').replace('=', '')}"
                write_outputs(kernel, d)
                summary = {"op": spec.instance_name, "target": target.name, "shape": dims, "run": r.run_id,
                           "candidates": r.candidates, "best_pipeline": r.best.proposal.pipeline,
                           "best_us": r.best.outcome.median_us,
                           "baseline_us": r.baseline.outcome.median_us if r.baseline else None,
                           "speedup_over_default": r.speedup}
                write_atomically(d / "tune.json", json.dumps(summary, indent=2) + "\n")
                console.print(f"  wrote {d}")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: every candidate evaluated so far is recorded; run the same command "
                      "to resume")
        return 130
    finally:
        rate = getattr(evaluator, "candidates_per_minute", None)  # a stand-in evaluator may not count
        if rate is not None:
            console.print(f"  throughput: {rate:.1f} candidates per minute on {evaluator.n_gpus} GPU(s)")
        evaluator.close()
        kb.close()
    return 0


def _evaluator(args):
    """Where candidates are evaluated: this machine's GPUs, or a Ray cluster's with --ray."""
    if args.ray is not None:
        from .cluster import RayEvaluator  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

        return RayEvaluator(args.ray, timeout_s=args.timeout, reference_limits=cli_args.reference_limits(args))
    from .evaluate import Evaluator  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

    gpus = _visible_gpus(args.gpus)
    if not gpus:
        raise GpuUnavailable("kfc tune times candidates on a GPU, and none is visible",
                             hint="run it on a machine with an NVIDIA GPU, or on a Ray cluster's with --ray; "
                                  "kfc compile and kfc check need none")
    return Evaluator(gpus, timeout_s=args.timeout, reference_limits=cli_args.reference_limits(args))


def _report_shape(console, r, target) -> None:
    if r.best is None:
        console.print(f"  no candidate of {r.op} was timed at {r.shape}")
        return
    base = r.baseline.outcome.median_us if r.baseline else None
    console.print(f"  {r.op} {r.shape} on {target}: {r.candidates} candidates; best {r.best.outcome.median_us:.1f} us"
                  + (f" vs default {base:.1f} us ({r.speedup:.3f}x)" if base else ""))
    console.print(f"  best pipeline: {r.best.proposal.pipeline}")


def _visible_gpus(spec: list[str] | None) -> list[str]:
    """The GPUs to evaluate on: --gpus, each checked against the GPUs this machine shows before
    anything is compiled or recorded; else all of them."""
    try:
        import torch  # lazy: torch (~3 s), only to count GPUs

        count = torch.cuda.device_count()
    except ImportError:
        count = 0
    if not spec:
        return [str(i) for i in range(count)]
    absent = [g for g in spec if int(g) >= count]
    if absent:
        shown = "no GPU is visible here" if count == 0 else \
            f"this machine shows {count} GPU(s), numbered 0 to {count - 1}"
        raise GpuUnavailable(f"--gpus names GPU {absent[0]}, but {shown}",
                             hint="list GPUs this machine has (nvidia-smi -L), or --gpus all; "
                                  "kfc compile and kfc check need none")
    return list(spec)


def _policy(args):
    if args.policy == "claude":
        from .claude import ClaudePolicy  # lazy: kfc.ir, ml_dtypes ~2 s; off kfc --help

        return ClaudePolicy()
    from .offline import SearchPolicy  # lazy: pulls kfc.kb.graph, kfc.ir, ml_dtypes ~2 s; off kfc --help

    return SearchPolicy(seed=args.seed)
