"""images/archs.py's table of what nvcc can target, against NVIDIA's statements of what each CUDA release added
or removed (tests/data/nvidia-tables/cuda-archs.txt): a test per statement."""

from types import SimpleNamespace

import pytest

from dockerlaunch.images import archs
from tests.nvidia_tables import rows

STATEMENTS = rows("cuda-archs.txt", "releases")


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _row(release: tuple[int, int]) -> set[str]:
    """The set the table applies to a stack of that CUDA."""
    return next(a for since, a in archs.ARCHS_BY_CUDA if release >= since)


def _before(release: tuple[int, int]) -> set[str] | None:
    older = [(since, a) for since, a in archs.ARCHS_BY_CUDA if since < release]
    return max(older)[1] if older else None


@pytest.mark.parametrize("release, change, caps, _quote", STATEMENTS, ids=[f"{r[0]} {r[1]}" for r in STATEMENTS])
def test_a_releases_architectures_are_what_nvidia_says(release, change, caps, _quote):
    v, caps = _version(release), caps.split()
    if change == "adds":
        assert v in [since for since, _ in archs.ARCHS_BY_CUDA], "a release that adds architectures has its row"
        assert set(caps) <= _row(v)
        assert not set(caps) & (_before(v) or set())
    elif change == "removes":
        assert not set(caps) & _row(v) and set(caps) <= _before(v)
    else:  # lists: the whole set, as that release's nvcc printed it
        assert _row(v) == set(caps) and archs.ARCHS_READ_UP_TO == v


def test_past_the_newest_list_read_only_a_dropped_architecture_is_refused():
    """CUDA 13.4/13.5's lists were not read: a newer architecture (third parties name Rubin, 10.7) is not refused,
    one older than every 13.x architecture still is."""
    assert archs.arch_problem(SimpleNamespace(cuda="13.5"), "10.7") is None
    assert "cannot target compute capability 7.0" in archs.arch_problem(SimpleNamespace(cuda="13.5"), "7.0")
    assert "cannot target compute capability 10.7" in archs.arch_problem(SimpleNamespace(cuda="13.0"), "10.7")
