"""The floors of ../shared/LAYERS.md, kept: no import cycle inside kfc, and the layers contract
of pyproject.toml holds (lint-imports runs it in .ci/run; this runs it in the suite too)."""

import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx

ROOT = Path(__file__).resolve().parents[1]


def import_graph() -> nx.DiGraph:
    g = grimp.build_graph("kfc", include_external_packages=False)
    graph = nx.DiGraph()
    for module in g.modules:
        graph.add_node(module)
        for imported in g.find_modules_directly_imported_by(module):
            graph.add_edge(module, imported)
    return graph


def test_no_module_of_kfc_imports_itself_through_others():
    cycles = sorted(" -> ".join(c + [c[0]]) for c in nx.simple_cycles(import_graph()))
    assert not cycles, "import cycles inside kfc:\n" + "\n".join(cycles)


def test_the_cycle_check_finds_a_planted_cycle():
    graph = import_graph()
    graph.add_edge("kfc.ir.types", "kfc.passes.base")  # ir importing a pass: a floor broken both ways
    assert any("kfc.ir.types" in c for c in nx.simple_cycles(graph))


def test_the_layers_contract_holds():
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout
