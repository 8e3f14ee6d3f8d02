"""`save` / `load`: images in one file for hosts no network reaches (sneakernet), checked before tagging.

A bundle is zstd(tar(images/<id>.tar ..., manifest.json)); the manifest comes last and holds each
tar's sha256 and size, so `load` reads to the end and checks every image before it sets any tag.
A delta bundle (`save --base OLD`) leaves out the layers OLD has: after an ms-swift bump, the top layers only.
Its manifest names the layer stack (chain ID) the target must already hold, and `load` checks that before it
loads anything; every entry records its own chain IDs, so a bundle's manifest can be the next delta's base.
Each image tar is the stream `push` sends (restream.image_chunks): any engine loads it, and the manifest
holds both IDs it can get -- `id` (config digest, the classic store's) and `manifest_id` (containerd's).
A bundle split into parts for small media is read through transfer/bundle_parts.py.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import re
import subprocess
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dockerlaunch.cache import replacing
from dockerlaunch.errors import DockerlaunchError, HostError, TransferError, describe_validation_error
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.tars import open_untrusted
from dockerlaunch.transfer.bundle_parts import check_parts, open_bundle
from dockerlaunch.transfer.image_facts import CONTAINERD, local_image, save_stream
from dockerlaunch.transfer.pipes import CHUNK, CountingReader
from dockerlaunch.transfer.restream import image_chunks, untagged_chunks

MAX_WINDOW = 32 << 20  # zstd window a bundle may need to be read (memory the launcher gives it)
BUNDLE_FORMAT = "dockerlaunch-bundle/1"  # delta entries add fields; a reader that predates them refuses them


@dataclass
class BundleEntry:
    ref: str
    id: str
    size: int
    file: str
    sha256: str = ""
    bytes: int = 0
    manifest_id: str = ""  # its Image ID in containerd's store ("" in bundles of dockerlaunch before 0.x)
    chain_ids: list[str] = field(default_factory=list)  # its layer stack, prefix by prefix (a later delta's base)
    needs: str = ""  # a delta: the chain ID of the layers left out, which the target must have
    base: str = ""  # a delta: what --base named, for messages

    def expected_id(self, store: str) -> str:
        return self.manifest_id if store == CONTAINERD else self.id


@dataclass
class Bundle:
    images: list[BundleEntry] = field(default_factory=list)


def base_chains(client, base: str) -> tuple[str, frozenset[str]]:
    """What `save --base` names: a local image, or a bundle (or its manifest.json) whose images the target
    holds. (label, every chain ID the target then has)."""
    path = Path(base)
    if path.is_file():
        if path.suffix == ".json":
            entries = _parse_manifest(path, path.read_bytes()[:MAX_MANIFEST + 1])
        else:
            entries = read_manifest(path)
        chains = {c for e in entries for c in e.chain_ids}
        if not chains:
            raise TransferError(f"--base {base}: its manifest records no layers (a bundle of an older dockerlaunch): "
                                "give the base image instead")
        return ", ".join(e.ref for e in entries), frozenset(chains)
    from dockerlaunch.transfer.oci import chain_ids

    try:
        img = local_image(client, base)
    except TransferError:
        raise TransferError(f"--base {base}: neither a local image nor a bundle file") from None
    return base, frozenset(chain_ids(list(img.diff_ids)))


def save_bundle(client, refs: list[str], path: Path, level: int = 3, base: str | None = None) -> Bundle:
    """zstd(tar(images/<id>.tar ..., manifest.json)). The manifest comes last: it holds each tar's sha256.
    With `base`, each image leaves out the layers the base has (a delta)."""
    import zstandard

    from dockerlaunch.transfer.image_facts import layer_map, with_facts
    from dockerlaunch.transfer.oci import chain_ids
    from dockerlaunch.transfer.push_plan import thin_layers

    images = [local_image(client, r) for r in refs]
    label, have = base_chains(client, base) if base else ("", frozenset())
    bundle = Bundle()
    with replacing(path) as raw:
        with zstandard.ZstdCompressor(level=level, threads=-1, write_checksum=True).stream_writer(raw) as zout:
            with tarfile.open(fileobj=zout, mode="w|") as tar:
                for img in images:
                    chains = chain_ids(list(img.diff_ids))
                    skip: list[str] = []
                    if have and set(chains) & have:
                        img = with_facts(client, img)
                        skip, _ = thin_layers(img, have, layer_map(client, img))
                    cfg = img.config_digest or img.id  # a containerd-store launcher knows it from the save's facts
                    shared = [c for c in chains if c in have]
                    entry = BundleEntry(ref=img.ref, id=cfg, size=img.size, file=f"images/{cfg[7:]}.tar",
                                        chain_ids=chains, needs=shared[-1] if skip else "",
                                        base=label if skip else "")
                    chunks = image_chunks(save_stream(client, img.id), img, set(skip),
                                          on_facts=lambda f, e=entry: setattr(e, "manifest_id", f.manifest_digest))
                    _add_stream(tar, entry, chunks)
                    bundle.images.append(entry)
                manifest = json.dumps({"format": BUNDLE_FORMAT, "images": [e.__dict__ for e in bundle.images]},
                                      indent=2).encode()
                info = tarfile.TarInfo("manifest.json")
                info.size = len(manifest)
                tar.addfile(info, io.BytesIO(manifest))
    return bundle


def read_manifest(path: Path) -> list[BundleEntry]:
    """A bundle's manifest (checked: the whole bundle is read)."""
    return verify_bundle(path)


def _add_stream(tar: tarfile.TarFile, entry: BundleEntry, chunks: Iterator[bytes]) -> None:
    """A tar member needs its size up front: spool the save stream to a temp file, hashing it."""
    import tempfile

    h = hashlib.sha256()
    with tempfile.TemporaryFile() as spool:
        for chunk in chunks:
            h.update(chunk)
            spool.write(chunk)
        entry.bytes = spool.tell()
        entry.sha256 = h.hexdigest()
        spool.seek(0)
        info = tarfile.TarInfo(entry.file)
        info.size = entry.bytes
        tar.addfile(info, spool)


class _HashingReader(io.RawIOBase):
    def __init__(self, f: BinaryIO):
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        self.n += len(data)
        return data


@dataclass(frozen=True)
class Piece:
    """One image tar of a bundle as a loader gets it: what it is, the Image ID the load must give, and the sha256 of
    the first n bytes of its stream (read again from the bundle: how a staged prefix on a host is proven ours)."""

    entry: BundleEntry
    expect_id: str
    prefix_sha256: Callable[[int], str | None]


Loader = Callable[[BinaryIO, Piece], tuple[int, str]]  # feeds a `docker load` and returns (status, output)


def local_loader(docker: str = "docker") -> Loader:
    def load(stream: BinaryIO, piece: Piece) -> tuple[int, str]:
        proc = subprocess.Popen([docker, "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        assert proc.stdin is not None
        try:
            while chunk := stream.read(CHUNK):
                proc.stdin.write(chunk)
        except BrokenPipeError:
            pass
        finally:  # the stream refused mid-way too: the load has ended before anything looks at the engine
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            status = proc.wait()
        return status, out

    return load


class _Skipped:
    """A reader that drops the first n bytes of another (sent before a cut: the host has them staged)."""

    def __init__(self, inner: BinaryIO, n: int):
        self.inner, self.left = inner, n

    def read(self, size: int = -1) -> bytes:
        while self.left:
            got = self.inner.read(min(self.left, CHUNK))
            if not got:
                return b""
            self.left -= len(got)
        return self.inner.read(size)


def remote_loader(remote: Remote, notes: list[str] | None = None, stop: threading.Event | None = None,
                  on_bytes: Callable[[int], None] | None = None) -> Loader:
    """`docker load` on a host over SSH. From staging's STAGE_MIN bytes an image tar is staged on the host as it
    arrives (push's load.sh, without its tag: the bundle tags once every image is checked), so a load cut off
    resumes where it stopped, and one whose load finished after the cut is not sent again. `notes` gets what
    happened per image (resumed, not staged and why)."""
    from dockerlaunch.transfer import script, staging

    notes = notes if notes is not None else []

    def plain(stream: BinaryIO) -> tuple[int, str]:
        out = bytearray()
        status = remote.stream(["docker", "load"], out.extend, out.extend, stdin=CountingReader(
            iter(functools.partial(stream.read, CHUNK), b""), on_bytes), stop=stop, bulk=True)
        return status, out.decode(errors="replace")

    def load(stream: BinaryIO, piece: Piece) -> tuple[int, str]:
        e = piece.entry
        if e.bytes < staging.stage_min():
            return plain(stream)
        key = hashlib.sha256(f"{remote.name} bundle {e.sha256}".encode()).hexdigest()[:32]
        try:
            pick = staging.pick_stage(remote, key, piece.expect_id, e.bytes)
        except HostError as err:
            return err.exit_status or 1, f"looking for a staged load failed: {err.detail}"
        if pick.delivered:  # an earlier load finished after it was cut off
            notes.append(f"{e.ref}: an earlier load had delivered it")
            return 0, "Loaded image ID: " + piece.expect_id
        if not pick.staged:
            notes.append(f"{e.ref}: {pick.note}")
            return plain(stream)
        facts = pick.facts
        offset = facts.staged if facts.staged and piece.prefix_sha256(facts.staged) == facts.digest else 0
        if offset:
            notes.append(f"{e.ref}: resumed at {offset / 1e6:.0f} MB staged on the host")
        reader = CountingReader(iter(functools.partial(_Skipped(stream, offset).read, CHUNK), b""), on_bytes)
        out, err = bytearray(), bytearray()
        status = remote.stream(["sh", "-c", script("load.sh"), "sh", piece.expect_id, "-", "none", key, str(offset)],
                               out.extend, err.extend, stdin=reader, stop=stop, bulk=True)
        if status in (3, 4) and reader.finished is not None:  # it all arrived and did not load: the stage goes
            staging.remove_stage(remote, key)
        text = (err or out).decode(errors="replace").strip()
        return status, text.removeprefix("load failed: ")

    return load


_MEMBER = re.compile(r"^images/[0-9a-f]{64}\.tar\Z")
MAX_MANIFEST = 1 << 20


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ref: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9][^\s]*$")
    id: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    size: int = Field(ge=0)
    file: str = Field(pattern=r"^images/[0-9a-f]{64}\.tar$")  # pydantic's (Rust) regex: `$` is the end of the text
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)
    manifest_id: str = Field(default="", pattern=r"^(sha256:[0-9a-f]{64})?$")
    chain_ids: list[str] = Field(default_factory=list, max_length=1000)
    needs: str = Field(default="", pattern=r"^(sha256:[0-9a-f]{64})?$")
    base: str = Field(default="", max_length=4096)


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: str
    images: list[_Entry] = Field(max_length=1000)


def _members(path: Path) -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    """The bundle's tar members, in order, from the zstd stream (never the whole file in memory). Reading a
    member reads the stream too: use inside `_damaged_is_one_line`."""
    import zstandard

    # the window a frame may ask for: dockerlaunch writes at most 8 MiB (level <= 19); zstd's default allows 128 MiB
    with open_bundle(path) as raw, zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(raw) as zin, \
            open_untrusted(fileobj=zin, mode="r|") as tar:
        for member in tar:
            yield member, tar.extractfile(member) if member.isfile() else None


@contextlib.contextmanager
def _damaged_is_one_line(path: Path) -> Iterator[None]:
    import zstandard

    from dockerlaunch.tars import Refused

    try:
        yield
    except Refused as e:
        raise TransferError(f"bundle {path}: {e}; nothing was loaded or tagged") from None
    except (zstandard.ZstdError, tarfile.TarError, EOFError, OSError) as e:
        raise TransferError(f"bundle {path} is corrupted or truncated ({type(e).__name__}: {e}); "
                            "nothing was loaded or tagged; copy it again") from None


def _parse_manifest(path: Path, raw: bytes) -> list[BundleEntry]:
    try:
        m = _Manifest.model_validate(json.loads(raw))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TransferError(f"bundle {path}: manifest.json is not JSON ({e}); nothing was loaded") from None
    except ValidationError as e:
        raise TransferError(f"bundle {path}: bad manifest.json: {describe_validation_error(e)}; "
                            "nothing was loaded") from None
    if m.format != BUNDLE_FORMAT:
        raise TransferError(f"bundle {path}: format {m.format!r}, expected {BUNDLE_FORMAT}; nothing was loaded")
    entries = [BundleEntry(**e.model_dump()) for e in m.images]
    for e in entries:
        if e.file != f"images/{e.id[7:]}.tar":
            raise TransferError(f"bundle {path}: {e.ref} is stored as {e.file}, not under its Image ID; "
                                "nothing was loaded")
    return entries


def verify_bundle(path: Path) -> list[BundleEntry]:
    """Read the whole bundle once and check it before anything is loaded: every part of a split one, then only
    a manifest and image tars, no member twice, every image listed and every listed image present with its size
    and sha256."""
    check_parts(path)
    with _damaged_is_one_line(path):
        return _verify(path)


def _verify(path: Path) -> list[BundleEntry]:
    seen: dict[str, tuple[str, int]] = {}
    entries: list[BundleEntry] | None = None
    for member, f in _members(path):
        if member.name == "manifest.json":
            if entries is not None:
                raise TransferError(f"bundle {path}: two manifests; nothing was loaded")
            if f is None or member.size > MAX_MANIFEST:
                raise TransferError(f"bundle {path}: manifest.json is not a file of at most {MAX_MANIFEST} bytes; "
                                    "nothing was loaded")
            entries = _parse_manifest(path, f.read())
        elif _MEMBER.match(member.name) and f is not None:
            if member.name in seen:
                raise TransferError(f"bundle {path}: {member.name} appears twice; nothing was loaded")
            reader = _HashingReader(f)
            while reader.read(CHUNK):
                pass
            seen[member.name] = (reader.h.hexdigest(), reader.n)
        else:
            raise TransferError(f"bundle {path}: unexpected member {member.name[:120]!r} (a bundle holds "
                                "manifest.json and images/<id>.tar only); nothing was loaded")
    if entries is None:
        raise TransferError(f"bundle {path} has no {BUNDLE_FORMAT} manifest: not a dockerlaunch bundle, or truncated")
    listed = {e.file for e in entries}
    if len(listed) != len(entries):
        raise TransferError(f"bundle {path}: the manifest lists an image twice; nothing was loaded")
    unlisted = sorted(set(seen) - listed)
    if unlisted:
        raise TransferError(f"bundle {path}: {unlisted[0]} is not in the manifest; nothing was loaded")
    for e in entries:
        got = seen.get(e.file)
        if got is None:
            raise TransferError(f"bundle {path}: {e.file} ({e.ref}) is listed but missing; nothing was loaded")
        if got != (e.sha256, e.bytes):
            raise TransferError(f"bundle {path}: checksum mismatch for {e.ref} ({e.file}); the file is corrupted; "
                                "nothing was loaded or tagged")
    return entries


def load_bundle(
    path: Path, load: Loader, run: Callable[[list[str]], tuple[int, str]], where: str = "local"
) -> list[BundleEntry]:
    """Verify the whole bundle, then load each image with its tags stripped (a tar's own RepoTags never
    apply), check each Image ID, and only then set the tags the manifest names.

    `run(argv)` runs a docker command where the images go (locally or on a host).
    """
    entries = verify_bundle(path)
    status, out = run(["docker", "info", "--format", "{{json .DriverStatus}}"])
    store = CONTAINERD if status == 0 and "io.containerd.snapshotter" in out else "graphdriver"
    old = [e.ref for e in entries if not e.expected_id(store)]
    if old:
        raise TransferError(f"{where}: the engine keeps images in containerd's store, and the bundle (made by an "
                            f"older dockerlaunch) does not say which ID {old[0]} gets there; save it again with "
                            "this version; nothing was loaded")
    deltas = [e for e in entries if e.needs]
    if deltas:
        have = engine_chains(run)
        for e in deltas:
            if e.needs not in have:
                raise TransferError(f"{where}: {e.ref} in bundle {path} is a delta on {e.base}, whose layers this "
                                    f"engine lacks (chain {e.needs[7:19]}): load {e.base} first; nothing was loaded")
    before = engine_tags(run, where)
    asked = {e.ref: e.expected_id(store) for e in entries}
    watched = set(asked.values())  # and every image the tars hold, as the loads read them (_load_verified)
    try:
        with _damaged_is_one_line(path):
            _load_verified(path, entries, load, where, store, watched)
    except DockerlaunchError as failed:
        try:
            now = engine_tags(run, where)
        except DockerlaunchError:
            raise failed from None
        _no_tag_moved(before, now, watched, asked, run, where)  # a load that failed may still have moved a tag
        raise
    _no_tag_moved(before, engine_tags(run, where), watched, asked, run, where)
    for e in entries:
        want = e.expected_id(store)
        status, out = run(["docker", "image", "inspect", "--format", "{{.Id}}", want])
        if status != 0 or out.strip() != want:
            raise TransferError(f"{where}: after loading {e.ref}, Image ID {want[7:19]} is missing")
    for e in entries:
        status, out = run(["docker", "tag", e.expected_id(store), e.ref])
        if status != 0:
            raise TransferError(f"{where}: tagging {e.ref} failed: {out.strip()[-200:]}")
    return entries


def _load_verified(path: Path, entries: list[BundleEntry], load: Loader, where: str, store: str,
                   contained: set[str]) -> None:
    """Load each image tar as untagged_chunks re-streams it; `contained` gets the IDs of every image the tars
    hold."""
    by_file = {e.file: e for e in entries}
    for member, f in _members(path):
        e = by_file.get(member.name)
        if e is None or f is None:
            continue
        reader = _HashingReader(f)
        refused: list[TransferError] = []
        stream = CountingReader(_recorded(untagged_chunks(iter(functools.partial(reader.read, CHUNK), b""),
                                                          (e.id, e.manifest_id), contained), refused))
        try:
            status, out = load(stream, Piece(e, e.expected_id(store), functools.partial(_prefix_sha256, path, e)))
        except DockerlaunchError:  # the re-streaming refused the tar while a loader read it (raised as the loader's)
            if not refused:
                raise
            status, out = 1, ""
        with contextlib.suppress(TransferError):  # recorded in `refused`
            while stream.read(CHUNK):  # what docker load did not read: the rewriter runs to its end first
                pass
        if refused:
            raise TransferError(f"{where}: {e.ref} ({e.file}) in bundle {path} was refused: "
                                f"{str(refused[0]).removeprefix('re-streaming the image failed: ')}; nothing of the "
                                "bundle was tagged")
        while reader.read(CHUNK):  # then the member's own trailing bytes, for the checksum
            pass
        if (reader.h.hexdigest(), reader.n) != (e.sha256, e.bytes):
            raise TransferError(f"bundle {path}: {e.file} changed while it was being loaded; nothing was tagged")
        unpack = re.search(r".*(rror unpacking image|apply layer error).*", out)
        if status != 0 or unpack:  # containerd's store reports a layer it could not unpack and exits 0
            raise TransferError(f"{where}: docker load of {e.ref} ({e.file}) failed: "
                                f"{(unpack.group(0) if unpack else out.strip())[-200:]}")


def _recorded(chunks: Iterator[bytes], errors: list[TransferError]) -> Iterator[bytes]:
    """`chunks`, with the TransferError that ends them (a refused image tar) kept in `errors`, whoever reads them."""
    try:
        yield from chunks
    except TransferError as e:
        errors.append(e)
        raise


def _prefix_sha256(path: Path, e: BundleEntry, n: int) -> str | None:
    """sha256 of the first n bytes of the stream a loader gets for `e` (its image tar, untagged), read again from
    the bundle; None when the stream is shorter."""
    h, seen = hashlib.sha256(), 0
    with _damaged_is_one_line(path):
        for member, f in _members(path):
            if member.name != e.file or f is None:
                continue
            for chunk in untagged_chunks(iter(functools.partial(f.read, CHUNK), b""), (e.id, e.manifest_id)):
                take = chunk[: n - seen]
                h.update(take)
                seen += len(take)
                if seen >= n:
                    return h.hexdigest()
            return None
    return None


ENGINE_TAGS = ["docker", "image", "ls", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}"]


def engine_tags(run: Callable[[list[str]], tuple[int, str]], where: str) -> dict[str, str]:
    """Every tag of the engine and the Image ID it names."""
    status, out = run(ENGINE_TAGS)
    if status != 0:
        raise TransferError(f"{where}: cannot list the engine's images: {out.strip()[-200:]}")
    tags: dict[str, str] = {}
    for line in out.splitlines():
        ref, _, image_id = line.strip().rpartition(" ")
        if ref and "<none>" not in ref:
            tags[ref] = image_id
    return tags


def _no_tag_moved(before: dict[str, str], after: dict[str, str], watched: set[str], asked: dict[str, str],
                  run: Callable[[list[str]], tuple[int, str]], where: str) -> None:
    """The loads are fed untagged tars, so no tag may have appeared on or moved to an image the tars hold
    (`watched`: the IDs the loads were to give, and the digest of every small member of the tars, which covers
    any other image a tar carries), except a tag the bundle asks for onto its own image: the check that does not
    rest on the re-streaming having understood the tar as the engine's loader does. Puts back what moved, removes
    what appeared, and fails naming it. A tag moved to another image meanwhile is someone else's pull or build on
    a shared engine: left as it is."""
    changed = sorted(ref for ref in after if before.get(ref) != after[ref] and after[ref] in watched
                     and asked.get(ref) != after[ref])
    if not changed:
        return
    for ref in changed:
        run(["docker", "tag", before[ref], ref] if ref in before else ["docker", "image", "rm", "--no-prune", ref])
    ref = changed[0]
    was = f"was {before[ref][7:19]}" if ref in before else "was not there"
    raise TransferError(f"{where}: tag {ref} changed during the load ({was}, the load made it "
                        f"{after[ref][7:19]}){f' with {len(changed) - 1} more' if len(changed) > 1 else ''}: "
                        "an image tar that sets tags of its own; put back as it was, nothing of the bundle was tagged")


ENGINE_LAYERS = ("docker image ls -q --no-trunc | sort -u | xargs -r docker image inspect "
                 "--format '{{json .RootFS.Layers}}'")


def engine_chains(run: Callable[[list[str]], tuple[int, str]]) -> set[str]:
    """Every layer stack (chain ID) the engine's images hold: what a delta bundle can be loaded on."""
    from dockerlaunch.transfer.oci import chain_ids

    status, out = run(["sh", "-c", ENGINE_LAYERS])
    chains: set[str] = set()
    for line in out.splitlines():
        try:
            layers = json.loads(line)
        except ValueError:
            continue
        if isinstance(layers, list):
            chains.update(chain_ids([str(x) for x in layers]))
    return chains


def local_runner(argv: list[str]) -> tuple[int, str]:
    r = subprocess.run(argv, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def remote_runner(remote: Remote) -> Callable[[list[str]], tuple[int, str]]:
    def run(argv: list[str]) -> tuple[int, str]:
        r = remote.run(argv, timeout=120)
        return r.exit_status, r.stdout + r.stderr

    return run
