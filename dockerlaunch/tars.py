"""Reading tars that came from elsewhere (bundles, image streams, the tars `dump` fetches, source archives) with
bounded memory: tarfile reads a GNU long-name or pax header's whole payload into memory before anything can look
at it, so 300 MB of name, compressed to a few KB, would cost the launcher 300 MB (more as Python strings); and it
keeps every entry of a GNU sparse map (old-GNU extension blocks, pax `GNU.sparse.*`) as a tuple: 128 MiB of
blocks in a 12 KB bundle cost it a gigabyte. Neither a `docker save` nor a source archive holds sparse members,
so they are refused outright."""

from __future__ import annotations

import tarfile

MAX_HEADER = 64 << 10  # a long name or a pax record set: paths are at most 4 KiB on Linux; 64 KiB is generous
_EXTENDED = {tarfile.GNUTYPE_LONGNAME: "long-name", tarfile.GNUTYPE_LONGLINK: "long-link",
             tarfile.XHDTYPE: "pax", tarfile.XGLTYPE: "pax global", tarfile.SOLARIS_XHDTYPE: "pax"}


class Refused(tarfile.TarError):
    """A header an untrusted tar may not have, refused before tarfile reads what it announces. A TarError (every
    reader's one-line handling of an unreadable tar says it) but not a ReadError: `tarfile.open(mode="r:*")`
    swallows ReadErrors to try the next compression, burying the reason in a many-line list."""


class HeaderTooLarge(Refused):
    """An extended header over MAX_HEADER."""


class SparseMember(Refused):
    """A GNU sparse member, in any of its four forms."""


def _sparse(name: str) -> SparseMember:
    return SparseMember(f"member {name[:200]!r} is a GNU sparse file: not something a docker save or a source "
                        "archive holds; refusing the tar (untrusted tars may not have sparse members)")


class BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo whose extended headers are refused over MAX_HEADER, and whose sparse headers are refused, before
    tarfile reads them. Use as `tarfile.open(..., tarinfo=BoundedTarInfo)`."""

    def _proc_member(self, tar):
        kind = _EXTENDED.get(self.type)
        if kind and self.size > MAX_HEADER:
            raise HeaderTooLarge(f"a {kind} header of {self.size} bytes at member {self.name[:100]!r}, over the "
                                 f"{MAX_HEADER}-byte limit for untrusted tars: not a tar dockerlaunch wrote or reads")
        if self.type == tarfile.GNUTYPE_SPARSE:  # before _proc_sparse reads its extension blocks
            raise _sparse(self.name)
        return super()._proc_member(tar)

    # pax sparse maps, versions 0.0, 0.1 and 1.0 (1.0 reads its map from the member's data, unbounded)
    def _proc_gnusparse_00(self, next, *_):
        raise _sparse(next.name)

    def _proc_gnusparse_01(self, next, *_):
        raise _sparse(next.name)

    def _proc_gnusparse_10(self, next, *_):
        raise _sparse(next.name)

    def _apply_pax_info(self, pax_headers, encoding, errors):
        if any(k.startswith("GNU.sparse.") for k in pax_headers):  # e.g. GNU.sparse.name/realsize without a map
            raise _sparse(self.name)
        super()._apply_pax_info(pax_headers, encoding, errors)


def open_untrusted(*args, **kwargs) -> tarfile.TarFile:
    """tarfile.open with BoundedTarInfo."""
    return tarfile.open(*args, tarinfo=BoundedTarInfo, **kwargs)
