"""Patterns that check a whole value end at `\\Z`, not `$`: `$` also matches before a final line feed, so `x\\n`
passed as `x` (issue 60, item 10). One case per pattern that guards a name reaching a path, a tag or a manifest."""

import pytest

from dockerlaunch.backends.kubernetes.objects import DNS_LABEL, RESOURCE_NAME
from dockerlaunch.images.lock import HASH
from dockerlaunch.images.stacks import COMMIT, EXACT_VERSION, PIN
from dockerlaunch.sim.layout import _NAME
from dockerlaunch.transfer.bundle import _MEMBER
from dockerlaunch.transfer.cache_server import _OUR_TAG, REPO


@pytest.mark.parametrize("pattern, good", [
    (_MEMBER, "images/" + "a" * 64 + ".tar"),
    (_NAME, "dlsim"),
    (DNS_LABEL, "train"),
    (RESOURCE_NAME, "nvidia.com/gpu"),
    (EXACT_VERSION, "2.13.0"),
    (COMMIT, "b" * 40),
    (PIN, "torch==2.13.0"),
    (HASH, "sha256:" + "c" * 64),
    (_OUR_TAG, f"127.0.0.1:5000/{REPO}:" + "d" * 12),
])
def test_a_whole_value_pattern_refuses_a_trailing_line_feed(pattern, good):
    assert pattern.match(good)
    assert not pattern.match(good + "\n")
