"""Index credentials (issue 50, finding 8): plain http only to this machine, decided on the parsed host (a
loopback IP address, or exactly `localhost`), never on how the name begins; and `stacks lock --index-url` (uv)
and `build --pip-index-url` (pip) refuse plain-http credentials the same way, in one line, before anything is
sent."""

import http.server
import socket
import threading

import pytest

from dockerlaunch.images import index as idx

TOKEN = "plainTOK3N"


@pytest.mark.parametrize("url", [
    f"http://u:{TOKEN}@localhost.evil.example/simple",
    f"http://u:{TOKEN}@127.evil.example/simple",
    f"http://u:{TOKEN}@127.0.0.1.nip.io/simple",
    f"http://u:{TOKEN}@localhost-evil.example:8080/simple",
    f"http://u:{TOKEN}@[::1].evil.example/simple",
    f"http://u:{TOKEN}@::1.evil.example/simple",
    # uv (WHATWG URLs) and pip (urllib3) end the host at a backslash: they would send this to evil.example,
    # while Python's urlsplit reads 127.0.0.1
    f"http://u:{TOKEN}@evil.example\\@127.0.0.1/simple",
    f"http://u:{TOKEN}@0.0.0.0/simple",
    f"http://u:{TOKEN}@192.0.2.7/simple",
])
def test_credentials_over_plain_http_to_a_name_that_only_looks_local_are_refused(url):
    with pytest.raises(idx.FetchError) as e:
        idx.check_credentials(url, "--index-url")
    assert str(e.value).startswith("--index-url") and "\n" not in str(e.value)
    assert TOKEN not in str(e.value) and "https" in str(e.value)


@pytest.mark.parametrize("url", [
    f"http://u:{TOKEN}@127.0.0.1:8080/simple",
    f"http://u:{TOKEN}@127.5.6.7/simple",
    f"http://u:{TOKEN}@[::1]:3141/simple",
    f"http://u:{TOKEN}@localhost/simple",
    f"http://u:{TOKEN}@LocalHost:3141/simple",
    f"https://u:{TOKEN}@localhost.evil.example/simple",  # over TLS: the user's choice of host
    "http://localhost.evil.example/simple",  # no credentials: nothing to protect
])
def test_credentials_to_this_machine_or_over_https_pass(url):
    idx.check_credentials(url)


@pytest.mark.parametrize("url, shown", [
    (f"http://u:{TOKEN}@host:abc/simple", "http://host:abc/simple"),
    (f"http://u:{TOKEN}@[::1/simple", "http://[::1/simple"),
    (f"https://u:{TOKEN}@mirror.example:8443/simple", "https://mirror.example:8443/simple"),
])
def test_redact_takes_the_credentials_out_even_of_a_url_urlsplit_cannot_read(url, shown):
    assert idx.redact(url) == shown


def test_a_malformed_index_url_on_the_command_line_is_one_line(cli):
    r = cli("stacks", "lock", "--stack", "cpu", "--index-url", f"http://ci:{TOKEN}@host:abc/simple")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-800:]
    assert r.stderr.strip().splitlines()[-1].startswith("error: --index-url http://host:abc/simple is not a valid URL")
    assert TOKEN not in r.stdout + r.stderr


def non_loopback_address() -> str:
    """This machine's address on its default route (a UDP connect sends nothing)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))
        return s.getsockname()[0]
    except OSError:
        pytest.skip("no non-loopback IPv4 address to listen on")
    finally:
        s.close()


@pytest.fixture
def listener():
    """A real HTTP listener on a non-loopback address: what reaches it is what would cross the network."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(f"{self.path} {self.headers.get('Authorization')}")
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((non_loopback_address(), 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"{server.server_address[0]}:{server.server_port}", seen
    server.shutdown()
    server.server_close()


def test_stacks_lock_refuses_an_index_token_over_plain_http(cli, listener):
    where, seen = listener
    r = cli("stacks", "lock", "--stack", "cpu", "--torch-index", "none", "--index-url",
            f"http://ci:{TOKEN}@{where}/simple")
    assert seen == [], seen  # nothing sent
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: --index-url http://{where}/simple: credentials over plain http can be read on the network: use "
        "https (plain http only to a loopback address)"), r.stderr
    assert TOKEN not in r.stdout + r.stderr


def test_build_refuses_a_pip_index_token_over_plain_http(cli, listener):
    where, seen = listener
    r = cli("build", "--stack", "cpu", "--dry-run", "--pip-index-url", f"http://ci:{TOKEN}@{where}/simple")
    assert r.returncode != 0, r.stdout[-500:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: --pip-index-url http://{where}/simple: credentials over plain http can be read on the network: use "
        "https (plain http only to a loopback address)"), r.stderr
    assert seen == [], seen
    assert TOKEN not in r.stdout + r.stderr
