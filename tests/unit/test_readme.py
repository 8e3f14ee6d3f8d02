"""The README's first screen starts a job (issue 52 item 6): its commands are real and runnable, its cluster file is
a valid config whose `up` plans the job, its lines fit a screen, its links resolve, and the status table and the
benchmark figures live in docs/. Pure: the first screen's `up` runs as a dry run (nothing is contacted)."""

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
STATUS = ROOT / "docs" / "STATUS.md"
FIRST_SCREEN = 40
LONGEST = 200


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


def test_no_readme_line_is_longer_than_a_screen_is_wide():
    long = [(n, len(line)) for n, line in enumerate(text().splitlines(), 1) if len(line) > LONGEST]
    assert not long, f"README lines over {LONGEST} characters (line, length): {long}"


def test_the_status_table_lives_in_docs_and_the_readme_links_it():
    table = re.compile(r"^\|\s*capability\s*\|\s*state\s*\|", re.M)
    assert not table.search(text()), "the status table is back in the README"
    assert table.search(text(STATUS)), "docs/STATUS.md has no status table"
    assert "(docs/STATUS.md)" in head(80), "the README's opening does not link docs/STATUS.md"


def test_the_readme_quotes_no_benchmark_ratio():
    """Measured ratios (`1.32 x S/B`, `0.995 x bare metal`) live in docs/STATUS.md and benchmarks/RESULTS.md."""
    ratios = [(n, m.group(0)) for n, line in enumerate(text().splitlines(), 1)
              for m in re.finditer(r"\b\d+\.\d+(?:-\d+\.\d+)? ?x\b", line)]
    assert not ratios, f"benchmark figures in the README (line, figure): {ratios}"


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


@pytest.mark.parametrize("page", [README, STATUS], ids=["README", "STATUS"])
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
    assert links(page), "no links found: the link parser is broken"
    assert not broken, broken
