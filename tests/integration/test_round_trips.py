"""`up` asks each host once per attempt (issue 61): probe.sh runs once per host per attempt (in the pre-flight's
own round trip, which `up` then plans from; in prepare's without a pre-flight), counted where every remote command
leaves this machine: each SSH channel paramiko opens, on a real session with the sim's hosts."""

import threading
from collections import Counter

import pytest

from dockerlaunch.backends.docker import up as launch
from dockerlaunch.hosts import ssh
from dockerlaunch.hosts.ssh import STEPS_MARK
from dockerlaunch.job.flags import Overrides
from dockerlaunch.job.load import load_config
from tests.integration.helpers import job_name, variant

pytestmark = pytest.mark.integration

PROBE_MARK = "SMI_APPS=gpu_bus_id,pid,used_memory"  # a line of probe.sh, whole in its quoted form
DIAG_MARK = "root=$1 job=$2 mode=$3 owner=$4"  # diagdir.sh's first line of code


@pytest.fixture
def channels(monkeypatch):
    """(host, command) of every SSH channel opened from this process, in order."""
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()
    real = ssh.Remote._channel

    def counting(self, command):
        with lock:
            seen.append((self.name, command))
        return real(self, command)

    monkeypatch.setattr(ssh.Remote, "_channel", counting)
    return seen


def what(command: str) -> str:
    return "probe.sh" if PROBE_MARK in command else " ".join(command.split())[:70]


@pytest.mark.parametrize("preflight", [True, False], ids=["preflight", "skip-preflight"])
def test_up_runs_probe_sh_once_per_host_per_attempt(sim_cluster, tmp_path, channels, preflight):
    cfg = variant(sim_cluster, tmp_path, job={"restart_backoff": 1})
    config = load_config(cfg, Overrides(name=job_name(), command=["sh", "-c", "exit 3"], max_restarts=1))
    code = launch.up(config, preflight=preflight, log_dir=str(tmp_path / "logs"))
    assert code == 3  # two attempts, each failed
    hosts = sorted({h.address for h in config.hosts})
    probes = Counter(host for host, command in channels if PROBE_MARK in command)
    assert probes == dict.fromkeys(hosts, 2), [(h, what(c)) for h, c in channels]
    for h in hosts:
        mine = [c for hh, c in channels if hh == h]
        starts = [i for i, c in enumerate(mine)
                  if c.startswith("docker run --detach --name") and "--label dockerlaunch.job=" in c]  # the job's
        assert len(starts) == 2, [what(c) for c in mine]
        before = mine[:starts[0]]
        print(f"\n{h}: {len(mine)} channel(s); before attempt 0's start: {[what(c) for c in before]}")
        if not preflight:  # the listing, stale secret files, the diagnostics folder and the probe: one round trip
            assert STEPS_MARK in before[0] and PROBE_MARK in before[0] and DIAG_MARK in before[0], what(before[0])
            assert all(PROBE_MARK not in c and DIAG_MARK not in c for c in before[1:]), [what(c) for c in before]
