"""Config and SSH settings checked before connecting, run as issue 52 quotes them, on the sim through the CLI: a
missing `ssh.identity_file`, a `hots:` typo, and `up` with no command and an image without CMD."""

import json

import yaml

from tests.integration.helpers import dl, job_name, variant


def test_a_missing_identity_file_is_named_before_any_connection(sim_cluster, tmp_path):
    key = tmp_path / "id_nosuch"
    cfg = variant(sim_cluster, tmp_path, ssh={"identity_file": str(key)})
    for args in (("doctor", "--config", cfg), ("up", "--config", cfg, "--name", job_name(), "--", "true")):
        r = dl(*args, timeout=120)
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert f"error: ssh.identity_file: key file {key} does not exist; " in r.stderr, out
        assert "No such file or directory" not in out and "cannot connect" not in out, out
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr  # one line, no traceback


def test_a_yaml_typo_gets_did_you_mean(sim_cluster, tmp_path):
    text = open(sim_cluster[1]).read()
    assert "\nhosts:" in "\n" + text
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(("\n" + text).replace("\nhosts:", "\nhots:", 1).lstrip("\n"))
    r = dl("doctor", "--config", str(cfg), timeout=120)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "hots: unknown field (did you mean `hosts`?" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_up_without_a_command_on_an_image_without_cmd_is_refused_before_any_container(sim_cluster, tmp_path,
                                                                                       job_containers):
    data = yaml.safe_load(open(sim_cluster[1]))
    assert not (data.get("job") or {}).get("command")  # the sim's tools image has no CMD and no ENTRYPOINT
    dry = dl("up", "--dry-run", "--output", "json", "--config", str(sim_cluster[1]))
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["command"] == "<the image's CMD>"
    for extra in ((), ("--skip-preflight",)):
        job = job_name()
        r = dl("up", "--config", str(sim_cluster[1]), "--name", job, *extra, timeout=180)
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert (f"error: no command to run: nothing after `--`, no job.command, and the image {data['image']} has "
                "no CMD or ENTRYPOINT; put the command after `--` or set `job.command`") in r.stderr, out
        assert "No command specified" not in out, out
        assert "doctor:" not in out, out  # refused before the pre-flight: nothing to check for it
        assert job_containers(job) == []
    # the fix, as printed: the command after `--` runs
    job = job_name()
    ok = dl("up", "--config", str(sim_cluster[1]), "--name", job, "--skip-preflight", "--", "echo", "ran-it",
            timeout=180)
    assert ok.returncode == 0 and "ran-it" in ok.stdout, ok.stdout + ok.stderr


def test_a_missing_known_hosts_file_or_proxy_jump_alias_is_named_before_any_connection(sim_cluster, tmp_path):
    known = tmp_path / "known_hosts_nosuch"
    cfg = variant(sim_cluster, tmp_path, ssh={"known_hosts": str(known)})
    r = dl("doctor", "--config", cfg, timeout=120)
    assert r.returncode != 0 and f"error: ssh.known_hosts: known_hosts file {known} does not exist; " in r.stderr, \
        r.stdout + r.stderr
    assert "ssh-keyscan -H " in r.stderr and "accept-new" not in r.stderr, r.stderr
    known.write_text("")  # there, but without the hosts' keys: each host's ssh row says how to add its key
    r = dl("doctor", "--config", cfg, timeout=120)
    assert r.returncode != 0 and r.stdout.count("host key unknown") == 2, r.stdout + r.stderr
    assert f"ssh-keyscan -H {sim_cluster[2][0].ip} | ssh-keygen -lf -" in " ".join(r.stdout.split()), r.stdout
    assert "accept-new" not in r.stdout, r.stdout
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host 172.30.*\n  ProxyJump bastoin.invalid\n")
    cfg = variant(sim_cluster, tmp_path, ssh={"config_file": str(ssh_config)})
    r = dl("doctor", "--config", cfg, timeout=120)
    assert r.returncode != 0, r.stdout + r.stderr
    assert (f"error: ProxyJump bastoin.invalid of Host {sim_cluster[2][0].ip} in {ssh_config}: {ssh_config} has no "
            "`Host bastoin.invalid` entry") in r.stderr, r.stderr
