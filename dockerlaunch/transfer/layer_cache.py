"""The launcher's layer cache: a thin push's new layers without `docker save` reading the whole image.

`docker save` has no "only these layers": for an ms-swift bump it reads and tars the whole 7.7 GB image (twice on
Docker 20.10) to hand over 260 MB. The engine's own `docker push` reads only the layers a registry lacks, so the
launcher runs one on 127.0.0.1 over its cache (Debian's docker-registry, distribution 2.8), pushes the image into
it, and makes the hosts' stream from the registry's blobs: a blob gunzipped is its layer's uncompressed tar, whose
sha256 is the diff ID (checked as it streams). The hosts get the stream they get today (no registry, no port
forward on them; every check push makes stays). The first push of a lineage fills the registry (the engine reads
and gzips the whole image once); later bumps cost their new layers. Measured in benchmarks/RESULTS.md ("Issue 43").

A launcher engine with containerd's store pushes the blobs of its content store as they are (compressed, never
gzipped again): the stream carries them as its `docker save` would, so the facts (and the Image ID every host
gives the image) are the save's, read here from the manifest the engine pushed, without reading the image. Any
failure falls back to `docker save`, said in the push's summary.

Here: the registry's storage (blobs, their sizes, the cap by age), the image read from it (`registry_image`, and
`CachedLayers`, a push's tar source), and what `dockerlaunch cache` shows and prunes. The registry process and the
engine's push into it are transfer/cache_server.py's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from dockerlaunch.cache import write_whole
from dockerlaunch.errors import TransferError
from dockerlaunch.transfer.cache_server import REPO, engine_push, mode, private_root, root, serve, unavailable
from dockerlaunch.transfer.image_facts import GRAPHDRIVER, LayerSource, LocalImage
from dockerlaunch.transfer.oci import COMPRESSED_MAGIC, OCI_CONFIG, OCI_LAYER, Blob, SaveFacts
from dockerlaunch.transfer.pipes import CHUNK, Pipe
from dockerlaunch.transfer.push_plan import CacheState

CAP_ENV = "DOCKERLAUNCH_LAYER_CACHE_GB"  # after a push, the least recently used blobs go until the storage fits
CAP_GB = 30


@contextlib.contextmanager
def _locked(wait: bool = True) -> Iterator[bool]:
    """One launcher at a time fills the registry (two pushes of one blob would race in its upload folders). Yields
    whether it holds the lock: without `wait`, False at once when another holds it."""
    fd = os.open(private_root() / "lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def blob_path(digest: str) -> Path:
    algo, hexd = digest.split(":", 1)
    return root() / "store" / "docker" / "registry" / "v2" / "blobs" / algo / hexd[:2] / hexd / "data"


class _Gunzip(IO[bytes]):
    """A registry blob read as its layer's uncompressed tar, checked against the diff ID at its end; with
    `raw`, read as it is and checked against its own digest (a containerd-store engine's blob, as its save has it)."""

    def __init__(self, path: Path, diff_id: str, raw: bool = False, fd: int | None = None):
        self.f = open(path, "rb") if fd is None else _At(fd)
        self.z = None if raw else zlib.decompressobj(wbits=31)
        self.h = hashlib.sha256()
        self.diff_id, self.path, self.buf, self.n, self.done = diff_id, path, b"", 0, False

    def read(self, n: int = -1) -> bytes:
        while not self.done and (n < 0 or len(self.buf) < n):
            raw = self.f.read(CHUNK)
            if raw:
                out = self.z.decompress(raw) if self.z else raw
            else:
                out, self.done = self.z.flush() if self.z else b"", True
                self.f.close()
            self.h.update(out)
            self.n += len(out)
            self.buf += out
            if self.done and "sha256:" + self.h.hexdigest() != self.diff_id:
                raise TransferError(f"the launcher's registry blob {self.path} is not layer {self.diff_id[7:19]} "
                                    f"(its sha256 is {self.h.hexdigest()[:12]}): delete {root()} and push again")
        out, self.buf = (self.buf, b"") if n < 0 else (self.buf[:n], self.buf[n:])
        return out

    def close(self) -> None:
        self.f.close()


class _At:
    """A blob another holds open, read from its start with offsets of this reader's own (streams to several hosts
    read one blob at once)."""

    def __init__(self, fd: int):
        self.fd, self.at = fd, 0

    def read(self, n: int) -> bytes:
        data = os.pread(self.fd, n, self.at)
        self.at += len(data)
        return data

    def close(self) -> None:
        pass


class _Held:
    """The blobs a push streams, opened while the registry's lock is held: another launcher's cap or
    `cache prune` may remove them from the storage before the stream reaches them (the lock is not held through a
    push), and an open file is still read whole. Closed when the push's image is let go (or the process ends)."""

    def __init__(self, paths: list[Path]):
        self.fds: list[int] = []
        try:
            for path in paths:
                self.fds.append(os.open(path, os.O_RDONLY | os.O_NOFOLLOW))
        except OSError as e:
            self.close()
            raise TransferError(f"cannot open {path} of the launcher's registry ({e.strerror}): push again, or with "
                                f"DOCKERLAUNCH_LAYER_SOURCE=save") from None

    def close(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __copy__(self) -> _Held:
        return self  # one owner of the descriptors: a copy that closed them would close another's

    def __deepcopy__(self, memo: dict) -> _Held:
        return self

    def __reduce__(self):
        raise TypeError("open registry blobs belong to this process: they cannot be pickled")


def _measure(path: Path, diff_id: str) -> int:
    """Uncompressed size of a layer blob, its diff ID checked on the way."""
    g = _Gunzip(path, diff_id)
    try:
        while g.read(CHUNK):
            pass
        return g.n
    finally:
        g.close()


def _sizes() -> dict[str, int]:
    try:
        data = json.loads((root() / "sizes.json").read_text())
        return {k: int(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError, TypeError):
        return {}


ENGINE_SIZES = "engine_sizes.json"  # diff ID -> the layer's size as its engine gives it (the unit of an image's Size)


def _engine_sizes() -> dict[str, int]:
    try:
        data = json.loads((root() / ENGINE_SIZES).read_text())
        return {k: int(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError, TypeError):
        return {}


LAYER_BLOBS = "layer_blobs.json"  # diff ID -> the digest of its blob in the registry, for every layer a push read


def _layer_blobs() -> dict[str, str]:
    try:
        data = json.loads((root() / LAYER_BLOBS).read_text())
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _remember_layer_blobs(image: LocalImage, blobs: list[str]) -> None:
    """Which blob holds each of the image's layers (RootFS order): what the cache holds is read from this, and from
    the manifests it stores, whose blobs eviction may take before a layer's."""
    index = _layer_blobs()
    index.update({d: "sha256:" + Path(b).parent.name for d, b in zip(image.diff_ids, blobs)})
    _write_json(root() / LAYER_BLOBS, index)


def _remember_engine_sizes(image: LocalImage, pushed: dict[str, int]) -> None:
    """The sizes the engine gave the layers it pushed (by the first 12 hex digits of their diff IDs), by diff ID:
    what the cache holds of an image is then counted in the unit of the image's own Size (holdings)."""
    if not pushed:
        return
    sizes = _engine_sizes()
    sizes.update({d: pushed[d[7:19]] for d in image.diff_ids if d[7:19] in pushed})
    _write_json(root() / ENGINE_SIZES, sizes)


def _limit() -> float:
    cap = os.environ.get(CAP_ENV, "").strip()
    if not cap:
        return CAP_GB * 1e9
    if not cap.replace(".", "", 1).isdigit():
        raise TransferError(f"{CAP_ENV}={cap[:40]!r}: give the registry's cap in GB, e.g. {CAP_ENV}={CAP_GB}")
    return float(cap) * 1e9


def _blobs() -> list[tuple[Path, int, float]]:
    """(folder, bytes, last used) of every blob in the registry's storage; a push touches the blobs it used."""
    out = []
    for data in (root() / "store" / "docker" / "registry" / "v2" / "blobs" / "sha256").glob("*/*/data"):
        with contextlib.suppress(OSError):
            st = data.stat()
            out.append((data.parent, st.st_size, st.st_mtime))
    return out


def evictions(blobs: list[tuple[Path, int, float]], keep: set[str], free_up: float) -> list[Path]:
    """The least recently used blobs not in `keep` (digests) whose bytes make up `free_up`, oldest first."""
    out, freed = [], 0
    for folder, size, _ in sorted(blobs, key=lambda b: b[2]):
        if freed >= free_up:
            break
        if "sha256:" + folder.name not in keep:
            out.append(folder)
            freed += size
    return out


def _evict(free_up: float, keep: set[str] = frozenset()) -> None:
    """Removes the least recently used blobs. The registry still lists a removed blob in its repository, but
    asked for it (the engine's HEAD before it skips a layer) it answers unknown, so the engine pushes it again
    when an image needs it: an evicted layer costs one more read, never a wrong stream (diff IDs are checked)."""
    for folder in evictions(_blobs(), keep, free_up):
        shutil.rmtree(folder, ignore_errors=True)


def _clean_uploads() -> None:
    """Upload folders a killed push left (none is running: the caller holds the lock)."""
    repos = root() / "store" / "docker" / "registry" / "v2" / "repositories"
    for uploads in repos.glob("**/_uploads"):
        shutil.rmtree(uploads, ignore_errors=True)


def _cap(keep: set[str]) -> None:
    """Keeps the registry's storage under its cap (DOCKERLAUNCH_LAYER_CACHE_GB) after a push: the blobs that push
    used are marked as just used, then the least recently used others go until the storage fits."""
    now = time.time()
    for digest in keep:
        with contextlib.suppress(OSError):
            os.utime(blob_path(digest), (now, now))
    over = sum(size for _, size, _ in _blobs()) - _limit()
    if over > 0:
        _evict(over, keep)


def registry_image(client, image: LocalImage, on_progress: Callable[[int], None] | None = None) -> LocalImage:
    """The image with facts and layer blobs from the launcher's registry, after the engine's push into it (which
    reads only the layers the registry lacks; `on_progress` hears the bytes it reads, as it reads them). Waits for
    another push that fills the registry. Raises TransferError when the registry cannot serve."""
    got = fill(client, image, on_progress)
    assert got is not None  # a fill that may wait always runs
    return got


FILLING = "filling.json"  # who fills the cache in the background now: pid, image, since, bytes read


def fill(client, image: LocalImage, on_progress: Callable[[int], None] | None = None,
         background: bool = False) -> LocalImage | None:
    """The engine's push of the image into the launcher's registry, and the image as the registry serves it
    (registry_image). `background` (a fill after a push, push.fill_later): None at once when the cache is in use,
    and while it runs FILLING says who fills what, and how far (`dockerlaunch cache` shows it)."""
    _limit()  # a cap that is not a number says so before the engine pushes anything
    with _locked(wait=not background) as held:
        if not held:
            return None
        status = root() / FILLING
        if background:
            said = {"pid": os.getpid(), "image": image.ref, "id": image.id, "since": time.time(), "read": 0}
            last = [0.0]

            def heard(n: int) -> None:
                said["read"] += n
                if time.monotonic() - last[0] >= 1:
                    last[0] = time.monotonic()
                    _write_json(status, said)
                if on_progress:
                    on_progress(n)

            _write_json(status, said)
        try:
            return _registry_image(client, image, heard if background else on_progress)
        finally:
            if background:
                status.unlink(missing_ok=True)


def _write_json(path: Path, data: dict) -> None:
    write_whole(path, json.dumps(data))


def _registry_image(client, image: LocalImage, on_progress: Callable[[int], None] | None) -> LocalImage:
    """registry_image, the lock held."""
    _clean_uploads()
    need = image.size + 2e9  # its gzip copy, with room to spare: the launcher's disk is never filled
    store = private_root()
    free = shutil.disk_usage(store).free
    if free < need:  # older layers make room, oldest first
        _evict(need - free)
        free = shutil.disk_usage(store).free
    if free < need:
        raise TransferError(f"{free / 1e9:.1f} GB free for the launcher's registry in {root()}, "
                            f"{image.size / 1e9:.1f} GB image")
    before = sum(size for _, size, _ in _blobs())
    pushed: dict[str, int] = {}
    with serve() as reg:
        manifest = engine_push(client, image, reg, on_progress, pushed)
    _remember_engine_sizes(image, pushed)
    image = replace(image, source=LayerSource("cache", 0.0, max(0, sum(size for _, size, _ in _blobs()) - before),
                                              str(root())))
    if image.store != GRAPHDRIVER:
        got = _content_store_image(image, manifest)
        _remember_layer_blobs(image, list(got.tar_source.blobs))
        _cap({got.facts.config.digest, *(b.digest for b in got.facts.layers)})  # got holds its blobs open
        return got
    config, layers = manifest.get("config") or {}, manifest.get("layers") or []
    if config.get("digest") != image.id or len(layers) != len(image.diff_ids):
        raise TransferError(f"the launcher's registry holds another manifest for {image.ref} (config "
                            f"{str(config.get('digest'))[:19]}, {len(layers)} layers)")
    sizes = _sizes()
    blobs, facts_layers = [], []
    for diff_id, layer in zip(image.diff_ids, layers):
        path = blob_path(str(layer.get("digest")))
        if not path.is_file():
            raise TransferError(f"the launcher's registry lacks blob {layer.get('digest')}")
        if diff_id not in sizes:
            sizes[diff_id] = _measure(path, diff_id)
        blobs.append(str(path))
        facts_layers.append(Blob(f"blobs/sha256/{diff_id[7:]}", diff_id, sizes[diff_id], OCI_LAYER))
    write_whole(root() / "sizes.json", json.dumps(sizes, indent=0, sort_keys=True))
    cfg = blob_path(image.id).read_bytes()
    if "sha256:" + hashlib.sha256(cfg).hexdigest() != image.id:
        raise TransferError(f"the launcher's registry blob {blob_path(image.id)} is not {image.ref}'s config")
    _remember_layer_blobs(image, blobs)
    held = _Held([Path(b) for b in blobs])
    _cap({image.id, *(str(layer.get("digest")) for layer in layers)})
    facts = SaveFacts(Blob(f"blobs/sha256/{image.id[7:]}", image.id, len(cfg), OCI_CONFIG), tuple(facts_layers),
                      image.platform)
    return replace(image, facts=facts, tar_source=CachedLayers(tuple(blobs), cfg, held))


def _content_store_image(image: LocalImage, manifest: dict) -> LocalImage:
    """A containerd-store engine's image from the blobs it pushed as they are: the facts its save would give (blob
    paths and digests, each layer's media type from its first bytes), so hosts name it as they always did."""
    config, layers = manifest.get("config") or {}, manifest.get("layers") or []
    if len(layers) != len(image.diff_ids):
        raise TransferError(f"the launcher's registry holds {len(layers)} layers for {image.ref}, "
                            f"the image has {len(image.diff_ids)}")
    cfg_digest = str(config.get("digest"))
    cfg = blob_path(cfg_digest).read_bytes()
    if "sha256:" + hashlib.sha256(cfg).hexdigest() != cfg_digest:
        raise TransferError(f"the launcher's registry blob {blob_path(cfg_digest)} is not {cfg_digest}")
    if (json.loads(cfg).get("rootfs") or {}).get("diff_ids") != list(image.diff_ids):
        raise TransferError(f"the config the launcher's registry holds for {image.ref} names other layers")
    blobs, facts_layers = [], []
    for layer in layers:
        digest, size, path = str(layer.get("digest")), int(layer.get("size", -1)), blob_path(str(layer.get("digest")))
        if not path.is_file() or path.stat().st_size != size:
            raise TransferError(f"the launcher's registry lacks blob {digest} ({size} bytes)")
        with open(path, "rb") as f:
            head = f.read(4)
        suffix = next((kind for magic, kind in COMPRESSED_MAGIC if head.startswith(magic)), "")
        facts_layers.append(Blob(f"blobs/sha256/{digest[7:]}", digest, size, OCI_LAYER + suffix))
        blobs.append(str(path))
    facts = SaveFacts(Blob(f"blobs/sha256/{cfg_digest[7:]}", cfg_digest, len(cfg), OCI_CONFIG), tuple(facts_layers),
                      image.platform)
    return replace(image, facts=facts, tar_source=CachedLayers(tuple(blobs), cfg, _Held([Path(b) for b in blobs])))


@dataclass(frozen=True)
class CachedLayers:
    """A push's tar source (image_facts.TarSource) where the layer cache serves the image: each layer's blob in the
    registry's storage, in RootFS order (registry_image finds them)."""

    blobs: tuple[str, ...]
    config: bytes = field(default=b"", repr=False)  # read (and checked) while the lock was held
    held: _Held | None = field(default=None, repr=False, compare=False)

    def tar(self, client, image: LocalImage, skip: set[str]) -> Iterator[bytes]:
        return chunks(image, self.blobs, skip, self.config, self.held)


def chunks(image: LocalImage, blobs: tuple[str, ...], skip: set[str], config: bytes = b"",
           held: _Held | None = None) -> Iterator[bytes]:
    """A `docker save`-shaped tar of the image from the registry's blobs: its config, every layer not in `skip`
    (uncompressed and checked against its diff ID; a containerd-store engine's as its save has them, checked
    against their digests), manifest.json. What image_chunks re-streams. With `held`, the blobs are read from the
    files opened under the lock (whatever the storage holds by now)."""
    assert image.facts is not None and len(blobs) == len(image.facts.layers)
    assert held is None or len(held.fds) == len(blobs)
    facts = image.facts
    pipe = Pipe()

    def member(name: str, size: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = size, 0o644, 0
        return info

    def produce() -> None:
        try:
            with tarfile.open(fileobj=pipe, mode="w|", format=tarfile.GNU_FORMAT) as tar:
                cfg = config or blob_path(facts.config.digest).read_bytes()
                tar.addfile(member(facts.config.path, len(cfg)), io.BytesIO(cfg))
                for i, (blob, path) in enumerate(zip(facts.layers, blobs)):
                    if blob.path in skip:
                        continue
                    g = _Gunzip(Path(path), blob.digest, raw=image.store != GRAPHDRIVER,
                                fd=held.fds[i] if held is not None else None)
                    try:
                        tar.addfile(member(blob.path, blob.size), g)
                        if g.read(1) or not g.done:  # more bytes than its recorded size
                            raise TransferError(f"layer {blob.digest[7:19]} in the launcher's registry is not "
                                                f"{blob.size} bytes: delete {root()} and push again")
                    finally:
                        g.close()
                body = json.dumps([{"Config": facts.config.path, "RepoTags": None,
                                    "Layers": [b.path for b in facts.layers]}]).encode()
                tar.addfile(member("manifest.json", len(body)), io.BytesIO(body))
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            pipe.fail(e)
        finally:
            pipe.close()

    threading.Thread(target=produce, daemon=True).start()
    yield from pipe.chunks()


# ---------------------------------------------------------------- what the cache holds, for a push's route


def _tags() -> Iterator[str]:
    """The manifest digest of every image the engine pushed into the cache (one tag each)."""
    tags = root() / "store" / "docker" / "registry" / "v2" / "repositories" / REPO / "_manifests" / "tags"
    for tag in sorted(tags.glob("*")) if tags.is_dir() else []:
        with contextlib.suppress(OSError):
            yield (tag / "current" / "link").read_text().strip()


def _image_manifests(digest: str, depth: int = 0) -> list[dict]:
    """The image manifests a stored manifest is or names (an index's followed); [] if it is gone or broken."""
    try:
        doc = json.loads(blob_path(digest).read_bytes())
    except (OSError, ValueError):
        return []
    if not isinstance(doc, dict):
        return []
    if doc.get("manifests") and depth < 2:
        return [m for d in doc["manifests"] if isinstance(d, dict)
                for m in _image_manifests(str(d.get("digest")), depth + 1)]
    return [doc]


def holdings() -> dict[str, int]:
    """diff ID -> bytes of every layer the cache holds, read from its storage (no registry is started): a layer a
    push read from it (LAYER_BLOBS) or a stored image's manifest names (its config giving the diff ID), whose blob
    is still there (eviction takes blobs, a manifest's too).
    Bytes are the engine's own for the layer (ENGINE_SIZES, the unit of an image's Size) where its push said them,
    else the layer's as a tar (sizes.json), else its blob's (a containerd-store engine's blob as it is). A blob the
    engine pushed without finishing its image (a fill cut off) is not counted: the next fill finds it there and
    reads it no more."""
    blobs = {"sha256:" + folder.name: size for folder, size, _ in _blobs()}
    sizes = {**_sizes(), **_engine_sizes()}
    out = {d: sizes.get(d, blobs[b]) for d, b in _layer_blobs().items() if b in blobs}
    for digest in _tags():
        for manifest in _image_manifests(digest):
            layers = [d for d in manifest.get("layers") or [] if isinstance(d, dict)]
            try:
                config = json.loads(blob_path(str((manifest.get("config") or {}).get("digest"))).read_bytes())
                diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
            except (OSError, ValueError, AttributeError):
                continue
            if len(diff_ids) != len(layers):
                continue
            for diff_id, layer in zip(diff_ids, layers):
                blob = str(layer.get("digest"))
                if isinstance(diff_id, str) and blob in blobs:
                    out[diff_id] = sizes.get(diff_id, blobs[blob])
    return out


def filling() -> dict | None:
    """The fill running in the background now (FILLING: pid, image, id, since, read), or None. Its file is written
    once it holds the lock and removed when it ends; a file whose writer is gone (the lock is free) is stale."""
    status = root() / FILLING
    try:
        said = json.loads(status.read_text())
    except (OSError, ValueError):
        return None
    with _locked(wait=False) as free:
        if free:  # nobody holds the lock: the fill that wrote this was killed
            status.unlink(missing_ok=True)
            return None
    return said if isinstance(said, dict) else None


def filling_text(said: dict) -> str:
    """`pid 123, wtpush/demo:v1, 300 MB read in 12 s`: a background fill, for a person."""
    since = max(0.0, time.time() - float(said.get("since") or time.time()))
    return (f"pid {said.get('pid')}, {str(said.get('image'))[:80]}, {int(said.get('read') or 0) / 1e6:.0f} MB read "
            f"in {since:.0f} s")


def cache_state(image: LocalImage, info: dict | None) -> CacheState:
    """What the layer cache can do for `image` now: push_plan.choose_route's input (the rule is there, pure)."""
    why = unavailable(image, info)
    if why is not None:
        return CacheState(unavailable=why)
    busy = filling()
    return CacheState(held=holdings(), filling=filling_text(busy) if busy else "", forced=mode() == "cache",
                      copies=image.store != GRAPHDRIVER)


def start_fill(image: LocalImage) -> int:
    """A fill of the cache with `image` (by its ID) in a process of its own, in a session of its own, so that the
    push that starts it ends when its hosts are done: `dockerlaunch cache fill ID --background`, which returns at
    once when the cache is in use. Its output goes to the cache's fill.log. The pid."""
    import subprocess
    import sys

    log = open(private_root() / "fill.log", "ab")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "dockerlaunch", "cache", "fill", image.id, "--background"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()
    threading.Thread(target=proc.wait, daemon=True, name="dl-fill-reaper").start()  # a launcher that lives on reaps it
    return proc.pid


# ---------------------------------------------------------------- `dockerlaunch cache`: see and prune it


@dataclass(frozen=True)
class CachedImage:
    """One image the layer cache holds (a tag the engine pushed: the first 12 hex of its Image ID)."""

    id: str
    layers: int  # layers its manifest names
    cached: int  # of those, blobs still in the cache (eviction takes blobs, not images)
    bytes: int  # its blobs' bytes in the cache (gzipped; a layer shared by images counts in each)
    last_used: float  # the newest of its blobs' last use (epoch seconds), 0 if none is left


@dataclass(frozen=True)
class CacheFacts:
    where: str
    bytes: int
    blobs: int
    cap: float
    oldest: float  # last use of the least recently used blob (epoch seconds; 0 when empty)
    newest: float
    images: tuple[CachedImage, ...]
    filling: dict | None = None  # the fill running in the background now (FILLING), if one is

    def to_dict(self) -> dict:
        return {"path": self.where, "bytes": self.bytes, "blobs": self.blobs, "cap_bytes": int(self.cap),
                "oldest_use": self.oldest, "newest_use": self.newest,
                "registry": "127.0.0.1, only while a push or a fill runs", "filling": self.filling,
                "images": [i.__dict__ for i in self.images]}


def _manifest_layers(digest: str) -> list[str]:
    """The blobs (config and layers) a stored manifest names, an index's manifests followed; [] if it is gone."""
    return [str(b.get("digest")) for doc in _image_manifests(digest)
            for b in [doc.get("config") or {}, *(doc.get("layers") or [])] if isinstance(b, dict) and b.get("digest")]


def cache_facts() -> CacheFacts:
    """What the layer cache holds, read from its storage on disk (no registry is started)."""
    blobs = _blobs()
    by_digest = {"sha256:" + folder.name: (size, used) for folder, size, used in blobs}
    tags = root() / "store" / "docker" / "registry" / "v2" / "repositories" / REPO / "_manifests" / "tags"
    images = []
    for tag in sorted(tags.glob("*")) if tags.is_dir() else []:
        try:
            digest = (tag / "current" / "link").read_text().strip()
        except OSError:
            continue
        names = _manifest_layers(digest)
        present = [by_digest[d] for d in dict.fromkeys(names) if d in by_digest]
        layers = max(0, len(names) - 1)  # less the config
        cached = sum(1 for d in names[1:] if d in by_digest)
        images.append(CachedImage(tag.name, layers, cached, sum(s for s, _ in present),
                                  max((u for _, u in present), default=0.0)))
    images.sort(key=lambda i: -i.last_used)
    uses = [u for _, _, u in blobs]
    return CacheFacts(str(root()), sum(s for _, s, _ in blobs), len(blobs), _limit(), min(uses, default=0.0),
                      max(uses, default=0.0), tuple(images), filling() if root().is_dir() else None)


def unused_since(blobs: list[tuple[Path, int, float]], cutoff: float) -> list[tuple[Path, int, float]]:
    """The blobs last used before `cutoff` (epoch seconds), oldest first."""
    return sorted((b for b in blobs if b[2] < cutoff), key=lambda b: b[2])


@dataclass(frozen=True)
class Pruned:
    blobs: int
    bytes: int
    kept_blobs: int
    kept_bytes: int


def prune(older_than: float | None = None) -> Pruned:
    """Removes the whole layer cache, or (`older_than` seconds) the blobs no push used for that long. Never while a
    push fills it: that push holds the lock, and this says so instead of waiting. A push that streams from it
    has its blobs open (`_Held`) and streams them whole."""
    store = root()
    if not store.is_dir():
        return Pruned(0, 0, 0, 0)
    fd = os.open(private_root() / "lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            busy = filling()
            who = f"a fill ({filling_text(busy)})" if busy else "a push"
            raise TransferError(f"{who} is using the layer cache ({store}) now; prune it after that") from None
        blobs = _blobs()
        if older_than is None:
            gone = blobs
            shutil.rmtree(store / "store", ignore_errors=True)
            (store / "sizes.json").unlink(missing_ok=True)
        else:
            gone = unused_since(blobs, time.time() - older_than)
            for folder, _, _ in gone:
                shutil.rmtree(folder, ignore_errors=True)
        kept = [b for b in blobs if b not in gone]
        return Pruned(len(gone), sum(b[1] for b in gone), len(kept), sum(b[1] for b in kept))
    finally:
        os.close(fd)
