"""The bytes of an image on the wire: `docker save` by ID (or the launcher's layer cache), re-streamed, thinned,
compressed.

Everything here streams in bounded memory: a 20 GB image never sits in RAM or on the launcher's disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from dockerlaunch.transfer.image_facts import LocalImage, remember_facts, save_stream, with_facts
from dockerlaunch.transfer.oci import SaveFacts
from dockerlaunch.transfer.restream import image_chunks


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


def outgoing(client, image: LocalImage, skip: set[str], mode: str,
             on_facts: Callable[[SaveFacts], None] | None = None) -> Iterator[bytes]:
    """What goes on the wire: `docker save <id>` as `image_chunks` re-streams it (minus the layer files in
    `skip`), zstd-compressed if `mode` says so. The facts it ends with are cached for the next push."""

    def remember(facts: SaveFacts) -> None:
        if image.facts is None and not image.layer_blobs:
            remember_facts(image, facts)
        if on_facts:
            on_facts(facts)

    if skip and image.facts is None:  # a stream that leaves layers out cannot learn their facts from itself
        image = with_facts(client, image)
    chunks = image_chunks(source_chunks(client, image, skip), image, skip, remember)
    if mode == "zstd":
        chunks = zstd_chunks(chunks)
    return chunks
