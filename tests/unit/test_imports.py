"""The architecture as import rules (pyproject's [tool.importlinter]): kept by the tree, and each one really
fails when an import breaks it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import venv_tool

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    tool = venv_tool("lint-imports")
    assert tool, "import-linter is a test dependency (pip install -e .[test])"
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's package wins over the installed one
    return subprocess.run([tool, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_import_rule():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "13 kept, 0 broken" in r.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("images/stacks.py", "from dockerlaunch.job import config", "The image side never imports the job side"),
    ("job/plan.py", "from dockerlaunch.images import stacks", "The job side never imports the image side"),
    ("transfer/push.py", "import rich", "Only the CLI prints with rich"),
    ("backends/docker/doctor/observe.py", "from dockerlaunch.sim import cluster", "Only the CLI imports the simulator"),
    ("engine.py", "from dockerlaunch.hosts import fleet as session", "Layers"),
    ("hosts/fleet.py", "from dockerlaunch.backends.docker import dockerhost", "Layers"),
    ("backends/compose/__init__.py", "from dockerlaunch.backends.docker import dockerhost", "never import each other"),
    ("backends/kubernetes/__init__.py", "import paramiko", "Rendering is pure"),
    ("job/plan.py", "from dockerlaunch.hosts import targets", "The job spec is neutral"),
    ("backends/docker/doctor/judge.py", "from dockerlaunch.hosts import ssh", "doctor judges what was observed"),
    ("backends/docker/doctor/observations.py", "from dockerlaunch.backends.docker import dockerhost",
     "doctor judges what was observed"),
    ("backends/renderers.py", "from dockerlaunch.backends import compose", "The renderers list names its targets"),
    ("sim/layout.py", "from dockerlaunch.sim import images", "The sim's layout is pure"),
    ("gpu/needs.py", "import subprocess", "The GPU model is types and rules"),
    ("gpu/host.py", "from dockerlaunch.cache import cache_root", "The GPU model is types and rules"),
    ("gpu/smi.py", "from dockerlaunch.job import facts", "Layers"),
])
def test_a_broken_rule_fails(tmp_path, module, line, contract):
    shutil.copytree(ROOT / "dockerlaunch", tmp_path / "dockerlaunch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "dockerlaunch" / module
    text = target.read_text()
    # after the module docstring and `from __future__`, so the file stays valid Python
    anchor = "from __future__ import annotations\n"
    target.write_text(text.replace(anchor, anchor + line + "  # noqa\n", 1) if anchor in text else line + "\n" + text)
    r = lint_imports(tmp_path)
    assert r.returncode != 0, r.stdout
    assert "0 broken" not in r.stdout, r.stdout
    assert contract in r.stdout.split("Broken contracts", 1)[1], r.stdout


def test_only_the_cli_prints():
    """Library code reports through a Reporter or the `dockerlaunch` logger (shown by the CLI), never by itself:
    no print() and no sys.stdout/sys.stderr outside cli/ (programs shipped to run elsewhere aside)."""
    import ast

    found = []
    for path in (ROOT / "dockerlaunch").rglob("*.py"):
        rel = path.relative_to(ROOT / "dockerlaunch")
        # gang.py is such a program too: the supervisor in each job container, whose output is the container's
        if rel.parts[0] == "cli" or "scripts" in rel.parts or "assets" in rel.parts or rel.name == "gang.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                found.append(f"{rel}:{node.lineno} print()")
            if isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr") \
                    and isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(f"{rel}:{node.lineno} sys.{node.attr}")
    assert found == []


def test_every_test_docs_security_names_exists():
    """docs/SECURITY.md names the test behind each defence: each one is a real test function."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    named = set(re.findall(r"`(test_[a-z0-9_]+)`", (root / "docs" / "SECURITY.md").read_text()))
    defined = set()
    for f in (root / "tests").rglob("test_*.py"):
        defined |= set(re.findall(r"^def (test_[a-z0-9_]+)", f.read_text(), re.M))
    assert named and named <= defined, sorted(named - defined)


def test_the_module_lists_name_every_top_level_module():
    """"Only the CLI imports the simulator" and "Only the CLI prints with rich" list every top-level module but the
    CLI's (and the sim's): a module added at the top and left out of them would escape both rules."""
    if sys.version_info >= (3, 11):
        import tomllib  # noqa: TID251 (guarded)
    else:
        import tomli as tomllib  # the test extra's backport on 3.10

    contracts = {c["name"]: c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
                 ["contracts"]}
    top = {f"dockerlaunch.{p.stem if p.is_file() else p.name}" for p in (ROOT / "dockerlaunch").iterdir()
           if (p.suffix == ".py" and not p.name.startswith("__")) or (p / "__init__.py").is_file()}
    assert set(contracts["Only the CLI imports the simulator"]["source_modules"]) == \
        top - {"dockerlaunch.cli", "dockerlaunch.sim"}
    assert set(contracts["Only the CLI prints with rich"]["source_modules"]) == top - {"dockerlaunch.cli"}


def test_no_import_circle_but_the_clis():
    """No two modules import each other, directly or round a ring (imports inside functions count), except the CLI's
    click registration (cli/main imports the command modules, which import main's group)."""
    import grimp

    graph = grimp.build_graph("dockerlaunch", cache_dir=None, exclude_type_checking_imports=True)
    edges = {m: {t for t in graph.find_modules_directly_imported_by(m) if t.startswith("dockerlaunch.") and t != m}
             for m in graph.modules if m.startswith("dockerlaunch")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            ring = []
            while True:
                w = stack.pop()
                ring.append(w)
                if w == v:
                    break
            if len(ring) > 1:
                circles.append(sorted(ring))

    for m in sorted(edges):
        if m not in index:
            visit(m)
    assert [c for c in circles if not all(m.startswith("dockerlaunch.cli.") for m in c)] == []
    assert len(edges) > 90  # the graph was really read
