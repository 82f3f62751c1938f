"""Build a package with `kfc package` and install it in a fresh venv that has torch and pytest
but not kfc (shared by the CPU test and the GPU one)."""

import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from kfc.package.build import build_package
from kfc.model.target import parse_target


def build_and_install(tmp: Path, kfc_file: str, shapes: list[dict], targets=("sm_90a", "sm_100a")) -> tuple[Path, Path]:
    """(the package folder, the venv's python)."""
    pkg = tmp / "pkg"
    build_package(kfc_file, [parse_target(t) for t in targets], shapes, pkg, kb_path=None, progress=lambda s: None)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # torch, setuptools and pytest from this environment's site-packages, added as a plain path:
    # its .pth files (kfc's editable install among them) are not processed, so kfc stays out
    purelib = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    purelib.mkdir(parents=True, exist_ok=True)
    here = [p for p in site.getsitepackages() if Path(p, "torch").is_dir()]
    (purelib / "host_packages.pth").write_text("\n".join(here) + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        "--no-build-isolation", "--no-index", str(pkg)], capture_output=True, text=True, timeout=600,
                       cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    return pkg, python
