"""Split bundles, for media with a file-size limit (FAT32 holds files under 4 GiB): parts and their index.

`save --split SIZE` cuts a bundle into FILE.001.. and FILE becomes their index (each part's name, size and sha256,
and the whole bundle's); `load` reads the parts as one file once every one is present and whole.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import BinaryIO

from dockerlaunch.cache import write_whole
from dockerlaunch.errors import TransferError
from dockerlaunch.transfer.pipes import CHUNK

PARTS_FORMAT = "dockerlaunch-parts/1"
MAX_INDEX = 1 << 20


def split_bundle(path: Path, size: int) -> list[Path]:
    """The bundle at `path` as parts `path.001`.. of at most `size` bytes, and `path` itself becomes their index
    (each part's name, size and sha256, and the whole bundle's): FAT32 media hold 4 GiB files at most."""
    parts: list[dict] = []
    whole = hashlib.sha256()
    with open(path, "rb") as src:
        n = 0
        while True:
            n += 1
            name = f"{path.name}.{n:03d}"
            h, written = hashlib.sha256(), 0
            part = path.with_name(name)
            with open(part, "wb") as out:
                while written < size:
                    chunk = src.read(min(CHUNK, size - written))
                    if not chunk:
                        break
                    out.write(chunk)
                    h.update(chunk)
                    whole.update(chunk)
                    written += len(chunk)
            if not written:
                part.unlink()
                break
            parts.append({"name": name, "size": written, "sha256": h.hexdigest()})
    write_whole(path, json.dumps({"format": PARTS_FORMAT, "sha256": whole.hexdigest(), "parts": parts}, indent=1))
    return [path.with_name(p["name"]) for p in parts]


def _parts_index(path: Path) -> dict | None:
    """The parts index at `path`, or None when `path` is a whole bundle."""
    with open(path, "rb") as f:
        head = f.read(MAX_INDEX + 1)
    if not head.startswith(b"{"):
        return None
    try:
        index = json.loads(head)
    except ValueError:
        raise TransferError(f"bundle {path}: not a bundle and not a parts index; nothing was loaded") from None
    parts = index.get("parts") if isinstance(index, dict) else None
    if index.get("format") != PARTS_FORMAT or not isinstance(parts, list) or not parts or not all(
            isinstance(p, dict) and re.fullmatch(re.escape(path.name) + r"\.\d{3}", str(p.get("name", "")))
            and isinstance(p.get("size"), int) and re.fullmatch(r"[0-9a-f]{64}", str(p.get("sha256", "")))
            for p in parts):
        raise TransferError(f"bundle {path}: a malformed parts index; nothing was loaded")
    return index


def check_parts(path: Path) -> None:
    """Every part of a split bundle present beside its index (copied in any order), with its size and sha256:
    one line naming the first that is missing or damaged."""
    index = _parts_index(path)
    if index is None:
        return
    for p in index["parts"]:
        part = path.with_name(p["name"])
        if not part.is_file():
            raise TransferError(f"bundle {path}: part {p['name']} is missing (of {len(index['parts'])}); copy it "
                                "beside the others; nothing was loaded")
        h = hashlib.sha256()
        with open(part, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        if (h.hexdigest(), part.stat().st_size) != (p["sha256"], p["size"]):
            raise TransferError(f"bundle {path}: part {p['name']} is damaged (sha256 {h.hexdigest()[:12]}, "
                                f"expected {p['sha256'][:12]}); copy it again; nothing was loaded")


class _Joined(io.RawIOBase):
    """The parts of a split bundle read as one file, in the index's order."""

    def __init__(self, files: list[Path]):
        self.files, self.f = list(files), None

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while True:
            if self.f is None:
                if not self.files:
                    return 0
                self.f = open(self.files.pop(0), "rb")
            n = self.f.readinto(b)
            if n:
                return n
            self.f.close()
            self.f = None

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
        super().close()


def open_bundle(path: Path) -> BinaryIO:
    index = _parts_index(path)
    if index is None:
        return open(path, "rb")
    return io.BufferedReader(_Joined([path.with_name(p["name"]) for p in index["parts"]]), CHUNK)


def bundle_path(given: str) -> Path:
    """What `load` was given: a bundle, a split bundle's index, or one of its parts (`x.dlb.002` -> `x.dlb`)."""
    path = Path(given)
    m = re.fullmatch(r"(.+)\.\d{3}", path.name)
    if m and path.with_name(m.group(1)).is_file():
        return path.with_name(m.group(1))
    return path
