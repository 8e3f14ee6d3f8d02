"""What `dump` reads from a host's commands (issue 60, finding 8): py-spy's stacks (the image's own or the sidecar's),
ranks.sh's processes and nvidia-smi come from the host and the job's image, so each is read in chunks and kept to
its first OUTPUT_LIMIT bytes (4 MB); past it the command is stopped, what came is kept and a note says it was cut.

Through the real `_HostDumper.run` on a stand-in host whose commands print 96 MB each."""

import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from dockerlaunch.diagnostics import dump
from dockerlaunch.hosts.ssh import Remote

FLOOD_MB = 96
BLOCK = (b"x" * 1023 + b"\n") * 1024  # 1 MiB of lines
STACK = b'==> pid 10\nThread 0x7f01 (active): "MainThread"\n    save_checkpoint (train.py:42)\n'


class FloodingHost(Remote):
    """Every command that prints what a host or image chose prints FLOOD_MB more after its first lines."""

    def __init__(self, image_has_pyspy: bool):
        self.image_has_pyspy = image_has_pyspy
        self.asked: list[list[str]] = []

    @property
    def name(self) -> str:
        return "10.0.0.1"

    def stream(self, command, on_stdout=None, on_stderr=None, stdin=None, timeout=None, stop=None, bulk=False):
        argv = list(command)
        self.asked.append(argv)
        text = " ".join(argv)

        def flood(head: bytes) -> int:
            on_stdout(head)
            for _ in range(FLOOD_MB):
                if stop is not None and stop.is_set():
                    return -1
                on_stdout(BLOCK)
                on_stderr(BLOCK[:4096])
            return 0

        if argv[:2] == ["docker", "inspect"]:
            on_stdout(b"running sha256:" + b"ab" * 32 + b" null\n")
            return 0
        if "proc $pid" in text:  # ranks.sh
            return flood(b"proc 10 1 0 0 python train.py\n")
        if "command -v py-spy" in text:
            if self.image_has_pyspy:
                on_stdout(b"/usr/local/bin/py-spy\n")
                return 0
            return 1
        if '"$SPY" dump' in text:  # the image's py-spy or the sidecar's
            return flood(STACK)
        if "fr-pipe" in text:
            on_stdout(b"triggered=0\n")
            return 0
        if "nvidia-smi" in text:
            return flood(b"| NVIDIA-SMI 580.95.05 |\n")
        if argv[-2:] == ["id", "-u"]:
            on_stdout(b"1000\n")
            return 0
        if argv[:2] == ["sh", "-c"] and "find fr nccl" in argv[2]:
            on_stderr(b"0 0\n")
            return 0
        raise AssertionError(f"asked {argv}")


@pytest.mark.parametrize("image_has_pyspy", [True, False], ids=["the images py-spy", "the sidecar"])
def test_a_hosts_endless_outputs_are_cut_at_the_bound_and_never_fill_the_launchers_memory(tmp_path, monkeypatch,
                                                                                       image_has_pyspy):
    monkeypatch.setattr(dump, "diag_dir", lambda config: "/var/tmp/dockerlaunch/job")
    monkeypatch.setattr(dump, "diag_root", lambda config: "/var/tmp/dockerlaunch")
    host = FloodingHost(image_has_pyspy)
    h = SimpleNamespace(rank=0, remote=host, connection=lambda: host, address="10.0.0.1", name="10.0.0.1")
    hp = SimpleNamespace(address="10.0.0.1", container=SimpleNamespace(name="job-0", image="app:1"))
    session = SimpleNamespace(plan=SimpleNamespace(hosts=[hp], config=None, job="job"))
    dumper = dump._HostDumper(session, h, tmp_path, False, Path("/usr/bin/py-spy"))
    monkeypatch.setattr(dumper, "_upload_pyspy", lambda: "/var/tmp/dockerlaunch/py-spy-abc")
    t0 = time.monotonic()
    tracemalloc.start()
    try:
        result = dumper.run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, f"the launcher held {peak / 2**20:.0f} MB of a host's outputs"
    assert time.monotonic() - t0 < 60
    pyspy = "py-spy (the image's own)" if image_has_pyspy else "py-spy's sidecar"
    for what in (pyspy, "ranks.sh", "nvidia-smi"):
        assert f"{what} printed more than 4 MB: cut there (the rest was not read)" in result.notes, result.notes
    # what came first is kept and read: the rank's stack from py-spy's first lines
    [stack] = result.stacks
    assert stack.threads and stack.threads[0].frames[0].func == "save_checkpoint", stack
    for name in ("nvidia-smi.txt", "processes.txt"):
        path = result.folder / name
        assert path.stat().st_size <= dump.OUTPUT_LIMIT + dump.STDERR_LIMIT + 200, (name, path.stat().st_size)
        assert path.read_text().endswith("[dockerlaunch: cut at 4 MB; the rest was not read]\n"), name
