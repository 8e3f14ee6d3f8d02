"""The fleet: every host of one config resolved once, connected concurrently, per-host steps run on all, closed.

`with Fleet.connect(config) as fleet:` owns the SSH config, the targets and the connections; `fleet.each(fn)`
runs `fn(host)` on every host at once and returns an `Outcomes` (per host: a value or the error).
Only `Exception`s become outcomes: KeyboardInterrupt and SystemExit always reach the caller, so a
Ctrl-C during any concurrent step stops the command instead of becoming one host's "result".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dockerlaunch.errors import DockerlaunchError, SSHError
from dockerlaunch.hosts.local import open_remote
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.hosts.targets import SSHTarget, check_settings, load_ssh_config, resolve_all
from dockerlaunch.job.config import ClusterConfig

T = TypeVar("T")
# Steps run on every host at once (each over its own connection, which already exists): a start or a teardown of
# 256 hosts is one round, not eight. Handshakes are CPU work for this process: a window of them (pdsh's 32).
MAX_WORKERS = 256
CONNECT_WINDOW = 32
# Open files this process needs per host: its SSH socket and its log file, plus a margin for commands' pipes
FILES_PER_HOST = 3
FILES_BASE = 64


def ensure_open_files(hosts: int) -> None:
    """Raise this process's soft open-files limit to what `hosts` connections need (the hard limit allows it on
    most machines; `ulimit -n` is 1024 by default); where the hard limit is too low, say so before connecting."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    need = FILES_BASE + FILES_PER_HOST * hosts
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise DockerlaunchError(f"{hosts} hosts need about {need} open files, and this shell allows {hard} "
                                f"(ulimit -Hn): raise it (e.g. `ulimit -n {need}` as root, or LimitNOFILE / "
                                "limits.conf for the user) and run again")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


@dataclass
class Outcome(Generic[T]):
    """What one step did on one item (a host, usually): `value`, or the `error` it raised."""

    item: Any
    value: T | None = None
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Outcomes(Generic[T]):
    """Per-item outcomes, in the order of the items."""

    all: list[Outcome[T]] = field(default_factory=list)

    def __iter__(self) -> Iterator[Outcome[T]]:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def __getitem__(self, i: int) -> Outcome[T]:
        return self.all[i]

    @property
    def ok(self) -> list[Outcome[T]]:
        return [o for o in self.all if o.ok]

    @property
    def failed(self) -> list[Outcome[T]]:
        return [o for o in self.all if not o.ok]

    def raise_first(self) -> list[T]:
        """Every value, in order; or the first error (all of them in one line when several failed)."""
        failed = self.failed
        if len(failed) == 1:
            raise failed[0].error  # type: ignore[misc]
        if failed:
            raise DockerlaunchError("; ".join(str(o.error) for o in failed))
        return [o.value for o in self.all]  # type: ignore[misc]


def each(fn: Callable[[Any], T], items: Sequence[Any], max_workers: int = MAX_WORKERS,
         settle: float = 0.0) -> Outcomes[T]:
    """`fn` over `items` concurrently; an Exception lands in its item's outcome, anything else is raised.

    Workers are daemon threads: a Ctrl-C or SIGTERM reaches the caller at once (the main thread only waits
    in short slices), no item starts after it, and a hung host cannot keep the process from exiting.
    `settle`: on an interrupt, wait up to this long for steps already under way (e.g. a `docker run`)
    so that what they did is visible to the cleanup that follows.
    """
    items = list(items)
    if not items:
        return Outcomes()
    slots: list[Outcome[T] | None] = [None] * len(items)
    raised: list[BaseException] = []
    lock = threading.Lock()
    cursor = [0]
    stop = threading.Event()
    finished = threading.Event()
    running = [0]

    def work() -> None:
        while not stop.is_set():
            with lock:
                if cursor[0] >= len(items):
                    break
                i = cursor[0]
                cursor[0] += 1
            try:
                slots[i] = Outcome(items[i], value=fn(items[i]))
            except Exception as e:  # noqa: BLE001 - a per-item outcome
                slots[i] = Outcome(items[i], error=e)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                raised.append(e)
                stop.set()
        with lock:
            running[0] -= 1
            if running[0] == 0:
                finished.set()

    n = min(max_workers, len(items))
    running[0] = n
    for _ in range(n):
        threading.Thread(target=work, daemon=True, name="dl-host").start()
    try:
        while not finished.wait(0.1):
            pass
    except BaseException:
        stop.set()
        if settle > 0:
            finished.wait(settle)
        raise
    if raised:
        raise raised[0]
    return Outcomes([o for o in slots if o is not None])


DNS_WAIT = 10.0  # seconds for every host name to resolve, all at once


def check_addresses(targets: Sequence[SSHTarget], wait: float = DNS_WAIT) -> None:
    """Before any connection: every name resolves, and no two entries are one host (after ~/.ssh/config and
    DNS). A typo among 300 hosts, or an alias and its IP both listed, is one line naming them; nothing starts.
    Names behind a jump host are resolved there, not here: only their ~/.ssh/config form is compared."""
    import socket

    direct = [(i, t) for i, t in enumerate(targets) if not t.local]
    seen: dict[tuple, int] = {}
    problems: list[str] = []
    for i, t in direct:
        key = (t.hostname, t.port, _jump_key(t))
        if key in seen:
            j = seen[key]
            problems.append(f"hosts[{j}] {targets[j].alias!r} and hosts[{i}] {t.alias!r} are the same host "
                            f"({t.hostname}:{t.port} after ~/.ssh/config)")
        seen.setdefault(key, i)
    if problems:
        raise DockerlaunchError("; ".join(problems) + ": list each host once")
    names = sorted({t.hostname for _, t in direct if not t.jumps})
    answers: dict[str, tuple[str, ...] | str] = {}

    def lookup(name: str) -> None:
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
            answers[name] = tuple(sorted({info[4][0] for info in infos}))
        except (OSError, UnicodeError) as e:
            answers[name] = getattr(e, "strerror", None) or str(e)

    threads = [threading.Thread(target=lookup, args=(n,), daemon=True, name="dl-dns") for n in names]
    deadline = time.monotonic() + wait
    for k in range(0, len(threads), CONNECT_WINDOW):
        batch = threads[k:k + CONNECT_WINDOW]
        for th in batch:
            th.start()
        for th in batch:
            th.join(max(0.0, deadline - time.monotonic()))
    unresolved = [f"{t.alias!r}" + (f" ({t.hostname})" if t.hostname != t.alias else "")
                  + f": {answers.get(t.hostname, f'DNS gave no answer within {wait:g}s')}"
                  for _, t in direct if not t.jumps and not isinstance(answers.get(t.hostname), tuple)]
    if unresolved:
        raise DockerlaunchError(f"{len(unresolved)} of {len(targets)} host(s) cannot be resolved: "
                                + "; ".join(unresolved[:10]) + (" ..." if len(unresolved) > 10 else "")
                                + "; fix the host list or ~/.ssh/config (nothing was started)")
    by_ip: dict[tuple[str, int], int] = {}
    for i, t in direct:
        if t.jumps:
            continue
        for ip in answers[t.hostname]:  # type: ignore[union-attr]
            j = by_ip.setdefault((ip, t.port), i)
            if j != i:
                problems.append(f"hosts[{j}] {targets[j].alias!r} and hosts[{i}] {t.alias!r} are the same host "
                                f"({ip}:{t.port})")
                break
    if problems:
        raise DockerlaunchError("; ".join(problems) + ": list each host once")


def _jump_key(t: SSHTarget) -> tuple:
    return tuple((j.hostname, j.port) for j in t.jumps)


@dataclass
class Host:
    """One host of a session: its rank, what the user called it, where we connect, and the connection."""

    rank: int
    address: str
    target: SSHTarget
    remote: Remote | None = None
    error: SSHError | None = None  # why it could not be connected

    @property
    def connected(self) -> bool:
        return self.remote is not None

    def connection(self) -> Remote:
        """The connection, or why there is none."""
        if self.remote is None:
            raise self.error or SSHError(self.address, "not connected")
        return self.remote

    @property
    def name(self) -> str:
        return self.address


class Fleet:
    """The hosts of one config, connected; close with `close()` or a `with` block."""

    def __init__(self, config: ClusterConfig, hosts: list[Host]):
        self.config = config
        self.hosts = hosts

    @classmethod
    def connect(cls, config: ClusterConfig, *, require_all: bool = True,
                targets: Sequence[SSHTarget] | None = None) -> Fleet:
        """Connect to every host concurrently. With `require_all`, one failure closes the rest and raises
        (naming every host that failed); without, failed hosts keep their error (`host.error`) for a report.
        `targets`: the hosts' targets as the caller resolved them (hosts/targets.resolve_all) to plan from, in rank
        order; resolved here when not given."""
        ssh_config = load_ssh_config(config.ssh.config_file)
        check_settings(config, ssh_config)  # a missing key or known_hosts file, an undefined ProxyJump: one line
        if targets is None:
            targets = resolve_all(config, ssh_config)
        elif len(targets) != len(config.hosts):
            raise ValueError(f"{len(targets)} SSH targets for {len(config.hosts)} hosts")
        hosts = [Host(i, h.address, t) for i, (h, t) in enumerate(zip(config.hosts, targets))]
        check_addresses(targets)
        ensure_open_files(len(hosts))
        results = each(lambda h: open_remote(h.target), hosts, max_workers=CONNECT_WINDOW)
        for h, o in zip(hosts, results):
            if o.ok:
                h.remote = o.value
            else:
                h.error = o.error if isinstance(o.error, SSHError) else SSHError(h.address, str(o.error))
        fleet = cls(config, hosts)
        if require_all and any(not h.connected for h in hosts):
            fleet.close()
            failed = [h.error for h in hosts if h.error]
            if len(failed) == 1:
                raise failed[0]
            raise DockerlaunchError("; ".join(str(e) for e in failed))
        return fleet

    @property
    def targets(self) -> list[SSHTarget]:
        return [h.target for h in self.hosts]

    @property
    def live(self) -> list[Host]:
        return [h for h in self.hosts if h.connected]

    def each(self, fn: Callable[[Host], T], hosts: Sequence[Host] | None = None, settle: float = 0.0
             ) -> Outcomes[T]:
        """`fn(host)` on every connected host (or on `hosts`) concurrently; see `each` for `settle`."""
        return each(fn, self.live if hosts is None else list(hosts), settle=settle)

    def peer_ip(self, rank: int = 0) -> str | None:
        h = self.hosts[rank]
        return h.remote.peer_ip if h.remote else None

    def close(self) -> None:
        for h in self.hosts:
            if h.remote is not None:
                h.remote.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
