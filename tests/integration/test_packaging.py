"""A plain (non-editable) `pip install .` into a new venv works outside the checkout: the stack matrix, the
Dockerfile, the shell programs, the made base's recorded tables and the recommended stack's vendored sources ship
inside the wheel."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_wheel_install_lists_and_plans_stacks_from_any_directory(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          str(ROOT)], capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-2000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    dl = str(venv / "bin" / "dockerlaunch")

    listed = subprocess.run([dl, "stacks", "list"], cwd=work, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "cpu" in listed.stdout and "swift4.5-mcore0.18-cu13" in listed.stdout

    planned = subprocess.run([dl, "build", "--stack", "cpu", "--dry-run"], cwd=work, capture_output=True, text=True,
                             timeout=120)
    assert planned.returncode == 0, planned.stderr
    assert "docker build" in planned.stdout and "site-packages" in planned.stdout  # the shipped Dockerfile
    assert str(ROOT) not in planned.stdout  # nothing read from the checkout

    shipped = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from dockerlaunch import transfer; from dockerlaunch.backends import docker;"
         "from dockerlaunch.images.stacks import default_dockerfiles_dir;"
         "from dockerlaunch.images import binaries; from dockerlaunch.images.stacks import load_matrix;"
         "s = load_matrix().stacks['swift4.6-mcore0.19-cu13-py313'];"
         "base = binaries.read_base(binaries.base_tables_path(s, default_dockerfiles_dir()));"
         "print(len(transfer.script('relay.sh')), len(docker.script('observe.sh')), default_dockerfiles_dir(),"
         "len(base['objects']),"
         "int('kv() {' in docker.script('probe.sh') and 'kv() {' in transfer.script('load.sh')))"],
        cwd=work, capture_output=True, text=True, timeout=120)
    assert shipped.returncode == 0, shipped.stderr
    relay, observe, where, base_objects, kv = shipped.stdout.split()
    assert int(relay) > 500 and int(observe) > 300 and "site-packages" in where
    assert kv == "1"  # the key=value contract's fragment (dockerlaunch/scripts/kv.sh) ships and is included
    assert int(base_objects) > 100  # the made base's recorded tables (stacks check --binaries)

    # the recommended stack's non-PyPI source (apex) from the wheel: offline, no DOCKERLAUNCH_SOURCE_DIRS, no cache
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKERLAUNCH_")}
    env["DOCKERLAUNCH_CACHE_DIR"] = str(tmp_path / "empty-cache")
    found = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from dockerlaunch.images import sources; from dockerlaunch.images.stacks import load_matrix;"
         "s = load_matrix().stacks['swift4.6-mcore0.19-cu13-py313'];"
         "p = s.apex; src = sources.Source('apex', '4-apex', p.archive_name, p.sha256, 'archive', p.archive_url);"
         "print(sources.get_source(src, None, None, True, print))"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr
    assert "site-packages" in found.stdout and "apex-6424da3b" in found.stdout
