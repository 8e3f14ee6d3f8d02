"""Rendered jobs run for real: the compose files of `render --to compose` start the 2-node demo on the sim nodes
(compose 1.29 talking to each node's own dockerd over SSH), and every node's ranks all_reduce together."""

import os
import subprocess

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
