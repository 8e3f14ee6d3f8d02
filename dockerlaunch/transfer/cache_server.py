"""Debian's docker-registry on 127.0.0.1 over the launcher's layer cache, for one push, and the engine's push into it.

Nothing goes to its port until /proc shows the port's one listener is the registry's own socket;
every request needs a password made for that push. What the registry's storage holds, and the stream made from it,
is transfer/layer_cache.py's.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dockerlaunch.cache import cache_root
from dockerlaunch.errors import TransferError
from dockerlaunch.job.facts import EngineSecurity
from dockerlaunch.transfer.image_facts import GRAPHDRIVER, LocalImage
from dockerlaunch.transfer.oci import OCI_INDEX, OCI_MANIFEST

MODE_ENV = "DOCKERLAUNCH_LAYER_SOURCE"  # auto (default): push_plan.choose_route decides; cache: always the registry
#                                        where it can serve; save: always docker save
MODES = ("auto", "cache", "save")
REGISTRY = "docker-registry"
REPO = "dockerlaunch/layers"
SCHEMA2 = "application/vnd.docker.distribution.manifest.v2+json"
LIST2 = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFESTS = (SCHEMA2, OCI_MANIFEST, LIST2, OCI_INDEX)  # what a containerd-store engine may push for one tag


def root() -> Path:
    """The layer cache's folder: the registry's storage (transfer/layer_cache.py reads it), its config and log."""
    return cache_root() / "registry"


def mode() -> str:
    """DOCKERLAUNCH_LAYER_SOURCE, checked: auto, cache or save."""
    got = os.environ.get(MODE_ENV, "").strip() or "auto"
    if got not in MODES:
        raise TransferError(f"{MODE_ENV}={got[:40]!r}: give auto (the default), cache or save")
    return got


def unavailable(image: LocalImage, info: dict | None = None) -> str | None:
    """Why the registry cannot give this image's layers here; None when it can. `info`: the engine's `docker info`."""
    if mode() == "save":
        return f"{MODE_ENV}=save"
    if os.environ.get("DOCKER_HOST", "unix://").split(":", 1)[0] not in ("unix", ""):
        return "the launcher's engine is not on this machine (DOCKER_HOST): it cannot reach 127.0.0.1 here"
    security = EngineSecurity.parse((info or {}).get("SecurityOptions"))
    if security is not None and security.rootless:
        return "the launcher's engine is rootless: its 127.0.0.1 is not this machine's, where the registry listens"
    if not shutil.which(REGISTRY):
        return "no docker-registry on this machine (apt-get install docker-registry)"
    if not os.path.isfile(TCP_TABLES[0]):
        return f"no {TCP_TABLES[0]} here: the launcher could not prove the registry's port is its registry's"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")  # this network namespace's sockets, with owner uid and inode
LOOPBACK = f"{int.from_bytes(socket.inet_aton('127.0.0.1'), sys.byteorder):08X}"  # 127.0.0.1 as those tables write it


def _listeners(port: int) -> list[tuple[str, int, int]]:
    """(address, owner uid, socket inode) of every TCP listener on `port`, any address (Linux /proc)."""
    out = []
    for table in TCP_TABLES:
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    out.append((f[1].rsplit(":", 1)[0], int(f[7]), int(f[9])))
    return out


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds open (empty when it cannot be read, or has exited)."""
    out = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    out.add(int(link[8:-1]))
    return out


def _who(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid}, {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"uid {uid}"


def _not_ours(proc: subprocess.Popen, port: int) -> tuple[str | None, bool]:
    """Why 127.0.0.1:`port` is not the registry's own (None: the registry runs, and the port's only listener is a
    socket it holds), and whether that may still change (it runs, nothing listens there yet). Read from /proc,
    never by asking the listener: nothing goes to a squatter before this says None. The listeners are read first
    (one the registry binds meanwhile is not taken for another's), its sockets next, then it is seen alive (until
    reaped, its pid is no one else's)."""
    listeners = _listeners(port)
    ours = _socket_inodes(proc.pid)
    alive = proc.poll() is None
    others = [uid for _, uid, inode in listeners if inode not in ours]
    if others:
        return (f"127.0.0.1:{port} is held by another listener ({_who(others[0])}), not the launcher's registry "
                f"(pid {proc.pid}, {'running' if alive else 'exited'}): nothing was sent to it"), False
    if not alive:
        return f"the launcher's registry for 127.0.0.1:{port} exited (see {root() / 'registry.log'})", False
    if not any(addr == LOOPBACK for addr, _, _ in listeners):
        return f"the launcher's registry (pid {proc.pid}) does not listen on 127.0.0.1:{port}", not listeners
    return None, False


@dataclass(frozen=True)
class Served:
    """The launcher's registry while it runs: its port, its one push password, its process."""

    port: int
    password: str
    proc: subprocess.Popen

    def check(self) -> None:
        """Raises unless the registry still runs and holds its port alone: before the password goes anywhere."""
        why, _ = _not_ours(self.proc, self.port)
        if why is not None:
            raise TransferError(why)


USER = "dockerlaunch"


def private_root() -> Path:
    """The cache's registry folder, this user's only (the layers of every image pushed are in it)."""
    store = root()
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    if store.is_symlink() or store.stat().st_uid != os.getuid():
        raise TransferError(f"{store} is not this user's own folder")
    store.chmod(0o700)
    return store


def _dies_with_parent() -> None:
    """In the registry's process: a launcher killed outright (SIGKILL) takes its registry with it (Linux)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def serve() -> Iterator[Served]:
    """Debian's registry on 127.0.0.1 over the cache's storage, for one push. Every request needs the password,
    new each time (another login on this machine could otherwise read or write layers while it listens); it
    reaches the engine in the API request, never a command line. The port is picked free, then released for the
    registry to bind: another login may bind it first (the registry then exits), so nothing is sent to the port
    until /proc shows its one listener is the registry's own socket."""
    import bcrypt

    store = private_root()
    port, password = _free_port(), secrets.token_urlsafe(24)
    htpasswd = store / f"htpasswd-{os.getpid()}"
    fd = os.open(htpasswd, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(USER.encode() + b":" + bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=8)) + b"\n")
    config = store / f"config-{os.getpid()}.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {store}/store\n"
                      f"auth:\n  htpasswd:\n    realm: dockerlaunch\n    path: {htpasswd}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
    log = open(store / "registry.log", "ab")
    proc = subprocess.Popen([shutil.which(REGISTRY) or REGISTRY, "serve", str(config)], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_dies_with_parent)
    served = Served(port, password, proc)
    try:
        deadline = time.monotonic() + 20
        while True:
            why, starting = _not_ours(proc, port)
            if why is None:
                break
            if not starting or time.monotonic() > deadline:
                raise TransferError(why)
            time.sleep(0.05)
        while True:  # the registry's own socket: the password may go to it
            try:
                with urllib.request.urlopen(_authorized(f"http://127.0.0.1:{port}/v2/", password), timeout=2):
                    break
            except OSError:
                served.check()
                if time.monotonic() > deadline:
                    raise TransferError(f"the launcher's registry did not start (see {store / 'registry.log'})"
                                        ) from None
                time.sleep(0.1)
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        config.unlink(missing_ok=True)
        htpasswd.unlink(missing_ok=True)


def _authorized(url: str, password: str, **headers: str) -> urllib.request.Request:
    token = base64.b64encode(f"{USER}:{password}".encode()).decode()
    return urllib.request.Request(url, headers={"Authorization": f"Basic {token}", **headers})


_OUR_TAG = re.compile(r"^127\.0\.0\.1:\d+/" + re.escape(REPO) + r":[0-9a-f]{12}\Z")


def _drop_stale_tags(client) -> None:
    """Tags an earlier push left on the launcher's engine when it was killed mid-push (each names a port gone)."""
    for img in client.api.images():
        for ref in img.get("RepoTags") or []:
            if _OUR_TAG.match(ref):
                with contextlib.suppress(Exception):
                    client.api.remove_image(ref, noprune=True)


def engine_push(client, image: LocalImage, reg: Served, on_progress: Callable[[int], None] | None = None,
                sizes: dict[str, int] | None = None) -> dict:
    """`docker push` of the image into the registry (the engine reads only what it lacks); its manifest. The
    registry is proven to hold its port before the engine gets the password, and seen alive on every progress
    line (a registry gone mid-push: its port is anyone's, so the push stops before the engine's next retry).
    `on_progress` hears the bytes the engine has read of the layers it pushes (before its gzip), as it reads;
    `sizes` gets the size the engine gives each layer it pushed (the unit of the image's Size), by the first 12
    hex digits of its diff ID (the progress lines' `id`)."""
    reg.check()
    _drop_stale_tags(client)
    port, password = reg.port, reg.password
    repo, tag = f"127.0.0.1:{port}/{REPO}", image.id[7:19]
    client.api.tag(image.id, repo, tag)
    lines = None
    try:
        lines = client.api.push(repo, tag, stream=True, decode=True,
                                auth_config={"username": USER, "password": password})
        read = _ReadCount(on_progress, sizes)
        for line in lines:
            if reg.proc.poll() is not None:
                reg.check()
            if isinstance(line, dict) and line.get("error"):
                raise TransferError(f"the engine's push into the launcher's registry failed: {line['error']}")
            if isinstance(line, dict):
                read.see(line)
    finally:
        if hasattr(lines, "close"):
            lines.close()  # its connection closed: the engine cancels the push
        with contextlib.suppress(Exception):
            client.api.remove_image(f"{repo}:{tag}", noprune=True)
    reg.check()  # still the registry's port: what answered the engine was the registry, and the password may go
    return _manifest(image, port, password, tag)


class _ReadCount:
    """The bytes the engine has read of the layers it pushes, from its progress lines: per layer (`id`), `Pushing`
    carries `progressDetail.current` of `total` (the layer's bytes before gzip), `Pushed` ends it. A retried
    upload starts again from 0: only bytes beyond the most yet seen of a layer count."""

    def __init__(self, on_progress: Callable[[int], None] | None, sizes: dict[str, int] | None = None):
        self.on_progress = on_progress
        self.seen: dict[str, int] = {}
        self.total: dict[str, int] = {} if sizes is None else sizes

    def see(self, line: dict) -> None:
        layer, detail = str(line.get("id") or ""), line.get("progressDetail") or {}
        if not layer or not isinstance(detail, dict):
            return
        now = self.seen.get(layer, 0)
        if line.get("status") == "Pushing" and isinstance(detail.get("current"), int):
            if isinstance(detail.get("total"), int):
                self.total[layer] = detail["total"]
            got = detail["current"]
        elif line.get("status") == "Pushed":
            got = self.total.get(layer, now)
        else:
            return
        if got > now:
            self.seen[layer] = got
            if self.on_progress is not None:
                self.on_progress(got - now)


def _get_manifest(port: int, password: str, ref: str) -> tuple[dict, str]:
    """(the manifest, its digest) of a tag or digest in the registry."""
    req = _authorized(f"http://127.0.0.1:{port}/v2/{REPO}/manifests/{ref}", password, Accept=", ".join(MANIFESTS))
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return json.loads(body), "sha256:" + hashlib.sha256(body).hexdigest()


def _manifest(image: LocalImage, port: int, password: str, tag: str) -> dict:
    """The image manifest the engine pushed for `tag`. A containerd-store engine names the image by what it
    pushed at the top (an index, or the manifest): that digest must be the Image ID; an index's entry for the
    image's platform is the manifest (attestations, platform unknown, are not)."""
    top, digest = _get_manifest(port, password, tag)
    if image.store == GRAPHDRIVER or top.get("mediaType") not in (OCI_INDEX, LIST2):
        if image.store != GRAPHDRIVER and digest != image.id:
            raise TransferError(f"the launcher's registry holds {digest[:19]} for {image.ref}, not its Image ID")
        return top
    if digest != image.id:
        raise TransferError(f"the launcher's registry holds index {digest[:19]} for {image.ref}, not its Image ID")
    os_, arch, variant = image.platform
    for entry in top.get("manifests") or []:
        plat = entry.get("platform") or {}
        if (plat.get("os"), plat.get("architecture"), plat.get("variant") or "") == (os_, arch, variant):
            manifest, got = _get_manifest(port, password, str(entry.get("digest")))
            if got != entry.get("digest"):
                raise TransferError(f"the launcher's registry served {got[:19]} for {entry.get('digest')}")
            return manifest
    raise TransferError(f"the index of {image.ref} names no manifest for {os_}/{arch}")
