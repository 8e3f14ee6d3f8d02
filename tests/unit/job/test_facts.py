"""job/facts.py: EngineSecurity, the one reader of `docker info`'s SecurityOptions, on real outputs of both forms
(tests/data/docker-info/, each file's first lines say where it is from and what was cut)."""

import pytest

from dockerlaunch.job.facts import EngineSecurity
from tests.docker_standin import DOCKER_INFO, SAVED, security_options


def test_every_saved_output_says_where_it_is_from_and_what_was_cut():
    assert len(SAVED) >= 6
    for name in SAVED:
        head = (DOCKER_INFO / name).read_text().splitlines()[:3]
        assert head[0].startswith("# source: https://github.com/"), name
        assert any(h.startswith("# cut: ") for h in head), name


@pytest.mark.parametrize("name", SAVED)
def test_selinux_is_read_from_real_outputs_of_both_forms(name):
    options = security_options(name)
    security = EngineSecurity.parse(options)
    assert security is not None and security.selinux is ("-no-selinux" not in name), (name, options)
    assert not security.rootless
    assert "seccomp" in security.names


def test_the_two_forms_as_the_api_gives_them():
    bare = security_options("moby-31556-docker-1.12.5-centos7.3-selinux.txt")
    assert bare == ["seccomp", "selinux"]  # a daemon before 1.13: the bare names
    named = security_options("projectatomic-docker-338-rhel-docker-1.13.1-selinux-userns.txt")
    assert named == ["name=seccomp,profile=/etc/docker/seccomp.json", "name=selinux", "name=userns"]
    assert EngineSecurity.parse(bare).names == ("seccomp", "selinux")
    assert EngineSecurity.parse(named).names == ("seccomp", "selinux", "userns")


@pytest.mark.parametrize("options, selinux, rootless", [
    (["name=seccomp,profile=default", "name=selinux"], True, False),  # Fedora/RHEL docker, --selinux-enabled
    (["name=seccomp,profile=builtin", "name=rootless", "name=cgroupns"], False, True),  # Docker 28, rootlesskit
    (["apparmor", "seccomp", "selinux"], True, False),  # Docker 1.11/1.12
    (["name=apparmor", "name=seccomp,profile=builtin", "name=cgroupns"], False, False),  # Docker CE on Ubuntu
    (["name=selinuxfs", "name=seccomp,profile=selinux", "notselinux"], False, False),  # a word is not a substring
    ([], False, False),
    (None, False, False),  # JSON null: an engine with none
])
def test_names_not_substrings(options, selinux, rootless):
    security = EngineSecurity.parse(options)
    assert (security.selinux, security.rootless) == (selinux, rootless)


@pytest.mark.parametrize("options", ["name=selinux", {"name": "selinux"}, [1, "name=selinux"], 7])
def test_anything_but_a_list_of_strings_is_no_answer(options):
    assert EngineSecurity.parse(options) is None
