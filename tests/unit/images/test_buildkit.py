"""Which docker CLI `build` runs BuildKit with, decided from probed facts (pure `choose_cli`), and the one
line it says when none can: no engine here. Probing is checked against stand-in `docker` scripts."""

import json
import os
import stat
import subprocess
import sys

import pytest

from dockerlaunch.errors import BuildError
from dockerlaunch.images import buildkit as builderlib
from dockerlaunch.images.buildkit import BuildxFile, DockerClient, choose_cli

NEW = DockerClient("/usr/local/bin/docker", "28.5.2")
NEW_BUILDX = DockerClient("/usr/local/bin/docker", "28.5.2", buildx="github.com/docker/buildx 0.29.1+ds1 0.29.1+ds1-4")
DEBIAN = DockerClient("/usr/bin/docker", "20.10.24+dfsg1")
DEBIAN_BUILDX = DockerClient("/usr/bin/docker", "20.10.24+dfsg1", buildx="github.com/docker/buildx v0.13.1 abc")


def message(clients, plugins=()) -> str:
    out = choose_cli(clients, plugins)
    assert isinstance(out, str), out
    assert "\n" not in out and out.strip() == out, out
    return out


def test_buildx_plugin_builds_with_load_and_no_env():
    b = choose_cli([NEW_BUILDX, DEBIAN])
    assert b.prefix == ("/usr/local/bin/docker", "buildx", "build", "--load") and b.env == {}
    assert b.docker == "/usr/local/bin/docker"
    assert b.what == "buildx 0.29.1+ds1 with the docker CLI at /usr/local/bin/docker (28.5.2)"


def test_buildx_is_preferred_to_a_built_in_buildkit_listed_first():
    b = choose_cli([DEBIAN, NEW_BUILDX])
    assert b.prefix[1:] == ("buildx", "build", "--load") and b.docker == "/usr/local/bin/docker"


def test_an_old_cli_with_the_plugin_uses_buildx_too():
    b = choose_cli([NEW, DEBIAN_BUILDX])
    assert b.prefix == ("/usr/bin/docker", "buildx", "build", "--load") and "v0.13.1" in b.what


def test_a_cli_older_than_23_has_buildkit_built_in():
    b = choose_cli([NEW, DEBIAN])  # the 28 CLI first on PATH, no plugin: Debian's 20.10 builds
    assert b.prefix == ("/usr/bin/docker", "build") and b.env == {"DOCKER_BUILDKIT": "1"}
    assert b.what == "the docker CLI at /usr/bin/docker (20.10.24+dfsg1, BuildKit built in)"
    for version in ("18.09.1", "19.03.15", "22.06.0-beta.0"):
        assert choose_cli([DockerClient("/x/docker", version)]).env == {"DOCKER_BUILDKIT": "1"}


def test_a_new_cli_without_buildx_says_what_to_install_in_one_line():
    assert message([NEW]) == (
        "the docker CLI at /usr/local/bin/docker (28.5.2) needs the buildx plugin for BuildKit: apt-get install "
        "docker-buildx (from Docker's own apt repository: docker-buildx-plugin), or put docker-buildx in "
        "~/.docker/cli-plugins")
    assert "the docker CLI at /usr/bin/docker (23.0.0) needs the buildx plugin" in message(
        [DockerClient("/usr/bin/docker", "23.0.0")])


def test_two_new_clis_without_buildx_are_named_in_one_sentence():
    m = message([NEW, DockerClient("/usr/bin/docker", "26.1.5+dfsg1")])
    assert m.startswith("the docker CLIs at /usr/local/bin/docker (28.5.2) and /usr/bin/docker (26.1.5+dfsg1) "
                        "need the buildx plugin for BuildKit: apt-get install docker-buildx")
    assert m.count("apt-get install") == 1


def test_a_broken_plugin_file_is_named():
    m = message([NEW], [BuildxFile("/usr/local/lib/docker/cli-plugins/docker-buildx", "Exec format error")])
    assert "needs the buildx plugin for BuildKit: /usr/local/lib/docker/cli-plugins/docker-buildx does not run " \
           "(Exec format error), replace it: apt-get install docker-buildx" in m


def test_a_plugin_that_runs_alone_but_not_under_the_cli_is_named():
    m = message([NEW], [BuildxFile("/root/.docker/cli-plugins/docker-buildx")])
    assert "/root/.docker/cli-plugins/docker-buildx runs on its own, but `docker buildx version` fails" in m


def test_no_cli_at_all():
    assert message([]).startswith("no docker CLI found (looked for docker on PATH, /usr/bin/docker, "
                                  "/usr/local/bin/docker): install Debian's docker.io")


def test_clis_that_do_not_run_or_are_too_old_are_each_named():
    m = message([NEW, DockerClient("/opt/docker", error="Permission denied"), DockerClient("/old/docker", "17.06.2")])
    parts = m.split("; ")
    assert parts[0].startswith("the docker CLI at /usr/local/bin/docker (28.5.2) needs the buildx plugin")
    assert parts[1] == "the docker CLI at /opt/docker does not run (Permission denied)"
    assert parts[2].startswith("the docker CLI at /old/docker (17.06.2) is too old for BuildKit")


def test_a_cli_that_failed_is_never_chosen_even_with_facts_that_look_good():
    assert isinstance(choose_cli([DockerClient("/d", "20.10.24", buildx="b 0.1", error="boom")]), str)


# ---------------------------------------------------------------- probing, with stand-in CLIs


def fake_docker(tmp_path, name: str, version_line: str, buildx: str | None) -> str:
    """A `docker` that prints VERSION_LINE for --version and answers `buildx version` only if BUILDX is set."""
    path = tmp_path / name
    buildx_branch = f'echo "{buildx}"; exit 0' if buildx else \
        "echo 'docker: unknown command: docker buildx' >&2; exit 1"
    path.write_text("#!/bin/sh\n"
                    f'if [ "$1" = --version ]; then echo "{version_line}"; exit 0; fi\n'
                    f'if [ "$1 $2" = "buildx version" ]; then {buildx_branch}; fi\n'
                    "echo unexpected >&2; exit 3\n")
    path.chmod(0o755)
    return str(path)


def test_probe_reads_version_and_buildx(tmp_path):
    d = fake_docker(tmp_path, "docker28", "Docker version 28.5.2, build 1234567", None)
    assert builderlib.probe_client(d) == DockerClient(d, "28.5.2")
    d = fake_docker(tmp_path, "docker20", "Docker version 20.10.24+dfsg1, build 297e128",
                    "github.com/docker/buildx 0.29.1+ds1 0.29.1+ds1-4")
    assert builderlib.probe_client(d) == DockerClient(d, "20.10.24+dfsg1",
                                                    buildx="github.com/docker/buildx 0.29.1+ds1 0.29.1+ds1-4")


def test_probe_of_what_is_not_a_docker_cli(tmp_path):
    podman = fake_docker(tmp_path, "podman", "podman version 4.3.1", None)
    assert builderlib.probe_client(podman).error == "not Docker's CLI: podman version 4.3.1"
    assert builderlib.probe_client(str(tmp_path / "absent")).error == "No such file or directory"
    noexec = tmp_path / "noexec"
    noexec.write_text("#!/bin/sh\n")
    assert builderlib.probe_client(str(noexec)).error == "Permission denied"


def test_plugin_dirs_follow_the_cli(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"cliPluginsExtraDirs": ["/opt/plugins"]}))
    dirs = builderlib.plugin_dirs({"DOCKER_CONFIG": str(tmp_path)})
    assert dirs == [str(tmp_path / "cli-plugins"), "/opt/plugins", "/usr/local/lib/docker/cli-plugins",
                    "/usr/local/libexec/docker/cli-plugins", "/usr/lib/docker/cli-plugins",
                    "/usr/libexec/docker/cli-plugins"]
    (tmp_path / "config.json").write_text("{not json")
    assert builderlib.plugin_dirs({"DOCKER_CONFIG": str(tmp_path)})[1] == "/usr/local/lib/docker/cli-plugins"


def test_probe_buildx_files_tells_broken_from_working(tmp_path):
    good, bad, none = tmp_path / "good", tmp_path / "bad", tmp_path / "none"
    for d in (good, bad, none):
        d.mkdir()
    (good / "docker-buildx").write_text("#!/bin/sh\necho github.com/docker/buildx 0.29.1\n")
    (bad / "docker-buildx").write_bytes(b"\x7fELFgarbage")
    for f in (good / "docker-buildx", bad / "docker-buildx"):
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    found = builderlib.probe_buildx_files([str(none), str(bad), str(good)])
    assert found == [BuildxFile(str(bad / "docker-buildx"), "Exec format error"),
                     BuildxFile(str(good / "docker-buildx"))]


def test_find_builder_raises_the_one_line(tmp_path, monkeypatch):
    d = fake_docker(tmp_path, "docker", "Docker version 28.5.2, build 1234567", None)
    monkeypatch.setattr(builderlib, "plugin_dirs", lambda env=None: [str(tmp_path / "no-plugins")])
    with pytest.raises(BuildError) as e:
        builderlib.find_cli([d])
    assert str(e.value) == f"the docker CLI at {d} (28.5.2) needs the buildx plugin for BuildKit: " + \
        builderlib.BUILDX_FIX


def test_build_command_prints_the_line_not_a_traceback(tmp_path):
    """`dockerlaunch build` with only a 23+ CLI and no plugin: `error: <the line>`, exit 1, nothing built (the
    real entry point in a subprocess, its client list and plugin folders replaced)."""
    d = fake_docker(tmp_path, "docker", "Docker version 28.5.2, build 1234567", None)
    program = (
        "import sys\n"
        "from dockerlaunch.images import build, buildkit\n"
        f"buildkit.docker_candidates = lambda: [{d!r}]\n"
        "buildkit.plugin_dirs = lambda env=None: []\n"
        "def no_verify(*a, **k): raise SystemExit('nothing was built, nothing to verify')\n"
        "build.verify = no_verify\n"
        "from dockerlaunch.cli.main import main\n"
        "main(['build', '--stack', 'cpu'])\n"
    )
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [
        f"error: the docker CLI at {d} (28.5.2) needs the buildx plugin for BuildKit: {builderlib.BUILDX_FIX}"
    ], r.stderr
    assert r.stdout == "" and os.listdir(tmp_path) == ["docker"]


def test_a_docker_container_builder_is_passed_over_for_the_engines_own():
    """A current buildx builder with the docker-container driver builds in its own BuildKit container, which
    cannot see the engine's images (the made base, the builder stage): the build names the context's builder."""
    current = DockerClient("/usr/local/bin/docker", "28.5.2", buildx=NEW_BUILDX.buildx, driver="docker-container",
                           context="default")
    b = choose_cli([current])
    assert b.prefix == ("/usr/local/bin/docker", "buildx", "build", "--builder", "default", "--load")
    assert "driver docker-container cannot see local images" in b.what
    same = DockerClient("/usr/local/bin/docker", "28.5.2", buildx=NEW_BUILDX.buildx, driver="docker",
                        context="default")
    assert choose_cli([same]).prefix == ("/usr/local/bin/docker", "buildx", "build", "--load")


def _proxy_args(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in enumerate(argv) if i and argv[i - 1] == "--build-arg"
                and a.split("=", 1)[0].lower() == "no_proxy")


@pytest.mark.parametrize("index, host", [("http://ci:tok@127.0.0.1:3141/simple", "127.0.0.1"),
                                         ("http://ci:tok@localhost:3141/simple", "localhost"),
                                         ("http://ci:tok@[::1]:3141/simple", "::1")])
def test_pip_in_the_build_asks_an_index_on_this_machine_directly_not_through_the_clis_proxy(tmp_path, monkeypatch,
                                                                                            index, host):
    """Issue 60, item 10: the docker CLI gives every build the proxies of its config.json (HTTP_PROXY, NO_PROXY
    and their lower-case twins as build args); pip then sent a loopback index's requests, plain-http token and
    all, to the proxy. The build names the loopback host in NO_PROXY and no_proxy, after the config's own noProxy
    (a --build-arg replaces the config's value). Elsewhere the CLI's proxy settings are left alone."""
    from dockerlaunch.images import lock as locks
    from dockerlaunch.images.build_argv import BuildOptions, render_build
    from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix

    (tmp_path / "config.json").write_text(json.dumps({"proxies": {"default": {
        "httpProxy": "http://10.9.9.9:3128", "httpsProxy": "http://10.9.9.9:3128", "noProxy": "corp.example,.lan"}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    stack = load_matrix().get("cpu")
    lock = locks.checked(stack, default_dockerfiles_dir())
    argv = render_build(stack, BuildOptions(pip_index_url=index), lock)
    assert _proxy_args(argv) == {"NO_PROXY": f"corp.example,.lan,{host}", "no_proxy": f"corp.example,.lan,{host}"}
    assert "tok" not in " ".join(argv)  # the index URL itself stays a secret file
    assert _proxy_args(render_build(stack, BuildOptions(pip_index_url="https://ci:tok@pypi.example/simple"),
                                    lock)) == {}
    (tmp_path / "config.json").write_text("{}")  # no proxies configured: the loopback host alone
    assert _proxy_args(render_build(stack, BuildOptions(pip_index_url=index), lock)) == {"NO_PROXY": host,
                                                                                        "no_proxy": host}


def test_the_clis_no_proxy_is_the_engines_hosts_entry_else_default(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"proxies": {
        "default": {"noProxy": "d.example"}, "tcp://10.0.0.5:2376": {"noProxy": "h.example"}}}))
    assert builderlib.cli_no_proxy({"DOCKER_CONFIG": str(tmp_path)}) == "d.example"
    on_host = {"DOCKER_CONFIG": str(tmp_path), "DOCKER_HOST": "tcp://10.0.0.5:2376"}
    assert builderlib.cli_no_proxy(on_host) == "h.example"
    (tmp_path / "config.json").write_text("not json")
    assert builderlib.cli_no_proxy({"DOCKER_CONFIG": str(tmp_path)}) == ""
    assert builderlib.cli_no_proxy({"DOCKER_CONFIG": str(tmp_path / "none")}) == ""
