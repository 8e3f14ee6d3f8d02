"""Bases that need no registry: Debian made with debootstrap from an apt mirror, imported as a local image.

Many sites (and these build machines) reach a PyPI and a Debian mirror but no registry, so `FROM nvidia/cuda:...`
cannot work there. A made base is Debian plus the system packages every stack image needs, baked in by
debootstrap (an offline build cannot run apt: the engine may have no network for RUN steps), and the CUDA toolkit
comes later from PyPI's wheels (train.Dockerfile's layer 0-cuda). The image's tag hashes what it was made from
(suite, packages), so it is made once and found again; its labels record the versions that change compiled bytes
(gcc, glibc, Python), which the compiled-wheel cache keys on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.gpu import labels as labels_
from dockerlaunch.images.stacks import DEBIAN_PYTHON, Stack

_LOG = logging.getLogger(__name__)

FORMAT = 1
DEFAULT_MIRROR = "http://deb.debian.org/debian"
MIRROR_ENV = "DOCKERLAUNCH_DEBIAN_MIRROR"
REPO = "dockerlaunch/os"
LABEL = labels_.BASE
# What train.Dockerfile's system layer installs on a registry base, here baked in by debootstrap: Python (venv,
# headers for extensions), a compiler and ninja (so the CUDA stage alone can compile), RDMA userspace (without it
# NCCL silently falls back to TCP), network and debug tools.
SYSTEM_PACKAGES = ("build-essential", "ninja-build", "ca-certificates", "git", "rdma-core", "libibverbs1",
                   "ibverbs-providers", "infiniband-diags", "perftest", "iproute2", "netcat-openbsd", "openssh-client",
                   "procps")
# Packages whose versions change what a compile produces (the compilers themselves, gcc-14 not the gcc meta
# package; glibc): recorded as labels, read by the wheel cache's key.
RECORDED = re.compile(r"^(gcc-\d+|g\+\+-\d+|libc6)$")


class BaseError(DockerlaunchError):
    exit_code = 2


def packages(suite: str) -> list[str]:
    py = f"python{DEBIAN_PYTHON[suite]}"
    return [py, f"{py}-venv", f"{py}-dev", *SYSTEM_PACKAGES]


def base_tag(suite: str) -> str:
    """`dockerlaunch/os:trixie-<12 hex>`: the hash of what the base is made from, so a changed package list makes
    a new base and an unchanged one is found again."""
    data = {"format": FORMAT, "suite": suite, "packages": sorted(packages(suite))}
    return f"{REPO}:{suite}-{hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]}"


def stack_base_tag(stack: Stack) -> str | None:
    return base_tag(stack.base.debian) if stack.base else None


def image_labels(docker: str, ref: str) -> dict[str, str] | None:
    """The image's labels, or None when the engine has no such image."""
    r = subprocess.run([docker, "image", "inspect", "--format", "{{json .Config.Labels}}", ref],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout or "null") or {}


def facts(labels: dict[str, str]) -> dict[str, str]:
    """The recorded versions (gcc, g++, libc6, python) from a made base's labels."""
    prefix = f"{LABEL}.version."
    return {k[len(prefix):]: v for k, v in labels.items() if k.startswith(prefix)}


def debootstrap_rootfs(suite: str, root: Path, include: list[str] | None = None, mirror: str | None = None) -> None:
    """`debootstrap --variant=minbase` of `suite` into `root`, apt's caches emptied (they are not the image's)."""
    mirror = mirror or os.environ.get(MIRROR_ENV, DEFAULT_MIRROR)
    if shutil.which("debootstrap") is None:
        raise BaseError(f"making a Debian {suite} base needs debootstrap: apt-get install debootstrap (or run "
                        "scripts/install-docker)")
    if os.geteuid() != 0:
        raise BaseError(f"making a Debian {suite} base needs root (debootstrap); run this build once as root, or "
                        f"load an image made elsewhere as {base_tag(suite)}")
    argv = ["debootstrap", "--variant=minbase"]
    if include:
        argv.append("--include=" + ",".join(include))
    proc = subprocess.run([*argv, suite, str(root), mirror], capture_output=True, text=True)
    if proc.returncode != 0:
        out = (proc.stderr or proc.stdout).strip().splitlines()
        why = next((ln for ln in reversed(out) if ln.startswith(("E:", "W: Failure"))), out[-1] if out else "?")
        raise BaseError(f"debootstrap {suite} from {mirror} failed: {why.strip()} (a mirror this machine reaches: "
                        f"set {MIRROR_ENV})")
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        shutil.rmtree(root / junk, ignore_errors=True)
        (root / junk / "partial").mkdir(parents=True, exist_ok=True)


def installed_versions(root: Path, wanted: re.Pattern) -> dict[str, str]:
    """Debian package versions in a rootfs, read from its dpkg status file (no chroot)."""
    out: dict[str, str] = {}
    status = (root / "var/lib/dpkg/status").read_text(errors="replace")
    for para in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line[0].isspace())
        if wanted.match(fields.get("Package", "")) and "installed" in fields.get("Status", ""):
            out[fields["Package"]] = fields.get("Version", "")
    return out


def ensure_base(suite: str, docker: str = "docker", log: Callable[[str], None] | None = None) -> tuple[str, dict]:
    """(tag, recorded versions) of the made base for `suite`: the local image when there is one, else made now
    (debootstrap, ~1-4 min and ~700 MB; root)."""
    log = log or (lambda msg: _LOG.info("%s", msg))
    tag = base_tag(suite)
    labels = image_labels(docker, tag)
    if labels is not None:
        return tag, facts(labels)
    log(f"making base {tag}: Debian {suite} with {', '.join(packages(suite))} (debootstrap, no registry)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dockerlaunch-base-", dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp:
        root = Path(tmp) / "rootfs"
        debootstrap_rootfs(suite, root, packages(suite))
        py = f"python{DEBIAN_PYTHON[suite]}"
        versions = installed_versions(root, re.compile(f"{RECORDED.pattern}|^{re.escape(py)}$"))
        versions["python"] = versions.pop(py, "")
        changes = ["ENV LANG=C.UTF-8", f"LABEL {LABEL}.suite={suite}", f"LABEL {LABEL}.format={FORMAT}"]
        changes += [f"LABEL {LABEL}.version.{k}={v}" for k, v in sorted(versions.items())]
        argv = [docker, "import"]
        for c in changes:
            argv += ["--change", c]
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        try:
            r = subprocess.run([*argv, "-", tag], stdin=tar.stdout, capture_output=True, text=True)
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
        if r.returncode != 0:
            raise BaseError(f"docker import of base {tag} failed: {(r.stderr or r.stdout).strip()[:300]}")
    gcc = next((v for k, v in sorted(versions.items()) if k.startswith("gcc-")), "?")
    log(f"base {tag} made in {time.monotonic() - t0:.0f} s (gcc {gcc}, glibc {versions.get('libc6')}, Python "
        f"{versions.get('python')})")
    return tag, versions
