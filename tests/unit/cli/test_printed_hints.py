"""Printed commands that need no host, run as printed in another folder (dockerlaunch/hints.py; the ones that need
the sim run in tests/integration, and tests/unit/test_hints.py says why the rest cannot run here)."""

import re
import subprocess
import tarfile

import pytest

from dockerlaunch.images import sources
from dockerlaunch.images.sources import SourceError
from tests import cli
from tests.cli import paste


def dl(*args: str, cwd) -> subprocess.CompletedProcess:
    return cli.dl(*args, timeout=120, cwd=cwd, drop_env=("DOCKERLAUNCH_CONFIG",))


@pytest.fixture
def elsewhere(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "elsewhere"


@pytest.mark.hint("config.schema")
def test_an_unknown_field_points_at_schema_which_lists_the_fields(tmp_path, elsewhere):
    (tmp_path / "dockerlaunch.yaml").write_text("hosts: [a, b]\nimage: x:1\njob:\n  nam: train\n")
    r = dl("config", "show", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    m = re.search(r"job\.nam: unknown field \(did you mean `name`\? `(dockerlaunch [^`]+)` lists the fields\)",
                  r.stderr)
    assert m, r.stderr
    shown = paste(m.group(1), elsewhere)
    assert shown.returncode == 0 and '"name"' in shown.stdout and '"hosts"' in shown.stdout, shown.stdout[:300]


@pytest.mark.hint("stacks.list")
def test_an_unknown_stack_points_at_the_list_of_stacks(tmp_path, elsewhere):
    r = dl("build", "--stack", "no-such-stack", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    m = re.search(r"unknown stack 'no-such-stack'; known: ([^(]+) \((dockerlaunch [^)]+)\)", r.stderr)
    assert m, r.stderr
    shown = paste(m.group(2), elsewhere)
    assert shown.returncode == 0, shown.stderr
    assert all(name in shown.stdout for name in m.group(1).split(", ")), shown.stdout


@pytest.mark.hint("sources.hash")
def test_a_source_that_does_not_match_its_pin_prints_the_command_that_hashes_it(tmp_path, elsewhere):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "setup.py").write_text("print('x')\n")
    archive = tmp_path / "Megatron-LM-core_v0.13.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src", arcname="Megatron-LM-core_v0.13.0")
    with pytest.raises(SourceError) as e:
        sources.check_archive(archive, "megatron-core", "0" * 64)
    m = re.search(r"put its hash in stacks\.yaml \((dockerlaunch [^)]+)\)", str(e.value))
    assert m, str(e.value)
    shown = paste(m.group(1), elsewhere)  # its path absolute: pasted in another folder, it still finds the file
    assert shown.returncode == 0 and sources.tree_sha256(archive) in shown.stdout, shown.stdout + shown.stderr
