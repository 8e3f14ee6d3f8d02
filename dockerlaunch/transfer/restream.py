"""Image tars re-streamed member by member: untagged, thinned, their metadata rebuilt, links that set tags refused.

Every image tar dockerlaunch sends or loads passes here: `image_chunks` for a push's `docker save` and a bundle's
images, `untagged_chunks` for a bundle's image tar on its way into `docker load`.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
import tarfile
import threading
from collections.abc import Callable, Iterator
from typing import IO

from dockerlaunch.errors import TransferError
from dockerlaunch.tars import open_untrusted
from dockerlaunch.transfer.image_facts import LocalImage, Recorder
from dockerlaunch.transfer.oci import (
    DOCKER_MANIFEST,
    MAX_METADATA,
    OCI_INDEX,
    OCI_MANIFEST,
    SaveFacts,
    blob_digest,
    legacy_config_digest,
    read_metadata,
)
from dockerlaunch.transfer.pipes import CountingReader, Pipe


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


METADATA_MEMBERS = frozenset({"manifest.json", "index.json", "repositories", "oci-layout"})
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
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


def _rebuilt_metadata(meta: dict[str, object], expect: tuple[str, str] | None,
                      image_id: str | None = None) -> list[tuple[tarfile.TarInfo, IO[bytes]]]:
    """manifest.json (and, where the tar names the manifest, oci-layout and index.json) written anew: one image,
    the one `expect` (config digest, manifest digest) names when given, no tag, no key a loader would act on
    beyond Config and Layers; the tar's own are dropped. `image_id` (without `expect`): the Image ID the load must
    give; where the tar's index names exactly it (a containerd store's ID is its manifest's or image index's
    digest, which pins everything under it), that entry is the index's one."""
    entries = meta.get("manifest.json")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise TransferError("the image tar has no manifest.json naming an image: not a docker save")
    if expect:
        keep = [e for e in entries if isinstance(e.get("Config"), str)
                and (blob_digest(e["Config"]) or legacy_config_digest(e["Config"])) == expect[0]]
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
    named = [d for d in (index.get("manifests") if isinstance(index, dict) else None) or []
             if isinstance(d, dict) and isinstance(d.get("digest"), str) and _DIGEST.fullmatch(d["digest"])
             and isinstance(d.get("size"), int)]
    found = [d for d in named if d.get("mediaType") in (OCI_MANIFEST, DOCKER_MANIFEST)
             and (not expect or d["digest"] == expect[1])]
    target = [d for d in named if d.get("mediaType") in (OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST)
              and d["digest"] == image_id]
    if not expect and image_id and len(target) == 1:
        found = target
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
                    contained: set[str] | None = None, image_id: str | None = None) -> Iterator[bytes]:
    """Re-stream a `docker save` tar so that `docker load` sets no tag and loads one image: the tar's own
    manifest.json, index.json, repositories and oci-layout dropped, and written anew at the end for the image
    `expect` (config digest, manifest digest) names, or the one `image_id` names (see _rebuilt_metadata); links
    that would let the loader read other metadata refused (_LinkGuard). `contained` gets the sha256 of every small
    member: the IDs of every image the tar holds, which no tag may move to during the load."""

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
                meta[member.name] = json.loads(read_metadata(member, f))
            return None
        if contained is not None and f is not None and member.size <= MAX_METADATA:
            data = f.read()
            contained.add("sha256:" + hashlib.sha256(data).hexdigest())
            f = io.BytesIO(data)
        return member, f

    return rewrite_tar(chunks, edit, lambda: _rebuilt_metadata(meta, expect, image_id))


def image_chunks(chunks: Iterator[bytes], image: LocalImage, skip: set[str] = frozenset(),
                 on_facts: Callable[[SaveFacts], None] | None = None) -> Iterator[bytes]:
    """Re-stream `docker save <id>` as the stream every engine loads alike: no tag anywhere (RepoTags
    cleared, `repositories` and the engine's own index.json dropped), the layer files in `skip` left out
    (the receivers have them), and at the end an OCI index and manifest written from the image's
    SaveFacts (see there). `on_facts` gets the facts once the stream is complete."""
    rec = Recorder(image)
    guard = _LinkGuard()

    def edit(member: tarfile.TarInfo, f: IO[bytes] | None):
        guard.check(member)
        if member.name in ("repositories", "index.json", "oci-layout") or member.name in skip:
            return None
        f = rec.see(member, f)
        if member.name == "manifest.json" and f is not None:
            rec.manifest_json(read_metadata(member, f))
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
