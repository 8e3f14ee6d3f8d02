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
        self.finished: float | None = None  # monotonic time the last chunk was taken

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                if self.finished is None:
                    self.finished = time.monotonic()
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

    comp = zstandard.ZstdCompressor(level=level, threads=-1, write_checksum=True).compressobj()
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


def outgoing(client, image: LocalImage, have: set[str] | None, mode: str) -> tuple[Iterator[bytes], str]:
    """What goes on the wire: `docker save <id>`, minus the layers the receivers have (`have`: their chain
    IDs; None = send all), zstd-compressed if `mode` says so. Returns the chunks and a note for the summary."""
    chunks = save_stream(client, image.id)
    note = ""
    chains = chain_ids(list(image.diff_ids))
    if have is not None and any(c in have for c in chains):  # layer_files reads the whole save once: only if needed
        files = layer_files(client, image)
        skip = {f for f, c in zip(files, chains) if c in have}
        if skip:
            chunks = thin_chunks(chunks, skip)
            note = f", thin: {len(skip)} of {len(files)} layers already there"
    if mode == "zstd":
        chunks = zstd_chunks(chunks)
    return chunks, note


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
    stream_seconds: float = 0.0  # until the last byte left the launcher; the rest is the host's docker load


def _stream_seconds(reader: CountingReader, t0: float) -> float:
    return reader.finished - t0 if reader.finished else 0.0


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
    chunks, skipped = outgoing(client, image, remote_chain_ids(remote) if thin else None, mode)
    reader = CountingReader(chunks, on_bytes)
    out, err = bytearray(), bytearray()
    status = remote.stream(["sh", "-c", LOAD_SCRIPT, "sh", image.id, image.ref, mode], out.extend, err.extend,
                           stdin=reader, stop=stop)
    if status != 0:
        reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {status}"]
        return HostResult(remote.name, "failed", reason[0][:300], reader.count, time.monotonic() - t0,
                          _stream_seconds(reader, t0))
    return HostResult(remote.name, "pushed",
                      f"{mode}{skipped}, image {image.size / 1e6:.0f} MB, Image ID {image.id[7:19]} verified",
                      reader.count, time.monotonic() - t0, _stream_seconds(reader, t0))


def push(client, remotes: list[Remote], ref: str, compress: str = "auto", console=None,
         thin: bool = True, strategy: str = "star", addresses: list[str] | None = None) -> list[HostResult]:
    """star: the launcher streams to every host concurrently. chain: one copy leaves the launcher and each
    host relays it to the next (`auto`: chain for 3+ hosts that need the image); hosts the chain did not
    reach get a star push. A progress bar per stream."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    image = local_image(client, ref)
    addresses = addresses or [r.target.hostname for r in remotes]
    # hosts that already have it are settled first, whatever the strategy
    settled: dict[str, HostResult] = {}
    need: list[int] = []
    for i, (r, state) in enumerate(zip(remotes, map_hosts(lambda r: remote_state(r, image), remotes))):
        if isinstance(state, BaseException):
            settled[r.name] = HostResult(r.name, "failed", str(state))
        elif state == "same":
            settled[r.name] = HostResult(r.name, "skipped", f"already has {image.id[7:19]}")
        elif state == "untagged":
            tagged = r.run(["docker", "tag", image.id, image.ref], timeout=60)
            settled[r.name] = (HostResult(r.name, "tagged", f"had {image.id[7:19]} untagged; tagged {image.ref}")
                               if tagged.ok else HostResult(r.name, "failed", f"tagging: {tagged.last_line()}"))
        else:
            need.append(i)
    if strategy == "auto":
        strategy = "chain" if len(need) >= 3 and not cannot_relay([remotes[i] for i in need]) else "star"
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=console, transient=False)
    with progress:
        done: list[HostResult] = []
        star_hosts = need
        chain_failed: dict[int, str] = {}
        if strategy == "chain" and need:
            task = progress.add_task(f"chain of {len(need):<9}", total=image.size or None)
            try:
                chained = push_chain(client, [remotes[i] for i in need], [addresses[i] for i in need], image,
                                     compress, thin, on_bytes=lambda n: progress.advance(task, n))
            except DockerlaunchError as e:
                chained = [HostResult(remotes[i].name, "failed", str(e)) for i in need]
            progress.update(task, completed=image.size or 0)
            # a broken link must not leave the hosts behind it without the image: star to those
            chain_failed = {i: r.detail for i, r in zip(need, chained) if r.status == "failed"}
            done = [r for r in chained if r.status != "failed"]
            star_hosts = list(chain_failed)
        tasks = {i: progress.add_task(f"{remotes[i].name:<18}", total=image.size or None) for i in star_hosts}

        def one(i: int) -> HostResult:
            try:
                res = push_to_host(client, remotes[i], image, compress,
                                   on_bytes=lambda n: progress.advance(tasks[i], n), thin=thin)
            except DockerlaunchError as e:
                res = HostResult(remotes[i].name, "failed", str(e))
            progress.update(tasks[i], completed=image.size or 0, description=f"{remotes[i].name:<18} {res.status}")
            if i in chain_failed:
                res.detail = f"star after the chain failed ({chain_failed[i][:160]}); {res.detail}"
            return res

        done += [r if isinstance(r, HostResult) else HostResult(remotes[i].name, "failed", str(r))
                 for i, r in zip(star_hosts, map_hosts(one, star_hosts))]
    by_name = {**settled, **{r.host: r for r in done}}
    return [by_name[r.name] for r in remotes]


# ---------------------------------------------------------------- chain


# One host of a chain: its input (SSH stdin for the first host, a TCP listener for the others) goes through
# tee into its own docker load and, unless it is the last, on to the next host over TCP. The tag is set only
# after the Image ID checks out, as in a star push.
RELAY_SCRIPT = r"""
set -u
image_id=$1 ref=$2 compress=$3 listen=$4 port=$5 next=$6
dir=$(mktemp -d) || exit 6
trap 'rm -rf "$dir"' EXIT
mkfifo "$dir/fifo" || exit 6
( if [ "$compress" = zstd ]; then zstd -dc < "$dir/fifo" | docker load; else docker load < "$dir/fifo"; fi \
    > "$dir/log" 2>&1; echo $? > "$dir/rc" ) &
loader=$!
recv() { if [ "$listen" = - ]; then cat; else nc -l "$listen" "$port"; fi; }
if [ "$listen" != - ]; then  # tell the launcher as soon as our listener is up, so the sender can start
  ( hex=$(printf '%04X' "$port"); i=0
    while [ $i -lt 300 ]; do
      if awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p {f = 1} END {exit !f}' \
          /proc/net/tcp /proc/net/tcp6 2>/dev/null; then echo listening; exit 0; fi
      sleep 0.05; i=$((i + 1))
    done ) &
fi
# if the next link breaks, drain its share so that tee (and our own load) goes on; that host reports its failure
if [ "$next" = - ]; then recv > "$dir/fifo"; else recv | tee "$dir/fifo" | { nc -N "$next" "$port"; cat > /dev/null; }; fi
wait $loader
if [ "$(cat "$dir/rc")" != 0 ]; then echo "load failed: $(tail -n 3 "$dir/log")" >&2; exit 3; fi
got=$(docker image inspect --format '{{.Id}}' "$image_id" 2>/dev/null) || { echo "after load, $image_id is missing" >&2; exit 4; }
[ "$got" = "$image_id" ] || { echo "loaded $got, expected $image_id" >&2; exit 4; }
docker tag "$image_id" "$ref" || exit 5
echo "ok $got"
"""


def can_relay(remote: Remote) -> bool:
    """OpenBSD netcat (it has -N: close the connection at end of input) and mkfifo."""
    probe = "command -v mkfifo >/dev/null && nc -h 2>&1 | grep -qE '^[[:space:]]*-N[[:space:]]'"
    return remote.run(["sh", "-c", probe], timeout=30).ok


def cannot_relay(remotes: list[Remote]) -> list[str]:
    """Names of the hosts that cannot be a link of a chain (probed concurrently)."""
    return [r.name for r, ok in zip(remotes, map_hosts(can_relay, remotes)) if ok is not True]


def _kill_listener(remote: Remote, port: int) -> None:
    remote.run(["sh", "-c", r'pkill -f "^nc -l [^ ]+ $1\$" || true', "sh", str(port)], timeout=30)


def push_chain(
    client, remotes: list[Remote], addresses: list[str], image: LocalImage, compress: str = "auto",
    thin: bool = True, on_bytes: Callable[[int], None] | None = None, port: int | None = None,
) -> list[HostResult]:
    """The launcher streams one copy to the first host; each host loads it and relays it to the next.

    `addresses[i]` is where host i listens (the address the previous host reaches it at).
    """
    import secrets

    t0 = time.monotonic()
    if not remotes:
        return []
    missing = cannot_relay(remotes)
    if missing:
        raise DistributeError(f"chain push needs OpenBSD netcat (nc -N) and mkfifo on every host; missing on "
                              f"{', '.join(missing)} (apt-get install netcat-openbsd) -- or use --strategy star")
    mode = compress
    zstd_everywhere = mode != "none" and all(ok is True for ok in map_hosts(has_zstd, remotes))
    if mode == "auto":
        mode = "zstd" if zstd_everywhere else "none"
    elif mode == "zstd" and not zstd_everywhere:
        raise DistributeError("--compress zstd: zstd is missing on a host of the chain")
    common = None
    if thin:  # a layer may be left out only if every host of the chain has it
        haves = map_hosts(remote_chain_ids, remotes)
        common = set.intersection(*haves) if all(isinstance(h, set) for h in haves) else set()
    chunks, skipped = outgoing(client, image, common, mode)
    port = port or 40000 + secrets.randbelow(20000)
    n = len(remotes)
    results: list[HostResult | None] = [None] * n
    threads: list[threading.Thread] = []
    stop = threading.Event()
    reader = CountingReader(chunks, on_bytes)
    listening = [threading.Event() for _ in remotes]

    def run_host(i: int) -> None:
        listen = "-" if i == 0 else addresses[i]
        nxt = addresses[i + 1] if i + 1 < n else "-"
        out, err = bytearray(), bytearray()

        def on_out(data: bytes) -> None:
            out.extend(data)
            if b"listening\n" in out:
                listening[i].set()

        try:
            status = remotes[i].stream(
                ["sh", "-c", RELAY_SCRIPT, "sh", image.id, image.ref, mode, listen, str(port), nxt],
                on_out, err.extend, stdin=reader if i == 0 else None, stop=stop)
        except DockerlaunchError as e:
            results[i] = HostResult(remotes[i].name, "failed", str(e))
            return
        if status != 0:
            reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {status}"]
            results[i] = HostResult(remotes[i].name, "failed", reason[0][:300])
        else:
            role = "head of chain" if i == 0 else f"relayed from {remotes[i - 1].name}"
            results[i] = HostResult(remotes[i].name, "pushed", f"chain ({role}), {mode}{skipped}, "
                                    f"Image ID {image.id[7:19]} verified", reader.count if i == 0 else 0,
                                    time.monotonic() - t0, _stream_seconds(reader, t0) if i == 0 else 0.0)

    # listeners first, from the tail, each one listening before its sender starts
    for i in reversed(range(1, n)):
        t = threading.Thread(target=run_host, args=(i,), daemon=True)
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 15
        while not listening[i].wait(0.05) and t.is_alive() and time.monotonic() < deadline:
            pass
        if not listening[i].is_set():
            stop.set()
            map_hosts(lambda r: _kill_listener(r, port), remotes[i:])  # a closed channel does not end `nc -l`
            for t in threads:
                t.join(timeout=10)
            why = results[i].detail if results[i] else f"no listener on port {port} after 15 s"
            return [HostResult(r.name, "failed", f"chain could not start at {remotes[i].name}: {why}")
                    for r in remotes]
    head = threading.Thread(target=run_host, args=(0,), daemon=True)
    head.start()
    threads.append(head)
    for t in threads:
        t.join()
    return [r or HostResult(remotes[i].name, "failed", "no result") for i, r in enumerate(results)]


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
        with zstandard.ZstdCompressor(level=level, threads=-1, write_checksum=True).stream_writer(raw) as zout:
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
    failed: dict[str, str] = {}
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
                            if status != 0:  # judged after the checksums: corruption is the likelier cause
                                failed.setdefault(member.name, out.strip()[-200:])
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
        if e.file in failed:
            raise DistributeError(f"{where}: docker load of {e.ref} ({e.file}) failed: {failed[e.file]}")
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
