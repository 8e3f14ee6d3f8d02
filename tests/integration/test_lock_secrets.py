"""A credentialed index URL for `stacks lock`: the token reaches the index (as uv's Basic auth), and nowhere
else: not the lock, not the output, not any child's argv (which `ps` shows to every user)."""

import base64
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dockerlaunch.images.stacks import default_dockerfiles_dir
from tests.integration.test_build import lock_args

pytestmark = pytest.mark.integration

TOKEN = "s3cr3tTOKEN"


class AuthIndex(http.server.BaseHTTPRequestHandler):
    """PyPI's simple index behind Basic auth: 401 without the token, else a redirect to pypi.org (uv drops the
    credentials on a redirect to another host)."""

    seen: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        want = "Basic " + base64.b64encode(f"ci:{TOKEN}".encode()).decode()
        if self.headers.get("Authorization") != want:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.end_headers()
            return
        AuthIndex.seen.append(self.path)
        self.send_response(302)
        self.send_header("Location", "https://pypi.org" + self.path)
        self.end_headers()

    def log_message(self, *args):
        pass


def argv_with(word: str, stop: threading.Event, found: list[str]) -> None:
    """Every process's argv, read from /proc every 20 ms while the lock runs."""
    while not stop.is_set():
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    cmd = (d / "cmdline").read_bytes()
                except OSError:
                    continue
                if word.encode() in cmd:
                    found.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
        time.sleep(0.02)


def test_an_index_token_never_shows(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AuthIndex)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    d = tmp_path / "dockerfiles"
    shutil.copytree(default_dockerfiles_dir(), d)
    stop, found = threading.Event(), []
    spy = threading.Thread(target=argv_with, args=(TOKEN, stop, found), daemon=True)
    try:
        spy.start()
        r = subprocess.run([sys.executable, "-m", "dockerlaunch", "stacks", "lock", "--stack", "cpu", *lock_args()],
                           capture_output=True, text=True, timeout=900,
                           env={**os.environ, "DOCKERLAUNCH_DOCKERFILES": str(d), "DOCKERLAUNCH_INDEX_URL":
                                f"http://ci:{TOKEN}@127.0.0.1:{server.server_port}/simple"})
    finally:
        stop.set()
        spy.join(5)
        server.shutdown()
    assert r.returncode == 0, r.stderr[-2000:]
    assert AuthIndex.seen, "the index was never asked with the token"
    lock = (d / "locks" / "cpu.lock").read_text()
    assert TOKEN not in lock and TOKEN not in r.stdout + r.stderr
    assert f"# sources: http://127.0.0.1:{server.server_port}/simple" in lock
    assert found == [], found


def test_a_token_on_the_command_line_is_warned_about(cli, tmp_path):
    # a folder of the test's own: as root, fetch makes its output folder before the index fails (was /nonexistent/x)
    r = cli("fetch", "--stack", "cpu", "-o", str(tmp_path / "out"), "--index-url", "https://u:p@127.0.0.1:9/simple")
    assert "warning: --index-url holds credentials" in r.stderr and "DOCKERLAUNCH_INDEX_URL" in r.stderr
    assert "u:p@" not in r.stdout + r.stderr and ":p@" not in r.stdout + r.stderr  # the output as it is


def test_uv_asks_an_index_on_this_machine_directly_never_through_a_proxy():
    """Plain-http credentials are allowed only to this machine; with http_proxy set (and no no_proxy) uv would
    hand every request, token and all, in plain text to the proxy (another machine, in real life)."""
    seen: dict[str, list[str]] = {"index": [], "proxy": []}

    def recorder(key: str):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                seen[key].append(self.path)
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args):
                pass

        return Handler

    servers = {}
    for key, address in (("proxy", "127.0.0.2"), ("index", "127.0.0.1")):
        servers[key] = http.server.ThreadingHTTPServer((address, 0), recorder(key))
        threading.Thread(target=servers[key].serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "http_proxy", "all_proxy")}
    env["http_proxy"] = f"http://127.0.0.2:{servers['proxy'].server_port}"
    env["DOCKERLAUNCH_INDEX_URL"] = f"http://ci:{TOKEN}@127.0.0.1:{servers['index'].server_port}/simple"
    try:
        r = subprocess.run([sys.executable, "-m", "dockerlaunch", "stacks", "lock", "--stack", "cpu", "--torch-index",
                            "none"], capture_output=True, text=True, timeout=300, env=env)
    finally:
        for server in servers.values():
            server.shutdown()
    assert seen["proxy"] == [], f"the proxy was handed {len(seen['proxy'])} requests: {seen['proxy'][:3]}"
    assert seen["index"], f"the index was never asked: {r.stderr[-500:]}"
    assert r.returncode != 0 and TOKEN not in r.stdout + r.stderr  # the index has nothing: uv fails
