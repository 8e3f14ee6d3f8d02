"""The benchmarks' shared harness. A benchmark is code a reader checks before trusting its figure, so every script
asks one question and gets its sim cluster, shaped links, repeats, medians and ratios from here, written once:

  sim_cluster    a sim cluster for the length of a `with`, removed after it even on an error or Ctrl-C
  tc / shape     a link of this machine or the sim nodes' egress shaped with a token bucket (netem is absent here)
  spread / ratio a figure over repeats as its median and spread; a ratio against a floor of the same run
  random_image   an image of random (incompressible) bytes, so that a byte count is what went over the link
  drop, ssh_argv a host made to lack an image again; OpenSSH to it, for the hand pipelines a push is compared with
  staged_bytes, rx_bytes, engine_reads, cpu   what a host staged, what a node's eth0 received, what this machine's
                                              engine read (dockerlaunch.sim.measure, as the tests count them), what
                                              the launcher spent

The scale questions (8 to 256 hosts) share more: `harness.direct` (the sim's engines asked straight, without the
launcher), `harness.launcher` (one CLI run, sampled) and `harness.sizes` (one run per size, its floors, the table).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dockerlaunch import sim  # noqa: E402
from dockerlaunch.sim.measure import engine_reads, rx_bytes, staged_bytes  # noqa: E402,F401  (the harness's names, counted as the tests count)
from dockerlaunch.transfer import image_facts  # noqa: E402


def log(msg: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def tail(text: str | bytes, n: int = 1500) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-n:]


# ---------------------------------------------------------------- sims and links


@contextlib.contextmanager
def sim_cluster(cluster: str, keep: bool = False, **create: object) -> Iterator[Path]:
    """`sim.create(cluster=cluster, **create)`; yields its cluster config; the cluster is removed afterwards (also
    when the start itself failed half-way, or on Ctrl-C) unless `keep`."""
    try:
        yield Path(sim.create(cluster=cluster, **create))
    finally:
        if not keep:
            sim.remove(cluster, quiet=True)


def rate_bytes_per_s(rate: str) -> float:
    """tc rate in bits (200mbit, 1gbit) -> bytes/s."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(gbit|mbit|kbit|bit)", rate.lower())
    if not m:
        raise SystemExit(f"--rate {rate}: expected a rate in bits, e.g. 200mbit or 1gbit")
    return float(m[1]) * {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}[m[2]] / 8


def tc(dev: str, rate: str | None) -> None:
    """Shape (or, with rate None, unshape) a device of this machine, as sim.shape does a node's eth0."""
    if rate:
        subprocess.run(sim.tbf_argv(dev, rate), check=True)
    else:
        subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], check=False, capture_output=True)


def shape(cluster: str, rate: str | None) -> None:
    """Every node's egress (eth0) of a regular sim cluster shaped to `rate` (None: unshaped)."""
    sim.shape(cluster, rate)


# ---------------------------------------------------------------- repeats, medians, ratios


def timed(fn: Callable[[], object]) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    """'median (min-max)' of repeats."""
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def ratio(x: float | None, floor: float | None, digits: int = 2) -> float | None:
    """x / floor, both measured in the same run; None where either is missing (or the floor is 0)."""
    if x is None or not floor:
        return None
    return round(x / floor, digits)


def cpu() -> float:
    """CPU seconds of this process and the children it has waited for."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


# ---------------------------------------------------------------- images and bytes


def random_image(client, tag: str, mb: int, base: str | None = None) -> str:
    """An image of `mb` MiB of random (incompressible) bytes: from scratch, or `base` plus one layer."""
    blob = os.urandom(mb << 20)
    if base is None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            sim._add_bytes(tar, "blob", blob, 0o644)
        subprocess.run(["docker", "import", "-", tag], input=buf.getvalue(), check=True, capture_output=True)
        return tag
    with tempfile.TemporaryFile() as context:
        with tarfile.open(fileobj=context, mode="w") as tar:
            sim._add_bytes(tar, "Dockerfile", f"FROM {base}\nCOPY top /top\n".encode(), 0o644)
            sim._add_bytes(tar, "top", blob, 0o644)
        context.seek(0)
        client.images.build(fileobj=context, custom_context=True, tag=tag, network_mode="host", rm=True)
    return tag


def save_bytes(client, image_id: str) -> int:
    return sum(len(c) for c in image_facts.save_stream(client, image_id))


def drop(remote, *refs: str) -> None:
    """Remove refs from the host, and what a push staged there: the next push has to send the image again."""
    remote.run(["sh", "-c", 'docker rmi -f "$@" >/dev/null 2>&1; rm -rf "$HOME/.cache/dockerlaunch/push"; true',
                "sh", *refs], timeout=300)


def ssh_argv(cfg, remote) -> list[str]:
    """OpenSSH to the node with the sim's key and known_hosts (the same host-key policy as paramiko's): the hand
    pipelines a push is compared with."""
    t = remote.target
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-p", str(t.port),
            "-o", f"UserKnownHostsFile={os.path.expanduser(t.known_hosts)}"]
    for k in t.identity_files:
        argv += ["-i", os.path.expanduser(k)]
    return argv + [f"{t.user}@{t.hostname}"]
