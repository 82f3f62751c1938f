"""bench.ab's CPU side: the earlier kfc exported as a folder the GPU machine can import, and the
command's errors. The timing itself runs on the GPU machine."""

import subprocess
import sys

import pytest

from bench import ab


def test_an_earlier_commit_exports_as_an_importable_folder(tmp_path):
    rev = subprocess.run(["git", "rev-parse", "HEAD~1"], capture_output=True, text=True, check=True).stdout.strip()
    ab.export("HEAD~1", tmp_path)
    assert (tmp_path / "REV").read_text().strip() == rev
    assert (tmp_path / "grammars" / "kfc.lark").is_file()
    out = subprocess.run([sys.executable, "-c", "import kfc; print(kfc.__file__)"], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(tmp_path / "kfc" / "__init__.py")


def test_a_base_that_is_not_an_export_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        ab.main(["--base", str(tmp_path)])
    assert e.value.code == 2 and "--export REV DIR" in capsys.readouterr().err
