"""Hostile or careless input: one line of error that names the field, exit code 2, never a traceback, and
nothing contacted (every case here is a dry run or a config command)."""

import pytest


def one_line_error(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def write(tmp_path, text: str):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("host, word", [
    ("10.0.0.1;reboot", "not a host name"),
    ("a@@10.0.0.1", "not a login name"),
    ("$(id)", "not a host name"),
    ("-oProxyCommand=x", "not a host name"),
    ("h`x`", "not a host name"),
])
def test_hosts_that_would_reach_a_shell_are_refused(cli, host, word):
    one_line_error(cli("up", "--dry-run", "--hosts", host, "--image", "img:1", "--", "true"), word)


@pytest.mark.parametrize("yaml_text, words", [
    ("hosts: ['10.0.0.1;reboot']\nimage: i:1\n", ["hosts[0]", "not a host name"]),
    ("hosts: [h1]\nimage: i:1\ncontainer:\n  env:\n    A: [1, 2]\n", ["container.env", "A is a list"]),
    ("hosts: [h1]\nimage: i:1\ncontainer:\n  env:\n    A: {b: 1}\n", ["container.env", "A is a mapping"]),
    ("hosts: [h1]\nimage: i:1\ncontainer:\n  gpus: [0, 0]\n", ["container.gpus", "listed twice"]),
    ("hosts: [h1]\nimage: i:1\ncontainer:\n  user: --privileged\n", ["container.user", "not a user"]),
    ("hosts: [h1]\nimage: i:1\ncontainer:\n  workdir: -w\n", ["container.workdir", "absolute"]),
    ("hosts: [h1]\nimage: i:1\ncontainer:\n  ulimits:\n    nofile: [1, 2]\n", ["container.ulimits", "a list"]),
    ("hosts: [{address: h1, user: 'a b'}]\nimage: i:1\n", ["hosts[0].user", "not a login name"]),
    ("hosts: [h1]\nssh:\n  user: 'x;y'\nimage: i:1\n", ["ssh.user", "not a login name"]),
])
def test_bad_config_values_are_one_line_errors(cli, tmp_path, yaml_text, words):
    one_line_error(cli("up", "--dry-run", "--config", write(tmp_path, yaml_text), "--", "true"), *words)


@pytest.mark.parametrize("spelling, flags", [("on", "/dev/infiniband"), ("yes", "/dev/infiniband"), ("off", None)])
def test_yaml_booleans_for_infiniband_mean_on_and_off(cli, tmp_path, spelling, flags):
    r = cli("up", "--dry-run", "--config", write(tmp_path, f"hosts: [10.0.0.1]\nimage: i:1\ncontainer:\n"
                                                          f"  gpus: none\n  infiniband: {spelling}\n"), "--", "true")
    assert r.returncode == 0, r.stderr
    if flags:
        assert flags in r.stdout and "memlock=-1:-1" in r.stdout
    else:
        assert "/dev/infiniband" not in r.stdout and "NCCL_IB_HCA" not in r.stdout


def test_a_missing_env_file_fails_the_dry_run(cli, tmp_path):
    cfg = write(tmp_path, f"hosts: [10.0.0.1]\nimage: i:1\ncontainer:\n  env_files: [{tmp_path}/nope.env]\n")
    one_line_error(cli("up", "--dry-run", "--config", cfg, "--", "true"), "container.env_files", "nope.env")


def test_deeply_nested_yaml_is_one_line(cli, tmp_path):
    cfg = write(tmp_path, "hosts: [h1]\nimage: i:1\nx: " + "[" * 5000 + "]" * 5000 + "\n")
    one_line_error(cli("up", "--dry-run", "--config", cfg, "--", "true"), "nested")


def test_an_alias_bomb_is_refused_before_it_expands(cli, tmp_path):
    lines = ["hosts: [h1]", "image: i:1", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    lines.append("container:\n  env:\n    BOMB: *a8")
    text = "\n".join(lines) + "\n"
    assert len(text) < 1000
    one_line_error(cli("up", "--dry-run", "--config", write(tmp_path, text), "--", "true"), "aliases")


@pytest.mark.parametrize("name", ["/", "..", "../x", "a/b", "-x", ""])
def test_sim_names_are_checked_before_anything_is_touched(cli, name):
    for command in (["sim", "down", "--name", name], ["sim", "up", "--name", name], ["sim", "status", "--name", name]):
        r = cli(*command)
        assert r.returncode == 1 and "--name" in r.stderr and "Traceback" not in r.stderr, (command, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_failed_docker_command_is_reported_by_its_error_line_not_the_usage_hint():
    from dockerlaunch.hosts.ssh import Result

    stderr = ("Unable to find image 'x:1' locally\n"
              "docker: Error response from daemon: pull access denied for x, repository does not exist.\n"
              "See 'docker run --help'.\n")
    assert Result(125, "", stderr).last_line().startswith("docker: Error response from daemon: pull access denied")
    assert Result(1, "", "").last_line() == "exit status 1"
    # seen in CI: docker run's logrus line after the daemon's error hid the refused rlimit from doctor
    rlimit = ("docker: Error response from daemon: failed to create task for container: failed to create shim task: "
              "OCI runtime create failed: runc create failed: unable to start container process: error during "
              "container init: error setting rlimit type 7: operation not permitted: unknown.")
    stderr = f"{rlimit}\nERRO[0000] error waiting for container: context canceled\n"
    assert Result(125, "", stderr).last_line() == rlimit
    assert Result(1, "", "WARN[0000] only this\n").last_line() == "WARN[0000] only this"


@pytest.mark.parametrize("yaml_text, flags, words", [
    ("hosts: [h1]\nimage: i:1\njob: 5\n", ["--offline"], ["job: must be a mapping", "int"]),
    ("hosts: [h1]\nimage: i:1\njob: [a]\n", ["--name", "j"], ["job: must be a mapping", "list"]),
    ("hosts: [h1]\nimage: i:1\ncontainer: 7\n", ["--env", "A=1"], ["container: must be a mapping"]),
    ("hosts: [h1]\nimage: i:1\ncontainer: {env: [A=1]}\n", ["--env", "B=2"], ["container.env: must be a mapping"]),
    ("hosts: [h1]\nimage: i:1\ndiagnostics: off\n", ["--no-diagnostics"], ["diagnostics: must be a mapping"]),
])
def test_a_flag_merged_into_a_section_that_is_not_a_mapping(cli, tmp_path, yaml_text, flags, words):
    one_line_error(cli("up", "--dry-run", "--config", write(tmp_path, yaml_text), *flags, "--", "true"), *words)


@pytest.mark.parametrize("args, expected", [
    (["up", "--", "python", "train.py"],
     "error: no hosts to run on: pass --hosts h1,h2 (no ./dockerlaunch.yaml here to read them from)"),
    (["doctor"], "error: no hosts to run on: pass --hosts h1,h2 (no ./dockerlaunch.yaml here to read them from)"),
    (["render", "--to", "compose", "--", "true"],
     "error: no hosts to run on: pass --hosts h1,h2 (no ./dockerlaunch.yaml here to read them from)"),
    (["render", "--to", "k8s", "--", "true"], "error: render --to k8s needs the number of nodes: pass --nodes N"),
    (["render", "--to", "jobset", "--", "true"], "error: render --to jobset needs the number of nodes: pass --nodes N"),
    (["render", "--to", "slurm", "--", "true"], "error: render --to slurm needs the number of nodes: pass --nodes N"),
])
def test_no_hosts_in_an_empty_folder_is_a_whole_sentence_with_one_fix(cli, tmp_path, args, expected):
    """The first command a newcomer types, in a folder with no config: the line ends in the fix, not mid-way."""
    assert one_line_error(cli(*args, cwd=tmp_path)) == expected


def test_a_config_file_without_hosts_names_the_file(cli, tmp_path):
    cfg = write(tmp_path, "image: i:1\n")
    assert one_line_error(cli("up", "--config", cfg, "--", "true")) == \
        f"error: no hosts to run on: list them under `hosts:` in {cfg}"
    assert one_line_error(cli("render", "--to", "k8s", "--config", cfg, "--", "true")) == \
        f"error: render --to k8s needs the number of nodes ({cfg} lists no hosts): pass --nodes N"


@pytest.mark.parametrize("flags, expected", [
    (["--hosts", "172.30.10.11;172.30.10.12"],
     "error: --hosts: '172.30.10.11;172.30.10.12' is not a host name or IP address (letters, digits, '.', '-', '_'); "
     "separate hosts with ',' (--hosts h1,h2)"),
    (["--name", "UX bad"],
     "error: --name: 'UX bad': use letters, digits, '_', '.', '-' (start with a letter or digit, at most 63)"),
    (["--hosts", "h1,root@h2:99999"], "error: --hosts root@h2:99999: port: Input should be less than or equal to "
                                      "65535"),
    (["--hosts", "h1,h1"], "error: --hosts: host 'h1' is listed twice (hosts[0] and hosts[1])"),
    (["--mount", "data:/data"], "error: --mount data:/data: source: 'data' is not an absolute path"),
    (["--spares", "h9 h8"], "error: --spares: 'h9 h8' is not a host name or IP address (letters, digits, '.', '-', "
                            "'_'); separate hosts with ',' (--spares h1,h2)"),
    (["--hang-timeout", "soon"], "error: --hang-timeout: 'soon' is not a duration"),
])
def test_a_flags_bad_value_is_blamed_on_the_flag_not_the_file(cli, tmp_path, flags, expected):
    """Quoted: `--hosts '172.30.10.11;172.30.10.12'` said `dockerlaunch.yaml: hosts[0].address: ...` and
    `--name 'UX bad'` said `dockerlaunch.yaml: job.name`: the file was valid, the flag was not."""
    (tmp_path / "dockerlaunch.yaml").write_text("hosts: [h1, h2]\nimage: i:1\ncontainer:\n  mounts: [/d:/d]\n")
    line = one_line_error(cli("up", "--dry-run", *flags, "--", "true", cwd=tmp_path))
    assert line.startswith(expected) and "dockerlaunch.yaml" not in line, line


def test_the_file_is_still_named_for_its_own_errors_when_flags_are_given(cli, tmp_path):
    (tmp_path / "dockerlaunch.yaml").write_text("hosts: [h1]\nimage: i:1\njob: {name: 'bad name'}\n")
    line = one_line_error(cli("up", "--dry-run", "--hosts", "h2", "--", "true", cwd=tmp_path))
    assert line.startswith("error: dockerlaunch.yaml: job.name: 'bad name'"), line


@pytest.mark.parametrize("flags, yaml_text, words", [
    pytest.param(["--name", "train\n"], "", ["--name", "'train\\n'", "use letters"], id="--name"),
    pytest.param([], 'ssh:\n  user: "root\\n"\n', ["ssh.user", "'root\\n'", "not a login name"], id="ssh.user"),
    pytest.param([], 'hosts: [{address: h1, user: "root\\n"}]\n', ["hosts[0].user", "not a login name"],
                 id="hosts.user"),
    pytest.param([], 'container:\n  user: "nobody\\n"\n', ["container.user", "not a user"], id="container.user"),
    pytest.param([], 'container:\n  env:\n    "A\\n": x\n', ["container.env", "not a valid environment variable name"],
                 id="container.env"),
    pytest.param([], 'container:\n  shm_size: "8g\\n"\n', ["container.shm_size"], id="container.shm_size"),
    pytest.param([], 'container:\n  cap_add: ["SYS_PTRACE\\n"]\n', ["container.cap_add"], id="container.cap_add"),
    pytest.param(["--env", "A\n=x"], "", ["--env", "not a valid environment variable name"], id="--env"),
])
def test_a_value_with_a_trailing_line_feed_is_refused(cli, tmp_path, flags, yaml_text, words):
    """Issue 60, item 10: the validators' `re.match('^...$')` accepted a trailing line feed (`$` matches before
    one), so `--name 'train\\n'` named the job's containers, labels and log folder with a line break in them, and
    an SSH user 'root\\n' reached ssh and the hosts' shells."""
    (tmp_path / "dockerlaunch.yaml").write_text("hosts: [h1]\nimage: i:1\n" + yaml_text)
    one_line_error(cli("up", "--dry-run", *flags, "--", "true", cwd=tmp_path), *words)
