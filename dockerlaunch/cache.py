"""What dockerlaunch keeps on this machine: one cache folder for everything it can rebuild (wheelhouses, save
tars, the launcher's layer registry, base tables), and the records of what verify found in an image, which doctor
judges from (deleting them costs a scan, never a wrong verdict: a missing record is read as "not scanned")."""

from __future__ import annotations

import os
from pathlib import Path

from dockerlaunch.gpu.needs import ImageNeeds


def cache_root() -> Path:
    """Where dockerlaunch caches things it can rebuild (wheelhouses, save tars, layer maps)."""
    return Path(os.environ.get("DOCKERLAUNCH_CACHE_DIR", "~/.cache/dockerlaunch")).expanduser()


# What an image needs of a GPU host, by Image ID: `dockerlaunch verify` keeps, per image it scanned, the cubins and
# PTX of every library with device code, the CUDA its runtime wheel is and its cuda-compat (gpu.needs.ImageNeeds);
# doctor reads it for an image without dockerlaunch's labels instead of scanning it again.


def image_needs_path(image_id: str) -> Path:
    return cache_root() / "verify" / "images" / f"{image_id.removeprefix('sha256:')[:64]}.json"


def save_image_needs(image_id: str, needs: ImageNeeds) -> None:
    import json

    path = image_needs_path(image_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(needs.to_record()))
    tmp.replace(path)


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
