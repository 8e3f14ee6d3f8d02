"""What dockerlaunch keeps on this machine: one cache folder for everything it can rebuild (wheelhouses, save
tars, the launcher's layer registry, base tables), and the records of what verify found in an image, which doctor
judges from (deleting them costs a scan, never a wrong verdict: a missing record is read as "not scanned")."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from dockerlaunch.gpu.needs import ImageNeeds


def cache_root() -> Path:
    """Where dockerlaunch caches things it can rebuild (wheelhouses, save tars, layer maps)."""
    return Path(os.environ.get("DOCKERLAUNCH_CACHE_DIR", "~/.cache/dockerlaunch")).expanduser()


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[IO[bytes]]:
    """A binary file that becomes `path` whole when the block ends, and leaves nothing when it raises. Its temporary
    name is its own: two writers of one path (threads of one push filling the same cache entry) each rename a
    complete file, where a shared `.part` name let the first rename take the second's file away mid-write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_whole(path: Path, data: str | bytes) -> None:
    with replacing(path) as f:
        f.write(data.encode() if isinstance(data, str) else data)


class HashMismatch(Exception):
    """The bytes that arrived are not the pinned ones (`got` is their sha256); nothing was written."""

    def __init__(self, got: str):
        super().__init__(got)
        self.got = got


def write_checked(src: IO[bytes], path: Path, sha256: str) -> None:
    """`src` into `path` when its bytes have the pinned `sha256`, checked as they arrive; else HashMismatch."""
    import hashlib

    digest = hashlib.sha256()
    with replacing(path) as out:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
        if digest.hexdigest() != sha256:
            raise HashMismatch(digest.hexdigest())


# What an image needs of a GPU host, by Image ID: `dockerlaunch verify` keeps, per image it scanned, the cubins and
# PTX of every library with device code, the CUDA its runtime wheel is and its cuda-compat (gpu.needs.ImageNeeds);
# doctor reads it for an image without dockerlaunch's labels instead of scanning it again.


def image_needs_path(image_id: str) -> Path:
    return cache_root() / "verify" / "images" / f"{image_id.removeprefix('sha256:')[:64]}.json"


def save_image_needs(image_id: str, needs: ImageNeeds) -> None:
    import json

    write_whole(image_needs_path(image_id), json.dumps(needs.to_record()))


def load_image_needs(image_id: str | None) -> ImageNeeds | None:
    import json
    import re

    if not re.fullmatch(r"(sha256:)?[0-9a-f]{64}", image_id or ""):
        return None
    try:
        record = json.loads(image_needs_path(image_id or "").read_text())
    except (OSError, ValueError):
        return None
    return ImageNeeds.from_record(record)
