"""`save` / `load`: images in one file for hosts no network reaches (sneakernet), checked before tagging.

A bundle is zstd(tar(images/<id>.tar ..., manifest.json)); the manifest comes last and holds each
tar's sha256 and size, so `load` reads to the end and checks every image before it sets any tag.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from dockerlaunch.cluster.ssh import Remote
from dockerlaunch.errors import TransferError
from dockerlaunch.transfer.streams import CHUNK, local_image, save_stream

BUNDLE_FORMAT = "dockerlaunch-bundle/1"


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


def load_bundle(
    path: Path, load: Loader, run: Callable[[list[str]], tuple[int, str]], where: str = "local"
) -> list[BundleEntry]:
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
        raise TransferError(f"bundle {path} is corrupted or truncated ({type(e).__name__}: {e}); "
                              "nothing was tagged; copy it again") from None
    if manifest is None or manifest.get("format") != BUNDLE_FORMAT:
        raise TransferError(f"bundle {path} has no {BUNDLE_FORMAT} manifest: not a dockerlaunch bundle, or truncated")
    entries = [BundleEntry(**e) for e in manifest["images"]]
    for e in entries:
        got = seen.get(e.file)
        if got is None:
            raise TransferError(f"bundle {path}: {e.file} ({e.ref}) is listed but missing; nothing was tagged")
        if got[0] != e.sha256 or got[1] != e.bytes:
            raise TransferError(f"bundle {path}: checksum mismatch for {e.ref} ({e.file}); the file is corrupted; "
                                  "nothing was tagged")
        if e.file in failed:
            raise TransferError(f"{where}: docker load of {e.ref} ({e.file}) failed: {failed[e.file]}")
        loaded.append((e, e.id))
    for e, image_id in loaded:
        status, out = run(["docker", "image", "inspect", "--format", "{{.Id}}", image_id])
        if status != 0 or out.strip() != image_id:
            raise TransferError(f"{where}: after loading {e.ref}, Image ID {image_id[7:19]} is missing")
        status, out = run(["docker", "tag", image_id, e.ref])
        if status != 0:
            raise TransferError(f"{where}: tagging {e.ref} failed: {out.strip()[-200:]}")
    return entries


def local_runner(argv: list[str]) -> tuple[int, str]:
    r = subprocess.run(argv, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def remote_runner(remote: Remote) -> Callable[[list[str]], tuple[int, str]]:
    def run(argv: list[str]) -> tuple[int, str]:
        r = remote.run(argv, timeout=120)
        return r.exit_status, r.stdout + r.stderr

    return run
