"""What every stored benchmark result records about where and how it was measured."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path

from kfc.provenance import git_commit, source_digest

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    info = {
        "host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
    }
    try:
        import lark
        import numpy

        info["numpy"] = numpy.__version__
        info["lark"] = lark.__version__
    except ImportError:
        pass
    return info


def save(name: str, payload: dict, also: str | Path | None = None) -> Path:
    """Write `payload` with provenance to bench/results/NAME-<UTC timestamp>.json (and, the
    same document, to `also`: a machine that keeps nothing can send it back from there)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    doc = {"benchmark": name, "utc": stamp, "kfc_commit": git_commit(), "kfc_sources": source_digest(),
           "machine": machine(), **payload}
    path = RESULTS / f"{name}-{stamp}.json"
    text = json.dumps(doc, indent=2, default=str) + "\n"
    for target in [path] + ([Path(also)] if also else []):
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, target)
    return path
