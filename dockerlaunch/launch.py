"""Apply: connect, check, probe, plan for real, start one container per host, stream, wait, tear down.

Invariants: nothing starts until every host is connected, checked and planned without
placeholders; once anything has started, every exit path (a failed start, a failed rank, Ctrl-C,
SIGTERM, a lost connection) removes every job container on every host, unless --detach/--keep.
"""

from __future__ import annotations

import queue
import secrets
import signal
import sys
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

from dockerlaunch import facts as factslib
from dockerlaunch.config import ClusterConfig
from dockerlaunch.dockerhost import ContainerState, DockerHost
from dockerlaunch.errors import ConfigError, DockerlaunchError
from dockerlaunch.plan import ClusterPlan, HostFacts, make_plan
from dockerlaunch.spec import Deferred
from dockerlaunch.ssh import Remote, load_ssh_config, map_hosts, open_all

COLORS = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta"]


class Terminated(BaseException):
    """SIGTERM, delivered to the main thread like KeyboardInterrupt."""


@dataclass
class Session:
    config: ClusterConfig
    plan: ClusterPlan  # dry plan (targets, names); the real one comes from `resolve`
    remotes: list[Remote]
    hosts: list[DockerHost]

    def close(self) -> None:
        for r in self.remotes:
            r.close()


def open_session(config: ClusterConfig) -> Session:
    plan = make_plan(config, ssh_config=load_ssh_config(config.ssh.config_file))
    remotes = open_all([h.ssh for h in plan.hosts])
    return Session(config, plan, remotes, [DockerHost(r) for r in remotes])


def master_addr_of(session: Session) -> str:
    addr = session.plan.master_addr
    if isinstance(addr, Deferred):
        peer = session.remotes[0].peer_ip
        if not peer:
            raise DockerlaunchError(f"host {session.plan.hosts[0].address}: cannot tell its IP; set hosts[0].advertise_addr")
        return peer
    return addr


def gather_facts(session: Session, env_files: dict[int, tuple[str, ...]] | None = None) -> dict[int, HostFacts]:
    """Probe every host concurrently and turn the answers into HostFacts (or one clear error)."""
    master = master_addr_of(session)
    probes = map_hosts(lambda r: factslib.probe(r, master), session.remotes)
    user_env = session.config.container.env
    out: dict[int, HostFacts] = {}
    errors = []
    for hp, p in zip(session.plan.hosts, probes):
        if isinstance(p, BaseException):
            errors.append(str(p))
            continue
        if p.problem and "NCCL_SOCKET_IFNAME" not in user_env:
            errors.append(
                f"host {hp.address}: NIC toward MASTER_ADDR {master}: {p.problem}; fix the route or set "
                "container.env NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME"
            )
            continue
        if isinstance(hp.nproc_per_node, Deferred) and not p.gpu_count:
            errors.append(
                f"host {hp.address}: no GPUs found (nvidia-smi -L) to set NPROC_PER_NODE; "
                "set job.nproc_per_node, or gpus: none for CPU jobs"
            )
            continue
        out[hp.rank] = HostFacts(
            interface=p.interface,
            gpu_count=p.gpu_count,
            infiniband=p.ib_device,
            ib_hca=",".join(p.ib_active),
            master_addr=master if hp.rank == 0 else None,
            env_files=(env_files or {}).get(hp.rank),
        )
    if errors:
        raise DockerlaunchError("; ".join(errors))
    return out


def existing_job_containers(session: Session, job: str) -> list[tuple[str, ContainerState]]:
    found = map_hosts(lambda h: h.job_containers(job), session.hosts)
    out = []
    for h, states in zip(session.hosts, found):
        if isinstance(states, BaseException):
            raise states
        out += [(h.name, s) for s in states]
    return out


# ---------------------------------------------------------------- secrets


def read_env_files(config: ClusterConfig) -> bytes:
    data = b""
    for path in config.container.env_files:
        p = Path(path).expanduser()
        try:
            content = p.read_bytes()
        except OSError as e:
            raise ConfigError(f"container.env_files: cannot read {p}: {e.strerror}") from None
        data += content if content.endswith(b"\n") or not content else content + b"\n"
    return data


def upload_env_files(session: Session, job: str, content: bytes) -> dict[int, tuple[str, ...]]:
    """One 0600 file per host with every secret line; the path goes to `--env-file`, never the values."""
    token = secrets.token_hex(6)
    paths = {hp.rank: f"/tmp/dockerlaunch-{job}-{hp.rank}-{token}.env" for hp in session.plan.hosts}

    def put(i: int):
        path = paths[i]
        session.remotes[i].check(["sh", "-c", 'umask 077 && cat > "$1"', "sh", path], f"writing {path}", stdin=content)
        return path

    results = map_hosts(put, list(range(len(session.remotes))))
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        remove_env_files(session, paths)
        raise failed[0]
    return {i: (paths[i],) for i in paths}


def remove_env_files(session: Session, paths: dict[int, tuple[str, ...]] | dict[int, str]) -> None:
    def rm(i: int):
        p = paths.get(i)
        if p:
            session.remotes[i].run(["rm", "-f", *([p] if isinstance(p, str) else p)], timeout=30)

    map_hosts(rm, list(range(len(session.remotes))))


# ---------------------------------------------------------------- log streaming


class LogSink:
    """Prefixes each line with a coloured `[rank host]` and appends the raw bytes to a per-host file."""

    def __init__(self, console, rank: int, host: str, path: Path | None):
        self.console, self.rank, self.host = console, rank, host
        self.prefix = f"[{rank} {host}] "
        self.style = COLORS[rank % len(COLORS)]
        self.buf = b""
        self.file = open(path, "ab") if path else None

    def __call__(self, data: bytes) -> None:
        if self.file:
            self.file.write(data)
            self.file.flush()
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self._emit(line)

    def _emit(self, line: bytes) -> None:
        from rich.text import Text

        text = Text(self.prefix, style=self.style)
        text.append(line.decode(errors="replace").rstrip("\r"))
        self.console.print(text, soft_wrap=True, highlight=False, markup=False)

    def close(self) -> None:
        if self.buf:
            self._emit(self.buf)
            self.buf = b""
        if self.file:
            self.file.close()


def _console():
    from rich.console import Console

    # no terminal (CI, a pipe): wide lines rather than tables wrapped at 80 columns
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def _say(console, msg: str, style: str = "bold") -> None:
    console.print(f"[dockerlaunch] {msg}", style=style, markup=False, highlight=False)


# ---------------------------------------------------------------- up


def up(
    config: ClusterConfig,
    *,
    detach: bool = False,
    keep: bool = False,
    preflight: bool = True,
    log_dir: str | None = "dockerlaunch-logs",
    console=None,
) -> int:
    """Start the job; return the exit code `dockerlaunch up` exits with."""
    console = console or _console()
    job = config.job.name
    session = open_session(config)
    try:
        existing = existing_job_containers(session, job)
        if existing:
            what = ", ".join(f"{s.name}@{host} {s.status}" for host, s in existing)
            raise DockerlaunchError(f"job {job} already has containers ({what}); remove them: dockerlaunch down --name {job}")
        if preflight:
            from dockerlaunch import doctor

            report = doctor.run_checks(session)
            doctor.print_report(report, console)
            if report.failed:
                _say(console, f"preflight FAILED ({len(report.failed)} check(s)); nothing was started. "
                     "Fix the above or use --skip-preflight.", "bold red")
                return 1
        env_paths: dict[int, tuple[str, ...]] = {}
        secrets_blob = read_env_files(config) if config.container.env_files else b""
        if secrets_blob:
            env_paths = upload_env_files(session, job, secrets_blob)
        try:
            plan = make_plan(config, facts=gather_facts(session, env_paths), ssh_config=load_ssh_config(config.ssh.config_file))
            if plan.unresolved():
                raise DockerlaunchError("internal: plan still has unresolved values: " + "; ".join(plan.unresolved()))
            return _start_and_watch(session, plan, console, detach=detach, keep=keep, log_dir=log_dir)
        finally:
            if env_paths:
                remove_env_files(session, env_paths)
    finally:
        session.close()


def _teardown(session: Session, plan: ClusterPlan, console, why: str) -> None:
    _say(console, f"{why}: stopping and removing job containers on {plan.nnodes} host(s)", "bold yellow")
    names = {hp.rank: hp.container.name for hp in plan.hosts}
    results = map_hosts(lambda i: session.hosts[i].remove([names[i]]), list(range(len(session.hosts))))
    for hp, r in zip(plan.hosts, results):
        if isinstance(r, BaseException):
            _say(console, f"host {hp.address}: could not remove {names[hp.rank]}: {r}", "bold red")


def _install_sigterm() -> Callable[[], None]:
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _start_and_watch(session: Session, plan: ClusterPlan, console, *, detach: bool, keep: bool, log_dir: str | None) -> int:
    restore = _install_sigterm()
    started = False
    stop = threading.Event()
    sinks: list[LogSink] = []
    try:
        _say(console, f"starting {plan.job}: {plan.nnodes} host(s), image {plan.image}, MASTER_ADDR={plan.master_addr}:{plan.master_port}")
        started = True  # from here on, any exit path tears down (a partial start too)
        results = map_hosts(lambda i: session.hosts[i].run_container(plan.hosts[i].container), list(range(len(plan.hosts))))
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            for f in failed:
                _say(console, str(f), "bold red")
            _teardown(session, plan, console, "start failed")
            started = False
            return 1
        if detach:
            started = False
            _say(console, f"started {plan.nnodes} container(s); follow with: dockerlaunch logs --follow --name {plan.job}")
            return 0

        run_dir = None
        if log_dir:
            run_dir = Path(log_dir) / f"{plan.job}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
            run_dir.mkdir(parents=True, exist_ok=True)
        exits: queue.Queue[tuple[int, int | BaseException]] = queue.Queue()

        def watch(i: int) -> None:
            hp = plan.hosts[i]
            sink = sinks[i]
            try:
                session.hosts[i].follow_logs(hp.container.name, sink, stop=stop)
                if stop.is_set():
                    return
                exits.put((i, session.hosts[i].wait(hp.container.name, timeout=120)))
            except BaseException as e:  # noqa: BLE001 - reported to the main thread
                exits.put((i, e))

        for hp in plan.hosts:
            path = run_dir / f"rank{hp.rank}-{hp.address.replace('/', '_').replace(':', '_')}.log" if run_dir else None
            sinks.append(LogSink(console, hp.rank, hp.address, path))
        threads = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(len(plan.hosts))]
        for t in threads:
            t.start()
        if run_dir:
            _say(console, f"logs: {run_dir}/")

        done: dict[int, int] = {}
        code = 0
        while len(done) < len(plan.hosts):
            try:
                i, result = exits.get(timeout=0.2)
            except queue.Empty:
                continue
            hp = plan.hosts[i]
            if isinstance(result, BaseException):
                _say(console, f"rank {hp.rank} ({hp.address}): lost track of the container: {result}", "bold red")
                code = 1
                break
            done[i] = result
            if result != 0:
                _say(console, f"rank {hp.rank} ({hp.address}) exited with {result}", "bold red")
                code = result
                break
            _say(console, f"rank {hp.rank} ({hp.address}) finished")
        stop.set()
        if code != 0:
            _teardown(session, plan, console, f"rank failed (exit {code})")
        elif not keep:
            map_hosts(lambda i: session.hosts[i].remove([plan.hosts[i].container.name], grace=1), list(range(len(plan.hosts))))
            _say(console, f"job {plan.job} succeeded on all {plan.nnodes} host(s)", "bold green")
        started = False
        return code
    except (KeyboardInterrupt, Terminated) as e:
        stop.set()
        interrupted = isinstance(e, KeyboardInterrupt)
        if started:
            _teardown(session, plan, console, "interrupted" if interrupted else "terminated")
            started = False
        return 130 if interrupted else 143
    finally:
        stop.set()
        if started:  # an unexpected error: never leave containers behind
            _teardown(session, plan, console, "error")
        for s in sinks:
            s.close()
        restore()


# ---------------------------------------------------------------- down / status / logs / exec


def down(config: ClusterConfig, console=None) -> int:
    console = console or _console()
    session = open_session(config)
    try:
        found = existing_job_containers(session, config.job.name)
        by_host: dict[str, list[str]] = {}
        for host, s in found:
            by_host.setdefault(host, []).append(s.name)
        results = map_hosts(lambda h: h.remove(by_host.get(h.name, [])), session.hosts)
        for h, r in zip(session.hosts, results):
            if isinstance(r, BaseException):
                raise DockerlaunchError(f"host {h.name}: removing containers failed: {r}")
        _say(console, f"removed {len(found)} container(s) of job {config.job.name}")
        return 0
    finally:
        session.close()


def status(config: ClusterConfig, console=None) -> int:
    from rich.table import Table

    console = console or _console()
    session = open_session(config)
    try:
        found = existing_job_containers(session, config.job.name)
    finally:
        session.close()
    if not found:
        _say(console, f"job {config.job.name}: no containers on {len(config.hosts)} host(s)")
        return 0
    table = Table("rank", "host", "container", "state", "exit code", "up since / finished", box=None)
    for host, s in found:
        when = s.started_at if s.status == "running" else s.finished_at
        table.add_row(str(s.rank), host, s.name, s.status, "" if s.status == "running" else str(s.exit_code),
                      when[:19].replace("T", " "))
    console.print(table)
    return 0


def _rank_hosts(session: Session, rank: int | None) -> list[int]:
    if rank is None:
        return list(range(len(session.hosts)))
    if not 0 <= rank < len(session.hosts):
        raise ConfigError(f"--rank {rank}: the job has ranks 0..{len(session.hosts) - 1}")
    return [rank]


def logs(config: ClusterConfig, rank: int | None = None, follow: bool = False, tail: str = "all", console=None) -> int:
    console = console or _console()
    session = open_session(config)
    sinks = []
    try:
        ranks = _rank_hosts(session, rank)
        stop = threading.Event()

        def show(i: int) -> int:
            hp = session.plan.hosts[i]
            sink = LogSink(console, hp.rank, hp.address, None)
            sinks.append(sink)
            return session.hosts[i].follow_logs(hp.container.name, sink, follow=follow, stop=stop, tail=tail)

        try:
            results = map_hosts(show, ranks)
        except KeyboardInterrupt:
            stop.set()
            return 130
        codes = [r for r in results if not isinstance(r, int) or r != 0]
        return 1 if codes else 0
    finally:
        for s in sinks:
            s.close()
        session.close()


def exec_in(config: ClusterConfig, rank: int, command: list[str]) -> int:
    if not command:
        raise ConfigError("exec: give a command after --, e.g. dockerlaunch exec --rank 0 -- nvidia-smi")
    session = open_session(config)
    try:
        [i] = _rank_hosts(session, rank)
        name = session.plan.hosts[i].container.name
        out = sys.stdout.buffer
        err = sys.stderr.buffer

        def w(stream):
            def write(data: bytes):
                stream.write(data)
                stream.flush()
            return write

        return session.remotes[i].stream(["docker", "exec", name, *command], w(out), w(err))
    finally:
        session.close()
