"""Each node's egress shaped with a token bucket (netem is not available here): `sim shape`."""

from __future__ import annotations

from dockerlaunch import hints
from dockerlaunch.engine import engine
from dockerlaunch.sim.layout import DEFAULT_NAME, NODE_LABEL, ROLE_LABEL, SimError, check_name, containers_of


def parse_rate(rate: str) -> str:
    import re

    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)", rate):
        raise SimError(f"egress rate {rate!r}: use tc units, e.g. 200mbit or 1gbit")
    return rate


def tbf_argv(dev: str, rate: str) -> list[str]:
    """tc command limiting a device's egress to `rate` with a token bucket (netem is not available here)."""
    return ["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", parse_rate(rate),
            "burst", "256kb", "latency", "50ms"]


def shape(cluster: str = DEFAULT_NAME, rate: str | None = None, nodes: list[int] | None = None) -> None:
    """Shape (or, with rate None, unshape) each node's egress on eth0 with a token bucket."""
    check_name(cluster)
    client = engine()
    containers = containers_of(client, cluster)
    if not containers:
        raise SimError(f"no sim cluster {cluster!r} "
                       f"({hints.dockerlaunch('sim', 'up', '--name', cluster, hint='sim.up')} first)")
    if any(c.labels.get(ROLE_LABEL) for c in containers):
        raise SimError(f"sim cluster {cluster!r} is a light cluster: its hosts share engines, whose traffic "
                       "cannot be shaped per host (use regular nodes)")
    for c in containers:
        idx = int(c.labels.get(NODE_LABEL, "0"))
        if nodes and idx not in nodes:
            continue
        if rate:
            cmd = tbf_argv("eth0", rate)
        else:
            cmd = ["sh", "-c", "tc qdisc del dev eth0 root 2>/dev/null || true"]
        code, out = c.exec_run(cmd)
        if code != 0:
            raise SimError(f"node {c.name}: tc failed: {out.decode(errors='replace').strip()[:200]}")
