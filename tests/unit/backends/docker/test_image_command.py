"""An empty command with an image that runs nothing is refused before any container starts (issue 52 item 2):
probe.sh reads the image's Entrypoint and Cmd in the same `docker image inspect` as its labels."""

import json
import subprocess

import pytest

from dockerlaunch.backends.docker.probe import ImageCommand, parse_image_command, parse_probe, probe_argv
from dockerlaunch.backends.docker.session import check_command
from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import IMAGE_CMD, command_refusal, make_plan


def cfg(**job) -> ClusterConfig:
    return ClusterConfig.model_validate({"hosts": ["10.0.0.1", "10.0.0.2"], "image": "team/img:1", "job": job})


@pytest.mark.parametrize("text, want", [
    ("[null,null]", ImageCommand((), ())),
    ('[null,["bash"]]', ImageCommand((), ("bash",))),
    ('[["/entry.sh"],[]]', ImageCommand(("/entry.sh",), ())),
    ("", None),  # the image was not there to inspect
    ("[null]", None), ('{"a": 1}', None), ("[1,2]", None), ("not json", None),
])
def test_parse_image_command(text, want):
    assert parse_image_command(text) == want


def test_no_command_and_an_image_that_runs_nothing_is_one_line_with_the_fix():
    why = command_refusal(cfg(), "team/img:1", False)
    assert why == ("no command to run: nothing after `--`, no job.command, and the image team/img:1 has no CMD or "
                   "ENTRYPOINT; put the command after `--` or set `job.command`")
    assert command_refusal(cfg(), "team/img:1", True) is None  # the image's CMD runs
    assert command_refusal(cfg(), "team/img:1", None) is None  # not known: nothing refused on a guess
    assert command_refusal(cfg(command="python train.py"), "team/img:1", False) is None
    assert command_refusal(cfg(command=["python", "x.py"]), "team/img:1", False) is None


def test_check_command_reads_the_probe_of_the_host_that_inspected_the_image():
    empty = parse_probe("has_ip=0\nimage_cmd=[null,null]\n")
    unasked = parse_probe("has_ip=0\n")  # hosts other than 0 are not asked for the image
    with pytest.raises(ConfigError, match=r"has no CMD or ENTRYPOINT; put the command after `--`"):
        check_command(make_plan(cfg()), [empty, unasked])
    check_command(make_plan(cfg()), [parse_probe('has_ip=0\nimage_cmd=[null,["sh"]]\n'), unasked])  # nothing raised
    # not known: left to the host's error
    check_command(make_plan(cfg()), [RuntimeError("host 0 unreachable"), unasked])


def test_the_dry_run_shows_the_image_s_cmd_where_the_command_would_be():
    assert make_plan(cfg()).to_dict()["command"] == IMAGE_CMD == "<the image's CMD>"
    assert make_plan(cfg(command=["python", "x.py"])).to_dict()["command"] == ["python", "x.py"]
    assert make_plan(cfg()).hosts[0].container.command == []  # renders and `up` get no placeholder as a command


def test_probe_sh_reads_labels_and_command_in_one_inspect(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    labels = {"ai.dockerlaunch.pin.torch": "2.13.0", "note": "a\nb"}
    docker = bin_dir / "docker"  # a stand-in engine CLI: what `docker image inspect --format` prints
    docker.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n'
                      f"[ \"$1\" = image ] && printf '%s\\n%s\\n' '{json.dumps(labels)}' '[null,null]'\nexit 0\n")
    docker.chmod(0o755)
    r = subprocess.run(probe_argv("127.0.0.1", "img:1", gpu=False), capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin"})
    assert r.returncode == 0, r.stderr
    p = parse_probe(r.stdout)
    assert p.image_labels == labels and p.image_command == ImageCommand((), ())
    asked = calls.read_text().splitlines()
    assert len([a for a in asked if a.startswith("image inspect")]) == 1, asked  # one question for both
    assert "{{json .Config.Entrypoint}},{{json .Config.Cmd}}" in asked[0]
