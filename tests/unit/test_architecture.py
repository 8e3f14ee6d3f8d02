"""docs/ARCHITECTURE.md stays true: every file path and every `module.name` it writes in backticks exists, and it stays
one page of decisions (<= 250 lines)."""

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PKG = ROOT / "dockerlaunch"

PATH = re.compile(r"^[\w.\-/{},]+$")
TOP = {"dockerlaunch", "tests", "scripts", "docs", "benchmarks", "compose", "Dockerfiles", ".ci", "backends", "hosts",
       "images", "job", "transfer", "diagnostics", "sim", "gpu", "cli"}
# heads of dotted names that are not dockerlaunch's (the standard library, torch): not checked
FILE_TYPES = {"json", "jsonl", "yaml", "yml", "md", "tar", "txt", "log", "toml", "sh", "py"}
EXTERNAL = {"shlex", "tarfile", "torch", "docker", "paramiko", "subprocess", "os", "sys", "importlib", "dataclasses"}
DOTTED = re.compile(r"^[a-z_][a-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def spans(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # the diagram is checked by test_the_diagram_names_real_modules
    return re.findall(r"`([^`\n]+)`", text)


def expand(path: str) -> list[str]:
    """`scripts/{a,b}.sh` -> both paths."""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in expand(path[:m.start()] + alt + path[m.end():])]


@cache
def files() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts
            and not any(d.startswith(".venv") for d in p.relative_to(ROOT).parts)  # .venv, .venv-py3.10 ...
            and p.relative_to(ROOT).parts[0] not in ("build", "dist")  # `pip install .` leaves build/lib/...
            and "__pycache__" not in p.parts]


def path_exists(path: str) -> bool:
    """A path from the repository root, or from dockerlaunch/, or the tail of one (`scripts/probe.sh` where only one
    package has it is fine; a name no file ends with is not)."""
    return any(f == path or f == f"dockerlaunch/{path}" or f.endswith("/" + path) or f.startswith(path + "/")
               or f.startswith(f"dockerlaunch/{path}/") for f in files())


@cache
def modules() -> dict[str, Path]:
    """Every module by its dotted name inside the package and each shorter tail of it (`docker.probe`, `probe`)."""
    out: dict[str, list[Path]] = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        for i in range(len(parts)):
            out.setdefault(".".join(parts[i:]), []).append(p)
    return {k: v[0] for k, v in out.items() if len(v) == 1 or k.count(".") == len(v[0].parts) - 1}


@cache
def names_in(path: Path) -> dict[str, set[str]]:
    """Top-level names of a module, and each class's own names (for `Class.attr`)."""
    tree = ast.parse(path.read_text())
    top: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            top[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            own = set()
            for n in node.body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    own.add(n.name)
                elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                    own.add(n.target.id)
                elif isinstance(n, ast.Assign):
                    own |= {t.id for t in n.targets if isinstance(t, ast.Name)}
            top[node.name] = own
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        top[n.id] = set()
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top[node.target.id] = set()
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                top[(a.asname or a.name).split(".")[0]] = set()
    return top


def dotted_exists(token: str) -> bool | None:
    """True/False for `module.name[.attr]` whose head is a module of the package; None when it names no module."""
    parts = token.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        mod = modules().get(".".join(parts[:cut]))
        if mod is None:
            continue
        rest = parts[cut:]
        top = names_in(mod)
        if rest[0] not in top:
            sub = modules().get(".".join(parts[:cut + 1]))  # a submodule of a package
            return sub is not None
        return len(rest) == 1 or rest[1] in top[rest[0]]
    return None


def test_every_path_and_name_in_backticks_exists():
    wrong = []
    for span in spans(DOC.read_text()):
        token = span.strip().rstrip(",.;:")
        if "/" in token and "." in token.split("/")[-1] and not token.endswith((".py", ".sh")) \
                and DOTTED.match(token.replace("/", ".")):
            token = token.replace("/", ".")  # `hosts/fleet.Fleet`: a module by its path, then a name in it
        if PATH.match(token) and "/" in token and (token.endswith((".py", ".sh")) or token.split("/")[0] in TOP):
            wrong += [p for p in expand(token) if not path_exists(p.rstrip("/"))]
        elif DOTTED.match(token) and token.rsplit(".", 1)[1] not in FILE_TYPES \
                and token.split(".")[0] not in EXTERNAL and not dotted_exists(token.removeprefix("dockerlaunch.")):
            wrong.append(token)
    assert wrong == [], f"docs/ARCHITECTURE.md names what does not exist: {wrong}"


def test_the_diagram_names_real_modules():
    """The package map: each `pkg/  a · b · c` line names modules of that package (a line that goes on without a
    folder continues the one above; `a · b` after an arrow names top-level modules)."""
    block = re.search(r"```\n(.*?)```", DOC.read_text(), re.S).group(1)
    names_re = r"((?:[a-z_]+(?:\{[a-z_,]+\})?\s*·\s*)+[a-z_]+)"
    wrong, folder, seen, prev = [], None, 0, ""
    for line in block.splitlines():
        m = re.search(r"([a-z_]+(?:/[a-z_]+)*)/\s+" + names_re, line)
        if m:
            folder, names = m.group(1), m.group(2)
        elif (c := re.search(r"^[\s│]+" + names_re, line)):
            names = c.group(1)  # a continuation line, or the top-level modules
            if "▼" in prev:
                folder = ""
        else:
            prev = line if line.strip() else prev
            continue
        prev = line
        for name in re.split(r"\s*·\s*", names):
            for n in expand(name):
                seen += 1
                base = PKG / folder if folder else PKG
                if not ((base / f"{n}.py").is_file() or (base / n / "__init__.py").is_file()):
                    wrong.append(f"{folder}/{n}" if folder else n)
    assert wrong == []
    assert seen > 60  # the map was really read


def test_it_is_one_page():
    assert len(DOC.read_text().splitlines()) <= 250


def test_the_checker_sees_a_wrong_name():
    """The checks above can fail: a moved module, a renamed function and a missing file are each caught."""
    assert dotted_exists("plan.resolve") is True
    assert dotted_exists("plan.no_such_function") is False
    assert dotted_exists("session.own_containers") is not False
    assert path_exists("backends/docker/probe.py") and not path_exists("backends/docker/docker_cli.py")
    assert dotted_exists("job.spec.ContainerSpec") is False
    assert not dotted_exists("launch.own_containers")  # a module that is not there is caught too


def test_the_unit_tests_follow_the_packages_folders():
    """The doc says `tests/unit/` follows the package's folders: every folder of tests there is one of the package's
    (a test folder for a package that is gone, or named otherwise, is found by nobody looking for its tests)."""
    unit = ROOT / "tests" / "unit"
    folders = {p.relative_to(unit) for p in unit.rglob("*") if p.is_dir() and "__pycache__" not in p.parts
               and "data" not in p.relative_to(unit).parts and any(p.glob("test_*.py"))}
    assert folders, "no test folder found"
    stray = sorted(str(f) for f in folders if not (PKG / f).is_dir())
    assert not stray, f"tests/unit folders with no package folder of the same path: {stray}"
