"""Where receivers of one stream resume (staging.resume_points): pure, over an in-memory stream."""

import hashlib
import os

from dockerlaunch.transfer.staging import resume_points

STREAM = os.urandom(1 << 20)


def fresh(size: int = 65536):
    def chunks():
        for i in range(0, len(STREAM), size):
            yield STREAM[i:i + size]

    return chunks


def staged(n: int, data: bytes = STREAM) -> tuple[int, str]:
    return n, hashlib.sha256(data[:n]).hexdigest()


def finish(offsets, chunks, sha) -> tuple[list[int], bytes, str]:
    rest = b"".join(chunks)
    sha.update(rest)
    return offsets, rest, sha.hexdigest()


def test_each_receiver_resumes_at_its_own_checked_prefix_and_the_hash_covers_the_whole_stream():
    offsets, rest, digest = finish(*resume_points(fresh(), [staged(700_001), staged(300_000), staged(5)]))
    assert offsets == [700_001, 300_000, 5]
    assert rest == STREAM[700_001:]  # the stream after the first receiver's prefix, byte for byte
    assert digest == hashlib.sha256(STREAM).hexdigest()  # what every relay checks its whole file against


def test_a_prefix_at_a_chunk_boundary_and_odd_chunk_sizes_give_the_same_answer():
    for size in (1, 4096, 65536, 1 << 20):
        for cut in (65536, 65537, 1 << 19):
            offsets, rest, digest = finish(*resume_points(fresh(size), [staged(cut), staged(cut // 2)]))
            assert offsets == [cut, cut // 2] and rest == STREAM[cut:], (size, cut)
            assert digest == hashlib.sha256(STREAM).hexdigest()


def test_a_receiver_behind_can_never_resume_past_the_one_that_feeds_it():
    # host 2 holds more than host 1 (host 1's stage was cleaned): it cannot be fed what host 1 lacks
    offsets, rest, _ = finish(*resume_points(fresh(), [staged(100_000), staged(400_000), staged(50_000)]))
    assert offsets == [100_000, 0, 0]
    assert rest == STREAM[100_000:]


def test_bytes_that_are_not_the_streams_count_for_nothing():
    other = os.urandom(len(STREAM))
    # the first receiver's prefix is someone else's: everyone starts at 0, the whole stream is sent
    offsets, rest, digest = finish(*resume_points(fresh(), [staged(200_000, other), staged(100_000)]))
    assert offsets == [0, 0] and rest == STREAM and digest == hashlib.sha256(STREAM).hexdigest()
    # a later receiver's bad prefix: it (and those it feeds) start at 0, the first keeps its own
    offsets, rest, _ = finish(*resume_points(fresh(), [staged(200_000), staged(100_000, other), staged(10)]))
    assert offsets == [200_000, 0, 0] and rest == STREAM[200_000:]


def test_a_prefix_longer_than_the_stream_or_none_at_all_starts_at_zero():
    offsets, rest, _ = finish(*resume_points(fresh(), [(len(STREAM) + 1, "0" * 64)]))
    assert offsets == [0] and rest == STREAM
    offsets, rest, _ = finish(*resume_points(fresh(), [(0, "-"), staged(10)]))
    assert offsets == [0, 0] and rest == STREAM
    offsets, rest, _ = finish(*resume_points(fresh(), []))
    assert offsets == [] and rest == STREAM
