"""Time a packaged op (copied into a package `kfc package` wrote, as bench/bench_<op>.py).

    python bench/bench_<op>.py [--rows 32768]

For each packaged instance and fixed dims on this GPU: fresh random inputs, then the median
time of one call eagerly (triton.testing.do_bench when triton is installed: L2 flushed before
every call; else CUDA events around back-to-back calls) and as CUDA-graph replays (the kernel
alone), and the bandwidth counting each input read and each output written once.
"""

import argparse
import importlib
import json
import statistics
from pathlib import Path

import torch

MODULE = "__KFC_MODULE__"
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64,
          "i32": torch.int32, "i64": torch.int64, "i8": torch.int8, "bool": torch.bool}


def eager_us(fn) -> float:
    try:
        from triton.testing import do_bench  # lazy: triton is optional (the package needs torch only)

        return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
    except ImportError:
        for _ in range(10):
            fn()
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)


def graph_us(fn, calls: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=32768, help="the size of every dim the package leaves free")
    args = ap.parse_args()
    pkg = importlib.import_module(MODULE)
    op = getattr(pkg, pkg.__all__[0])
    meta = json.loads((Path(pkg.__file__).resolve().parent / "op.json").read_text())
    major, minor = torch.cuda.get_device_capability()
    here = f"sm_{major * 10 + minor}"
    print(f"{meta['op']} on {torch.cuda.get_device_name()}: eager and CUDA-graph time per call")
    for inst in meta["instances"]:
        for k in inst["kernels"]:
            if k["target"].rstrip("a") != here:
                continue
            dims = dict(k["dims"])
            call, moved = [], 0
            for i in meta["inputs"]:
                if i["kind"] == "tensor":
                    shape = tuple(d if isinstance(d, int) else dims.setdefault(d[0], args.rows) + d[1]
                                  for d in i["shape"])
                    t = torch.randn(shape, device="cuda").to(DTYPES[inst["types"][i["name"]]])
                    moved += t.numel() * t.element_size()
                    call.append(t)
                else:
                    call.append(i.get("default", 1.0) if not isinstance(i.get("default"), str) else 1.0)
            outs = op(*call)
            for o in outs if isinstance(outs, tuple) else (outs,):
                moved += o.numel() * o.element_size()
            e, g = eager_us(lambda: op(*call)), graph_us(lambda: op(*call))
            print(f"  {inst['name']:>16} {', '.join(f'{s}={v}' for s, v in sorted(dims.items())):>24}  "
                  f"eager {e:9.2f} us {moved / e / 1e6:6.2f} TB/s   graph {g:9.2f} us {moved / g / 1e6:6.2f} TB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
