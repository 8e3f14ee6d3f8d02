"""stage.sh (the stage fragment of load.sh and relay.sh) run for real in a local sh with its own $HOME: real files,
real flock."""

import os
import subprocess
import time

from dockerlaunch.transfer import script


def test_the_seven_day_sweep_removes_only_stages_no_load_holds(tmp_path):
    """issue 50, finding 9: the sweep takes each old stage's lock before removing it: a load still reading a stage
    older than 7 days (a slow host, a clock) keeps it; an unheld one goes; lock files stay."""
    d = tmp_path / ".cache" / "dockerlaunch" / "push"
    d.mkdir(parents=True, mode=0o700)
    for key in ("held", "free"):
        (d / f"{key}.tar").write_bytes(b"x" * 1000)
        (d / f"{key}.lock").touch()
        old = time.time() - 10 * 86400
        os.utime(d / f"{key}.tar", (old, old))
    holder = subprocess.Popen(["flock", str(d / "held.lock"), "sleep", "30"])
    try:
        time.sleep(0.3)
        program = script("load.sh").split("\nif [ -n \"$key\" ]")[0] + '\nopen_stage "$key" 0\necho opened\n'
        r = subprocess.run(["sh", "-c", program, "sh", "sha256:x", "-", "none", "newkey", "0"], capture_output=True,
                           text=True, env={**os.environ, "HOME": str(tmp_path)}, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == "opened", r.stderr
        assert (d / "held.tar").exists(), "the sweep removed a stage a load still holds"
        assert not (d / "free.tar").exists(), "the sweep left an unheld 10-day-old stage"
        assert (d / "held.lock").exists() and (d / "free.lock").exists() and (d / "newkey.tar").exists()
    finally:
        holder.kill()
        holder.wait()
