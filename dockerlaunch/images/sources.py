"""Sources that are not on a package index (apex, Megatron-LM archives), pinned by their content.

A GitHub archive of a commit and a `git archive | gzip -n` of the same commit hold the same files in other bytes
(gzip and tar headers differ), and a tag can be moved by its owner. So a pin's sha256 is over the unpacked tree:
every regular file's path (below the archive's one top folder), executable bit and bytes, and every symlink's
target, in path order. The same commit gives the same hash whichever archive carried it; one changed byte, file
or mode gives another.
"""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.tars import open_untrusted


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
                          "you trust this file, put its hash in stacks.yaml (dockerlaunch sources hash FILE)")
    return got
