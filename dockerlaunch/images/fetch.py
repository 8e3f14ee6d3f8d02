"""`fetch`: exactly the stack's lock for its Python into a wheelhouse (hashes checked by pip), the sources pinned by
content, and the compiled wheels; a layer is asked again only when its locked part changed."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from dockerlaunch.errors import BuildError
from dockerlaunch.images import lock as locks
from dockerlaunch.images import sources
from dockerlaunch.images.build import _LOG, flash_attn_prebuilt
from dockerlaunch.images.build_argv import BuildOptions, flash_drop
from dockerlaunch.images.build_context import _dist_of
from dockerlaunch.images.index import file_sha256
from dockerlaunch.images.layers import LAYERS
from dockerlaunch.images.stacks import Stack, default_dockerfiles_dir

FETCH_STAMPS = ".dockerlaunch-fetch.json"  # in the wheelhouse: each layer's requirements when last fetched


def lock_sources(lock: locks.Lock) -> tuple[list[str], list[str]]:
    """(indexes, find-links folders) the lock was resolved from, as its `# sources:` line says."""
    indexes, folders = [], []
    for part in lock.header.get("sources", "").split(";"):
        part = part.strip()
        if part.startswith("find-links "):
            folders.append(part[len("find-links "):])
        elif part:
            indexes.append(part)
    return indexes, folders


def fetch(stack: Stack, out_dir: Path, log=None, dockerfiles: Path | None = None, index_url: str | None = None,
          find_links: Sequence[str] = ()) -> dict[str, int]:
    """Download exactly the stack's lock, layer by layer, and the source archives of git pins, for offline builds.
    Each file is found on the index (or a find-links folder) by the lock's sha256 for the stack's Python and
    platform, whatever Python runs this, and checked as it arrives. Every file is the locked one, byte for byte:
    the few sdists (crcmod, oss2...) stay sdists and the image's top layer builds them with the build layer's
    setuptools, so the offline build can check each file against the committed lock, not against a list this
    machine wrote. Each layer's `<layer>.lock` beside its folder names its files, for --require-hashes."""
    from dockerlaunch.images import index as idx

    log = log or (lambda msg: _LOG.info("[fetch] %s", msg))
    lock = locks.checked(stack, dockerfiles or default_dockerfiles_dir())
    out_dir.mkdir(parents=True, exist_ok=True)
    indexes, folders = lock_sources(lock)
    if index_url:
        indexes = [index_url, *indexes[1:]]
    indexes = indexes or [locks.DEFAULT_INDEX]
    torch = lock.get("torch")
    if stack.torch_index_url and torch and "+" in torch.version:
        indexes.append(stack.torch_index_url)
    folders = [*find_links, *folders]
    tags = idx.target_tags(stack.python)
    archives = {p.archive_name for p in (stack.apex, stack.megatron_lm) if p}
    # What each layer was last fetched with: after a pin bump only the layers whose locked part changed are
    # asked of the index again (a whole fetch is minutes; one layer's is seconds when the rest is unchanged).
    stamps_file = out_dir / FETCH_STAMPS
    try:
        stamps = json.loads(stamps_file.read_text()) if stamps_file.exists() else {}
    except (OSError, ValueError):
        stamps = {}
    for layer in LAYERS:
        dest = out_dir / layer
        dest.mkdir(exist_ok=True)
        part = lock.layer_text(layer, flash_drop(stack))
        if not part:
            continue
        # a lock entry lists every Python's files: the same part fetched for another Python is other files
        digest = hashlib.sha256(f"{stack.python} {locks.PLATFORM}\n{part}".encode()).hexdigest()
        pins = " ".join(f"{e.name}=={e.version}" for e in lock.layer(layer)
                        if e.name in {locks.pin_name(p) for p in locks.flat_pins(stack)})
        if stamps.get(layer) == digest and (out_dir / f"{layer}.lock").is_file():
            log(f"{layer}: up to date ({pins})")
            continue
        stamps.pop(layer, None)
        stamps_file.write_text(json.dumps(stamps, indent=1))  # a fetch cut off here asks again next time
        for f in dest.iterdir():  # another lock's files: the offline build must see only this one's
            if f.is_file() and f.name not in archives:
                f.unlink()
        log(f"{layer}: downloading {len(lock.layer(layer))} locked distributions for Python {stack.python} ({pins})")
        for e in lock.layer(layer):
            if e.name not in flash_drop(stack):
                idx.download(idx.locate(e, indexes, folders, tags), dest)
        (out_dir / f"{layer}.lock").write_text(_hashed_files(lock, layer, dest, flash_drop(stack)))
        stamps[layer] = digest
        stamps_file.write_text(json.dumps(stamps, indent=1))
    for pin, layer in ((stack.apex, "4-apex"), (stack.megatron_lm, "6-megatron")):
        if pin:
            name = "apex" if pin is stack.apex else "Megatron-LM"
            src = sources.Source(f"{name} {pin.ref[:12]} source", layer, pin.archive_name, pin.sha256 or "",
                                "archive", pin.archive_url)
            got = sources.get_source(src, None, index_url, False, log, dest_dir=out_dir / layer)
            if got.parent != out_dir / layer:
                shutil.copy2(got, out_dir / layer / got.name)
    for got in flash_attn_prebuilt(stack, BuildOptions(), log, dest_dir=out_dir / "5-flash"):
        if got.parent != out_dir / "5-flash":
            shutil.copy2(got, out_dir / "5-flash" / got.name)
    return {layer: len(list((out_dir / layer).iterdir())) for layer in LAYERS}




def _hashed_files(lock: locks.Lock, layer: str, dest: Path, drop: frozenset[str]) -> str:
    """`name==version --hash=sha256:H  # file` for each locked distribution of the layer, H the file's own."""
    from packaging.version import Version

    files = {}
    for f in dest.iterdir():
        dist = _dist_of(f.name) if f.is_file() else None
        if dist:
            files[(dist[0], Version(dist[1]))] = f
    lines = []
    for e in lock.layer(layer):
        if e.name in drop:
            continue
        f = files.get((e.name, Version(e.version)))
        if f is None:
            raise BuildError(f"fetch: pip downloaded no file for {e.name}=={e.version} (layer {layer})")
        digest = file_sha256(f)  # in chunks: the torch wheel alone is 0.5-0.9 GB
        lines.append(f"{e.name}=={e.version} --hash=sha256:{digest}  # {f.name}")
    return "\n".join(lines) + "\n"
