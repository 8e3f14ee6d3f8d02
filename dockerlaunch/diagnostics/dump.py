"""`dockerlaunch dump`: every rank's Python stack (py-spy), the flight recorder's record, nvidia-smi, and the
NCCL logs of a running job, from every host into one local folder, with a summary that names the odd rank.

py-spy runs from the image when it has one (needs SYS_PTRACE, on by default); otherwise dockerlaunch's own
py-spy (a static binary) is copied to the host once and run in a throwaway container of the job's image that
joins the rank's PID namespace (`--pid container:NAME`, SYS_PTRACE on that container only).
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import shutil
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from dockerlaunch import keyvalue
from dockerlaunch.backends.docker.pyspy import local_pyspy, stage_pyspy
from dockerlaunch.backends.docker.session import Session, open_session
from dockerlaunch.diagnostics import script
from dockerlaunch.diagnostics.callstacks import RankStack, parse_pyspy, summary
from dockerlaunch.docker_run import label_disabled, sandbox_argv, sidecar_argv
from dockerlaunch.errors import DockerlaunchError, HostError
from dockerlaunch.hosts.fleet import Host
from dockerlaunch.hosts.ssh import Remote, Result
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import diag_dir, diag_root
from dockerlaunch.reporting import Reporter
from dockerlaunch.tars import open_untrusted

PYSPY_TIMEOUT = 90.0
# What dump keeps of each command's output on a host (py-spy's stacks, ranks.sh's processes, the sidecar's, nvidia-smi
# and the small answers around them): read in the chunks SSH delivers, the first OUTPUT_LIMIT bytes of stdout and
# STDERR_LIMIT of stderr. Past OUTPUT_LIMIT the command is stopped there, what came is kept and a note says it was
# cut (summary.txt, the file's last line): a host or image cannot fill the launcher's memory through a dump.
OUTPUT_LIMIT = 4 * 2**20
STDERR_LIMIT = 64 * 2**10
SIDECAR_PYSPY = "/dockerlaunch-py-spy"  # not under /usr: the job may mount that read-only
FR_WAIT = 20.0  # seconds for the flight recorder to write its dumps once asked
# POSIX sh has no `test -O`
_PROC = re.compile(r"^proc (\d+) (\d+) (\d+) (\S+) ?(.*)$")


@dataclass(frozen=True)
class RankProcess:
    pid: int
    ppid: int
    rank: int
    local_rank: str
    command: str


def parse_ranks(text: str) -> list[RankProcess]:
    """ranks.sh output -> one process per RANK: the topmost holder (DataLoader workers inherit RANK too)."""
    procs = []
    for line in text.split("\n"):
        m = _PROC.match(line.strip())
        if m:
            try:
                command = keyvalue.decode(m[5])
            except keyvalue.Malformed:
                continue  # not a line of ranks.sh's
            procs.append(RankProcess(int(m[1]), int(m[2]), int(m[3]), m[4], command))
    by_pid = {p.pid: p for p in procs}
    tops = [p for p in procs if not (p.ppid in by_pid and by_pid[p.ppid].rank == p.rank)]
    best: dict[int, RankProcess] = {}
    for p in sorted(tops, key=lambda p: p.pid):
        best.setdefault(p.rank, p)
    return [best[r] for r in sorted(best)]


def split_marked(text: str, marker: str = "==> pid ") -> dict[int, str]:
    out: dict[int, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(marker) and line[len(marker):].strip().isdigit():
            current = int(line[len(marker):].strip())
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) + "\n" for k, v in out.items()}


def safe_extract(data: bytes | BinaryIO, dest: Path) -> list[str]:
    """A tar from a host (bytes, or a file it was spooled to), into dest: regular files and folders only, no path
    leaving dest; each member copied in chunks, never whole in memory."""
    names = []
    with open_untrusted(fileobj=io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data) as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                continue
            target = dest.joinpath(*parts)
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            if src is not None:
                with open(target, "wb") as f:
                    shutil.copyfileobj(src, f, CHUNK)
                names.append(m.name)
    return names


@dataclass
class HostDump:
    rank: int
    address: str
    folder: Path
    stacks: list[RankStack] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fr_files: int = 0


# a rank's container: its state, the image it runs and its security options (SELinux labels off or not)
INSPECT = "{{.State.Status}} {{.Image}} {{json .HostConfig.SecurityOpt}}"


def parse_state(text: str) -> tuple[str, str, bool]:
    """INSPECT's line -> (status, image ID, whether its SELinux labels are off). dump's containers get the labels
    the rank's container has (the job's container.selinux, or Docker's own choice for --ipc host): the py-spy
    sidecar and the flight-recorder sandbox read host folders, which an engine's label would deny them. (pure)"""
    status, image, options = (text.strip().split(" ", 2) + ["", "", ""])[:3]
    try:
        security = json.loads(options) if options else None
    except ValueError:
        security = None
    return status, image, label_disabled(security)


def _label(rank: int, address: str) -> str:
    return f"host{rank}-" + re.sub(r"[^A-Za-z0-9_.-]", "_", address)


class Bounded(Result):
    """A command's Result, read through `bounded_run`: `cut` is true when stdout went past the limit."""

    cut: bool = False


def bounded_run(remote: Remote, argv: list[str], timeout: float, limit: int = OUTPUT_LIMIT) -> Bounded:
    """`remote.run`, keeping the first `limit` bytes of stdout and STDERR_LIMIT of stderr: a command that prints
    more is stopped once past `limit` (its Result then `cut`, exit status -1, with what came)."""
    out, err = Capped(limit), Capped(STDERR_LIMIT)
    over = threading.Event()

    def take(chunk: bytes) -> None:
        out.add(chunk)
        if out.dropped:
            over.set()

    status = remote.stream(argv, take, err.add, timeout=timeout, stop=over)
    r = Bounded(status, out.text(), err.text())
    r.cut = over.is_set()
    return r


def _cut_note(what: str) -> str:
    return f"{what} printed more than {OUTPUT_LIMIT // 2**20} MB: cut there (the rest was not read)"


def _cut_line(r: Bounded) -> str:
    """The line a kept output ends with when it was cut."""
    return f"\n[dockerlaunch: cut at {OUTPUT_LIMIT // 2**20} MB; the rest was not read]\n" if r.cut else ""


class _HostDumper:
    def __init__(self, session: Session, h: Host, out: Path, native: bool, pyspy: Path | None,
                 budget: Budget | None = None):
        self.h, self.session, self.native, self.pyspy, self.budget = h, session, native, pyspy, budget
        self.hp = session.plan.hosts[h.rank]
        self.name = self.hp.container.name
        self.where = diag_dir(session.plan.config)
        self.result = HostDump(h.rank, self.hp.address, out / _label(h.rank, self.hp.address))
        self.label_disable = False  # the rank's container has its SELinux labels off: its sidecar gets them off

    def _run(self, argv: list[str], timeout: float, what: str | None = None) -> Bounded:
        """A command on the host, its output bounded (bounded_run); `what`: its name in the note if it was cut."""
        r = bounded_run(self.h.connection(), argv, timeout)
        if r.cut and what:
            self.result.notes.append(_cut_note(what))
        return r

    def _docker(self, *args: str, timeout: float, what: str | None = None) -> Bounded:
        return self._run(["docker", *args], timeout, what)

    def run(self) -> HostDump:
        r = self.result
        r.folder.mkdir(parents=True, exist_ok=True)
        state = self._docker("inspect", "--format", INSPECT, self.name, timeout=30)
        if not state.ok:
            r.notes.append(f"no container {self.name} on this host")
            return r
        status, image, self.label_disable = parse_state(state.stdout)
        if status != "running":
            r.notes.append(f"container {self.name} is {status}: no process to dump")
        else:
            procs = self._ranks()
            if not procs:
                r.notes.append(f"no process with RANK in its environment in {self.name} (not started yet?)")
            else:
                self._stacks(procs, image)
                self._trigger_flight_recorder()
        self._nvidia_smi()
        self._fetch_files()
        return r

    def _ranks(self) -> list[RankProcess]:
        res = self._docker("exec", self.name, "sh", "-c", script("ranks.sh"), timeout=60, what="ranks.sh")
        (self.result.folder / "processes.txt").write_text(res.stdout + res.stderr + _cut_line(res))
        return parse_ranks(res.stdout)

    def _stacks(self, procs: list[RankProcess], image: str) -> None:
        flags = "--native " if self.native else ""
        loop = f'for p in "$@"; do echo "==> pid $p"; "$SPY" dump {flags}--pid "$p" 2>&1; done'
        pids = [str(p.pid) for p in procs]
        has = self._docker("exec", self.name, "sh", "-c", "command -v py-spy", timeout=30)
        text = None
        if has.ok and has.stdout.strip():
            res = self._docker("exec", "-e", "SPY=py-spy", self.name, "sh", "-c", loop, "sh", *pids,
                               timeout=PYSPY_TIMEOUT, what="py-spy (the image's own)")
            text = res.stdout
            if "Permission denied" in text or "Operation not permitted" in text:
                self.result.notes.append("py-spy in the image was refused (no SYS_PTRACE?): used a sidecar")
                text = None
            else:
                self.result.notes.append("py-spy: the image's own")
        if text is None:
            text = self._sidecar(loop, pids, image)
            if text:
                self.result.notes.append("py-spy: dockerlaunch's own, in a sidecar container (the image has none)")
        by_pid = split_marked(text or "")
        for p in procs:
            out = by_pid.get(p.pid, "")
            (self.result.folder / f"rank{p.rank}.pyspy.txt").write_text(out)
            threads = parse_pyspy(out)
            err = None if threads else (out.strip().splitlines() or ["py-spy printed nothing"])[-1][:300]
            self.result.stacks.append(RankStack(p.rank, self.hp.address, threads, err))

    def _sidecar(self, loop: str, pids: list[str], image: str) -> str:
        if self.pyspy is None:
            self.result.notes.append("the image has no py-spy and none is installed here: pip install py-spy")
            return ""
        binary = self._upload_pyspy()
        # the rank's PID namespace and its own mounts (its code, and the tools of an image that takes them there)
        argv = sidecar_argv(self.name, image, ["-c", loop, "sh", *pids], caps=["SYS_PTRACE"],
                            volumes=[f"{binary}:{SIDECAR_PYSPY}:ro"], env={"SPY": SIDECAR_PYSPY},
                            labels={"dockerlaunch.dump": self.session.plan.job}, entrypoint="sh",
                            label_disable=self.label_disable)
        res = self._run(argv, PYSPY_TIMEOUT, "py-spy's sidecar")
        if not res.ok and not res.stdout:
            self.result.notes.append(f"py-spy sidecar failed: {res.last_line()}")
        return res.stdout

    def _upload_pyspy(self) -> str:
        return stage_pyspy(self.h.remote, self.where, diag_root(self.session.plan.config), self.pyspy)

    def _trigger_flight_recorder(self) -> None:
        # the pipes belong to the container's user: write them from inside
        res = self._docker(
            "exec", self.name, "sh", "-c",
            'n=0; for p in "$1"/fr-pipe/*.pipe; do [ -p "$p" ] || continue; '
            'timeout 5 sh -c \'echo 1 > "$1"\' sh "$p" && n=$((n+1)); done; echo "triggered=$n"',
            "sh", self.where, timeout=60)
        m = re.search(r"triggered=(\d+)", res.stdout)
        n = int(m[1]) if m else 0
        if n == 0:
            self.result.notes.append("no flight-recorder pipe (not an NCCL job, torch too old, or flight recorder off)")
            return
        deadline = time.monotonic() + FR_WAIT
        while time.monotonic() < deadline:
            ls = self._run(["sh", "-c", 'ls "$1"/fr 2>/dev/null | wc -l', "sh", self.where], 30)
            if ls.ok and ls.stdout.strip().isdigit() and int(ls.stdout.strip()) >= n:
                time.sleep(1)  # the last file may still be being written
                return
            time.sleep(1)
        self.result.notes.append(f"flight recorder: asked {n} rank(s), not every dump appeared in {FR_WAIT:g}s")

    def _nvidia_smi(self) -> None:
        res = self._run(["sh", "-c", "command -v nvidia-smi >/dev/null && nvidia-smi"], 60, "nvidia-smi")
        if res.ok or res.cut:
            (self.result.folder / "nvidia-smi.txt").write_text(res.stdout + _cut_line(res))

    def _fetch_files(self) -> None:
        uid = self._docker("exec", self.name, "id", "-u", timeout=30)
        owner = uid.stdout.strip() if uid.ok and uid.stdout.strip().isdigit() else None
        self.result.fr_files = fetch_diag_files(self.h.remote, self.where, owner, self.result.folder,
                                                self.result.notes, self.budget)


# What `dump` takes from a host's diagnostics folder: files of the ranks' own uid only (a file another local user
# planted there, which fr_trace would unpickle, is left), none over FILE_LIMIT, at most TOTAL_LIMIT from one host
# and DUMP_BUDGET from all hosts of one dump together (DOCKERLAUNCH_DUMP_BUDGET lowers or raises it). A host's
# tar is spooled to disk as it arrives and unpacked from there in chunks: the launcher holds a chunk per host,
# not the files (256 hosts x 1 GB would not fit in its memory).
FILE_LIMIT = 256 * 2**20
TOTAL_LIMIT = 1024 * 2**20
DUMP_BUDGET = 4096 * 2**20
BUDGET_ENV = "DOCKERLAUNCH_DUMP_BUDGET"
CHUNK = 2**20


def dump_budget() -> int:
    """DUMP_BUDGET, or DOCKERLAUNCH_DUMP_BUDGET: bytes, or a size like 512M or 8G."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    if not text:
        return DUMP_BUDGET
    m = re.fullmatch(r"(\d+)([KMGT]?)i?B?", text, re.I)
    if not m:
        raise DockerlaunchError(f"{BUDGET_ENV}={text!r}: give a size like 512M or 8G (the most `dump` fetches from "
                                "all hosts together)")
    return int(m[1]) * 1024 ** " KMGT".index(m[2].upper() or " ")


class Budget:
    """The bytes one dump may still fetch, shared by the threads of every host."""

    def __init__(self, total: int):
        self.total, self.left = total, total
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if n > self.left:
                return False
            self.left -= n
            return True

    def give_back(self, n: int) -> None:
        with self._lock:
            self.left += n
FETCH = r"""cd "$1" 2>/dev/null || exit 0
set -- "$2" "$3"
n=$(find fr nccl -type f ! -user "$1" 2>/dev/null | wc -l)
b=$(find fr nccl -type f -user "$1" -size +"$2"c 2>/dev/null | wc -l)
printf '%s %s\n' "$n" "$b" >&2
find fr nccl -type f -user "$1" -size -"$2"c -print0 2>/dev/null | tar --null -T - -cf - 2>/dev/null; exit 0"""


def fetch_diag_files(remote, where: str, owner: str | None, dest: Path, notes: list[str],
                     budget: Budget | None = None) -> int:
    """The host's fr/ and nccl/ files into dest, through a spool file beside it; the number of flight-recorder
    files taken. `budget`: what the whole dump may still fetch (every host's call shares it)."""
    if owner is None:
        notes.append("the ranks' uid is unknown (no container to ask): diagnostics files not fetched")
        return 0
    budget = budget or Budget(dump_budget())
    dest.mkdir(parents=True, exist_ok=True)
    err = bytearray()
    over = threading.Event()
    spent = 0
    why = ""
    with tempfile.TemporaryFile(dir=dest) as spool:
        def take(chunk: bytes) -> None:
            nonlocal spent, why
            if over.is_set():
                return
            if spent + len(chunk) > TOTAL_LIMIT:
                why = f"over {TOTAL_LIMIT // 2**20} MB together"
            elif not budget.take(len(chunk)):
                why = f"past what is left of this dump's {budget.total // 2**20} MB for all hosts ({BUDGET_ENV})"
            else:
                spent += len(chunk)
                spool.write(chunk)
                return
            over.set()

        def said(chunk: bytes) -> None:
            err.extend(chunk[:max(0, 4096 - len(err))])  # the counts line; a host cannot fill memory through stderr

        status = remote.stream(["sh", "-c", FETCH, "sh", where, owner, str(FILE_LIMIT)], take, said,
                               timeout=300, stop=over)
        counts = err.decode(errors="replace").split()
        if len(counts) >= 2 and counts[0].isdigit() and int(counts[0]):
            notes.append(f"{counts[0]} file(s) in {where} not of the ranks' uid {owner}: left there, not read")
        if len(counts) >= 2 and counts[1].isdigit() and int(counts[1]):
            notes.append(f"{counts[1]} file(s) in {where} over {FILE_LIMIT // 2**20} MB: left on the host")
        if over.is_set():
            budget.give_back(spent)  # nothing of this host is kept
            notes.append(f"the diagnostics files of {where} are {why}: not fetched; copy them from the host")
            return 0
        if status != 0 or not spool.tell():
            return 0
        spool.seek(0)
        try:
            names = safe_extract(spool, dest)
        except tarfile.TarError as e:
            notes.append(f"could not read the diagnostics folder's files: {e}")
            return 0
    return sum(1 for n in names if n.startswith("fr/"))


@dataclass
class DumpResult:
    folder: Path
    hosts: list[HostDump]
    summary: list[str]
    fr_analysis: str | None = None
    errors: list[str] = field(default_factory=list)


FR_TRACE_S = 300
FR_TRACE_KEEP = 2**20  # of fr_trace's output (the sandbox runs what a rank's uid could write): kept, the rest counted


class Capped:
    """The first `limit` bytes of a stream, and how many more came."""

    def __init__(self, limit: int):
        self.limit, self.data, self.dropped = limit, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        room = max(0, self.limit - len(self.data))
        self.data.extend(chunk[:room])
        self.dropped += len(chunk) - min(room, len(chunk))

    def text(self) -> str:
        return self.data.decode(errors="replace")

MERGED_LIMIT = 2048 * 2**20  # the flight-recorder dumps of all hosts together, sent to host 0 for the analysis


def _analyze_flight_recorder(session: Session, out: Path, hosts: list[HostDump]) -> str | None:
    """Every host's dumps side by side, read by PyTorch's own analyzer in a sandbox on host 0 (docker_run's
    sandbox_argv: the dumps are pickles)."""
    paths = [p for hd in hosts for p in sorted((hd.folder / "fr").glob("rank_*"))]
    if not paths:
        return None
    total = sum(p.stat().st_size for p in paths)
    if total > MERGED_LIMIT:
        return (f"the flight-recorder dumps are {total // 2**20} MB together, over {MERGED_LIMIT // 2**20} MB: not "
                "analysed here; they are in each host's folder of this dump")
    merged = out / "fr"
    merged.mkdir(exist_ok=True)
    h0 = session.fleet.hosts[0]
    where = diag_dir(session.plan.config)
    with tempfile.TemporaryFile(dir=out) as spool:  # on disk: up to MERGED_LIMIT, never in memory
        with tarfile.open(fileobj=spool, mode="w") as tar:
            for p in paths:
                shutil.copyfile(p, merged / p.name)
                info = tarfile.TarInfo(f"fr-all/{p.name}")
                info.size = p.stat().st_size
                info.mode = 0o644
                with open(p, "rb") as f:
                    tar.addfile(info, f)
        spool.seek(0)
        h0.remote.check(["sh", "-c", 'cd "$1" && rm -rf fr-all && tar -xf -', "sh", where],
                        "copying flight-recorder dumps", timeout=300, stdin=spool)
    # fr_trace unpickles the dumps, and a dump is a file a rank's uid could write: it is read in a throwaway
    # container of the job's image with nothing to lose (docker_run.sandbox_argv), never in a rank's container
    name = f"dl-frtrace-{secrets.token_hex(4)}"
    # the image rank 0 runs (its ID: the config may name another image than the one the job was started with)
    ran = bounded_run(h0.connection(), ["docker", "inspect", "--format", INSPECT,
                                        session.plan.hosts[0].container.name], 60)
    _, image, label_disable = parse_state(ran.stdout) if ran.ok else ("", "", False)
    image = image or session.plan.hosts[0].container.image
    argv = sandbox_argv(name, image, [
        "-c", 'for py in python3 python; do command -v "$py" >/dev/null && exec "$py" -m '
        'torch.distributed.flight_recorder.fr_trace /fr -p rank_; done; echo "no python in the image"'],
        ro_volumes=[f"{where}/fr-all:/fr"], labels={"dockerlaunch.dump": "1"}, label_disable=label_disable)
    kept = Capped(FR_TRACE_KEEP)  # fr_trace reports through logging, on stderr: both, in arrival order
    try:
        status = h0.remote.stream(argv, kept.add, kept.add, timeout=FR_TRACE_S)
    finally:
        h0.remote.run(["docker", "rm", "-f", name], timeout=60)
        h0.remote.run(["rm", "-rf", f"{where}/fr-all"], timeout=60)
    text = "\n".join(line for line in kept.text().splitlines() if "tabulate is not installed" not in line)
    if kept.dropped:
        text += f"\n(fr_trace printed {kept.dropped} bytes more: cut at {FR_TRACE_KEEP // 2**20} MB)"
    if status != 0:
        text += f"\n(fr_trace exited with {status})"
    (out / "fr_trace.txt").write_text(text)
    return text


def dump(config: ClusterConfig, out_dir: str | None = None, native: bool = False,
         reporter: Reporter | None = None) -> DumpResult:
    reporter = reporter or Reporter()
    dump_budget()  # a bad DOCKERLAUNCH_DUMP_BUDGET stops it before any host is contacted
    base = Path(out_dir) if out_dir else Path("dockerlaunch-dumps") / (
        f"{config.job.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DockerlaunchError(f"--out {base}: cannot create the folder: {e.strerror}") from None
    session = open_session(config)
    try:
        reporter.say(f"dumping job {session.plan.job} on {len(session.fleet.hosts)} host(s) into {base}/")
        return dump_session(session, base, native)
    finally:
        session.close()


def dump_session(session: Session, base: Path, native: bool = False) -> DumpResult:
    """Every rank of a connected job into `base` (also what `up` takes when the job hangs)."""
    base.mkdir(parents=True, exist_ok=True)
    pyspy = local_pyspy()
    budget = Budget(dump_budget())  # one for every host of this dump
    results = session.fleet.each(lambda h: _HostDumper(session, h, base, native, pyspy, budget).run())
    hosts, errors = [], []
    for h, o in zip(session.fleet.hosts, results):
        if o.ok:
            hosts.append(o.value)
        else:
            errors.append(str(o.error) if isinstance(o.error, HostError) else f"host {h.name}: {o.error}")
    stacks = [s for hd in hosts for s in hd.stacks]
    lines = summary(stacks) if stacks else ["no rank stacks were taken (see the notes)"]
    fr = None
    try:
        fr = _analyze_flight_recorder(session, base, hosts)
    except HostError as e:
        errors.append(f"flight-recorder analysis: {e}")
    result = DumpResult(base, hosts, lines, fr, errors)
    _write_summary(result)
    return result


def hang_dump(session: Session, base: Path) -> str:
    """`up`'s dump of a hung attempt, in one line: where the ranks are, and the odd one out."""
    r = dump_session(session, base)
    return "; ".join(r.summary[:4]) + (f" (+{len(r.summary) - 4} more in summary.txt)" if len(r.summary) > 4 else "")


def _write_summary(r: DumpResult) -> None:
    out = ["# dockerlaunch: dump", *r.summary, ""]
    for hd in r.hosts:
        out.append(f"## host {hd.rank} ({hd.address}): {len(hd.stacks)} rank process(es), "
                   f"{hd.fr_files} flight-recorder file(s)")
        out += [f"- rank {s.rank}: {s.describe()}" for s in sorted(hd.stacks, key=lambda s: s.rank)]
        out += [f"- note: {n}" for n in hd.notes]
    out += [f"error: {e}" for e in r.errors]
    if r.fr_analysis:
        out += ["", "## flight recorder (torch.distributed.flight_recorder.fr_trace)", r.fr_analysis]
    (r.folder / "summary.txt").write_text("\n".join(out) + "\n")
