"""dump's containers beside a job: the py-spy sidecar and the flight-recorder sandbox get the SELinux labels the
rank's container has (its `docker inspect`, as dump reads it)."""

import pytest

from dockerlaunch.diagnostics.dump import parse_state
from dockerlaunch.docker_run import sandbox_argv, sidecar_argv

IMAGE_ID = "sha256:" + "ab" * 32


@pytest.mark.parametrize("security_opt, off", [
    ('["label=disable"]', True),  # up's under container.selinux auto/disable, or Docker's own for --ipc host
    ('["label:disable"]', True),  # as Docker before 1.11 wrote it
    ('["no-new-privileges","label=disable"]', True),
    ("null", False),  # labelled (where the engine labels at all)
    ('["label=type:container_t"]', False),
    ("", False), ("not json", False),
])
def test_a_ranks_labels_are_read_from_its_inspect_line(security_opt, off):
    assert parse_state(f"running {IMAGE_ID} {security_opt}\n") == ("running", IMAGE_ID, off)


def test_an_odd_inspect_line_reads_as_labelled_never_as_an_error():
    assert parse_state("") == ("", "", False)
    assert parse_state("exited") == ("exited", "", False)


@pytest.mark.parametrize("off", [True, False])
def test_the_sidecar_and_the_sandbox_carry_the_ranks_labels(off):
    sidecar = sidecar_argv("job-0", IMAGE_ID, ["-c", "true"], caps=["SYS_PTRACE"], volumes=[], env={}, labels={},
                           label_disable=off)
    sandbox = sandbox_argv("fr", IMAGE_ID, ["-c", "true"], ro_volumes=["/d/fr-all:/fr"], labels={},
                           label_disable=off)
    for argv in (sidecar, sandbox):
        assert ("label=disable" in argv) is off
        if off:
            i = argv.index("label=disable")
            assert argv[i - 1] == "--security-opt" and i < argv.index(IMAGE_ID)
    # the sandbox keeps its own confinement either way: no new privileges, no capabilities, read-only
    assert "no-new-privileges" in sandbox and "--cap-drop" in sandbox and "--read-only" in sandbox
