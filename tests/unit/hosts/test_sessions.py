"""Which failed session opens are asked for again (the churn itself runs against a real sshd in
tests/integration/test_sim_cluster.py)."""

import paramiko
import pytest

from dockerlaunch.hosts.ssh import _session_refused


@pytest.mark.parametrize(("error", "again"), [
    (paramiko.ChannelException(2, "Connect failed"), True),  # sshd's "open failed" past MaxSessions
    (paramiko.ChannelException(1, "Administratively prohibited"), True),
    (paramiko.SSHException("Unable to open channel."), True),  # another thread took the saved refusal
    (paramiko.SSHException("Timeout opening channel."), False),  # sshd did not answer: waiting more is no cure
    (paramiko.SSHException("SSH session not active"), False),
])
def test_only_a_refusal_is_asked_for_again(error, again):
    assert _session_refused(error) is again
