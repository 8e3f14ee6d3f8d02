"""The image in the launcher's engine: its ID, image store, layers, and the facts of its `docker save` (cached per ID).

What a host must hold after a push (`LocalImage.expected_id`) is known from these facts, read once from the save (or,
for a thin push, from the launcher's layer cache: transfer/layer_cache.py) without keeping any of its bytes.
"""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Protocol

from dockerlaunch.cache import cache_root, write_whole
from dockerlaunch.errors import TransferError
from dockerlaunch.tars import open_untrusted
from dockerlaunch.transfer.oci import (
    COMPRESSED_MAGIC,
    OCI_CONFIG,
    OCI_LAYER,
    Blob,
    SaveFacts,
    blob_digest,
    legacy_config_digest,
    read_metadata,
)
from dockerlaunch.transfer.pipes import CHUNK, CountingReader

CONTAINERD = "containerd"  # an engine whose images live in containerd's store (Docker 29's default)
GRAPHDRIVER = "graphdriver"  # the classic store (overlay2): Docker 20.10 to 28 by default


@dataclass(frozen=True)
class LayerSource:
    """How a thin push read the image's layers: through the launcher's layer cache (`via` "cache"; `added`: the
    bytes the engine pushed into it, `where`: its folder), or one read of `docker save` (`why` the cache did not)."""

    via: str  # "cache" or "save"
    seconds: float
    added: int = 0
    where: str = ""
    why: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class TarSource(Protocol):
    """Where a push reads the image as a `docker save` tar: `docker save` (DOCKER_SAVE, the default) or the
    launcher's layer cache (layer_cache.CachedLayers). Chosen once, by push.thin_source, and carried on the
    LocalImage; the stream (streams.outgoing) reads whichever it is given. The layer files in `skip` may be left
    out (the receivers have them)."""

    def tar(self, client, image: LocalImage, skip: set[str]) -> Iterator[bytes]: ...


@dataclass(frozen=True)
class DockerSave:
    """`docker save <id>` from the launcher's engine: the whole image, whatever `skip` says."""

    def tar(self, client, image: LocalImage, skip: set[str]) -> Iterator[bytes]:
        return save_stream(client, image.id)


DOCKER_SAVE = DockerSave()


@dataclass(frozen=True)
class LocalImage:
    """An image in the launcher's engine: what it is called, its ID, size and layers (RootFS diff IDs).

    `id` is the launcher engine's own ID: the config digest in the classic store, the manifest digest in
    containerd's. What a target must hold afterwards is `expected_id(store)` (see SaveFacts).
    """

    ref: str
    id: str
    size: int
    diff_ids: tuple[str, ...] = ()
    platform: tuple[str, str, str] = ("linux", "amd64", "")  # os, architecture, variant
    store: str = GRAPHDRIVER  # the launcher engine's image store
    facts: SaveFacts | None = None  # from a read of the save (cached per ID); None until one was needed
    tar_source: TarSource = DOCKER_SAVE  # where a push reads its tar (push.thin_source picks the layer cache)
    source_note: str = ""  # how the stream's layers are read, for the push's summary
    source: LayerSource | None = None  # the same, as facts (push --dry-run and its json say them)

    @property
    def config_digest(self) -> str:
        """The image's config digest: the Image ID every classic-store engine gives it ("" until known)."""
        if self.store == GRAPHDRIVER:
            return self.id
        return self.facts.config.digest if self.facts else ""

    def expected_id(self, store: str) -> str:
        """The Image ID an engine with `store` gives this image once it loaded our stream ("" if not known
        yet): the config digest in the classic store, the digest of the manifest the stream carries in
        containerd's store."""
        if store == CONTAINERD:
            return self.facts.manifest_digest if self.facts else ""
        return self.config_digest


def engine_store(client) -> str:
    """Which image store an engine uses (its `docker info` driver status names containerd's snapshotter)."""
    status = json.dumps(client.info().get("DriverStatus") or [])
    return CONTAINERD if "io.containerd.snapshotter" in status else GRAPHDRIVER


def local_image(client, ref: str, facts: bool = True) -> LocalImage:
    """The image as the launcher's engine has it; on a containerd-store launcher, with its save facts (its
    config digest is known only from the save), unless `facts` is False (push.source_image finds them another
    way first)."""
    import docker

    try:
        img = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise TransferError(f"image {ref} is not in the local Docker engine (docker images)") from None
    a = img.attrs
    image = LocalImage(ref=ref, id=img.id, size=int(a.get("Size", 0)),
                       diff_ids=tuple(a.get("RootFS", {}).get("Layers", [])),
                       platform=(a.get("Os") or "linux", a.get("Architecture") or "amd64", a.get("Variant") or ""),
                       store=engine_store(client))
    cached = _cached_facts(image)
    if cached or (facts and image.store == CONTAINERD):
        image = with_facts(client, image)
    return image


def save_stream(client, image_id: str) -> Iterator[bytes]:
    """`docker save <id>`: by ID, so the tar names no tag."""
    return client.api.get_image(image_id, chunk_size=CHUNK)


class Recorder:
    """Watches the members of a `docker save` stream go by: sizes, the first bytes of every file (is a
    layer compressed?), links, manifest.json. At the end it knows the image's SaveFacts."""

    def __init__(self, image: LocalImage):
        self.image = image
        self.sizes: dict[str, int] = {}
        self.heads: dict[str, bytes] = {}
        self.links: dict[str, str] = {}
        self.manifest: dict | None = None

    def see(self, member: tarfile.TarInfo, f: IO[bytes] | None) -> IO[bytes] | None:
        if member.issym() or member.islnk():
            target = member.linkname if member.islnk() else posixpath.join(posixpath.dirname(member.name),
                                                                           member.linkname)
            self.links[member.name] = posixpath.normpath(target)
        elif member.isfile() and f is not None:
            self.sizes[member.name] = member.size
            return _Peek(f, lambda head: self.heads.__setitem__(member.name, head))
        return f

    def manifest_json(self, data: bytes) -> None:
        entries = json.loads(data)
        if not isinstance(entries, list) or len(entries) != 1 or not isinstance(entries[0], dict):
            raise TransferError("the image's docker save has a manifest.json that does not name one image")
        self.manifest = entries[0]

    def _resolve(self, path: str) -> str:
        seen = 0
        while path in self.links and seen < 8:
            path, seen = self.links[path], seen + 1
        return path

    def facts(self) -> SaveFacts:
        if not self.manifest:
            raise TransferError(f"docker save of {self.image.ref} has no manifest.json")
        layers = []
        paths = list(self.manifest.get("Layers") or [])
        if len(paths) != len(self.image.diff_ids):
            raise TransferError(f"docker save of {self.image.ref} names {len(paths)} layers, the image has "
                                f"{len(self.image.diff_ids)}")
        for path, diff_id in zip(paths, self.image.diff_ids):
            real = self._resolve(path)
            if real not in self.sizes:
                raise TransferError(f"docker save of {self.image.ref}: layer file {path} is missing")
            head = self.heads.get(real, b"")
            suffix = next((kind for magic, kind in COMPRESSED_MAGIC if head.startswith(magic)), "")
            # a blob is named by its digest; a legacy layer.tar is the uncompressed layer: its digest is the diff ID
            digest = blob_digest(real) or diff_id
            layers.append(Blob(real, digest, self.sizes[real], OCI_LAYER + suffix))
        config = self._resolve(str(self.manifest.get("Config", "")))
        digest = blob_digest(config) or legacy_config_digest(config)
        if config not in self.sizes or not digest:
            raise TransferError(f"docker save of {self.image.ref}: its config file {config!r} is missing")
        return SaveFacts(Blob(config, digest, self.sizes[config], OCI_CONFIG), tuple(layers), self.image.platform)


class _Peek(io.RawIOBase):
    """Passes a member's bytes through, handing its first bytes to `on_head` once."""

    def __init__(self, f: IO[bytes], on_head: Callable[[bytes], None]):
        self.f, self.on_head, self.first = f, on_head, True

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        if self.first:
            self.first = False
            self.on_head(bytes(data[:4]))
        return data


def _cache_path(image: LocalImage):
    return cache_root() / "layers" / f"{image.id[7:]}.v3.json"


def _cached_facts(image: LocalImage) -> SaveFacts | None:
    path = _cache_path(image)
    if not path.is_file():
        return None
    try:
        return SaveFacts.from_json(path.read_text())
    except (ValueError, KeyError, TypeError):
        return None  # an older or broken cache file: read the save again


def remember_facts(image: LocalImage, facts: SaveFacts) -> None:
    write_whole(_cache_path(image), facts.to_json())


def facts_known(image: LocalImage) -> bool:
    """Whether the image's SaveFacts are at hand without a read of its save (on it, or cached per Image ID)."""
    return image.facts is not None or _cached_facts(image) is not None


def with_facts(client, image: LocalImage, on_bytes: Callable[[int], None] | None = None) -> LocalImage:
    """The image with its SaveFacts: cached per Image ID, else from one read of its save (data discarded; `on_bytes`
    hears the save's bytes as they are read)."""
    if image.facts:
        return image
    facts = _cached_facts(image)
    if facts is None:
        rec = Recorder(image)
        with open_untrusted(fileobj=CountingReader(save_stream(client, image.id), on_bytes), mode="r|") as tar:
            for member in tar:
                f = rec.see(member, tar.extractfile(member) if member.isfile() else None)
                if member.name == "manifest.json" and f is not None:
                    rec.manifest_json(read_metadata(member, f))
                elif f is not None:
                    f.read(4)  # the head, to tell compressed layers; tarfile skips the rest
        facts = rec.facts()
        remember_facts(image, facts)
    return LocalImage(**{**image.__dict__, "facts": facts})


def layer_map(client, image: LocalImage) -> list[tuple[str, int]]:
    """(file inside the save tar, bytes) of each layer, in RootFS order; one read of the save, cached."""
    return [(b.path, b.size) for b in with_facts(client, image).facts.layers]


def layer_files(client, image: LocalImage) -> list[str]:
    """Path of each layer's file inside `docker save <id>`, in RootFS order."""
    return [f for f, _ in layer_map(client, image)]
