"""Staged pushes: a host keeps a stream as it arrives, so a push cut off resumes where it stopped.

From STAGE_MIN bytes each host stages the stream it gets (star, chain link or bundle image) under
$HOME/.cache/dockerlaunch/push, one file per stream and host, under a lock a load holds; here: whether a host may
stage (space for the stage and the load, no shared storage, flock), each stream's key, where receivers resume, and
`push --clean`. The hosts' side is scripts/stage_facts.sh, load.sh and clean_staged.sh.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dockerlaunch import keyvalue
from dockerlaunch.errors import TransferError
from dockerlaunch.hosts.fleet import each
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.transfer import script
from dockerlaunch.transfer.push_plan import HostTransfer

STAGE_MIN = 512 * 2**20  # images from this size are staged on the target as they arrive: a cut push resumes
STAGE_MIN_ENV = "DOCKERLAUNCH_PUSH_STAGE_MIN"  # bytes; 0 stages every push (the tests' small images)
STAGE_DIR = "$HOME/.cache/dockerlaunch/push"
# file systems several hosts mount as one (`stat -f -c %T` names, GNU coreutils' table in src/stat.c: BeeGFS is
# `fhgfs`, 9p `v9fs`, AFS also `k-afs`, StorNext `snfs`, GFS2 the literal `gfs/gfs2`, NetWare `novell`, Oracle ACFS
# `acfs`, HPE IBRIX `ibrix`, the VMware, Parallels and VirtualBox shared folders `vmhgfs`, `prl_fs`, `vboxsf`,
# clustered Veritas `vxfs`; every FUSE mount is `fuseblk`, one magic number for all of them: sshfs, JuiceFS,
# ceph-fuse, glusterfs, s3fs): a stage there would be every host's at once. A type stat does not know
# (`UNKNOWN (0x...)`) or none at all is not staged on either: it may be shared.
SHARED_FS = re.compile(r"(nfs\d?|lustre|ceph|cifs|smb[23]?|gpfs|beegfs|fhgfs|glusterfs|(k-)?afs|acfs|coda|9p|v9fs|"
                       r"snfs|fuseblk|panfs|wekafs|orangefs|ocfs2|gfs2?|gfs/gfs2|novell|ibrix|vxfs|vmhgfs|prl_fs|"
                       r"vboxsf)", re.I)
# A stage goes only under its lock (a load of it may still run); the lock file stays (a waiting load holds it open)
REMOVE_STAGE = (f'd="{STAGE_DIR}"; if [ -f "$d/$1.lock" ] && command -v flock >/dev/null 2>&1; then '
                'flock -w 60 "$d/$1.lock" rm -f "$d/$1.tar"; else rm -f "$d/$1.tar"; fi')


def remove_stage(remote: Remote, key: str) -> None:
    """The host's stage of one stream goes, under its lock (a load of it may still run)."""
    remote.run(["sh", "-c", REMOVE_STAGE, "sh", key], timeout=60)


@dataclass(frozen=True)
class Disk:
    """A filesystem as stage_facts.sh saw it (sizes in bytes)."""

    device: str
    total: int
    free: int

    def shares(self, other: Disk | None) -> bool:
        # the same device, or an overlay over it (a container's root reports the backing disk's sizes)
        return other is not None and (self.device == other.device or self.total == other.total)


@dataclass(frozen=True)
class StageFacts:
    staged: int
    digest: str
    present_id: str | None
    cache: Disk | None
    docker: Disk | None
    docker_root: str = "docker's root"
    flock: bool = True  # the host has flock: a stage can be kept to one load at a time
    fs: str = ""  # the file system type of $HOME/.cache (stat -f -c %T)


def _disk(words: list[str]) -> Disk | None:
    if len(words) >= 3 and words[1].isdigit() and words[2].isdigit():
        return Disk(words[0], int(words[1]) * 1024, int(words[2]) * 1024)
    return None


STAGE_FACTS_STEP = "looking for a staged push"
STAGE_PROBE_KEYS = ("flock", "fs", "staged", "id", "cache", "docker", "root")


def parse_stage_facts(text: str, host: str = "?") -> StageFacts:
    """stage_facts.sh's output (key=value lines) -> StageFacts (pure); what a host did not say stays None. An
    answer that breaks the key=value contract (dockerlaunch/keyvalue.py) is a HostError naming the host and key."""
    try:
        kv = {k: v[0] for k, v in keyvalue.parse(text, STAGE_PROBE_KEYS).items()}
    except keyvalue.Malformed as e:
        raise keyvalue.host_error(host, STAGE_FACTS_STEP, e) from None
    w = kv.get("staged", "").split()
    staged, digest = (int(w[0]), w[1]) if len(w) >= 2 and w[0].isdigit() else (0, "-")
    present = kv.get("id", "").strip()
    return StageFacts(staged, digest, present if present.startswith("sha256:") else None,
                      _disk(kv.get("cache", "").split()), _disk(kv.get("docker", "").split()),
                      kv.get("root", "").strip() or "docker's root", kv.get("flock", "1").strip() != "0",
                      kv.get("fs", "").strip())


def reserve(d: Disk) -> int:
    """What a push leaves free on a disk: a full root disk stops more than the push."""
    return max(4 << 30, d.total // 20)


def stage_choice(host: str, stream: int, facts: StageFacts) -> tuple[bool, str]:
    """(stage?, why not): staging costs the stream's size again beside docker load's own copy and the
    unpacked layers; a push stages only where all of it fits with a reserve left, and otherwise streams
    straight into docker load (a cut push then starts over). An image whose load cannot fit is refused
    before any byte is sent. (pure)"""
    gib = 2**30
    load = 2 * stream  # docker load's temporary copy of the tar, then the unpacked layers
    if facts.docker is not None and facts.docker.free < load:
        raise TransferError(f"host {host}: {facts.docker.free / gib:.1f} GiB free in {facts.docker_root}, and "
                            f"loading this image needs about {load / gib:.1f} GiB there (the tar and its unpacked "
                            "layers): free space on the host (docker image prune, docker builder prune) and push "
                            "again; nothing was sent")
    if not facts.flock:
        return False, "not staged (no flock on the host: two loads of one stage could not be kept apart)"
    if SHARED_FS.fullmatch(facts.fs):
        return False, f"not staged ($HOME/.cache is on {facts.fs}, shared storage: hosts would share one stage)"
    if not facts.fs or facts.fs.upper().startswith("UNKNOWN"):
        return False, (f"not staged ($HOME/.cache is on a file system stat does not know: {facts.fs or 'none said'}; "
                       "it may be shared storage)")
    cache = facts.cache
    if cache is None:
        return False, "not staged (the host did not say how much space $HOME/.cache has)"
    need = max(0, stream - facts.staged) + (load if cache.shares(facts.docker) else 0) + reserve(cache)
    if cache.free < need:
        return False, (f"not staged ({cache.free / gib:.1f} GiB free in $HOME/.cache, staging needs "
                       f"{need / gib:.1f} GiB with the load and a reserve): a cut push starts over")
    return True, ""


def stage_min() -> int:
    import os

    value = os.environ.get(STAGE_MIN_ENV, "")
    return int(value) if value.isdigit() else STAGE_MIN


def stage_key(t: HostTransfer) -> str:
    """One staged file per stream and host: the image as this host gets it (its ID, the layers left out, and the
    compression: a stage holds the stream as it travels)."""
    import hashlib

    # the host too: where homes are shared storage that was not recognised, two hosts still never share a file
    return hashlib.sha256(f"{t.host} {t.expect_id} {' '.join(sorted(t.skip_files))} {t.compression}".encode()
                          ).hexdigest()[:32]


@dataclass(frozen=True)
class StagePick:
    """What one host's stage of one stream says before it is sent: the host has the image already (an earlier
    push's load finished after its cut), or the stream is staged (`facts` holds the prefix to check) or not."""

    delivered: bool
    staged: bool
    facts: StageFacts
    note: str = ""  # why not staged


def pick_stage(remote: Remote, key: str, expect_id: str, stream_bytes: int) -> StagePick:
    """Ask a host about one stream's stage and choose (stage_choice); a stage that will not be used goes (its space
    is the load's). Raises what the question or the choice raise (a load that cannot fit: one line)."""
    r = remote.check(["sh", "-c", script("stage_facts.sh"), "sh", key, expect_id], STAGE_FACTS_STEP, timeout=1200)
    facts = parse_stage_facts(r.stdout, remote.name)
    if facts.present_id == expect_id:
        if facts.staged:
            remove_stage(remote, key)
        return StagePick(True, False, facts)
    staged, why = stage_choice(remote.name, stream_bytes, facts)
    if not staged and facts.staged:
        remove_stage(remote, key)
    return StagePick(False, staged, facts, why)


def chain_key(t: HostTransfer) -> str:
    """A chain host's stage: the stream as it travels (compressed), never mixed with a star stage of the image."""
    import hashlib

    return hashlib.sha256(f"{stage_key(t)} chain {t.compression}".encode()).hexdigest()[:32]


def resume_points(fresh: Callable[[], Iterator[bytes]], prefixes: list[tuple[int, str]]):
    """(offsets, the stream after offsets[0], sha256 of the stream up to there) for receivers that staged
    prefixes (size, sha256) of one stream, in the order it passes through them: receiver i+1 is fed by receiver
    i, so it resumes at most where i does. A prefix counts only when its sha256 is that of the same bytes of
    `fresh()`, read here, in one pass; when the first receiver's does not, every receiver starts at 0."""
    import hashlib

    n = len(prefixes)
    head = prefixes[0][0] if prefixes else 0
    if not head:
        return [0] * n, fresh(), hashlib.sha256()
    marks = sorted({size for size, _ in prefixes if 0 < size <= head})
    chunks, h, seen, rest, digests = fresh(), hashlib.sha256(), 0, b"", {}
    for chunk in chunks:
        while marks and seen + len(chunk) >= marks[0]:
            cut = marks[0] - seen
            h.update(chunk[:cut])
            chunk, seen = chunk[cut:], marks[0]
            digests[marks.pop(0)] = h.hexdigest()
        if not marks:
            rest = chunk
            break
        h.update(chunk)
        seen += len(chunk)
    offsets: list[int] = []
    for size, digest in prefixes:
        limit = offsets[-1] if offsets else size
        offsets.append(size if 0 < size <= limit and digests.get(size) == digest else 0)
    if not offsets[0]:  # not this stream's bytes (or more of them than it has)
        chunks.close()
        return [0] * n, fresh(), hashlib.sha256()

    def after() -> Iterator[bytes]:
        if rest:
            yield rest
        yield from chunks

    return offsets, after(), h


@dataclass(frozen=True)
class Cleaned:
    host: str
    files: int = 0
    bytes: int = 0
    in_use: int = 0
    error: str = ""


def clean_staged(remotes: list[Remote]) -> list[Cleaned]:
    """`push --clean`: each host's staged prefixes of cut pushes go (not one a push is loading now)."""

    def one(remote: Remote) -> Cleaned:
        r = remote.check(["sh", "-c", script("clean_staged.sh")], "removing staged pushes", timeout=300)
        words = r.stdout.split()
        if len(words) != 4 or words[0] != "removed" or not all(w.isdigit() for w in words[1:]):
            raise TransferError(f"host {remote.name}: clean_staged.sh said {r.stdout.strip()[:200]!r}")
        return Cleaned(remote.name, int(words[1]), int(words[2]), int(words[3]))

    return [o.value if o.ok else Cleaned(r.name, error=str(o.error)) for r, o in zip(remotes, each(one, remotes))]
