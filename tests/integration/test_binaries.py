"""`stacks check --binaries` on the recommended stack's real lock and real wheels (no Docker): the ELF resolver, not
a hand-written rule, finds TE's missing cuBLAS symbol in a lock without the override; the committed lock passes;
offline, a file that is not the lock's, and a full disk are each one line and exit 1.

The wheels torch resolves to are read from the test-wheels folder test_verify.py fills too (downloaded once per
machine); the rest (~0.3-0.9 GB) once into the tables cache, which is kept by sha256 like every cache here."""

import gzip
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dockerlaunch.cache import cache_root
from dockerlaunch.images import lock as locks
from dockerlaunch.images.stacks import load_matrix, shipped_dockerfiles_dir
from tests.integration.helpers import torch_wheels

STACK = "swift4.6-mcore0.19-cu13-py313"
TE_LIB = "transformer_engine/wheel_lib/libtransformer_engine.so"
SKIP_RULES = ("--skip-rule", "te-cublas", "--skip-rule", "te-cublas-grouped")


@pytest.fixture(scope="module")
def find_links() -> list[str]:
    out = ["--find-links", str(torch_wheels())]
    te = cache_root() / "test-wheels"  # test_verify.py's TE and cuBLAS 13.3 wheels, where that ran first
    if any(te.glob("transformer_engine_cu13-*.whl")):
        out += ["--find-links", str(te)]
    return out


def copy_dockerfiles(dest: Path) -> Path:
    src = shipped_dockerfiles_dir()
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("sources"))
    return dest


@pytest.fixture(scope="module")
def no_override(tmp_path_factory, find_links) -> Path:
    """A copy of the matrix whose recommended stack has no cuBLAS override, and its lock as `stacks lock` would
    write it then: torch's own nvidia-cublas==13.1.0.3 (the hash of the real wheel), digests made again."""
    d = copy_dockerfiles(tmp_path_factory.mktemp("no-override") / "Dockerfiles")
    yaml_path = d / "stacks.yaml"
    text = yaml_path.read_text()
    line = "    overrides: [nvidia-cublas==13.3.0.5]\n"
    start = text.index(f"  {STACK}:\n")
    at = text.index(line, start)
    yaml_path.write_text(text[:at] + text[at + len(line):])
    stack = load_matrix(yaml_path).get(STACK)
    assert not stack.overrides
    [wheel] = Path(find_links[1]).glob("nvidia_cublas-13.1.0.3-*.whl")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock_path = d / "locks" / f"{STACK}.lock"
    head, _, body = lock_path.read_text().partition("\n\n")
    body, n = re.subn(r"nvidia-cublas==13\.3\.0\.5 \\\n(    --hash=sha256:\w+ \\\n)*    --hash=sha256:\w+\n",
                      f"nvidia-cublas==13.1.0.3 \\\n    --hash=sha256:{sha}\n", body)
    assert n == 1
    head = "\n".join(x for x in head.splitlines() if not x.startswith("# overrides:"))
    head = re.sub(r"# inputs-sha256: \w+", f"# inputs-sha256: {locks.inputs_digest(stack)}", head)
    head = re.sub(r"# body-sha256: \w+", f"# body-sha256: {hashlib.sha256(body.encode()).hexdigest()}", head)
    lock_path.write_text(f"{head}\n\n{body}")
    assert locks.check(stack, d) == []
    return d


def binaries(*args: str, env: dict | None = None, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dockerlaunch", "stacks", "check", "--stack", STACK, "--binaries",
                           *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd="/")


@pytest.fixture(scope="module")
def committed(find_links) -> subprocess.CompletedProcess:
    """The committed lock checked once (this fills the tables cache the other tests copy from)."""
    return binaries(*find_links)


def test_the_committed_recommended_lock_passes(committed):
    r = committed
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert f"binaries {STACK}: PASS" in r.stdout
    rows = {line.split()[0] for line in r.stdout.splitlines() if line}
    assert {"symbols", "archs", "wheels", "base"} <= rows, r.stdout
    assert re.search(r"^symbols +PASS +\d{3} of \d{3} libraries", r.stdout, re.M), r.stdout
    assert " FAIL " not in r.stdout and "ERROR" not in r.stdout


def test_the_lock_without_the_cublas_override_fails_from_the_elf_resolver(no_override, find_links):
    env = {"DOCKERLAUNCH_DOCKERFILES": str(no_override)}
    # the hand-written rule sees it too (so this is the lock it was written for) ...
    with_rule = subprocess.run([sys.executable, "-m", "dockerlaunch", "stacks", "check", "--stack", STACK],
                               capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert with_rule.returncode == 1 and "te-cublas" in with_rule.stdout, with_rule.stdout
    # ... and with it (and its grouped-GEMM sibling) off, the resolver finds the symbol in the wheels' tables
    r = binaries(*SKIP_RULES, *find_links, env=env)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert "te-cublas" not in r.stdout.replace("rules left out: te-cublas, te-cublas-grouped", "")
    [row] = [line for line in r.stdout.splitlines() if line.startswith(f"symbols {TE_LIB}")]
    assert " FAIL " in row
    assert "cublasLtGroupedMatrixLayoutInit_internal" in row
    assert "(transformer-engine-cu13 2.16.1)" in row  # the wheel that needs it
    assert "libcublasLt.so.13 (nvidia-cublas 13.1.0.3, nvidia/cu13/lib/libcublasLt.so.13) does not define" in row
    assert f"\nbinaries {STACK}: FAIL\n" in r.stdout


def _cache_copy(tmp: Path, drop: str | None = None) -> Path:
    """A cache folder with the tools and the tables (all, or all but one wheel's), so one wheel has to be read."""
    cache = tmp / "cache"
    shutil.copytree(cache_root() / "tools", cache / "tools", ignore=shutil.ignore_patterns("wheels"))
    shutil.copytree(cache_root() / "tables", cache / "tables",
                    ignore=shutil.ignore_patterns(*([f"{drop}.json.gz"] if drop else [])))
    return cache


def _table(name: str) -> dict:
    """The cached table of the lock's `name` (the `committed` fixture made it)."""
    version = locks.read(load_matrix().get(STACK), shipped_dockerfiles_dir()).get(name).version
    for p in (cache_root() / "tables").glob("*.json.gz"):
        with gzip.open(p, "rt") as f:
            t = json.load(f)
        if t["name"] == name and t["version"] == version:
            return t
    raise AssertionError(f"no table for {name} {version} in {cache_root() / 'tables'}")


def test_offline_without_tables_is_one_error_row(tmp_path, committed):
    cache = tmp_path / "cache"
    shutil.copytree(cache_root() / "tools", cache / "tools", ignore=shutil.ignore_patterns("wheels"))
    r = binaries("--offline", env={"DOCKERLAUNCH_CACHE_DIR": str(cache)}, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    [row] = [line for line in r.stdout.splitlines() if line.startswith("wheels") and "ERROR" in line]
    assert "have no tables in the cache and --offline forbids a download" in row
    assert f"binaries {STACK}: ERROR" in r.stdout and f"binaries {STACK}: PASS" not in r.stdout


class _Index(http.server.BaseHTTPRequestHandler):
    """A package index that lists msgpack's locked file under its real sha256 and serves other bytes."""
    page = b""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = self.page if self.path.startswith("/simple/msgpack/") else b"not the lock's file" * 100
        if self.path.startswith("/simple/") and not self.path.startswith("/simple/msgpack/"):
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_file_that_is_not_the_locked_one_is_an_error_naming_it(tmp_path, find_links, committed):
    t = _table("msgpack")
    sha, name = t["sha256"], t["filename"]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    _Index.page = f'<a href="/files/{name}#sha256={sha}">{name}</a>'.encode()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cache = _cache_copy(tmp_path, drop=sha)
        r = binaries("--index-url", f"http://127.0.0.1:{server.server_port}/simple", *find_links,
                     env={"DOCKERLAUNCH_CACHE_DIR": str(cache)}, timeout=600)
    finally:
        server.shutdown()
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    [row] = [line for line in r.stdout.splitlines() if line.startswith("wheels") and "ERROR" in line]
    assert f"{name}: the bytes that arrived do not match the lock (expected sha256 {sha}" in row
    assert not list((cache / "tables").glob(".wheel-*")), "the download's folder is left behind"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="mounts a small tmpfs (root, unshare)")
def test_a_full_disk_is_one_line(tmp_path, find_links, committed):
    sha = _table("torch")["sha256"]
    staged = _cache_copy(tmp_path, drop=sha)
    cache = tmp_path / "small"
    cache.mkdir()
    # a 24 MB file system for the cache: the tools and tables fit, torch's 1 GB library does not
    script = ('mount -t tmpfs -o size=24m tmpfs "$1" && cp -a "$2"/. "$1"/ && shift 2 && exec "$@"')
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(cache),
                        str(staged), sys.executable, "-m", "dockerlaunch", "stacks", "check", "--stack", STACK,
                        "--binaries", *find_links], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "DOCKERLAUNCH_CACHE_DIR": str(cache)}, cwd="/")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    err = [line for line in r.stderr.splitlines() if not line.startswith("  ")]
    assert len(err) == 1, r.stderr
    assert re.match(rf"error: stacks check --binaries: no space left in {cache}/tables while reading torch-2\.11\.0-"
                    r"\S+\.whl \(\d+\.\d GB free\): free some, or point DOCKERLAUNCH_CACHE_DIR", err[0]), err[0]
    assert "Traceback" not in r.stderr
