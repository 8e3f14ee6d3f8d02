"""doctor's image row where hosts keep images in different stores (classic vs containerd's)."""

from dockerlaunch.backends.docker.doctor.report import FAIL, PASS
from tests.unit.backends.docker.test_doctor_judge import H0, H1, OTHER_ID, cfg, host, row, run

CONTENT = '2026-11-23T14:40:47.764912492Z ["sha256:9f6f...","sha256:e5b3..."]'


def test_one_image_under_two_stores_ids_passes_by_its_content():
    # the classic store names it by its config digest, containerd's by its manifest digest
    report = run(cfg(), host(0, image_content=CONTENT), host(1, image_id=OTHER_ID, image_content=CONTENT))
    row(report, H0, "image", PASS)
    row(report, H1, "image", PASS, "99ff88ee77dd")


def test_other_content_under_another_id_still_fails():
    other = CONTENT.replace("e5b3", "ffff")
    report = run(cfg(), host(0, image_content=CONTENT), host(1, image_id=OTHER_ID, image_content=other))
    row(report, H1, "image", FAIL, "is 99ff88ee77dd here but ab12cd34ef56 on another host")
    # a host that does not report the content (an older observe) is judged by the ID alone
    report = run(cfg(), host(0, image_content=CONTENT), host(1, image_id=OTHER_ID))
    row(report, H1, "image", FAIL, "here but ab12cd34ef56 on another host")
