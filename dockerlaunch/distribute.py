"""Images to hosts without a registry: `push` over SSH, and `save`/`load` bundles for sneakernet.

Safety rule: an image travels by ID (a `docker save <id>` tar carries no tag), the target loads it,
its Image ID is checked, and only then is the tag set. A broken stream therefore leaves the tag
absent or pointing where it pointed before -- never at a partial or different image.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.ssh import Remote, map_hosts

BUNDLE_FORMAT = "dockerlaunch-bundle/1"
CHUNK = 1 << 20


class DistributeError(DockerlaunchError):
    pass


@dataclass(frozen=True)
class LocalImage:
    ref: str
    id: str
    size: int
    diff_ids: tuple[str, ...] = ()


def local_image(client, ref: str) -> LocalImage:
    import docker

    try:
        img = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise DistributeError(f"image {ref} is not in the local Docker engine (docker images)") from None
    return LocalImage(ref=ref, id=img.id, size=int(img.attrs.get("Size", 0)),
                      diff_ids=tuple(img.attrs.get("RootFS", {}).get("Layers", [])))


# ---------------------------------------------------------------- streams


class CountingReader(io.RawIOBase):
    """A file-like view of a chunk iterator that counts bytes and can be cut off (for tests and Ctrl-C)."""

    def __init__(self, chunks: Iterator[bytes], on_bytes: Callable[[int], None] | None = None):
        self._chunks = chunks
        self._buf = b""
        self.count = 0
        self._on_bytes = on_bytes

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return b""
        if n < 0 or n >= len(self._buf):
            out, self._buf = self._buf, b""
        else:
            out, self._buf = self._buf[:n], self._buf[n:]
        self.count += len(out)
        if self._on_bytes:
            self._on_bytes(len(out))
        return out


def save_stream(client, image_id: str) -> Iterator[bytes]:
    """`docker save <id>`: by ID, so the tar names no tag."""
    return client.api.get_image(image_id, chunk_size=CHUNK)


def zstd_chunks(chunks: Iterator[bytes], level: int = 3) -> Iterator[bytes]:
    import zstandard

    comp = zstandard.ZstdCompressor(level=level, threads=-1).compressobj()
    for chunk in chunks:
        out = comp.compress(chunk)
        if out:
            yield out
    yield comp.flush()


# ---------------------------------------------------------------- thin transfers


def chain_ids(diff_ids: list[str]) -> list[str]:
    """OCI chain IDs of every prefix: chain(L1)=L1, chain(L1..Ln)=sha256(chain(L1..Ln-1) + " " + Ln)."""
    out: list[str] = []
    for d in diff_ids:
        if not out:
            out.append(d)
        else:
            out.append("sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


def layer_files(client, image: LocalImage) -> list[str]:
    """Path of each layer's tar inside `docker save <id>`, in RootFS order (manifest.json's Layers).

    The manifest comes at the end of the stream, so this reads the save once (discarding data) and caches
    the answer per Image ID.
    """
    from dockerlaunch.sim import cache_root

    cache = cache_root().parent / "layers" / f"{image.id[7:]}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    manifest = None
    with tarfile.open(fileobj=CountingReader(save_stream(client, image.id)), mode="r|") as tar:
        for member in tar:
            if member.name == "manifest.json":
                f = tar.extractfile(member)
                manifest = json.loads(f.read()) if f else None
    if not manifest:
        raise DistributeError(f"docker save of {image.ref} has no manifest.json")
    files = list(manifest[0]["Layers"])
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(files))
    return files


def remote_chain_ids(remote: Remote) -> set[str]:
    """Every chain ID the host's engine has (from each image's RootFS layers)."""
    script = 'ids=$(docker image ls -aq) && if [ -n "$ids" ]; then docker image inspect --format "{{json .RootFS.Layers}}" $ids; fi'
    r = remote.check(["sh", "-c", script], "listing layers", timeout=120)
    have: set[str] = set()
    for line in r.stdout.splitlines():
        if line.strip().startswith("["):
            have.update(chain_ids(json.loads(line)))
    return have


def thin_chunks(chunks: Iterator[bytes], skip: set[str]) -> Iterator[bytes]:
    """Re-stream a `docker save` tar without the layer files in `skip` (the target already has them)."""
    pipe = _Pipe()

    def produce():
        try:
            with tarfile.open(fileobj=CountingReader(chunks), mode="r|") as tin, \
                    tarfile.open(fileobj=pipe, mode="w|", format=tarfile.GNU_FORMAT) as tout:
                for member in tin:
                    if member.name in skip:
                        continue
                    tout.addfile(member, tin.extractfile(member) if member.isfile() else None)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            pipe.fail(e)
        finally:
            pipe.close()

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    yield from pipe.chunks()
    t.join()


class _Pipe:
    """A bounded in-memory pipe: a tarfile writer on one thread, a chunk iterator on the other."""

    def __init__(self, depth: int = 16):
        import queue

        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None

    def write(self, data: bytes) -> int:
        if data:
            self.q.put(bytes(data))
        return len(data)

    def fail(self, e: BaseException) -> None:
        self.error = e

    def close(self) -> None:
        self.q.put(None)

    def chunks(self) -> Iterator[bytes]:
        while True:
            item = self.q.get()
            if item is None:
                if self.error:
                    raise DistributeError(f"re-streaming the image failed: {self.error}")
                return
            yield item


# ---------------------------------------------------------------- remote side


LOAD_SCRIPT = r"""
set -u
image_id=$1 ref=$2 compress=$3
if [ "$compress" = zstd ]; then out=$(zstd -dc | docker load 2>&1); else out=$(docker load 2>&1); fi
status=$?
if [ $status -ne 0 ]; then echo "load failed: $out" >&2; exit 3; fi
got=$(docker image inspect --format '{{.Id}}' "$image_id" 2>/dev/null) || { echo "after load, $image_id is missing: $out" >&2; exit 4; }
[ "$got" = "$image_id" ] || { echo "loaded $got, expected $image_id" >&2; exit 4; }
docker tag "$image_id" "$ref" || exit 5
echo "ok $got"
"""


@dataclass
class HostResult:
    host: str
    status: str  # pushed | skipped | tagged | failed
    detail: str = ""
    bytes_sent: int = 0
    seconds: float = 0.0


def remote_state(remote: Remote, image: LocalImage) -> str:
    """`same` (tag -> this ID), `untagged` (ID present, tag elsewhere/absent), `absent`."""
    script = ('tag=$(docker image inspect --format "{{.Id}}" "$1" 2>/dev/null || true); '
              'has=$(docker image inspect --format "{{.Id}}" "$2" 2>/dev/null || true); echo "$tag|$has"')
    r = remote.check(["sh", "-c", script, "sh", image.ref, image.id], "inspecting images", timeout=60)
    tag_id, has_id = (r.stdout.strip().split("|") + [""])[:2]
    if tag_id == image.id:
        return "same"
    if has_id == image.id:
        return "untagged"
    return "absent"


def has_zstd(remote: Remote) -> bool:
    return remote.run(["sh", "-c", "command -v zstd >/dev/null"], timeout=30).ok


def push_to_host(
    client, remote: Remote, image: LocalImage, compress: str = "auto",
    on_bytes: Callable[[int], None] | None = None, stop: threading.Event | None = None, thin: bool = True,
) -> HostResult:
    t0 = time.monotonic()
    state = remote_state(remote, image)
    if state == "same":
        return HostResult(remote.name, "skipped", f"already has {image.id[7:19]}")
    if state == "untagged":
        remote.check(["docker", "tag", image.id, image.ref], "tagging")
        return HostResult(remote.name, "tagged", f"had {image.id[7:19]} untagged; tagged {image.ref}")
    mode = compress
    if mode == "auto":
        mode = "zstd" if has_zstd(remote) else "none"
    elif mode == "zstd" and not has_zstd(remote):
        raise DistributeError(f"host {remote.name}: --compress zstd but zstd is not installed there")
    chunks = save_stream(client, image.id)
    skipped = ""
    if thin:
        files = layer_files(client, image)
        have = remote_chain_ids(remote)
        skip = {f for f, c in zip(files, chain_ids(image.diff_ids)) if c in have}
        if skip:
            chunks = thin_chunks(chunks, skip)
            skipped = f", thin: {len(skip)} of {len(files)} layers already there"
    if mode == "zstd":
        chunks = zstd_chunks(chunks)
    reader = CountingReader(chunks, on_bytes)
    out, err = bytearray(), bytearray()
    status = remote.stream(["sh", "-c", LOAD_SCRIPT, "sh", image.id, image.ref, mode], out.extend, err.extend,
                           stdin=reader, stop=stop)
    if status != 0:
        reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {status}"]
        return HostResult(remote.name, "failed", reason[0][:300], reader.count, time.monotonic() - t0)
    return HostResult(remote.name, "pushed",
                      f"{mode}{skipped}, image {image.size / 1e6:.0f} MB, Image ID {image.id[7:19]} verified",
                      reader.count, time.monotonic() - t0)


def push(client, remotes: list[Remote], ref: str, compress: str = "auto", console=None,
         thin: bool = True) -> list[HostResult]:
    """Star: the launcher streams to every host concurrently; a rich progress bar per host."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    image = local_image(client, ref)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=console, transient=False)
    with progress:
        tasks = {r.name: progress.add_task(f"{r.name:<18}", total=image.size or None) for r in remotes}

        def one(remote: Remote) -> HostResult:
            task = tasks[remote.name]
            try:
                res = push_to_host(client, remote, image, compress,
                                   on_bytes=lambda n: progress.advance(task, n), thin=thin)
            except DockerlaunchError as e:
                res = HostResult(remote.name, "failed", str(e))
            progress.update(task, completed=image.size or 0, description=f"{remote.name:<18} {res.status}")
            return res

        results = map_hosts(one, remotes)
    return [r if isinstance(r, HostResult) else HostResult(remotes[i].name, "failed", str(r))
            for i, r in enumerate(results)]


# ---------------------------------------------------------------- bundles


@dataclass
class BundleEntry:
    ref: str
    id: str
    size: int
    file: str
    sha256: str = ""
    bytes: int = 0


@dataclass
class Bundle:
    images: list[BundleEntry] = field(default_factory=list)


def save_bundle(client, refs: list[str], path: Path, level: int = 3) -> Bundle:
    """zstd(tar(images/<id>.tar ..., manifest.json)). The manifest comes last: it holds each tar's sha256."""
    import zstandard

    images = [local_image(client, r) for r in refs]
    bundle = Bundle()
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as raw:
        with zstandard.ZstdCompressor(level=level, threads=-1).stream_writer(raw) as zout:
            with tarfile.open(fileobj=zout, mode="w|") as tar:
                for img in images:
                    entry = BundleEntry(ref=img.ref, id=img.id, size=img.size, file=f"images/{img.id[7:]}.tar")
                    _add_stream(tar, entry, save_stream(client, img.id))
                    bundle.images.append(entry)
                manifest = json.dumps({"format": BUNDLE_FORMAT, "images": [e.__dict__ for e in bundle.images]},
                                      indent=2).encode()
                info = tarfile.TarInfo("manifest.json")
                info.size = len(manifest)
                tar.addfile(info, io.BytesIO(manifest))
    tmp.rename(path)
    return bundle


def _add_stream(tar: tarfile.TarFile, entry: BundleEntry, chunks: Iterator[bytes]) -> None:
    """A tar member needs its size up front: spool the save stream to a temp file, hashing it."""
    import tempfile

    h = hashlib.sha256()
    with tempfile.TemporaryFile() as spool:
        for chunk in chunks:
            h.update(chunk)
            spool.write(chunk)
        entry.bytes = spool.tell()
        entry.sha256 = h.hexdigest()
        spool.seek(0)
        info = tarfile.TarInfo(entry.file)
        info.size = entry.bytes
        tar.addfile(info, spool)


class _HashingReader(io.RawIOBase):
    def __init__(self, f: BinaryIO):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        self.n += len(data)
        return data


Loader = Callable[[BinaryIO], tuple[int, str]]  # feeds a `docker load` and returns (status, output)


def local_loader(docker: str = "docker") -> Loader:
    def load(stream: BinaryIO) -> tuple[int, str]:
        proc = subprocess.Popen([docker, "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        assert proc.stdin is not None
        try:
            while chunk := stream.read(CHUNK):
                proc.stdin.write(chunk)
        except BrokenPipeError:
            pass
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        return proc.wait(), out

    return load


def remote_loader(remote: Remote) -> Loader:
    def load(stream: BinaryIO) -> tuple[int, str]:
        out = bytearray()
        status = remote.stream(["docker", "load"], out.extend, out.extend, stdin=stream)
        return status, out.decode(errors="replace")

    return load


def load_bundle(path: Path, load: Loader, run: Callable[[list[str]], tuple[int, str]], where: str = "local") -> list[BundleEntry]:
    """Load every image of a bundle, checking sha256 and Image ID before any tag is set.

    `run(argv)` runs a docker command where the images go (locally or on a host).
    """
    import zstandard

    loaded: list[tuple[BundleEntry, str]] = []
    seen: dict[str, tuple[str, int]] = {}
    manifest = None
    try:
        with open(path, "rb") as raw:
            with zstandard.ZstdDecompressor().stream_reader(raw) as zin:
                with tarfile.open(fileobj=zin, mode="r|") as tar:
                    for member in tar:
                        f = tar.extractfile(member)
                        if member.name == "manifest.json" and f is not None:
                            manifest = json.loads(f.read())
                        elif member.name.startswith("images/") and f is not None:
                            reader = _HashingReader(f)
                            status, out = load(reader)
                            while reader.read(CHUNK):  # drain what docker load did not read
                                pass
                            if status != 0:
                                raise DistributeError(f"{where}: docker load of {member.name} failed: {out.strip()[-200:]}")
                            seen[member.name] = (reader.h.hexdigest(), reader.n)
    except (zstandard.ZstdError, tarfile.TarError, EOFError, OSError, json.JSONDecodeError) as e:
        raise DistributeError(f"bundle {path} is corrupted or truncated ({type(e).__name__}: {e}); "
                              "nothing was tagged; copy it again") from None
    if manifest is None or manifest.get("format") != BUNDLE_FORMAT:
        raise DistributeError(f"bundle {path} has no {BUNDLE_FORMAT} manifest: not a dockerlaunch bundle, or truncated")
    entries = [BundleEntry(**e) for e in manifest["images"]]
    for e in entries:
        got = seen.get(e.file)
        if got is None:
            raise DistributeError(f"bundle {path}: {e.file} ({e.ref}) is listed but missing; nothing was tagged")
        if got[0] != e.sha256 or got[1] != e.bytes:
            raise DistributeError(f"bundle {path}: checksum mismatch for {e.ref} ({e.file}); the file is corrupted; "
                                  "nothing was tagged")
        loaded.append((e, e.id))
    for e, image_id in loaded:
        status, out = run(["docker", "image", "inspect", "--format", "{{.Id}}", image_id])
        if status != 0 or out.strip() != image_id:
            raise DistributeError(f"{where}: after loading {e.ref}, Image ID {image_id[7:19]} is missing")
        status, out = run(["docker", "tag", image_id, e.ref])
        if status != 0:
            raise DistributeError(f"{where}: tagging {e.ref} failed: {out.strip()[-200:]}")
    return entries


def local_runner(argv: list[str]) -> tuple[int, str]:
    r = subprocess.run(argv, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def remote_runner(remote: Remote) -> Callable[[list[str]], tuple[int, str]]:
    def run(argv: list[str]) -> tuple[int, str]:
        r = remote.run(argv, timeout=120)
        return r.exit_status, r.stdout + r.stderr

    return run
