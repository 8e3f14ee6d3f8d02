"""Values with quotes, $, ;, backslashes, newlines and spaces must reach docker byte-exact."""

import shlex
import subprocess

from hypothesis import given, settings
from hypothesis import strategies as st

from dockerlaunch.container import ContainerSpec
from dockerlaunch.docker_run import run_argv, shell_command

NASTY = list("ab '\"$;\\\n\t`|&*?!#~{}()<>=-") + ["$(id)", "${HOME}", "'\"'", "\\n", "--rm", "-e"]
text = st.lists(st.sampled_from(NASTY) | st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=12).map("".join)
env_key = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)


def spec(env, command):
    return ContainerSpec(name="job-0", image="img:tag", env=env, command=command, init=False)


@given(env=st.dictionaries(env_key, text, max_size=4), command=st.lists(text, max_size=5))
@settings(max_examples=300, deadline=None)
def test_shlex_round_trip(env, command):
    s = spec(env, command)
    line = shell_command(s)
    assert shlex.split(line) == run_argv(s)
    argv = shlex.split(line)
    assert argv[len(argv) - len(command):] == command
    for k, v in env.items():
        assert f"{k}={v}" in argv


@given(env=st.dictionaries(env_key, text, max_size=3), command=st.lists(text, max_size=4))
@settings(max_examples=100, deadline=None)
def test_real_shell_round_trip(env, command):
    """What a remote shell (POSIX sh) receives: the argv, each byte as rendered."""
    s = spec(env, command)
    line = shell_command(s)
    assert line.startswith("docker ")
    probe = "printf '%s\\0' " + line[len("docker "):]
    out = subprocess.run(["/bin/sh", "-c", probe], capture_output=True, check=True).stdout
    got = out.split(b"\0")[:-1]
    assert [g.decode() for g in got] == run_argv(s)[1:]
