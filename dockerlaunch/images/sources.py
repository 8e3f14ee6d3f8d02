"""Pinned files a build needs that no layer's lock installs: sdists compiled here, source archives (apex,
Megatron-LM) and prebuilt wheels, each found locally or downloaded, and checked against its pin before use.

Archives not on a package index (apex, Megatron-LM) are pinned by their content: a GitHub archive of a commit and
a `git archive | gzip -n` of the same commit hold the same files in other bytes (gzip and tar headers differ), and
a tag can be moved by its owner. So a pin's sha256 is over the unpacked tree:
every regular file's path (below the archive's one top folder), executable bit and bytes, and every symlink's
target, in path order. The same commit gives the same hash whichever archive carried it; one changed byte, file
or mode gives another.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dockerlaunch import hints
from dockerlaunch.cache import cache_root, replacing
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.images import index as idx
from dockerlaunch.images import lock as locks
from dockerlaunch.images.index import file_sha256
from dockerlaunch.images.stacks import default_dockerfiles_dir, shipped_dockerfiles_dir
from dockerlaunch.tars import open_untrusted

SOURCE_DIRS_ENV = "DOCKERLAUNCH_SOURCE_DIRS"  # folders holding source archives (e.g. a vendored apex), ':'-separated


class WheelError(DockerlaunchError):
    """A compiled wheel, or a pinned file a build needs (a source, a prebuilt wheel), cannot be had or checked."""


class SourceError(DockerlaunchError):
    """A source archive that is not what its pin says (exit 2: the user's pin or file is wrong)."""

    exit_code = 2


def tree_sha256(archive: Path) -> str:
    """The content hash of a .tar.gz source archive (see the module's docstring); a SourceError for a file that
    is not one."""
    entries: list[tuple[str, str, bytes]] = []
    tops: set[str] = set()
    try:
        with open_untrusted(archive, "r:*") as tar:
            for m in tar:
                if m.name == "pax_global_header" or m.type in (tarfile.XGLTYPE, tarfile.XHDTYPE):
                    continue
                parts = m.name.lstrip("./").split("/", 1)
                tops.add(parts[0])
                if len(parts) == 1 and not m.isdir():  # a file beside the top folder: not part of any hash
                    raise SourceError(f"{archive}: {m.name} is outside the archive's top folder; a source archive "
                                      "holds one folder")
                rel = parts[1] if len(parts) > 1 else ""
                if not rel or m.isdir():
                    continue
                if m.issym():
                    entries.append((rel, "l", m.linkname.encode()))
                elif m.isfile():
                    f = tar.extractfile(m)
                    digest = hashlib.sha256()
                    while chunk := f.read(1 << 20):
                        digest.update(chunk)
                    kind = "x" if m.mode & 0o111 else "f"
                    entries.append((rel, kind, digest.hexdigest().encode()))
                elif m.islnk():
                    entries.append((rel, "h", m.linkname.split("/", 1)[-1].encode()))
    except (OSError, tarfile.TarError, EOFError) as e:
        raise SourceError(f"{archive}: not a readable source archive ({e})") from None
    if not entries:
        raise SourceError(f"{archive}: the archive holds no files")
    if len(tops) != 1:
        raise SourceError(f"{archive}: holds {len(tops)} top-level entries ({', '.join(sorted(tops)[:3])}); a "
                          "source archive holds one folder")
    total = hashlib.sha256()
    for rel, kind, data in sorted(entries):
        total.update(rel.encode() + b"\0" + kind.encode() + b"\0" + data + b"\n")
    return total.hexdigest()


def check_archive(archive: Path, what: str, want: str | None) -> str:
    """The archive's tree hash, or a one-line SourceError naming the source, the expected and the actual hash."""
    got = tree_sha256(archive)
    if want is not None and got != want:
        raise SourceError(f"{what}: {archive.name} does not match its pin (expected sha256 {want}, got {got}): "
                          "the archive was changed or is of another commit; fetch it again from upstream, or, if "
                          "you trust this file, put its hash in stacks.yaml ("
                          + hints.dockerlaunch("sources", "hash", os.path.abspath(archive), hint="sources.hash") + ")")
    return got


# ---------------------------------------------------------------- finding and checking a pinned file


@dataclass(frozen=True)
class Source:
    """A file a build needs that is pinned by content: an sdist (sha256 of the file, from the lock) or a source
    archive (sha256 of its unpacked tree, from stacks.yaml)."""

    what: str  # for messages: "flash-attn 2.8.3 source", "Megatron-LM ea651a3b source"
    layer: str  # the wheelhouse folder that `fetch` puts it in
    filename: str
    sha256: str
    kind: str  # "sdist" | "file" (sha256 of the file) | "archive" (sha256 of the unpacked tree)
    url: str | None = None  # an archive's or file's upstream URL; sdists are found on the index by their hash
    index_name: str = ""  # the distribution's name on the index (sdists)


def source_candidates(src: Source, wheelhouse: Path | None) -> list[Path]:
    """Where a pinned source may already be: the wheelhouse, the download cache, the site's own folders
    (DOCKERLAUNCH_SOURCE_DIRS), then the copies vendored with dockerlaunch (Dockerfiles/sources: every archive in a
    checkout, the recommended stack's in the wheel). Each is checked against the pin before use."""
    dirs = [wheelhouse / src.layer] if wheelhouse else []
    dirs += [cache_root() / "sources"]
    dirs += [Path(d) for d in os.environ.get(SOURCE_DIRS_ENV, "").split(":") if d]
    dirs += vendored_dirs()
    return [d / src.filename for d in dict.fromkeys(dirs)]


def vendored_dirs() -> list[Path]:
    """The Dockerfiles/sources folders: of the matrix in use (DOCKERLAUNCH_DOCKERFILES or the shipped one) and,
    where that is a site's own matrix, the one shipped with dockerlaunch too."""
    return list(dict.fromkeys([default_dockerfiles_dir() / "sources", shipped_dockerfiles_dir() / "sources"]))


def get_source(src: Source, wheelhouse: Path | None, index_url: str | None, offline: bool,
               log: Callable[[str], None], dest_dir: Path | None = None) -> Path:
    """The source file, checked against its pin; downloaded (into `dest_dir`, default the cache) when no local
    copy has it. A copy that does not match its pin stops here, naming both hashes."""
    own = [cache_root() / "sources", *vendored_dirs()]  # folders only dockerlaunch and this user write
    for cand in source_candidates(src, wheelhouse) + ([dest_dir / src.filename] if dest_dir else []):
        if cand.is_file():
            use = cand if cand.parent in own else _private_copy(cand)
            try:
                check_source(src, use)
            except DockerlaunchError:
                if use != cand:
                    use.unlink(missing_ok=True)
                raise
            if use != cand:  # checked as a copy of ours, and only the copy is used: a shared folder's file could
                # be swapped between a check and the unpacking
                final = cache_root() / "sources" / src.filename
                use.replace(final)
                use = final
            if src.kind == "archive":  # where a non-PyPI source came from is worth a line (vendored, a site's own)
                log(f"{src.what}: {cand} (its tree matches the pin" + (f"; copied to {use})" if use != cand else ")"))
            return use
    if src.kind == "file" and not src.sha256:
        raise WheelError(f"{src.what} {src.url} is not pinned by hash: download it once where you trust the "
                         "network, check it, and put its sha256 in stacks.yaml (flash_attn_wheel_sha256); nothing "
                         "unverified is installed")
    if offline:
        raise WheelError(f"{src.what} {src.filename} ({_pin_words(src)}) is not vendored with dockerlaunch and "
                         f"--offline forbids a download: {_put_it_words(src)}")
    dest = (dest_dir or cache_root() / "sources") / src.filename
    dest.parent.mkdir(parents=True, exist_ok=True)
    log(f"{src.what}: downloading {src.filename}")
    if src.kind == "archive":  # its pin is the unpacked tree's hash: checked below, after the download
        _download(src, dest)
    else:  # the file's own hash: checked as it arrives
        try:
            f = sdist_file(src, index_url) if src.url is None else idx.IndexFile(src.filename, src.url, src.sha256)
            idx.download(idx.IndexFile(src.filename, f.url, src.sha256), dest.parent)
        except idx.FetchError as e:
            raise WheelError(f"{src.what}: {e}") from None
    try:
        check_source(src, dest)
    except DockerlaunchError:
        dest.unlink(missing_ok=True)
        raise
    return dest


def _private_copy(path: Path) -> Path:
    """A copy of `path` in the cache's sources folder, read once, under a name nobody else uses."""
    folder = cache_root() / "sources"
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    with os.fdopen(fd, "wb") as out, open(path, "rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)
    return Path(tmp)


def check_source(src: Source, path: Path) -> None:
    if src.kind == "archive":
        if not src.sha256:
            raise WheelError(f"{src.what}: stacks.yaml gives no sha256 for it, so {path.name} cannot be checked: "
                             f"add sha256: {tree_sha256(path)} if this file is the one you trust")
        check_archive(path, src.what, src.sha256)
        return
    if not src.sha256:
        raise WheelError(f"{src.what} {src.filename} is not pinned by hash, so it cannot be checked; pin it "
                         f"(sha256 {file_sha256(path)} is what {path} holds, if that file is the one you trust)")
    got = file_sha256(path)
    if got != src.sha256:
        pin = "the lock" if src.kind == "sdist" else "its pin"
        raise WheelError(f"{src.what}: {path} does not match {pin} (expected sha256 {src.sha256}, got {got}); "
                         "delete it and fetch again")


def sdist_file(src: Source, index_url: str | None) -> idx.IndexFile:
    """The sdist on the index's simple page, found by the lock's hash (`pip download` cannot fetch these sdists:
    their setup.py imports torch to make metadata)."""
    index = index_url or locks.DEFAULT_INDEX
    for f in idx.index_files(index, src.index_name):
        if f.sha256 == src.sha256:
            return f
    raise WheelError(f"{src.what}: {idx.redact(index)} has no file with the lock's sha256 {src.sha256}")


def _download(src: Source, dest: Path) -> None:
    try:
        with idx.open_url(idx.request(src.url), timeout=120) as r, replacing(dest) as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except idx.NET_ERRORS as e:
        raise WheelError(f"{src.what} {src.filename} ({_pin_words(src)}) is not vendored with dockerlaunch and "
                         f"{idx.redact(src.url)} cannot be reached ({getattr(e, 'reason', e)}): "
                         f"{_put_it_words(src)}") from None


def _pin_words(src: Source) -> str:
    return f"{'tree ' if src.kind == 'archive' else ''}sha256 {src.sha256 or 'not pinned'}"


def _put_it_words(src: Source) -> str:
    """The one fix for a source that is neither here nor reachable: where to put the file."""
    where = f"from {idx.redact(src.url)} " if src.url else ""
    return (f"download it {where}on a machine that can, and put it in {cache_root() / 'sources'} (or in a "
            f"folder named by {SOURCE_DIRS_ENV}); it is checked against that sha256 before use")
