"""The README's first screen starts a job (issue 52 item 6): its commands are real and runnable, its cluster file is
a valid config whose `up` plans the job, its lines fit a screen, its links resolve, and the status table and the
benchmark figures live in docs/. The reference that followed the Quickstart lives in docs/ pages the README links
(issue 61), under the same rules. Pure: the first screen's `up` runs as a dry run (nothing is contacted)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dockerlaunch.transfer import layer_cache

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
STATUS = DOCS / "STATUS.md"
FIRST_SCREEN = 40
LONGEST = 200
MOST_LINES = 250
# The reference that was the README's after the Quickstart (issue 61): each section and the docs page it moved to.
MOVED = {
    "The doctor's checks": "DOCTOR.md",
    "Dry run": "DOCTOR.md",
    "GPUs, and the local machine as a host": "DOCTOR.md",
    "Restarts, spares and hangs": "RECOVERY.md",
    "When a job hangs or is slow": "DIAGNOSTICS.md",
    "Fine-tune with ms-swift on 2 hosts": "RECIPES.md",
    "Images: pinned stacks": "IMAGES.md",
    "Moving images without a registry": "TRANSFER.md",
    "Docker engines": "ENGINES.md",
    "Other launchers: compose, Kubernetes, Slurm": "RENDER.md",
    "Large clusters": "OPERATIONS.md",
    "Where things are kept": "OPERATIONS.md",
    "Hosts where you are not root": "OPERATIONS.md",
    "Config": "CONFIG.md",
    "Simulated cluster": "SIM.md",
}


def text(path: Path = README) -> str:
    return path.read_text(encoding="utf-8")


def head(n: int = FIRST_SCREEN) -> str:
    return "\n".join(text().splitlines()[:n])


def blocks(source: str, lang: str) -> list[str]:
    """The fenced code blocks of one language, in order (a block cut by the end of `source` counts too)."""
    return [m.group(1) for m in re.finditer(rf"^```{lang}\n(.*?)(?:^```|\Z)", source, re.M | re.S)]


def console_commands(block: str) -> list[list[str]]:
    """The `$ ...` commands of a console block, continuation lines (a trailing backslash) joined, as argv."""
    out, lines = [], block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            out.append(shlex.split(cmd, comments=True))
        i += 1
    return out


def first_screen_commands() -> list[list[str]]:
    return [c for b in blocks(head(), "console") for c in console_commands(b)]


def headings(source: str) -> list[tuple[int, int, str]]:
    """(line index, level, title) of each Markdown heading outside fenced code (a `# comment` in a block is none)."""
    out, fenced = [], False
    for i, line in enumerate(source.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"(#{1,6}) (.+)", line)):
            out.append((i, len(m.group(1)), m.group(2).strip()))
    return out


def section(path: Path, title: str) -> str:
    """The part of a page under the heading `title` (any level), down to the next heading of its level or above."""
    source = text(path)
    found = [(i, level) for i, level, t in headings(source) if t == title]
    assert len(found) == 1, f"{path.name} has {len(found)} headings {title!r}"
    (start, level), lines = found[0], source.splitlines()
    end = next((i for i, lv, _ in headings(source) if i > start and lv <= level), len(lines))
    return "\n".join(lines[start:end])


def ruled() -> list[tuple[str, str]]:
    """(name, text) of what the README's rules cover: the README, and each section moved from it to docs/."""
    moved = [(f"docs/{page} ({title})", section(DOCS / page, title)) for title, page in MOVED.items()]
    return [("README", text()), *moved]


# ------------------------------------------------------------------ the first screen


def test_the_first_screen_holds_install_test_a_cluster_file_and_up():
    first = head()
    bash = "\n".join(blocks(first, "bash"))
    assert re.search(r"^pip install \.\s", bash, re.M), "the install command is not on the first screen"
    assert re.search(r"^scripts/test\s", bash, re.M), "the test command is not on the first screen"
    assert re.search(r"^scripts/demo\s", bash, re.M), "the demo (the cluster the first screen uses) is not there"
    yaml_blocks = blocks(first, "yaml")
    assert yaml_blocks and re.search(r"^hosts:", yaml_blocks[0], re.M) and re.search(r"^image:", yaml_blocks[0], re.M)
    assert "mounts:" in yaml_blocks[0], "the cluster file shows no mount"
    commands = [c[1] for c in first_screen_commands() if c[0] == "dockerlaunch"]
    for needed in ("doctor", "push", "up", "logs", "down"):
        assert needed in commands, f"`dockerlaunch {needed}` is not on the first screen: {commands}"


def test_the_install_and_test_commands_are_the_ones_that_run():
    """`pip install .` installs this project for the Python the README names; `scripts/test` is what CI runs."""
    pyproject = text(ROOT / "pyproject.toml")
    assert 'name = "dockerlaunch"' in pyproject
    python = re.search(r'requires-python = ">=(\d+\.\d+)"', pyproject).group(1)
    assert f"Python >= {python}" in head(), f"the first screen does not name Python >= {python}"
    assert 'dockerlaunch = "dockerlaunch.cli:main"' in pyproject, "`pip install .` would not make the command"
    for script in ("scripts/test", "scripts/demo"):
        assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"
    assert re.search(r"^exec scripts/test$", text(ROOT / ".ci" / "run"), re.M), ".ci/run no longer runs scripts/test"


def test_every_first_screen_dockerlaunch_command_takes_its_options():
    """Each `dockerlaunch ...` of the first screen, with --help before any `--`: an option the command does not
    take (a renamed flag) fails click's parse before --help answers."""
    from click.testing import CliRunner

    from dockerlaunch.cli import diagnose, images, jobs, render, sim, transfer  # noqa: F401 - registers commands
    from dockerlaunch.cli.main import cli

    ran = 0
    for argv in first_screen_commands():
        if argv[0] != "dockerlaunch":
            continue
        own = argv[1:argv.index("--")] if "--" in argv else argv[1:]
        r = CliRunner().invoke(cli, [*own, "--help"])
        assert r.exit_code == 0 and "Usage: " in r.output, (argv, r.output)
        ran += 1
    assert ran >= 5


def test_the_first_screen_cluster_file_plans_its_up(tmp_path):
    """The cluster file as printed, and the `up` as printed made a dry run: the job the README shows is planned
    (2 hosts, its name, its image, its mount), from a folder with nothing else in it."""
    (tmp_path / "dockerlaunch.yaml").write_text(blocks(head(), "yaml")[0])
    up = next(c for c in first_screen_commands() if c[:2] == ["dockerlaunch", "up"])
    env = {**os.environ, "HOME": str(tmp_path)}  # no ~/.ssh/config of this machine's user changes the plan
    env.pop("DOCKERLAUNCH_CONFIG", None)
    r = subprocess.run([sys.executable, "-m", "dockerlaunch", "up", "--dry-run", *up[2:]], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "2 host(s)" in r.stdout and "--volume /shared:/shared" in r.stdout, r.stdout[:2000]
    job = re.search(r"name: (\w[\w.-]*)", blocks(head(), "yaml")[0]).group(1)
    image = re.search(r"^image: (\S+)", blocks(head(), "yaml")[0], re.M).group(1)
    assert f"Plan for job '{job}'" in r.stdout and image in r.stdout, r.stdout[:400]


# ------------------------------------------------------------------ the whole README


def test_the_readme_is_at_most_250_lines():
    n = len(text().splitlines())
    assert n <= MOST_LINES, f"README.md is {n} lines (at most {MOST_LINES}): reference goes in a docs/ page it links"


def test_each_moved_section_is_on_its_docs_page_and_the_readme_links_that_page():
    """Nothing of the reference is lost or unreachable: each section is on its page (not left in the README), and
    the README's Reference links each page."""
    readme_titles = {t for _, _, t in headings(text())}
    linked = set(links(README))
    for title, page in MOVED.items():
        assert section(DOCS / page, title).count("\n") >= 3, f"docs/{page}: the section {title!r} is empty"
        assert title not in readme_titles, f"the section {title!r} is back in the README"
        assert f"docs/{page}" in linked, f"the README does not link docs/{page} (where {title!r} lives)"
    reference = section(README, "Reference")
    for page in set(MOVED.values()):
        assert f"](docs/{page})" in reference, f"the README's Reference has no line for docs/{page}"


def test_every_docs_page_the_readme_links_exists():
    pages = {target.partition("#")[0] for target in links(README) if target.startswith("docs/")}
    assert {f"docs/{page}" for page in MOVED.values()} <= pages
    missing = sorted(page for page in pages if not (ROOT / page).is_file())
    assert not missing, f"the README links docs pages that do not exist: {missing}"


@pytest.mark.parametrize("name,body", ruled(), ids=[name for name, _ in ruled()])
def test_no_readme_line_is_longer_than_a_screen_is_wide(name, body):
    long = [(n, len(line)) for n, line in enumerate(body.splitlines(), 1) if len(line) > LONGEST]
    assert not long, f"{name}: lines over {LONGEST} characters (line, length): {long}"


def test_the_status_table_lives_in_docs_and_the_readme_links_it():
    table = re.compile(r"^\|\s*capability\s*\|\s*state\s*\|", re.M)
    for name, body in ruled():
        assert not table.search(body), f"the status table is back in {name}"
    assert table.search(text(STATUS)), "docs/STATUS.md has no status table"
    assert "(docs/STATUS.md)" in head(80), "the README's opening does not link docs/STATUS.md"


@pytest.mark.parametrize("name,body", ruled(), ids=[name for name, _ in ruled()])
def test_the_readme_quotes_no_benchmark_ratio(name, body):
    """Measured ratios (`1.32 x S/B`, `0.995 x bare metal`) live in docs/STATUS.md and benchmarks/RESULTS.md, also
    for the reference moved from the README to docs/ pages."""
    ratios = [(n, m.group(0)) for n, line in enumerate(body.splitlines(), 1)
              for m in re.finditer(r"\b\d+\.\d+(?:-\d+\.\d+)? ?x\b", line)]
    assert not ratios, f"benchmark figures in {name} (line, figure): {ratios}"


def test_the_readme_says_where_the_local_registry_is_and_how_big_it_grows(monkeypatch):
    """Its words match the code: the registry `push` runs on 127.0.0.1, its folder and its cap."""
    monkeypatch.delenv("DOCKERLAUNCH_CACHE_DIR", raising=False)
    monkeypatch.delenv(layer_cache.CAP_ENV, raising=False)
    folder = "~/" + str(layer_cache.root().relative_to(Path.home()))
    opening = " ".join(head(70).split())
    for said in ("docker-registry", "127.0.0.1", folder, f"{layer_cache.CAP_GB} GB", layer_cache.CAP_ENV):
        assert said in opening, f"the README's opening does not say {said!r}"
    assert layer_cache._limit() == layer_cache.CAP_GB * 1e9


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, seen, fenced = set(), {}, False
    for line in text(path).splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            s = slug(m.group(1))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
        out.update(re.findall(r'<a id="([^"]+)"', line))
    return out


def links(path: Path) -> list[str]:
    body = re.sub(r"^```.*?^```", "", text(path), flags=re.M | re.S)  # links in code are not links
    body = re.sub(r"`[^`\n]*`", "", body)
    return re.findall(r"\]\(([^)\s]+)\)", body)


LINKED = [README, STATUS, *(DOCS / page for page in sorted(set(MOVED.values())))]


@pytest.mark.parametrize("page", LINKED, ids=[p.stem for p in LINKED])
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading or anchor #{anchor} in {dest.name}")
    assert links(page) or page not in (README, STATUS), "no links found: the link parser is broken"
    assert not broken, broken
