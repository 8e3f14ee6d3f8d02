"""doctor's image row: the build this machine holds against each host's, across image stores (classic vs
containerd's), and the parsing of what engines say of a build."""

import json

import pytest

from dockerlaunch.backends.docker.doctor.judge import judge
from dockerlaunch.backends.docker.doctor.observations import ImageBuild, Observations, parse_created
from dockerlaunch.backends.docker.doctor.report import FAIL, PASS
from dockerlaunch.hosts.targets import resolve_target
from dockerlaunch.job.plan import make_plan
from tests.unit.backends.docker.test_doctor_judge import H0, H1, IMAGE_ID, MASTER, OTHER_ID, cfg, host, row, run

L1, L2 = "sha256:" + "9f6f" * 16, "sha256:" + "e5b3" * 16
CREATED = "2026-11-23T14:40:47.764912492Z"
CONTENT = f'{CREATED} ["{L1}","{L2}"]'
NEWER = "2026-11-27T09:00:00.5Z"


def built(image_id: str, content: str) -> ImageBuild:
    return ImageBuild.from_content(image_id, content)


def judged(local: ImageBuild | None, *hosts):
    config = cfg()
    targets = [resolve_target(h, config.ssh, None, "root") for h in config.hosts]
    obs = Observations(MASTER, list(hosts), reach_ports=(29500, 45678), image_here=local is not None,
                       local_build=local)
    return judge(config, make_plan(config), targets, obs)


def on(rank: int, image_id: str, content: str):
    return host(rank, image_id=image_id, image_build=built(image_id, content))


def test_one_image_under_two_stores_ids_passes_by_its_content():
    # the classic store names it by its config digest, containerd's by its manifest digest
    report = run(cfg(), on(0, IMAGE_ID, CONTENT), on(1, OTHER_ID, CONTENT))
    row(report, H0, "image", PASS)
    row(report, H1, "image", PASS, "99ff88ee77dd")


def test_other_content_under_another_id_still_fails():
    other = CONTENT.replace("e5b3", "ffff")
    report = run(cfg(), on(0, IMAGE_ID, CONTENT), on(1, OTHER_ID, other))
    row(report, H1, "image", FAIL, "is 99ff88ee77dd here but ab12cd34ef56 on another host")
    # a host that does not report the content (an older observe) is judged by the ID alone
    report = run(cfg(), on(0, IMAGE_ID, CONTENT), host(1, image_id=OTHER_ID))
    row(report, H1, "image", FAIL, "here but ab12cd34ef56 on another host")
    # the same layers built at another time (only ENV or CMD changed: no new layer) are another build
    report = run(cfg(), on(0, IMAGE_ID, CONTENT), on(1, OTHER_ID, CONTENT.replace(CREATED, NEWER)))
    row(report, H1, "image", FAIL, "on another host")


def test_a_rebuild_here_that_no_host_has_fails_every_host_with_both_builds_and_the_push():
    """Quoted: both hosts held the old acc/stale:v1 and doctor said `image PASS` on both; `up` ran the old build."""
    local = built(OTHER_ID, CONTENT.replace(CREATED, NEWER).replace("e5b3", "abcd"))
    report = judged(local, on(0, IMAGE_ID, CONTENT), on(1, IMAGE_ID, CONTENT))
    for h in (H0, H1):
        got = row(report, h, "image", FAIL, "img:tag is ab12cd34ef56 (built 2026-11-23 14:40:47 UTC) here but "
                  "99ff88ee77dd (built 2026-11-27 09:00:00 UTC) on this machine", "fix: dockerlaunch push img:tag")
        assert got.detail.endswith("fix: dockerlaunch push img:tag")


def test_the_build_this_machine_holds_passes_in_either_store():
    local = built(IMAGE_ID, CONTENT)
    report = judged(local, on(0, IMAGE_ID, CONTENT), on(1, OTHER_ID, CONTENT))  # host 1: containerd's ID
    row(report, H0, "image", PASS, "ab12cd34ef56 (as on this machine)")
    row(report, H1, "image", PASS, "99ff88ee77dd (as on this machine)")
    assert not report.failed


def test_one_stale_host_fails_alone():
    local = built(IMAGE_ID, CONTENT)
    report = judged(local, on(0, IMAGE_ID, CONTENT), on(1, OTHER_ID, '2026-11-01T00:00:00Z ["' + L1 + '"]'))
    row(report, H0, "image", PASS)
    row(report, H1, "image", FAIL, "99ff88ee77dd (built 2026-11-01 00:00:00 UTC) here but ab12cd34ef56", "push")


def test_hosts_holding_a_newer_build_than_this_machine_get_no_push_over_it():
    """A teammate or CI pushed a newer build: a push from here would overwrite it with an older one."""
    local = built(OTHER_ID, CONTENT)
    newer = CONTENT.replace(CREATED, NEWER).replace("e5b3", "abcd")
    report = judged(local, on(0, IMAGE_ID, newer), on(1, IMAGE_ID, newer))
    for h in (H0, H1):
        got = row(report, h, "image", FAIL, "newer than this machine's 99ff88ee77dd (built 2026-11-23 14:40:47 UTC)",
                  "no push over it", "`docker image rm img:tag`")
        assert "dockerlaunch push" not in got.detail


def test_a_build_whose_time_is_unknown_is_never_called_older():
    local = built(OTHER_ID, f' ["{L1}"]')  # no creation time: the push is still the fix
    report = judged(local, on(0, IMAGE_ID, CONTENT), on(1, IMAGE_ID, CONTENT))
    row(report, H0, "image", FAIL, "99ff88ee77dd (build time unknown) on this machine", "fix: dockerlaunch push")


def test_where_this_machine_lacks_the_image_the_hosts_are_compared_with_each_other():
    report = judged(None, on(0, IMAGE_ID, CONTENT), on(1, IMAGE_ID, CONTENT))
    row(report, H0, "image", PASS, "ab12cd34ef56")
    assert "as on this machine" not in report.get(H0, "image").detail


# Real `docker image inspect` answers (Docker 28.2.2 here, and the moby API's documented RFC 3339 nano form): the
# creation times that engines print, and what observe.sh sends for an image without one.
@pytest.mark.parametrize("text,ns", [
    ("2026-11-23T14:40:47.764912492Z", 1795444847764912492),
    ("2024-02-01T00:00:00Z", 1706745600000000000),
    ("1970-01-01T00:00:00Z", 0),  # SOURCE_DATE_EPOCH=0 builds
    ("2026-11-23T15:40:47.5+01:00", 1795444847500000000),
    ("", None), ("<no value>", None), ("2026-13-40T00:00:00Z", None), ("2026-11-23 14:40:47 +0000 UTC", None),
    ("2026-11-23T14:40:47.7649124920Z", None),  # ten digits of fraction: not RFC 3339 nano
])
def test_creation_times_are_parsed_exactly_or_not_at_all(text, ns):
    assert parse_created(text) == ns


def test_what_a_host_says_of_layers_is_taken_only_as_digests():
    assert built(IMAGE_ID, CONTENT).layers == (L1, L2)
    for bad in (f'{CREATED} ["sha256:zz"]', f"{CREATED} {{}}", f"{CREATED} [", f"{CREATED} []", CREATED,
                f'{CREATED} ["{L1}\\n"]', f"{CREATED} [1]"):
        got = built(IMAGE_ID, bad)
        assert got.layers is None, bad
        assert not got.same_as(built(OTHER_ID, bad)), bad  # unknown content never makes two IDs the same


def test_a_local_engines_attrs_read_as_a_build():
    attrs = json.loads(json.dumps({"Id": IMAGE_ID, "Created": CREATED, "RootFS": {"Type": "layers",
                                                                                  "Layers": [L1, L2]}}))
    local = ImageBuild.of(attrs["Id"], attrs["Created"], attrs["RootFS"]["Layers"])
    assert local.same_as(built(OTHER_ID, CONTENT))
    assert local.describe() == "ab12cd34ef56 (built 2026-11-23 14:40:47 UTC)"
