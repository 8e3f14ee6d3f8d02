"""NCCL's own account of how it moves data, read from its INFO log, and the verdicts users need from it.

NCCL falls back from InfiniBand to TCP sockets, or from P2P/SHM to the network between ranks of one host,
without a word on the console; its INFO log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET) says it all. Pure:
log text in, per-host summaries and warnings out; tested on logs recorded on real GPUs (tests/unit/data/nccl).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dockerlaunch import hints
from dockerlaunch.verdict import Finding, Verdict

CHECK = "transport"  # the check its rows name (their JSON says only level, host, message)
# `host:pid:tid [cudaDev] NCCL INFO message` (WARN lines have the same prefix)
_LINE = re.compile(
    r"^(?P<host>[^:\s]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>[^\]]*)\] NCCL (?P<level>INFO|WARN) (?P<msg>.*)$"
)
_INIT = re.compile(r"comm (0x[0-9a-f]+) rank (\d+) nranks (\d+) cudaDev (\d+).* commId (0x[0-9a-f]+) - Init START")
_TOPO = re.compile(r"comm (0x[0-9a-f]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)")
_CHANNEL = re.compile(
    r"^Channel (\d+)(?:/\d+)? : (\d+)\[([^\]]*)\] -> (\d+)\[([^\]]*)\](?: \[(send|receive)\])? via (\S+)"
)
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_IB_USING = re.compile(r"^NET/IB : Using (.*?)(?: ; OOB (\S+))?\s*$")
_SOCKET_USING = re.compile(r"^NET/Socket : Using (.*?)\s*$")
_VERSION = re.compile(r"^NCCL version (\S+)")


def path_kind(via: str) -> str:
    """`P2P/CUMEM/read` -> `P2P/CUMEM`, `SHM/direct/direct` -> `SHM`, `NET/IB/0/GDRDMA` -> `NET/IB`."""
    parts = via.split("/")
    if parts[0] == "SHM":
        return "SHM"
    if parts[0] in ("P2P", "NET") and len(parts) > 1:
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


@dataclass
class Channel:
    comm: str | None  # commId, when known
    src: int
    dst: int
    via: str  # as NCCL printed it
    src_host: str | None = None
    dst_host: str | None = None

    @property
    def kind(self) -> str:
        return path_kind(self.via)

    @property
    def gdr(self) -> bool:
        return self.via.endswith("/GDRDMA")


@dataclass
class ProcessLog:
    """One NCCL log file: one process."""

    hostname: str | None = None
    pid: int | None = None
    version: str | None = None
    networks: list[str] = field(default_factory=list)
    ib_hcas: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)
    gdr_enabled: bool = False
    ib_none: bool = False  # `NET/IB : No device found.`
    ibverbs_missing: bool = False
    comms: dict[str, dict] = field(default_factory=dict)  # commId -> {rank, nranks, dev, ptr, nnodes, local}
    channels: list[Channel] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lines: int = 0


def parse_log(text: str) -> ProcessLog:
    log = ProcessLog()
    by_ptr: dict[str, str] = {}  # this process's comm pointer -> commId
    current: str | None = None  # the comm initialised last: channel lines carry no comm, they follow its init
    for raw in text.splitlines():
        m = _LINE.match(raw.strip())
        if not m:
            continue
        log.lines += 1
        log.hostname = log.hostname or m["host"]
        log.pid = log.pid or int(m["pid"])
        msg = m["msg"]
        if m["level"] == "WARN":
            if msg not in log.warnings:
                log.warnings.append(msg)
            if "libibverbs" in msg:
                log.ibverbs_missing = True
            continue
        if (c := _CHANNEL.match(msg)) is not None:
            src, dst = int(c[2]), int(c[4])
            comm = current
            if comm is None or not (src == log.comms[comm]["rank"] or dst == log.comms[comm]["rank"]):
                # the latest comm this process has that holds one end of the link
                comm = next((cid for cid in reversed(log.comms) if log.comms[cid]["rank"] in (src, dst)), None)
            log.channels.append(Channel(comm, src, dst, c[7]))
        elif (c := _INIT.search(msg)) is not None:
            ptr, rank, nranks, dev, cid = c.groups()
            log.comms[cid] = {"rank": int(rank), "nranks": int(nranks), "dev": int(dev), "ptr": ptr}
            by_ptr[ptr] = cid
            current = cid
        elif (c := _TOPO.search(msg)) is not None and c[1] in by_ptr:
            log.comms[by_ptr[c[1]]].update(nnodes=int(c[4]), local=int(c[5]))
        elif (c := _NETWORK.match(msg)) is not None:
            if c[1] not in log.networks:
                log.networks.append(c[1])
        elif (c := _IB_USING.match(msg)) is not None:
            for hca in re.findall(r"\[\d+\](\S+)", c[1]):
                if hca not in log.ib_hcas:
                    log.ib_hcas.append(hca)
        elif (c := _SOCKET_USING.match(msg)) is not None:
            for nic in re.findall(r"\[\d+\]([^:\s]+)", c[1]):  # `[0]eth0:10.0.0.1<0>` -> eth0
                if nic not in log.sockets:
                    log.sockets.append(nic)
        elif msg.startswith("NET/IB : No device found"):
            log.ib_none = True
        elif "GPU Direct RDMA Enabled" in msg:
            log.gdr_enabled = True
        elif "libibverbs" in msg and ("Failed" in msg or "failed" in msg or "Unable" in msg):
            log.ibverbs_missing = True
        elif (c := _VERSION.match(msg)) is not None:
            log.version = c[1]
    return log


def place_channels(logs: list[ProcessLog]) -> None:
    """Name the host of each end of every channel, from every process's `Init START` line (all hosts' logs)."""
    where: dict[tuple[str, int], str] = {}
    for log in logs:
        for cid, c in log.comms.items():
            if log.hostname:
                where[(cid, c["rank"])] = log.hostname
    for log in logs:
        for ch in log.channels:
            if ch.comm is not None:
                ch.src_host = where.get((ch.comm, ch.src))
                ch.dst_host = where.get((ch.comm, ch.dst))


@dataclass
class HostTransport:
    """What NCCL chose on one host, over every process whose log is there."""

    host: str
    processes: int = 0
    version: str | None = None
    network: list[str] = field(default_factory=list)  # IB, Socket, or a plugin's name
    hcas: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)
    gdrdma: bool | None = None
    intra: list[str] = field(default_factory=list)  # path kinds between ranks of one host
    inter: list[str] = field(default_factory=list)  # path kinds between hosts
    same_host_net: list[str] = field(default_factory=list)  # `a -> b via NET/...` where both ends share a host
    ib_none: bool = False
    ibverbs_missing: bool = False
    nccl_warnings: list[str] = field(default_factory=list)
    local_ranks: int | None = None

    @property
    def seen(self) -> bool:
        return bool(self.network or self.intra or self.inter)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def _add(items: list[str], value: str) -> None:
    if value not in items:
        items.append(value)


def summarize(host: str, logs: list[ProcessLog]) -> HostTransport:
    """One host's logs (channels already placed with `place_channels` over every host's logs)."""
    t = HostTransport(host=host, processes=len(logs))
    for log in logs:
        t.version = t.version or log.version
        for n in log.networks:
            _add(t.network, n)
        for h in log.ib_hcas:
            _add(t.hcas, h)
        for s in log.sockets:
            _add(t.sockets, s)
        t.ib_none |= log.ib_none
        t.ibverbs_missing |= log.ibverbs_missing
        for w in log.warnings:
            _add(t.nccl_warnings, w)
        for c in log.comms.values():
            if c.get("local") is not None:
                t.local_ranks = max(t.local_ranks or 0, c["local"])
        for ch in log.channels:
            kind = ch.kind
            if ch.src_host is not None and ch.dst_host is not None:
                same = ch.src_host == ch.dst_host
            else:
                same = not kind.startswith("NET")  # P2P and SHM never leave a host
            _add(t.intra if same else t.inter, kind)
            if same and kind.startswith("NET"):
                _add(t.same_host_net, f"{ch.src} -> {ch.dst} via {ch.via}")
            if ch.gdr:
                t.gdrdma = True
        if log.gdr_enabled:
            t.gdrdma = True
    if t.gdrdma is None and t.seen:
        t.gdrdma = False
    return t


def by_process(text: str) -> list[str]:
    """One text per `host:pid` prefix: a log shared by several processes (NCCL_DEBUG_FILE without %p, or the
    console) is split so that each process's comms and channels stay together."""
    groups: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            groups.setdefault(f"{m['host']}:{m['pid']}", []).append(line)
    return ["\n".join(lines) for lines in groups.values()]


def parse_hosts(texts: dict[str, list[str]]) -> list[HostTransport]:
    """host -> its log files' texts; hosts keep their order."""
    parsed = {host: [parse_log(x) for text in files for x in by_process(text)] for host, files in texts.items()}
    place_channels([log for logs in parsed.values() for log in logs])
    return [summarize(host, [log for log in logs if log.lines]) for host, logs in parsed.items()]


def _list(items: list[str]) -> str:
    return ", ".join(items) if items else "-"


def describe(t: HostTransport) -> str:
    """The one line `up` and `transport` print for a host."""
    if not t.seen:
        return "no NCCL transport lines yet"
    net = _list(t.network)
    if t.hcas:
        net += f" ({_list(t.hcas)})"
    elif t.sockets and "Socket" in t.network:
        net += f" ({_list(t.sockets)})"
    gdr = {True: "yes", False: "no", None: "-"}[t.gdrdma]
    intra = _list(t.intra) if t.intra else ("- (one rank)" if t.local_ranks == 1 else "-")
    return f"network {net}; GDRDMA {gdr}; intra-host {intra}; inter-host {_list(t.inter)}"


def judge(t: HostTransport, ib_active: list[str] | None, *, multi_host: bool, ipc: str | None = None,
          doctor: str = hints.dockerlaunch("doctor", hint="transport.doctor")) -> list[Finding]:
    """Warnings for one host: WARN or FAIL rows on `t.host`. `ib_active`: the ACTIVE InfiniBand ports doctor saw
    there (None: not known).

    On one host NCCL's network is unused (ranks meet by P2P/SHM), so only a multi-host job's socket choice counts.
    """
    out: list[Finding] = []
    uses_socket = "NET/Socket" in t.inter or ("Socket" in t.network and "IB" not in t.network)
    if ib_active and multi_host and uses_socket:
        if t.ibverbs_missing:
            cause = "NCCL could not load libibverbs in the image: install rdma-core (libibverbs1, ibverbs-providers)"
        elif t.ib_none:
            cause = ("NCCL found no InfiniBand device in the container: check that /dev/infiniband is passed "
                     "(container.infiniband: on) and the image has ibverbs-providers (libmlx5)")
        else:
            cause = "check NCCL_IB_DISABLE and NCCL_IB_HCA in container.env, and NCCL_NET if you set it"
        out.append(Finding(CHECK, Verdict.FAIL,
                           f"NCCL uses TCP sockets although InfiniBand port(s) {', '.join(ib_active)} are ACTIVE on "
                           f"this host: expect training 10-100x slower. Likely cause: {cause}; then re-run "
                           f"`{doctor}`", t.host))
    if t.same_host_net:
        why = ("the containers do not share an IPC namespace (container.ipc is private: use ipc: host, the default)"
               if ipc in ("private", "shareable") else
               "ranks of this host are in separate containers or namespaces, or NCCL_P2P_DISABLE/NCCL_SHM_DISABLE "
               "is set; run one container per host with all its GPUs and --ipc host (dockerlaunch's default)")
        out.append(Finding(CHECK, Verdict.WARN,
                           f"ranks on this host talk through the network ({t.same_host_net[0]}) instead of "
                           f"NVLink/PCIe P2P or shared memory: often 10-100x slower. Likely cause: {why}", t.host))
    return out
