"""`image:` is checked against Docker's reference grammar (issue 60, item 1): a value that is not a reference never
reaches a `docker run` line or a printed fix."""

import pytest

from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import is_image_ref
from dockerlaunch.job.load import load_config

GOOD = ["i:1", "ubuntu", "myteam/train:v1", "dockerlaunch/demo-torch:6aa7d402cc0c", "registry:5000/team/train:v1",
        "127.0.0.1:5000/dockerlaunch-cache:0123456789ab", "nvcr.io/nvidia/pytorch:25.01-py3", "a__b/c-d.e:t_1",
        "[::1]:5000/x:y", "x@sha256:" + "0" * 64, "x:1@sha256:" + "a" * 64, "sha256:" + "f" * 64, "0123456789ab",
        "nvcr.io#nvidia/pytorch:25.01-py3", "dockerd://train:1", "/shared/images/train.sqsh"]  # enroot's (pyxis)
BAD = ["x;curl${IFS}e|sh", "x:1;reboot", "$(id)", "-rm", "", "x y", "UPPER/case:1", "x:-bad", "x:1\n", "x/../y",
       "x:" + "t" * 129, "x@sha256:short", "a" * 256 + ":1",
       "a#b#c", "dockerd://x;y", "/x;y.sqsh", "nvcr.io#x y"]


@pytest.mark.parametrize("ref", GOOD)
def test_references_docker_accepts_are_accepted(ref):
    assert is_image_ref(ref)


@pytest.mark.parametrize("ref", BAD)
def test_what_is_not_a_reference_is_refused(ref):
    assert not is_image_ref(ref)


def test_a_shell_word_as_the_image_is_one_line_naming_the_field(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hosts: [10.0.0.1]\nimage: 'x;curl${IFS}e|sh'\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(cfg))
    assert "image" in str(e.value) and "not an image reference" in str(e.value) and "\n" not in str(e.value)
