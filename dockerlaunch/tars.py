"""Reading tars that came from elsewhere (bundles, image streams, the tars `dump` fetches, source archives) with
bounded memory: tarfile reads a GNU long-name or pax header's whole payload into memory before anything can look
at it, so 300 MB of name, compressed to a few KB, would cost the launcher 300 MB (more as Python strings)."""

from __future__ import annotations

import tarfile

MAX_HEADER = 64 << 10  # a long name or a pax record set: paths are at most 4 KiB on Linux; 64 KiB is generous
_EXTENDED = {tarfile.GNUTYPE_LONGNAME: "long-name", tarfile.GNUTYPE_LONGLINK: "long-link",
             tarfile.XHDTYPE: "pax", tarfile.XGLTYPE: "pax global", tarfile.SOLARIS_XHDTYPE: "pax"}


class HeaderTooLarge(tarfile.ReadError):
    """An extended header over MAX_HEADER: refused before its payload is read (a ReadError, so every reader's
    one-line handling of an unreadable tar says it)."""


class BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo whose extended headers are refused over MAX_HEADER before tarfile reads them. Use as
    `tarfile.open(..., tarinfo=BoundedTarInfo)`."""

    def _proc_member(self, tar):
        kind = _EXTENDED.get(self.type)
        if kind and self.size > MAX_HEADER:
            raise HeaderTooLarge(f"a {kind} header of {self.size} bytes at member {self.name[:100]!r}, over the "
                                 f"{MAX_HEADER}-byte limit for untrusted tars: not a tar dockerlaunch wrote or reads")
        return super()._proc_member(tar)


def open_untrusted(*args, **kwargs) -> tarfile.TarFile:
    """tarfile.open with BoundedTarInfo."""
    return tarfile.open(*args, tarinfo=BoundedTarInfo, **kwargs)
