"""The bytes of an image on the wire: `docker save` by ID (or the launcher's layer cache), re-streamed, thinned,
compressed.

Everything here streams in bounded memory: a 20 GB image never sits in RAM or on the launcher's disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from dockerlaunch.transfer.image_facts import LocalImage, remember_facts, with_facts
from dockerlaunch.transfer.oci import SaveFacts
from dockerlaunch.transfer.restream import image_chunks


def zstd_chunks(chunks: Iterator[bytes], level: int = 3) -> Iterator[bytes]:
    import zstandard

    comp = zstandard.ZstdCompressor(level=level, threads=-1, write_checksum=True).compressobj()
    for chunk in chunks:
        out = comp.compress(chunk)
        if out:
            yield out
    yield comp.flush()


def counted(chunks: Iterator[bytes], on_bytes: Callable[[int], None]) -> Iterator[bytes]:
    for chunk in chunks:
        on_bytes(len(chunk))
        yield chunk


def outgoing(client, image: LocalImage, skip: set[str], mode: str,
             on_facts: Callable[[SaveFacts], None] | None = None,
             on_bytes: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """What goes on the wire: the image's tar from wherever push chose to read it (`image.tar_source`: `docker
    save <id>`, or the launcher's layer cache), as `image_chunks` re-streams it (minus the layer files in `skip`),
    zstd-compressed if `mode` says so. The facts a whole save ends with are cached for the next push. `on_bytes`
    hears the bytes read from the tar source as they are read: the whole image from `docker save` (the layers the
    stream leaves out too: they are read), only the layers sent from the layer cache."""

    def remember(facts: SaveFacts) -> None:
        if image.facts is None:  # a whole `docker save` of it (a tar from the layer cache comes with its facts)
            remember_facts(image, facts)
        if on_facts:
            on_facts(facts)

    if skip and image.facts is None:  # a stream that leaves layers out cannot learn their facts from itself
        image = with_facts(client, image)
    source = image.tar_source.tar(client, image, skip)
    chunks = image_chunks(source if on_bytes is None else counted(source, on_bytes), image, skip, remember)
    if mode == "zstd":
        chunks = zstd_chunks(chunks)
    return chunks
