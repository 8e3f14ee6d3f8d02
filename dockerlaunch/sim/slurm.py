"""A real Slurm in the sim (`sim up --slurm`): slurm.conf from the nodes' own hardware, munge and the daemons
started, nodes waited for until idle."""

from __future__ import annotations

import concurrent.futures as cf
import re
import secrets
import time

from dockerlaunch.sim.images import _tar_of
from dockerlaunch.sim.layout import MUNGE_KEY, SLURM_CONF, SLURM_READY_TIMEOUT, SimError, SimNode, _log

# What `slurmd -C` reports that slurm.conf takes for a node (RealMemory is left out: every node shares this
# machine's memory, and nothing here is scheduled by memory).
_HW_KEYS = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")


def parse_slurmd_hw(text: str) -> dict[str, str]:
    """The hardware fields of `slurmd -C` ("NodeName=x CPUs=2 Boards=1 ... RealMemory=...")."""
    fields = dict(kv.split("=", 1) for kv in text.split() if "=" in kv)
    hw = {k: fields[k] for k in _HW_KEYS if k in fields}
    if not hw.get("CPUs", "").isdigit():
        raise SimError(f"`slurmd -C` gave no CPU count: {text.strip()[:200]!r}")
    return hw


def render_slurm_conf(cluster: str, layout: list[SimNode], hw: dict[str, str]) -> str:
    """Pure: slurm.conf for a sim cluster whose nodes are unprivileged containers on one machine."""
    hw_text = " ".join(f"{k}={v}" for k, v in hw.items())
    name = re.sub(r"[^a-z0-9]", "", cluster.lower())[:30] or "sim"
    ctld = layout[0]
    lines = [
        f"# Written by the sim (sim up --slurm) for sim cluster {cluster!r}.",
        f"ClusterName={name}",
        f"SlurmctldHost=node{ctld.index}({ctld.ip})",
        "AuthType=auth/munge",
        "CryptoType=crypto/munge",
        "SlurmUser=slurm",
        "SlurmdUser=root",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        # The nodes are containers without systemd or a delegated cgroup: track a job's processes by
        # parentage, bind nothing, gather no accounting, keep no database.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # The submitter's rlimits cannot all be raised in an unprivileged node (memlock: these VMs cap it at 8 MB,
        # docs/ARCHITECTURE.md)
        "PropagateResourceLimits=NONE",
        "ReturnToService=2",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "KillWait=5",
        "MailProg=/bin/true",  # no mail here; the default (/usr/bin/mail) is absent and slurmctld logs an error
    ]
    lines += [f"NodeName=node{n.index} NodeAddr={n.ip} {hw_text} State=UNKNOWN" for n in layout]
    lines.append("PartitionName=sim Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def _exec(container, cmd: list[str], what: str) -> str:
    code, out = container.exec_run(cmd)
    text = out.decode(errors="replace")
    if code != 0:
        raise SimError(f"node {container.name}: {what} failed ({code}): {text.strip()[-300:]}")
    return text


def start_slurm(client, cluster: str, layout: list[SimNode], timeout: float = SLURM_READY_TIMEOUT) -> None:
    """One munge key and one slurm.conf into every node, then munged, slurmctld (node1) and slurmd; wait for idle."""
    t0 = time.monotonic()
    containers = [client.containers.get(n.name) for n in layout]
    first = containers[0]
    hw = parse_slurmd_hw(_exec(first, ["slurmd", "-C"], "slurmd -C").splitlines()[0])
    uid, gid = (int(x) for x in _exec(first, ["sh", "-c", "id -u munge; id -g munge"], "id munge").split())
    conf = render_slurm_conf(cluster, layout, hw).encode()
    key = secrets.token_bytes(1024)  # what `mungekey` makes: 1024 random bytes
    archive = _tar_of({SLURM_CONF: (conf, 0o644), MUNGE_KEY: (key, 0o400, uid, gid)})
    for c in containers:
        c.put_archive("/", archive)
    _exec(first, ["sim-slurm-start", "ctld"], "starting munged and slurmctld")
    with cf.ThreadPoolExecutor(max_workers=len(containers)) as pool:
        list(pool.map(lambda c: _exec(c, ["sim-slurm-start", "slurmd"], "starting slurmd"), containers))
    _wait_slurm_idle(containers, layout, timeout)
    _log(f"Slurm: {len(layout)} node(s) idle in {time.monotonic() - t0:.1f}s (partition sim, slurmctld on node1)")


def slurm_node_states(container) -> dict[str, str] | None:
    """sinfo's state of each node, asked on a node of the cluster (None if sinfo does not answer in 3 s: it
    retries for about 10 s when slurmctld is down)."""
    code, out = container.exec_run(["timeout", "3", "sinfo", "--noheader", "--Node", "--format", "%N %T"])
    if code != 0:
        return None
    states: dict[str, str] = {}
    for line in out.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def _wait_slurm_idle(containers, layout: list[SimNode], timeout: float) -> None:
    want = {f"node{n.index}" for n in layout}
    deadline = time.monotonic() + timeout
    states: dict[str, str] | None = None
    while time.monotonic() < deadline:
        states = slurm_node_states(containers[0])
        if states is not None and set(states) == want and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.5)
    logs = []
    for c, n in zip(containers, layout):
        if states is None or states.get(f"node{n.index}") != "idle":
            files = "/var/log/slurm/slurmd.log" + (" /var/log/slurm/slurmctld.log" if n.index == 1 else "")
            tail = c.exec_run(["sh", "-c", f"tail -q -n 2 {files} 2>&1"])[1].decode(errors="replace")
            logs.append(f"node{n.index}: " + " / ".join(line[:200] for line in tail.strip().splitlines()))
    raise SimError(f"Slurm not ready after {timeout:.0f}s: sinfo says {states or 'nothing'}; "
                   f"log tails (/var/log/slurm in the nodes): {' | '.join(logs)}")
