"""Rendered jobs run for real: the compose files of `render --to compose` start the 2-node demo on the sim nodes
(compose 1.29 talking to each node's own dockerd over SSH), and every node's ranks all_reduce together."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.helpers import dl, job_name
from tests.integration.test_launch import TORCHRUN

pytestmark = pytest.mark.integration


def compose_home(tmp_path, cluster_config) -> str:
    """A HOME whose ~/.ssh holds the sim's key and pinned host keys (compose's paramiko reads ~/.ssh/config)."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "config").write_text(f"Host *\n  User root\n  IdentityFile {cluster_config.ssh.identity_file}\n")
    (ssh / "known_hosts").write_text(open(cluster_config.ssh.known_hosts).read())
    for p in ssh.iterdir():
        p.chmod(0o600)
    return str(ssh.parent)


def test_rendered_compose_files_run_the_two_node_demo(sim_cluster, cluster_config, demo_image, job_containers,
                                                      tmp_path):
    job = job_name()
    out = tmp_path / "compose"
    r = dl("render", "--to", "compose", "--config", str(sim_cluster[1]), "--image", demo_image, "--nproc-per-node",
           "2", "--name", job, "--out", str(out), "--", "sh", "-c", TORCHRUN)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["node-0.yaml", "node-1.yaml"]
    home = compose_home(tmp_path, cluster_config)
    procs = []
    try:
        for rank, host in enumerate(cluster_config.hosts):
            env = {**os.environ, "HOME": home, "DOCKER_HOST": f"ssh://root@{host.address}",
                   "COMPOSE_PARAMIKO_SSH": "1"}
            procs.append(subprocess.Popen(
                ["docker-compose", "-f", f"node-{rank}.yaml", "up", "--abort-on-container-exit",
                 "--exit-code-from", "node"], cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for rank, host in enumerate(cluster_config.hosts):
            env = {**os.environ, "HOME": home, "DOCKER_HOST": f"ssh://root@{host.address}",
                   "COMPOSE_PARAMIKO_SSH": "1"}
            subprocess.run(["docker-compose", "-f", f"node-{rank}.yaml", "down"], cwd=out, env=env,
                           capture_output=True, timeout=120)
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-3000:]
    ok = [line for text in outputs for line in text.splitlines() if "all_reduce sum=10 expected=10 OK" in line]
    ranks = sorted(line.split(" rank ")[1].split("/")[0] for line in ok)
    assert ranks == ["0", "1", "2", "3"], "\n".join(outputs)[-3000:]
    assert job_containers(job) == []


def test_render_probe_asks_each_host_like_up(sim_cluster, demo_image, tmp_path):
    """`render --probe` connects over SSH as `up` does (pinned host keys) and writes each host's own values."""
    import yaml

    out = tmp_path / "probed"
    r = dl("render", "--to", "compose", "--probe", "--config", str(sim_cluster[1]), "--image", demo_image,
           "--out", str(out), "--", "true")
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        text = (out / f"node-{rank}.yaml").read_text()
        env = yaml.safe_load(text)["services"]["node"]["environment"]
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"  # the sim nodes' NIC
        assert env["NODE_RANK"] == str(rank) and env["NPROC_PER_NODE"] == "1" and "note:" not in text


# ---- the pyxis script's env-file reader against a real `docker run --env-file` (issue 42, finding 7)

# Lines Docker's --env-file takes (docker/cli opts/parse.go), each a case a shell reader could get wrong: `$`,
# backquotes, `;` and quotes as data, blanks kept at the end of a value and trimmed before the name, CR before the
# newline dropped (one), `=` in the value, an empty value, a name given twice (the last wins), a name alone taken
# from the environment or, where the environment lacks it, left out, bytes beyond ASCII, a last line without `\n`.
ENV_FILE = (b"# a comment\n\n   \n"
            b"DLT_DOLLAR=$HOME and ${HOME} and $(id) and `id`\n"
            b"DLT_SEMI=a; touch pwned; b\n"
            b"DLT_QUOTES='single' \"double\" \\back\\slash \\n\n"
            b"DLT_SPACES=  lead and trail  \n"
            b"DLT_TABS=\tx\t\n"
            b"  \tDLT_INDENTED=x\n"
            b"DLT_EQ=k=v=w\n"
            b"DLT_EMPTY=\n"
            b"DLT_TWICE=first\nDLT_TWICE=second\n"
            b"DLT_FROM_ENV\n"
            b"DLT_NOT_IN_ENV\n"
            b"DLT_CRLF=windows\r\n"
            b"DLT_TWO_CR=a\r\r\n"
            b"DLT_HASH=#not a comment\n"
            b"DLT_UTF8=h\xc3\xa9llo \xe2\x98\x83\n"
            b"DLT_LAST=no newline")
CALLER_ENV = {"HOME": "/home/x", "DLT_FROM_ENV": "from the caller's environment"}


def file_vars(env0: bytes) -> dict[bytes, bytes]:
    return dict(kv.split(b"=", 1) for kv in env0.split(b"\0") if kv.startswith(b"DLT_"))


def test_pyxis_reads_an_env_file_byte_for_byte_as_a_real_docker_run_does(engine, tmp_path):
    """The same file, read by the rendered pyxis sbatch under bash (srun replaced by `env -0`) and by the docker
    CLI's own --env-file for a real container (`env -0` inside it): the same variables, byte for byte."""
    from dockerlaunch import sim
    from tests.unit.backends.test_render import plan_of, rendered

    env_file = tmp_path / "secrets.env"
    env_file.write_bytes(ENV_FILE)
    image = sim.ensure_base_image(engine)
    docker = subprocess.run(["docker", "run", "--rm", "--network", "none", "--env-file", str(env_file),
                             "--entrypoint", "env", image, "-0"], capture_output=True, timeout=300,
                            env={**os.environ, **CALLER_ENV})
    assert docker.returncode == 0, docker.stderr.decode()
    by_docker = file_vars(docker.stdout)

    text = rendered("slurm", plan_of(container__env_files=[str(env_file)], job__command=["python", "x.py"]))[
        "sft-qwen.pyxis.sbatch"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho gpu07\n")
    (bin_dir / "srun").write_text(f"#!/bin/sh\nenv -0 > {tmp_path}/env\n")
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    (tmp_path / "job.sbatch").write_text(text)
    r = subprocess.run(["bash", str(tmp_path / "job.sbatch")], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "x", **CALLER_ENV})
    assert r.returncode == 0, r.stderr
    by_pyxis = file_vars((tmp_path / "env").read_bytes())

    # the control: docker read every line this file means it to (so the comparison below compares something)
    assert sorted(by_docker) == sorted(k.split(b"=")[0].strip() for k in ENV_FILE.split(b"\n")
                                       if k.strip().startswith(b"DLT_") and b"DLT_NOT_IN_ENV" not in k
                                       and k != b"DLT_TWICE=first"), by_docker
    assert by_docker[b"DLT_TWICE"] == b"second" and by_docker[b"DLT_TWO_CR"] == b"a\r"
    assert by_pyxis == by_docker
    assert not (tmp_path / "pwned").exists()


# ---- compose's env_file against a real `docker run --env-file` (issue 60)

# Lines compose 2 and docker-compose 1.29 read as Docker's --env-file does, each a case a dotenv reader could get
# wrong: `$` before no name, backquotes (first, too), `;`, quotes and backslashes inside or last, `#` with no white
# space before it, white space inside, `=` in the value, an empty value, a name given twice, a name alone taken from
# the environment or, where the environment lacks it, left out, CRLF, beyond ASCII, a byte-order mark, a lowercase
# name, a last line without `\n`.
COMPOSE_ENV_FILE = (b"\xef\xbb\xbf# a comment after a byte-order mark\n\n   \n  # 'an indented' \"comment\" $HOME\n"
                    b"DLT_DOLLAR=a$ and $(id) and a$1 and $} and a$-b and a$.b and $\n"
                    b"DLT_BACKQUOTES=`id` and `id`\n"
                    b"DLT_SEMI=a; touch pwned; b\n"
                    b"DLT_QUOTES=it's a \"quoted\" word'\n"
                    b"DLT_BACKSLASH=\\back\\slash \\n \\$1 \\\"x\\\n"
                    b"DLT_HASH=#not a comment\n"
                    b"DLT_HASH_INSIDE=a#b#\n"
                    b"DLT_SPACES=inner  spaces\tand a tab\x0band a vertical one\n"
                    b"  \tDLT_INDENTED=x\n"
                    b"DLT_EQ==k=v=w\n"
                    b"DLT_EMPTY=\n"
                    b"DLT_TWICE=first\nDLT_TWICE=second\n"
                    b"DLT_FROM_ENV\n"
                    b"DLT_NOT_IN_ENV\n"
                    b"DLT_CRLF=windows\r\n"
                    b"DLT_UTF8=h\xc3\xa9llo \xe2\x98\x83 a\xc2\xa0b a\xe2\x80\xa8b\n"
                    b"DLT_lower=x\n"
                    b"DLT_LAST=no newline")
# Lines compose reads otherwise than Docker (measured here: the control below), each with what the render says. A
# line feed cannot be in a value: the line after it is a line of its own (`second line` below, refused as one).
COMPOSE_MISREADS = {
    b"DLT_SQ='s3cr3t'": "starts with a quote", b'DLT_DQ="s3cr3t"': "starts with a quote",
    b"DLT_LEAD= s3cr3t": "white space", b"DLT_TRAIL=s3cr3t ": "white space",
    b"DLT_TRAIL_NBSP=s3cr3t\xc2\xa0": "white space", b"DLT_TRAIL_CR=s3cr3t\r\r": "white space",
    b"DLT_COMMENT=s3cr3t #x": "`#` after white space", b"DLT_TAB_COMMENT=s3cr3t\t#x": "`#` after white space",
    b"DLT_VAR=s3cr3t$HOME": "`$` before", b"DLT_BRACE=s3cr3t${HOME}": "`$` before",
    b"DLT_ESCAPE=s3cr3t$$": "`$` before", b"DLT_UNDERSCORE=s3cr3t$_x": "`$` before",
    b"DLT_CR=s3cr3t\rDLT_SPLIT=y": "carriage return",
}
# ... and lines that make one of them (docker or a compose) refuse the whole file while another takes it; the last,
# a name alone, only as the file's last line with no line feed after it (the render writes these in this order)
COMPOSE_MISREAD_FILES = {
    b"DLT_LF=s3cr3t line\nsecond line": "not NAME=VALUE",
    b"export DLT_EXPORT=s3cr3t": "not NAME=VALUE", b"DLT_COLON:x=s3cr3t": "not NAME=VALUE",
    b"DLT_LATIN1=s3cr3t\xe9": "not UTF-8", b"DLT_ALONE": "alone on a last line with no line feed",
}
COMPOSE_TOOLS = {"compose 2": ["docker", "compose"], "compose 1.29": ["docker-compose"]}


def env_by(tool: list[str] | None, image: str, env_file: Path, tmp_path: Path, compose_file: Path | None = None):
    """The DLT_ variables a container gets from `env_file` through `docker run --env-file` (tool None) or through
    compose's env_file (the rendered `compose_file`, else a minimal one), or the error that stopped it."""
    env = {**os.environ, **CALLER_ENV, "MASTER_ADDR": "127.0.0.1", "NPROC_PER_NODE": "1"}
    if tool is None:
        argv = ["docker", "run", "--rm", "--network", "none", "--env-file", str(env_file), "--entrypoint", "env",
                image, "-0"]
    else:
        if compose_file is None:
            compose_file = tmp_path / "minimal.yaml"
            compose_file.write_text(json.dumps({"services": {"node": {
                "image": image, "network_mode": "none", "env_file": [str(env_file)], "entrypoint": ["env", "-0"]}}}))
        argv = [*tool, "-f", str(compose_file), "-p", job_name(), "run", "--rm", "-T", "node"]
    r = subprocess.run(argv, capture_output=True, timeout=300, env=env)
    return file_vars(r.stdout) if r.returncode == 0 else f"exit {r.returncode}: {r.stderr.decode()[-300:]}"


def test_compose_env_file_gives_the_container_what_docker_run_env_file_does(engine, tmp_path):
    """The compose file `render` writes, run by compose 2 and by 1.29 (`docker compose run`, the container's
    environment as `env -0` prints it), and the same env file through a real `docker run --env-file` (as `up`
    runs it): the same variables, byte for byte. A line compose would read otherwise is refused by the render, one
    line each naming the file, the line and the variable, never the value; and each such line is one compose does
    misread (the control)."""
    from dockerlaunch import sim

    image = sim.ensure_base_image(engine)
    env_file = tmp_path / "secrets.env"
    config = tmp_path / "job.yaml"
    # nofile 1024: an engine in a container cannot raise it to the job's 1048576
    config.write_text(json.dumps({"hosts": ["127.0.0.1"], "image": image, "container": {
        "gpus": "none", "ulimits": {"nofile": "1024"}, "env_files": [str(env_file)]}}))

    def render(data: bytes):
        env_file.write_bytes(data)
        out = tmp_path / f"out-{job_name()}"
        return out, dl("render", "--to", "compose", "--config", str(config), "--infiniband", "off", "--out",
                       str(out), "--", "env", "-0")

    out, r = render(COMPOSE_ENV_FILE)
    assert r.returncode == 0, r.stderr
    by_docker = env_by(None, image, env_file, tmp_path)
    # the control: docker read every line this file means it to (so the comparison below compares something)
    assert isinstance(by_docker, dict) and len(by_docker) == 17 and by_docker[b"DLT_TWICE"] == b"second", by_docker
    assert by_docker[b"DLT_SPACES"] == b"inner  spaces\tand a tab\x0band a vertical one", by_docker
    for name, tool in COMPOSE_TOOLS.items():
        assert env_by(tool, image, env_file, tmp_path, out / "node-0.yaml") == by_docker, name
    assert not (tmp_path / "pwned").exists()

    # every line compose misreads, after the good ones: one refusal each, its line, its reason, no value
    lines = [*COMPOSE_MISREADS, *COMPOSE_MISREAD_FILES]
    data = COMPOSE_ENV_FILE + b"\n" + b"\n".join(lines)  # DLT_ALONE last, no line feed after it
    _, r = render(data)
    assert r.returncode == 2 and "s3cr3t" not in r.stderr, r.stderr
    first = COMPOSE_ENV_FILE.count(b"\n") + 2
    expected = []
    for line in lines:
        reason = {**COMPOSE_MISREADS, **COMPOSE_MISREAD_FILES}[line]
        n = first + line.count(b"\n")  # a line feed: the line after it is the one refused
        first += line.count(b"\n") + 1
        expected.append((n, reason))
    got = r.stderr.strip().splitlines()
    assert len(got) == len(expected), r.stderr
    for text, (n, reason) in zip(got, expected):
        assert text.startswith(f"error: render --to compose: container.env_files: {env_file} line {n}: "), text
        assert reason in text and text.endswith("; change that line"), text

    # the control: each refused line is one that docker and a compose read apart
    env_file.write_bytes(b"\n".join(COMPOSE_MISREADS) + b"\n")
    by_docker = env_by(None, image, env_file, tmp_path)
    by_compose = {name: env_by(tool, image, env_file, tmp_path) for name, tool in COMPOSE_TOOLS.items()}
    assert all(isinstance(env, dict) for env in [by_docker, *by_compose.values()]), (by_docker, by_compose)
    for line in COMPOSE_MISREADS:
        var = line.split(b"=")[0]
        assert any(env.get(var) != by_docker[var] for env in by_compose.values()), (line, by_docker, by_compose)

    def outcome(env):  # the variables, or that it failed (two failures are alike, whatever their words)
        return env if isinstance(env, dict) else "failed"

    for line in COMPOSE_MISREAD_FILES:
        env_file.write_bytes(line)
        by_docker = outcome(env_by(None, image, env_file, tmp_path))
        by_compose = {name: outcome(env_by(tool, image, env_file, tmp_path)) for name, tool in COMPOSE_TOOLS.items()}
        assert any(env != by_docker for env in by_compose.values()), (line, by_docker, by_compose)
