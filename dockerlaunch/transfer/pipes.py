"""Bounded-memory plumbing for image streams: chunk iterators counted, read ahead on a thread, or fed from a writer.

A 20 GB image never sits in RAM or on the launcher's disk: every stage hands on chunks of CHUNK bytes.
"""

from __future__ import annotations

import io
import queue
import threading
import time
from collections.abc import Callable, Iterator

from dockerlaunch.errors import TransferError

CHUNK = 1 << 20


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
