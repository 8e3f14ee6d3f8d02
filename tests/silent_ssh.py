"""`dockerlaunch up` caught mid-connect: an SSH server (a real socket) that accepts and never answers, so a signal
sent then arrives while `up` connects. For the tests of how `up` ends on a signal."""

import contextlib
import os
import socket
import subprocess
import sys
import time


@contextlib.contextmanager
def up_mid_connect(tmp_path, preexec_fn):
    """Yields the `up` process once the server accepted its connection (and half a second more); kills it and
    closes the server on the way out."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(30)  # a run that never connects fails here, not hangs
    port = srv.getsockname()[1]
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "known_hosts").write_text("")
    p = subprocess.Popen([sys.executable, "-m", "dockerlaunch", "up", "--skip-preflight", "--hosts",
                          f"127.0.0.1:{port}", "--image", "i:1", "--log-dir", str(tmp_path / "logs"), "--", "true"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn,
                         env={**os.environ, "HOME": str(tmp_path)})
    conn = None
    try:
        try:
            conn, _ = srv.accept()  # `up` is connecting now
        except TimeoutError:
            p.kill()
            raise AssertionError(p.communicate()) from None
        time.sleep(0.5)
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        if conn is not None:
            conn.close()
        srv.close()
