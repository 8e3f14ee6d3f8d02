"""The registry route, issue 43's anchor: the hosts' own engines pull from the launcher's registry through an SSH
port forward (`ssh -R`), as a team with `docker push`/`pull` and no registry host could run it.

This script measures the route's known trap first (moby/moby#46664, docker/cli#3776): a classic-store engine holds
a layer that arrived by `docker load` as its uncompressed tar only, cannot match it with the registry's compressed
blob, and so downloads every layer again on its first pull after a load. One sim node per engine kind; BASE is
--base-mb of random bytes, NEW = BASE + --top-mb; for each node, the bytes the registry served for `docker pull NEW`:

  after load   BASE arrived by `dockerlaunch push` (docker load), as it does on every host push has served
  after pull   BASE arrived by `docker pull` from the same registry

thin_push.py --routes pull times the route on the real image with `pull` (below).

  .venv/bin/python benchmarks/registry_pull.py [--base-mb 64] [--top-mb 8] [--engines 20.10,28,28-containerd]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shlex
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

from harness import random_image, ssh_argv

from dockerlaunch import sim
from dockerlaunch.engine import engine
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.load import load_config
from dockerlaunch.transfer import cache_server, image_facts, layer_cache, push


class CountingRelay:
    """127.0.0.1:port -> the registry, counting the bytes it serves (what crosses the link to the host)."""

    def __init__(self, target: int):
        self.target, self.served, self.lock = target, 0, threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                if count:
                    with self.lock:
                        self.served += len(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def launcher_registry() -> Iterator[cache_server.Served]:
    """The launcher's own registry (transfer.cache_server: Debian's distribution over its cache), held open."""
    with layer_cache._locked(), cache_server.serve() as reg:
        yield reg


def into_registry(client, reg: cache_server.Served, ref: str) -> str:
    """The engine's own `docker push` of `ref` into the registry (it sends only the layers the registry lacks);
    the repository:tag a host pulls."""
    image = image_facts.local_image(client, ref, facts=False)
    cache_server.engine_push(client, image, reg)
    return f"{cache_server.REPO}:{image.id[7:19]}"


def pull(cfg, remote: Remote, port: int, password: str, repo_tag: str, ref: str) -> tuple[float, int]:
    """`docker pull` on the host from the launcher's registry through `ssh -R` (OpenSSH, the sim's keys and
    known_hosts), tagged `ref`; (seconds, bytes the registry served). The password goes on stdin."""
    relay = CountingRelay(port)
    there = 20000 + secrets.randbelow(30000)
    src = f"127.0.0.1:{there}/{repo_tag}"
    script = (f"docker login -u {cache_server.USER} --password-stdin 127.0.0.1:{there} >/dev/null && "
              f"docker pull -q {shlex.quote(src)} >/dev/null && docker tag {shlex.quote(src)} {shlex.quote(ref)} && "
              f"docker rmi {shlex.quote(src)} >/dev/null; s=$?; docker logout 127.0.0.1:{there} >/dev/null; exit $s")
    argv = ssh_argv(cfg, remote)
    argv = argv[:-1] + ["-o", "ExitOnForwardFailure=yes", "-R", f"{there}:127.0.0.1:{relay.port}", argv[-1], script]
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, input=password, text=True, capture_output=True, timeout=3600)
    finally:
        relay.close()
    if r.returncode != 0:
        raise SystemExit(f"pull on {remote.name} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return time.monotonic() - t0, relay.served


def forget(remote: Remote, *refs: str) -> None:
    """The host forgets these images and every layer only they held."""
    remote.run(["sh", "-c", 'docker rmi -f "$@" >/dev/null 2>&1; docker image prune -f >/dev/null 2>&1; true',
                "sh", *refs], timeout=600)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-mb", type=int, default=64)
    ap.add_argument("--top-mb", type=int, default=8)
    ap.add_argument("--engines", default="20.10,28,28-containerd")
    ap.add_argument("--cluster", default=f"dlbench{os.getpid()}")
    ap.add_argument("--subnet", default="172.30.249.0/24")
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="dlbench-pull-cache-")
    client = engine()
    nonce = secrets.token_hex(3)
    base, new = f"dlbench/pull-{nonce}:base", f"dlbench/pull-{nonce}:new"
    kinds = args.engines.split(",")
    rows: list[tuple[str, int, int]] = []
    remotes: list[Remote] = []
    try:
        random_image(client, base, args.base_mb)
        random_image(client, new, args.top_mb, base=base)
        cfg = load_config(sim.create(cluster=args.cluster, subnet=args.subnet, engines=args.engines))
        remotes = [Remote(resolve_target(h, cfg.ssh)) for h in cfg.hosts]
        os.environ["DOCKERLAUNCH_CACHE_DIR"] = cache  # a registry of its own (set after the sim found its caches)
        with launcher_registry() as reg:
            port, password = reg.port, reg.password
            base_tag, new_tag = (into_registry(client, reg, ref) for ref in (base, new))
            for kind, remote in zip(kinds, remotes):
                r = push.push_to_host(client, remote, image_facts.local_image(client, base), compress="none",
                                      thin=False)
                assert r.status == "pushed", r
                _, after_load = pull(cfg, remote, port, password, new_tag, new)
                forget(remote, base, new)
                pull(cfg, remote, port, password, base_tag, base)
                _, after_pull = pull(cfg, remote, port, password, new_tag, new)
                rows.append((kind, after_load, after_pull))
                print(f"{kind}: after load {after_load / 1e6:.1f} MB, after pull {after_pull / 1e6:.1f} MB",
                      flush=True)
    finally:
        for remote in remotes:
            remote.close()
        sim.remove(args.cluster, quiet=True)
        subprocess.run(["docker", "rmi", new, base], capture_output=True)
        subprocess.run(["rm", "-rf", cache])
    print(f"\nBASE {args.base_mb} MiB, NEW = BASE + {args.top_mb} MiB (random bytes); bytes the launcher's "
          "registry served for `docker pull NEW` through ssh -R")
    print("| host engine | after `docker load` of BASE | after `docker pull` of BASE | load / pull |")
    print("|---|---|---|---|")
    for kind, after_load, after_pull in rows:
        print(f"| {kind} | {after_load / 1e6:.1f} MB | {after_pull / 1e6:.1f} MB | "
              f"{after_load / max(after_pull, 1):.1f} x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
