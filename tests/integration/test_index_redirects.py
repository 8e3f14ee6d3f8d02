"""Index credentials stay with the index (issue 42, finding 2): an index at 127.0.0.1 that redirects to another
listener (127.0.0.2, another host as far as URLs go) must not hand it the Authorization header; credentials over
plain http to anything but loopback are refused in one line, before anything is sent."""

import base64
import http.server
import os
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.integration

TOKEN = "redir-s3cret"


def serve(address: str, handler) -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer((address, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_redirect_to_another_host_does_not_carry_the_index_token(tmp_path):
    seen: dict[str, list[str | None]] = {"index": [], "elsewhere": []}

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen["elsewhere"].append(self.headers.get("Authorization"))
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    other = serve("127.0.0.2", Elsewhere)

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen["index"].append(self.headers.get("Authorization"))
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.2:{other.server_port}{self.path}")
            self.end_headers()

        def log_message(self, *args):
            pass

    index = serve("127.0.0.1", Index)
    try:
        r = subprocess.run([sys.executable, "-m", "dockerlaunch", "fetch", "--stack", "cpu", "-o", str(tmp_path / "w"),
                            "--index-url", f"http://ci:{TOKEN}@127.0.0.1:{index.server_port}/simple"],
                           capture_output=True, text=True, timeout=300)
    finally:
        index.shutdown()
        other.shutdown()
    want = "Basic " + base64.b64encode(f"ci:{TOKEN}".encode()).decode()
    assert seen["index"] and seen["index"][0] == want, seen  # the index itself got it
    assert seen["elsewhere"], f"the redirect was not followed: {r.stderr[-500:]}"
    assert seen["elsewhere"] == [None] * len(seen["elsewhere"]), seen  # ... and nobody else did
    assert r.returncode != 0 and TOKEN not in r.stdout + r.stderr


def test_credentials_over_plain_http_to_another_machine_are_refused_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dockerlaunch", "fetch", "--stack", "cpu", "-o", str(tmp_path / "w"),
                        "--index-url", f"http://ci:{TOKEN}@index.example.invalid/simple"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines[-1] == ("error: index http://index.example.invalid/simple: credentials over plain http can be read on "
                         "the network: use https (plain http only to a loopback address)"), r.stderr
    assert TOKEN not in r.stdout + r.stderr


def test_an_index_on_this_machine_is_never_asked_through_a_proxy(tmp_path):
    """Plain http is allowed only to this machine: with http_proxy set (and no no_proxy), urllib would hand the
    request, token and all, in plain text to the proxy (another machine, in real life)."""
    seen: dict[str, list[str | None]] = {"index": [], "proxy": []}

    def recorder(key: str):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                seen[key].append(self.headers.get("Authorization"))
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args):
                pass

        return Handler

    proxy = serve("127.0.0.2", recorder("proxy"))
    index = serve("127.0.0.1", recorder("index"))
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "http_proxy", "all_proxy")}
    env["http_proxy"] = f"http://127.0.0.2:{proxy.server_port}"
    try:
        r = subprocess.run([sys.executable, "-m", "dockerlaunch", "fetch", "--stack", "cpu", "-o", str(tmp_path / "w"),
                            "--index-url", f"http://ci:{TOKEN}@127.0.0.1:{index.server_port}/simple"],
                           capture_output=True, text=True, timeout=300, env=env)
    finally:
        index.shutdown()
        proxy.shutdown()
    assert seen["proxy"] == [], f"the proxy was handed {len(seen['proxy'])} requests: {seen['proxy'][:1]}"
    assert seen["index"], f"the index was never asked: {r.stderr[-500:]}"
    assert r.returncode != 0 and TOKEN not in r.stdout + r.stderr
