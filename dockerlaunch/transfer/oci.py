"""The image formats a stream speaks: a `docker save` tar's files, the OCI manifest and index, chain IDs (no I/O)."""

from __future__ import annotations

import hashlib
import json
import tarfile
from dataclasses import dataclass
from typing import IO

from dockerlaunch.errors import TransferError


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


def blob_digest(path: str) -> str:
    parts = path.split("/")
    if len(parts) == 3 and parts[0] == "blobs" and len(parts[2]) == 64:
        return f"{parts[1]}:{parts[2]}"
    return ""


def legacy_config_digest(path: str) -> str:
    name = path.removesuffix(".json")
    return f"sha256:{name}" if "/" not in path and len(name) == 64 and path.endswith(".json") else ""


MAX_METADATA = 4 << 20  # a save's manifest.json / index.json: a few KB; more is not a docker save
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def read_metadata(member: tarfile.TarInfo, f: IO[bytes]) -> bytes:
    if member.size > MAX_METADATA:
        raise TransferError(f"{member.name} in an image tar is {member.size} bytes: not a docker save")
    return f.read()
