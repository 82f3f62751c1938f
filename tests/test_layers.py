"""The floors of ../shared/LAYERS.md, kept: no import cycle inside kfc, and the layers contract
of pyproject.toml holds (lint-imports runs it in .ci/run; this runs it in the suite too)."""

import ast
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


def imports_inside_functions(root: Path) -> list[str]:
    """file:line of every import inside a function or method whose line has no `# lazy:` comment."""
    found = []

    def visit(node: ast.AST, in_function: bool, path: Path, lines: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                line = lines[child.lineno - 1]
                if "# lazy:" not in line:
                    found.append(f"{path.relative_to(root)}:{child.lineno}: {line.strip()}")
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                  path, lines)

    for path in sorted((root / "kfc").rglob("*.py")):
        text = path.read_text()
        visit(ast.parse(text, str(path)), False, path, text.splitlines())
    return found


def test_imports_inside_functions_say_why():
    found = imports_inside_functions(ROOT)
    assert not found, ("an import inside a function stays only for an optional extra or a measured slow import "
                       "kept off a hot path, with `# lazy: which, how slow` on its line; move these to the "
                       "module's top:\n" + "\n".join(found))


def test_the_lazy_import_check_finds_an_unmarked_import(tmp_path):
    (tmp_path / "kfc").mkdir()
    (tmp_path / "kfc" / "m.py").write_text("import json\n\n\ndef f():\n    import os\n    import torch  # lazy: torch (~3 s)\n"
                                           "    return os, torch, json\n")
    assert imports_inside_functions(tmp_path) == ["kfc/m.py:5: import os"]
