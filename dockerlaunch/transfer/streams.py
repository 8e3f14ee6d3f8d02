"""The bytes of an image on the wire: `docker save` by ID, thinned, compressed, counted.

Everything here streams in bounded memory: a 20 GB image never sits in RAM or on the launcher's disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from dockerlaunch.engine import cache_root
from dockerlaunch.errors import TransferError

CHUNK = 1 << 20


@dataclass(frozen=True)
class LocalImage:
    """An image in the launcher's engine: what it is called, its ID, size and layers (RootFS diff IDs)."""

    ref: str
    id: str
    size: int
    diff_ids: tuple[str, ...] = ()


def local_image(client, ref: str) -> LocalImage:
    import docker

    try:
        img = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise TransferError(f"image {ref} is not in the local Docker engine (docker images)") from None
    return LocalImage(ref=ref, id=img.id, size=int(img.attrs.get("Size", 0)),
                      diff_ids=tuple(img.attrs.get("RootFS", {}).get("Layers", [])))


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


def stream_seconds(reader: CountingReader, t0: float) -> float:
    """Seconds from t0 until the reader handed out its last chunk (0 if it never finished)."""
    return reader.finished - t0 if reader.finished else 0.0


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
    return [f for f, _ in layer_map(client, image)]


def layer_map(client, image: LocalImage) -> list[tuple[str, int]]:
    """(path inside the save tar, bytes) of each layer, in RootFS order; one read of the save, cached."""
    cache = cache_root() / "layers" / f"{image.id[7:]}.v2.json"
    if cache.is_file():
        return [(f, int(n)) for f, n in json.loads(cache.read_text())]
    sizes: dict[str, int] = {}
    manifest = None
    with tarfile.open(fileobj=CountingReader(save_stream(client, image.id)), mode="r|") as tar:
        for member in tar:
            if member.name == "manifest.json":
                f = tar.extractfile(member)
                manifest = json.loads(f.read()) if f else None
            elif member.isfile():
                sizes[member.name] = member.size
    if not manifest:
        raise TransferError(f"docker save of {image.ref} has no manifest.json")
    layers = [(f, sizes.get(f, 0)) for f in manifest[0]["Layers"]]
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(layers))
    return layers


def rewrite_tar(chunks: Iterator[bytes], edit: Callable[[tarfile.TarInfo, IO[bytes] | None],
                                                     tuple[tarfile.TarInfo, IO[bytes] | None] | None]
                ) -> Iterator[bytes]:
    """Re-stream a tar member by member; `edit(member, file)` returns what to write instead, or None to drop
    the member. Streams in bounded memory (a thread and a small pipe)."""
    pipe = _Pipe()

    def produce():
        try:
            with tarfile.open(fileobj=CountingReader(chunks), mode="r|") as tin, \
                    tarfile.open(fileobj=pipe, mode="w|", format=tarfile.GNU_FORMAT) as tout:
                for member in tin:
                    out = edit(member, tin.extractfile(member) if member.isfile() else None)
                    if out is not None:
                        tout.addfile(*out)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            pipe.fail(e)
        finally:
            pipe.close()

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    yield from pipe.chunks()
    t.join()


def thin_chunks(chunks: Iterator[bytes], skip: set[str]) -> Iterator[bytes]:
    """Re-stream a `docker save` tar without the layer files in `skip` (the target already has them)."""
    return rewrite_tar(chunks, lambda m, f: None if m.name in skip else (m, f))


MAX_METADATA = 4 << 20  # a save's manifest.json / index.json: a few KB; more is not a docker save


def untagged_chunks(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Re-stream a `docker save` tar so that `docker load` sets no tag: RepoTags cleared in manifest.json,
    the legacy `repositories` file dropped, image-name annotations removed from an OCI index.json."""

    def edit(member: tarfile.TarInfo, f: IO[bytes] | None):
        if member.name == "repositories":
            return None
        if member.name in ("manifest.json", "index.json") and f is not None:
            if member.size > MAX_METADATA:
                raise TransferError(f"{member.name} in an image tar is {member.size} bytes: not a docker save")
            data = json.loads(f.read())
            if member.name == "manifest.json":
                for entry in data if isinstance(data, list) else []:
                    if isinstance(entry, dict):
                        entry["RepoTags"] = None
            else:
                for m in data.get("manifests", []) if isinstance(data, dict) else []:
                    notes = m.get("annotations") if isinstance(m, dict) else None
                    if isinstance(notes, dict):
                        for k in [k for k in notes if k.endswith(("image.name", "ref.name"))]:
                            del notes[k]
            body = json.dumps(data).encode()
            info = tarfile.TarInfo(member.name)
            info.size, info.mode, info.mtime = len(body), member.mode, member.mtime
            return info, io.BytesIO(body)
        return member, f

    return rewrite_tar(chunks, edit)


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
                    raise TransferError(f"re-streaming the image failed: {self.error}")
                return
            yield item


def outgoing(client, image: LocalImage, skip: set[str], mode: str) -> Iterator[bytes]:
    """What goes on the wire: `docker save <id>`, minus the layer files in `skip` (the receivers have
    them), zstd-compressed if `mode` says so."""
    chunks = save_stream(client, image.id)
    if skip:
        chunks = thin_chunks(chunks, skip)
    if mode == "zstd":
        chunks = zstd_chunks(chunks)
    return chunks
