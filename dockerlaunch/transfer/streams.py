"""The bytes of an image on the wire: `docker save` by ID, thinned, compressed, counted.

Everything here streams in bounded memory: a 20 GB image never sits in RAM or on the launcher's disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import queue
import re
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from dockerlaunch.engine import cache_root
from dockerlaunch.errors import TransferError
from dockerlaunch.tars import open_untrusted

CHUNK = 1 << 20


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
    layer_blobs: tuple[str, ...] = ()  # each layer's blob in the launcher's registry, when it serves the stream
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


def source_chunks(client, image: LocalImage, skip: set[str]) -> Iterator[bytes]:
    """The image as a `docker save` tar: from the launcher's registry where it serves this push (only the layers
    not in `skip` are read, transfer/layer_cache.py), else `docker save <id>`."""
    if image.layer_blobs:
        from dockerlaunch.transfer import layer_cache

        return layer_cache.chunks(image, skip)
    return save_stream(client, image.id)


def zstd_chunks(chunks: Iterator[bytes], level: int = 3) -> Iterator[bytes]:
    import zstandard

    comp = zstandard.ZstdCompressor(level=level, threads=-1, write_checksum=True).compressobj()
    for chunk in chunks:
        out = comp.compress(chunk)
        if out:
            yield out
    yield comp.flush()


def prefetched(chunks: Iterator[bytes], depth: int = 8) -> Iterator[bytes]:
    """`chunks`, made by a thread of their own up to `depth` ahead, so that reading `docker save`, re-streaming its
    tar and compressing overlap with the SSH write (each releases the GIL in its C parts). An error upstream is
    raised here; closing this generator (a cut push) stops the thread and closes `chunks`."""
    q: queue.Queue = queue.Queue(depth)
    closed = threading.Event()
    end = object()

    def put(item: object) -> bool:
        """Into the queue, unless the consumer is gone (False)."""
        while not closed.is_set():
            try:
                q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not put(chunk):
                    break
            last: object = end
        except BaseException as e:  # noqa: BLE001 - raised in the consumer
            last = e
        finally:
            close = getattr(chunks, "close", None)
            if close is not None and closed.is_set():
                close()
        put(last)

    threading.Thread(target=produce, daemon=True, name="prefetch").start()
    try:
        while True:
            item = q.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        closed.set()


def chain_ids(diff_ids: list[str]) -> list[str]:
    """OCI chain IDs of every prefix: chain(L1)=L1, chain(L1..Ln)=sha256(chain(L1..Ln-1) + " " + Ln)."""
    out: list[str] = []
    for d in diff_ids:
        if not out:
            out.append(d)
        else:
            out.append("sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
COMPRESSED_MAGIC = ((b"\x1f\x8b", "+gzip"), (b"\x28\xb5\x2f\xfd", "+zstd"))  # Docker 29 saves gzip layers


@dataclass(frozen=True)
class Blob:
    """A file of a `docker save` tar that the image's manifest names."""

    path: str  # the regular file in the tar (legacy paths that are links to blobs resolved)
    digest: str
    size: int
    media_type: str = OCI_LAYER


@dataclass(frozen=True)
class SaveFacts:
    """What one `docker save` of an image holds: its config and layer files, in RootFS order.

    Every stream dockerlaunch sends ends with an OCI index and an image manifest written from these facts,
    whatever layout the launcher's engine saved (legacy `<id>/layer.tar`, or OCI `blobs/sha256/` since
    Docker 25): a classic-store engine loads the legacy manifest.json and names the image by its config
    digest; a containerd-store engine loads the index and names it by the manifest's digest. Both are
    known here, so every target's Image ID is checked before its tag is set.
    """

    config: Blob
    layers: tuple[Blob, ...]
    platform: tuple[str, str, str] = ("linux", "amd64", "")

    def manifest(self) -> bytes:
        body = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": self.config.digest, "size": self.config.size},
            "layers": [{"mediaType": b.media_type, "digest": b.digest, "size": b.size} for b in self.layers],
        }
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @property
    def manifest_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest()).hexdigest()

    def index(self) -> bytes:
        os_, arch, variant = self.platform
        platform = {"os": os_, "architecture": arch, **({"variant": variant} if variant else {})}
        entry = {"mediaType": OCI_MANIFEST, "digest": self.manifest_digest, "size": len(self.manifest()),
                 "platform": platform}  # no name annotation: the load sets no tag
        return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]},
                          separators=(",", ":"), sort_keys=True).encode()

    def to_json(self) -> str:
        return json.dumps({"config": self.config.__dict__, "layers": [b.__dict__ for b in self.layers],
                           "platform": list(self.platform)})

    @staticmethod
    def from_json(text: str) -> SaveFacts:
        d = json.loads(text)
        return SaveFacts(Blob(**d["config"]), tuple(Blob(**b) for b in d["layers"]), tuple(d["platform"]))


class _Recorder:
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
            digest = _blob_digest(real) or diff_id
            layers.append(Blob(real, digest, self.sizes[real], OCI_LAYER + suffix))
        config = self._resolve(str(self.manifest.get("Config", "")))
        digest = _blob_digest(config) or _legacy_config_digest(config)
        if config not in self.sizes or not digest:
            raise TransferError(f"docker save of {self.image.ref}: its config file {config!r} is missing")
        return SaveFacts(Blob(config, digest, self.sizes[config], OCI_CONFIG), tuple(layers), self.image.platform)


def _blob_digest(path: str) -> str:
    parts = path.split("/")
    if len(parts) == 3 and parts[0] == "blobs" and len(parts[2]) == 64:
        return f"{parts[1]}:{parts[2]}"
    return ""


def _legacy_config_digest(path: str) -> str:
    name = path.removesuffix(".json")
    return f"sha256:{name}" if "/" not in path and len(name) == 64 and path.endswith(".json") else ""


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


def _remember(image: LocalImage, facts: SaveFacts) -> None:
    path = _cache_path(image)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(facts.to_json())
    tmp.replace(path)


def with_facts(client, image: LocalImage) -> LocalImage:
    """The image with its SaveFacts: cached per Image ID, else from one read of its save (data discarded)."""
    if image.facts:
        return image
    facts = _cached_facts(image)
    if facts is None:
        rec = _Recorder(image)
        with open_untrusted(fileobj=CountingReader(save_stream(client, image.id)), mode="r|") as tar:
            for member in tar:
                f = rec.see(member, tar.extractfile(member) if member.isfile() else None)
                if member.name == "manifest.json" and f is not None:
                    rec.manifest_json(_metadata(member, f))
                elif f is not None:
                    f.read(4)  # the head, to tell compressed layers; tarfile skips the rest
        facts = rec.facts()
        _remember(image, facts)
    return LocalImage(**{**image.__dict__, "facts": facts})


def layer_map(client, image: LocalImage) -> list[tuple[str, int]]:
    """(file inside the save tar, bytes) of each layer, in RootFS order; one read of the save, cached."""
    return [(b.path, b.size) for b in with_facts(client, image).facts.layers]


def layer_files(client, image: LocalImage) -> list[str]:
    """Path of each layer's file inside `docker save <id>`, in RootFS order."""
    return [f for f, _ in layer_map(client, image)]


def _metadata(member: tarfile.TarInfo, f: IO[bytes]) -> bytes:
    if member.size > MAX_METADATA:
        raise TransferError(f"{member.name} in an image tar is {member.size} bytes: not a docker save")
    return f.read()


def rewrite_tar(chunks: Iterator[bytes], edit: Callable[[tarfile.TarInfo, IO[bytes] | None],
                                                     tuple[tarfile.TarInfo, IO[bytes] | None] | None],
                tail: Callable[[], list[tuple[tarfile.TarInfo, IO[bytes]]]] | None = None) -> Iterator[bytes]:
    """Re-stream a tar member by member; `edit(member, file)` returns what to write instead, or None to drop
    the member; `tail()` gives members to add at the end. Streams in bounded memory (a thread, a small pipe)."""
    pipe = Pipe()

    def produce():
        try:
            with open_untrusted(fileobj=CountingReader(chunks), mode="r|") as tin, \
                    tarfile.open(fileobj=pipe, mode="w|", format=tarfile.GNU_FORMAT) as tout:
                for member in tin:
                    out = edit(member, tin.extractfile(member) if member.isfile() else None)
                    if out is not None:
                        tout.addfile(*out)
                for out in tail() if tail else []:
                    tout.addfile(*out)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            pipe.fail(e)
        finally:
            pipe.close()

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    yield from pipe.chunks()
    t.join()


MAX_METADATA = 4 << 20  # a save's manifest.json / index.json: a few KB; more is not a docker save
METADATA_MEMBERS = frozenset({"manifest.json", "index.json", "repositories", "oci-layout"})
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class _LinkGuard:
    """Docker's classic loader unpacks an image tar and then opens manifest.json by name, following links: a
    symlinked or hardlinked manifest.json, or `d -> .` with `d/manifest.json`, is read though re-streaming never
    saw a member of that name. A docker save links layer files only, so links named as metadata, members under a
    linked folder and links over a folder already used are refused (in whichever order they come)."""

    def __init__(self):
        self.links: set[str] = set()
        self.folders: set[str] = set()

    def check(self, member: tarfile.TarInfo) -> None:
        parts = member.name.split("/")
        parents = ["/".join(parts[:i]) for i in range(1, len(parts))]
        under = next((p for p in parents if p in self.links), None)
        if under is not None:
            raise TransferError(f"image tar member {member.name!r} is under {under!r}, a link: a docker save has no "
                                "linked folders; refusing an image tar that could set tags of its own")
        if member.issym() or member.islnk():
            if member.name in METADATA_MEMBERS or member.name in self.folders:
                what = "a metadata name" if member.name in METADATA_MEMBERS else "a folder other members are in"
                raise TransferError(f"image tar member {member.name!r} is a link (to {member.linkname[:200]!r}) "
                                    f"over {what}: refusing an image tar that could set tags of its own")
            self.links.add(member.name)
        self.folders.update(parents)


def _clean_path(p: object) -> bool:
    return isinstance(p, str) and bool(p) and p == posixpath.normpath(p) and not p.startswith(("/", "../")) \
        and p != ".." and p not in METADATA_MEMBERS


def _rebuilt_metadata(meta: dict[str, object], expect: tuple[str, str] | None) -> list[tuple[tarfile.TarInfo,
                                                                                           IO[bytes]]]:
    """manifest.json (and, where the tar names the manifest, oci-layout and index.json) written anew: one image,
    the one `expect` (config digest, manifest digest) names when given, no tag, no key a loader would act on
    beyond Config and Layers; the tar's own are dropped."""
    entries = meta.get("manifest.json")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise TransferError("the image tar has no manifest.json naming an image: not a docker save")
    if expect:
        keep = [e for e in entries if isinstance(e.get("Config"), str)
                and (_blob_digest(e["Config"]) or _legacy_config_digest(e["Config"])) == expect[0]]
        if len(keep) != 1:
            raise TransferError(f"the image tar's manifest.json names no image {expect[0][7:19]} (or names it "
                                f"twice), the image the bundle says it holds: not a tar dockerlaunch saved")
    elif len(entries) != 1:
        raise TransferError(f"the image tar's manifest.json names {len(entries)} images: a re-streamed image tar "
                            "holds one")
    else:
        keep = entries
    config, layers = keep[0].get("Config"), keep[0].get("Layers")
    if not _clean_path(config) or not isinstance(layers, list) or not all(_clean_path(x) for x in layers):
        raise TransferError("the image tar's manifest.json has a Config or Layers entry that is not a plain path "
                            "inside the tar: not a docker save")
    out = [_member("manifest.json", json.dumps([{"Config": config, "RepoTags": None, "Layers": layers}],
                                               separators=(",", ":")).encode())]
    index = meta.get("index.json")
    found = [d for d in (index.get("manifests") if isinstance(index, dict) else None) or []
             if isinstance(d, dict) and d.get("mediaType") in (OCI_MANIFEST, DOCKER_MANIFEST)
             and isinstance(d.get("digest"), str) and _DIGEST.fullmatch(d["digest"])
             and isinstance(d.get("size"), int) and (not expect or d["digest"] == expect[1])]
    if len(found) == 1:
        d = found[0]
        desc = {"mediaType": d["mediaType"], "digest": d["digest"], "size": d["size"]}
        platform = d.get("platform")
        if isinstance(platform, dict) and all(isinstance(v, str) for v in platform.values()):
            desc["platform"] = platform
        body = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [desc]}  # no annotation: no name
        out += [_member("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                _member("index.json", json.dumps(body, separators=(",", ":"), sort_keys=True).encode())]
    return out


def untagged_chunks(chunks: Iterator[bytes], expect: tuple[str, str] | None = None,
                    contained: set[str] | None = None) -> Iterator[bytes]:
    """Re-stream a `docker save` tar so that `docker load` sets no tag and loads one image: the tar's own
    manifest.json, index.json, repositories and oci-layout dropped, and written anew at the end for the image
    `expect` (config digest, manifest digest) names (see _rebuilt_metadata); links that would let the loader read
    other metadata refused (_LinkGuard). `contained` gets the sha256 of every small member: the IDs of every image
    the tar holds, which no tag may move to during the load."""

    seen: set[str] = set()
    guard = _LinkGuard()
    meta: dict[str, object] = {}

    def edit(member: tarfile.TarInfo, f: IO[bytes] | None):
        # Docker's loader cleans member names (`./manifest.json` is manifest.json): a name matched here must be the
        # one it reads, so any name that is not already clean, or that comes twice, is refused
        clean = posixpath.normpath(member.name.lstrip("/")) if member.name else member.name
        if member.name != clean or member.name.startswith(("/", "../")) or clean == "..":
            raise TransferError(f"image tar member {member.name!r} is not a canonical name (a docker save writes "
                                f"{clean!r}): refusing an image tar that could set tags of its own")
        # a member that says what to tag may come once (a containerd store's save repeats content-addressed blobs,
        # which are checked by their digest on load: those may)
        if member.name in METADATA_MEMBERS and member.name in seen:
            raise TransferError(f"image tar member {member.name!r} is in the image tar twice: not a docker save")
        seen.add(member.name)
        guard.check(member)
        if member.name in METADATA_MEMBERS:
            if member.name in ("manifest.json", "index.json") and f is not None:
                meta[member.name] = json.loads(_metadata(member, f))
            return None
        if contained is not None and f is not None and member.size <= MAX_METADATA:
            data = f.read()
            contained.add("sha256:" + hashlib.sha256(data).hexdigest())
            f = io.BytesIO(data)
        return member, f

    return rewrite_tar(chunks, edit, lambda: _rebuilt_metadata(meta, expect))


class Pipe:
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


def image_chunks(chunks: Iterator[bytes], image: LocalImage, skip: set[str] = frozenset(),
                 on_facts: Callable[[SaveFacts], None] | None = None) -> Iterator[bytes]:
    """Re-stream `docker save <id>` as the stream every engine loads alike: no tag anywhere (RepoTags
    cleared, `repositories` and the engine's own index.json dropped), the layer files in `skip` left out
    (the receivers have them), and at the end an OCI index and manifest written from the image's
    SaveFacts (see there). `on_facts` gets the facts once the stream is complete."""
    rec = _Recorder(image)
    guard = _LinkGuard()

    def edit(member: tarfile.TarInfo, f: IO[bytes] | None):
        guard.check(member)
        if member.name in ("repositories", "index.json", "oci-layout") or member.name in skip:
            return None
        f = rec.see(member, f)
        if member.name == "manifest.json" and f is not None:
            rec.manifest_json(_metadata(member, f))
            body = json.dumps([{**rec.manifest, "RepoTags": None}]).encode()
            return _member(member.name, body, member.mode, member.mtime)
        return member, f

    def tail():
        facts = image.facts or rec.facts()  # a thin stream lacks some layers: its facts come from the save's read
        if on_facts:
            on_facts(facts)
        manifest = facts.manifest()
        return [_member("blobs/sha256/" + facts.manifest_digest[7:], manifest),
                _member("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                _member("index.json", facts.index())]

    return rewrite_tar(chunks, edit, tail)


def _member(name: str, body: bytes, mode: int = 0o644, mtime: float = 0) -> tuple[tarfile.TarInfo, IO[bytes]]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(body), mode, mtime
    return info, io.BytesIO(body)


def outgoing(client, image: LocalImage, skip: set[str], mode: str,
             on_facts: Callable[[SaveFacts], None] | None = None) -> Iterator[bytes]:
    """What goes on the wire: `docker save <id>` as `image_chunks` re-streams it (minus the layer files in
    `skip`), zstd-compressed if `mode` says so. The facts it ends with are cached for the next push."""

    def remember(facts: SaveFacts) -> None:
        if image.facts is None and not image.layer_blobs:
            _remember(image, facts)
        if on_facts:
            on_facts(facts)

    if skip and image.facts is None:  # a stream that leaves layers out cannot learn their facts from itself
        image = with_facts(client, image)
    chunks = image_chunks(source_chunks(client, image, skip), image, skip, remember)
    if mode == "zstd":
        chunks = zstd_chunks(chunks)
    return chunks
