"""The local Docker engine (the launcher's own) and dockerlaunch's cache folder.

Used by push/save/load (the images leave from here), builds and the simulator; kept apart from all
of them so that product code never imports the simulator.
"""

from __future__ import annotations

import os
from pathlib import Path

from dockerlaunch.errors import EngineError
from dockerlaunch.gpu.needs import ImageNeeds


def cache_root() -> Path:
    """Where dockerlaunch caches things it can rebuild (wheelhouses, save tars, layer maps)."""
    return Path(os.environ.get("DOCKERLAUNCH_CACHE_DIR", "~/.cache/dockerlaunch")).expanduser()


def engine():
    """The local Docker engine, or a one-line error that says how to get one."""
    import docker  # local import: the plan/config path must not need the docker SDK

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:  # docker raises DockerException / requests errors / FileNotFoundError
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        reason = str(e).splitlines()[0][:160]
        raise EngineError(
            f"no usable Docker engine at {host} ({reason}); on Debian run `sudo scripts/install-docker` "
            "(installs docker.io and starts dockerd)"
        ) from None
    return client


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
