"""Two logins without root on the same hosts, as the seed users have them (in the docker group; the sim's nodes
give every regular node `alice` and `bob`, sim.SIM_USERS): doctor, push, up, logs, dump and down end to end for
each, side by side. What they share on a host is the kernel, the engine and /var/tmp: each gets a diagnostics folder
of its own, owned by it (checked as root over SSH, not by the product's word)."""

import json

import pytest

from dockerlaunch.sim import SIM_USERS
from tests.integration.helpers import dl, ids_on_nodes, job_name, variant

pytestmark = pytest.mark.integration


def as_user(sim_cluster, tmp_path, user: str, **changes) -> str:
    return variant(sim_cluster, tmp_path, ssh={"user": user}, **changes)


def verdicts(out: str) -> dict[tuple[str, str], tuple[str, str]]:
    return {(c["host"], c["check"]): (c["verdict"], c["reason"]) for c in json.loads(out)["checks"]}


def test_doctor_as_a_login_without_root_passes_and_the_shared_check_writes_as_the_jobs_user(sim_cluster,
                                                                                           tmp_path, remotes):
    """Quoted: `shared FAIL cannot write to /shared: Permission denied` as a non-root login, where the job's
    container could write."""
    assert remotes[0].check(["stat", "-c", "%U %a", "/shared"], "owner").stdout.split() == ["root", "755"]
    for user in SIM_USERS:
        r = dl("doctor", "--config", as_user(sim_cluster, tmp_path, user), "--output", "json")
        rows = verdicts(r.stdout)
        assert r.returncode == 0, r.stdout + r.stderr
        ip2 = sim_cluster[2][1].ip
        verdict, reason = rows[(ip2, "shared")]
        assert verdict == "PASS" and "the job's user wrote there, in a container" in reason, reason
        assert rows[(sim_cluster[2][0].ip, "ssh")][1].startswith(f"{user}@")
    # nothing left: no marker on the storage, no probe container
    assert remotes[0].check(["ls", "-A", "/shared"], "listing").stdout.count(".dockerlaunch-shared-") == 0
    assert remotes[0].check(["docker", "ps", "-aq", "--filter", "label=dockerlaunch.probe"], "ps").stdout == ""


def test_a_read_only_shared_mount_passes_by_its_names_and_is_never_written(sim_cluster, tmp_path, remotes):
    mount = {"source": "/shared", "target": "/models", "shared": True, "read_only": True}
    # the job's user may not write there either (nobody): only the names at the top level can be compared
    cfg = as_user(sim_cluster, tmp_path, "alice", container={"mounts": [mount], "user": "65534"})
    remotes[0].check(["sh", "-c", "mkdir -p /shared/dlt-ro-a /shared/dlt-ro-b"], "two folders")
    try:
        r = dl("doctor", "--config", cfg, "--output", "json")
        verdict, reason = verdicts(r.stdout)[(sim_cluster[2][1].ip, "shared")]
        assert verdict == "PASS" and "mounted read-only" in reason and "names at its top level" in reason, reason
        assert ".dockerlaunch-shared-" not in remotes[0].check(["ls", "-A", "/shared"], "listing").stdout
    finally:
        remotes[0].run(["rmdir", "/shared/dlt-ro-a", "/shared/dlt-ro-b"])


def test_two_logins_without_root_run_side_by_side_end_to_end(sim_cluster, tmp_path, remotes, fresh_image,
                                                            job_containers):
    cfgs = {u: as_user(sim_cluster, tmp_path, u) for u in SIM_USERS}
    jobs = {u: f"{job_name()}-{u}" for u in SIM_USERS}
    image = fresh_image(mb=1)
    try:
        first = dl("push", image, "--config", cfgs["alice"], timeout=600)
        assert first.returncode == 0, first.stdout + first.stderr
        again = dl("push", image, "--config", cfgs["bob"], "--output", "json", timeout=600)
        assert again.returncode == 0 and {h["status"] for h in json.loads(again.stdout)["hosts"]} == {"skipped"}
        assert len(set(ids_on_nodes(remotes, image))) == 1 and None not in ids_on_nodes(remotes, image)
        for u in SIM_USERS:  # attached, then detached beside the other's
            ran = dl("up", "--config", cfgs[u], "--image", image, "--name", jobs[u], "--", "sh", "-c",
                     "echo ran as $(id -u) on rank $NODE_RANK")
            assert ran.returncode == 0 and "ran as 0 on rank 1" in ran.stdout, ran.stdout + ran.stderr
        for u in SIM_USERS:
            started = dl("up", "--detach", "--config", cfgs[u], "--image", image, "--name", jobs[u], "--", "sh",
                         "-c", f"echo {u} started $NODE_RANK; sleep 300")
            assert started.returncode == 0, started.stdout + started.stderr
        for u in SIM_USERS:
            logs = dl("logs", "--config", cfgs[u], "--name", jobs[u])
            assert f"{u} started 0" in logs.stdout and f"{u} started 1" in logs.stdout, logs.stdout + logs.stderr
            dump = dl("dump", "--config", cfgs[u], "--name", jobs[u], timeout=300)
            said = dump.stdout + dump.stderr
            assert dump.returncode in (0, 1) and "Traceback" not in said and f"dumping job {jobs[u]}" in said, said
        for rm in remotes:  # each login's folder is its own, beside the other's
            for u, uid in SIM_USERS.items():
                got = rm.check(["stat", "-c", "%u %a", f"/var/tmp/dockerlaunch-{u}/{jobs[u]}"], "stat").stdout.split()
                assert got == [str(uid), "755"], (rm.name, u, got)
        for u in SIM_USERS:
            down = dl("down", "--config", cfgs[u], "--name", jobs[u])
            assert down.returncode == 0, down.stdout + down.stderr
            assert job_containers(jobs[u]) == []
    finally:
        for u in SIM_USERS:
            dl("down", "--config", cfgs[u], "--name", jobs[u], "--ignore-missing")
        for rm in remotes:
            rm.run(["docker", "rmi", image])
            rm.run(["rm", "-rf", *(f"/var/tmp/dockerlaunch-{u}/{jobs[u]}" for u in SIM_USERS)])
