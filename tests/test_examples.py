"""Every op in examples/ (programs beyond a straight row: for loops over chunks, scans, branches)
passes `kfc check` against its reference and `kfc compile` for sm_90a and sm_100a, as a user
runs them."""

import json

import pytest

from kfc.cli import main
from tests.example_ops import EXAMPLES

NAMES = sorted(p.stem for p in EXAMPLES.glob("*.kfc"))


def test_there_are_examples_of_each_kind():
    texts = {n: (EXAMPLES / f"{n}.kfc").read_text() for n in NAMES}
    assert any("for " in t for t in texts.values())
    assert any("cumsum(" in t for t in texts.values())
    assert any("if " in t for t in texts.values())


@pytest.mark.parametrize("name", NAMES)
def test_an_example_checks_and_compiles_for_both_targets(tmp_path, name, capsys):
    path = str(EXAMPLES / f"{name}.kfc")
    assert main(["check", path, "--seed", "0"]) == 0
    for target in ("sm_90a", "sm_100a"):
        out = tmp_path / target
        assert main(["compile", path, "--target", target, "-o", str(out)]) == 0, capsys.readouterr().err
        ptxas = json.loads((out / "report.json").read_text())["ptxas"]
        assert ptxas["spill_stores"] == ptxas["spill_loads"] == 0
        assert (out / f"{name}.cubin").stat().st_size > 0
