"""Run the upstream KDA forward tests, unchanged, against kfc's entry points (on a GPU machine).

    python tests/upstream/kda.py fla --tests ../shared/peers/fla-tests [-k EXPR] [--split] [--out FILE]
    python tests/upstream/kda.py flashkda --tests FlashKDA/tests [-k EXPR] [--out FILE]

fla: fla's tests/ops/test_kda.py and tests/conftest.py (fla-core installed: its references,
naive_recurrent_kda and the gates, stay fla's) with one conftest above them that makes
`fla.ops.kda.chunk_kda` kfc.nn.kda.chunk_kda (with --split, its pair of kernels where it holds:
kfc.nn.kda.FLA_SPLIT). FlashKDA: its tests/ with a module `flash_kda`
whose `fwd` is kfc.nn.kda.flash_kda_fwd. Each runs in a fresh directory under /tmp; the report
lists every test passed, failed (with the first line of why) or skipped (with its reason), and
`--out` writes it as JSON with its provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FLA_ADAPTER = '''"""kfc's adapter: fla's chunk_kda is kfc.nn.kda.chunk_kda; everything else stays fla's."""
import fla.ops.kda

import kfc.nn.kda

fla.ops.kda.chunk_kda = kfc.nn.kda.chunk_kda
'''

FLASHKDA_SHIM = '''"""kfc's stand-in for FlashKDA's module: fwd is kfc.nn.kda.flash_kda_fwd."""
from kfc.nn.kda import flash_kda_fwd as fwd  # noqa: F401
'''


# each test's outcome as it ends, a JSON line, so that a run stopped at its limit keeps what it ran
OUTCOME_LOG = '''

def pytest_runtest_logreport(report):
    import json
    import os

    if report.when != "call" and report.passed:
        return
    why = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        why = str(report.longrepr[2])
    elif not report.passed:
        crash = getattr(report.longrepr, "reprcrash", None)
        why = crash.message if crash is not None else str(report.longrepr)
    outcome = "skipped" if report.skipped else "passed" if report.passed else "failed" if report.when == "call" else "error"
    with open(os.environ["KFC_UPSTREAM_LOG"], "a") as f:
        f.write(json.dumps({"test": report.nodeid, "outcome": outcome, "seconds": round(report.duration, 3),
                            "why": why.strip().splitlines()[0][:300] if why.strip() else ""}) + "\\n")
'''


def prepare(suite: str, tests: Path, where: Path, split: bool = False) -> tuple[Path, dict]:
    """The directory to run pytest in, and the environment it needs (fla's chunk_kda as kfc's
    pair where `split`)."""
    env = dict(os.environ)
    paths = [str(ROOT)]
    if suite == "fla":
        (where / "tests" / "ops").mkdir(parents=True)
        shutil.copy(tests / "conftest.py", where / "tests" / "conftest.py")
        shutil.copy(tests / "test_kda.py", where / "tests" / "ops" / "test_kda.py")
        split_line = "kfc.nn.kda.FLA_SPLIT = True  # --split: the pair of kernels where it holds\n" if split else ""
        (where / "conftest.py").write_text(FLA_ADAPTER + split_line + OUTCOME_LOG)
    else:
        shutil.copytree(tests, where / "tests")
        (where / "shim" / "flash_kda").mkdir(parents=True)
        (where / "shim" / "flash_kda" / "__init__.py").write_text(FLASHKDA_SHIM)
        (where / "conftest.py").write_text(OUTCOME_LOG)
        paths.insert(0, str(where / "shim"))
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
    env["KFC_UPSTREAM_LOG"] = str(where / "outcomes.jsonl")
    return where, env


def logged(log: Path) -> list[dict]:
    """The outcomes the run logged as each test ended (a setup that failed or skipped, a call)."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def outcomes(junit: Path) -> list[dict]:
    """Each test case of a junit XML report: name, outcome and (where not passed) why."""
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name')}"
        row = {"test": name, "outcome": "passed", "seconds": float(case.get("time", 0))}
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                row["outcome"] = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                text = (node.get("message") or node.text or "").strip()
                row["why"] = text.splitlines()[0][:300] if text else ""
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tests/upstream/kda.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=["fla", "flashkda"])
    ap.add_argument("--tests", required=True, type=Path,
                    help="fla: the folder with test_kda.py and conftest.py; flashkda: FlashKDA's tests/ folder")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression selecting tests")
    ap.add_argument("--timeout", type=int, default=540, help="seconds before the run is stopped (default 540)")
    ap.add_argument("--split", action="store_true",
                    help="fla: run chunk_kda as its pair of kernels where it holds (kfc.nn.kda.FLA_SPLIT)")
    ap.add_argument("--out", help="write the report as JSON here")
    args = ap.parse_args(argv)
    if args.split and args.suite != "fla":
        ap.error("--split is fla's chunk_kda's; FlashKDA's fwd splits by its own `split` argument")
    where, env = prepare(args.suite, args.tests.resolve(), Path(tempfile.mkdtemp(prefix=f"kfc-upstream-{args.suite}-")),
                         args.split)
    junit = where / "report.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "tests"]
    if args.keyword:
        cmd += ["-k", args.keyword]
    print("running:", " ".join(cmd), f"(in {where})", flush=True)
    try:
        rc = subprocess.run(cmd, cwd=where, env=env, timeout=args.timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    # the junit report where pytest finished; else what it logged before it was stopped
    rows = outcomes(junit) if junit.exists() else logged(where / "outcomes.jsonl")
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "error", "skipped")}
    stopped = f"; stopped at its {args.timeout} s limit, the tests after these not reached" if rc == "timeout" else ""
    print(f"\n{args.suite}: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + f" (pytest exit {rc}{stopped})")
    slowest = sorted(rows, key=lambda r: -r.get("seconds", 0))[:5]
    print("slowest: " + ", ".join(f"{r['test'].split('::')[-1]} {r.get('seconds', 0):.1f} s" for r in slowest))
    for r in rows:
        if r["outcome"] != "passed":
            print(f"  {r['outcome']:7} {r['test']}: {r.get('why', '')}")
    if args.out:
        sys.path.insert(0, str(ROOT))
        from bench.provenance import save

        save(f"kda_upstream_{args.suite}", {"suite": args.suite, "tests": str(args.tests), "keyword": args.keyword,
                                            "split": args.split, "pytest_exit": rc, "counts": counts, "cases": rows},
             also=args.out)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
