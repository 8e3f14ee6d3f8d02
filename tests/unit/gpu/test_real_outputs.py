"""Every real nvidia-smi output of tests/data/nvidia-smi/real/ through the REAL probe.sh (no SSH, no engine: the
probe runs in a local sh with the folder's replay, tests/gpu_standin.py's `replay`, as `nvidia-smi` on its PATH, and
its kernel log, gpu_standin's `dmesg`, as `dmesg`), parsed by probe.parse_probe and judged for the recommended image
(CUDA 13.0, sm_90) by `ImageNeeds.runs_on` and gpu.health: the `driver`, `archs` and `gpu health` verdicts, the
reasons they give and the facts each folder's expected.yaml lists.

expected.yaml's words: every verdict is compared (PASS, WARN, FAIL or ERROR: what doctor concludes from this output,
an excerpt included: a field the excerpt lacks is one nvidia-smi left unanswered); each `why` line, `ROW: PHRASE`, is
compared too: PHRASE must be found, exactly as written (case and spaces included), in the reason of ROW's row, the
detail doctor prints next to the verdict; `driver`, `cuda` and each GPU's `compute_cap`, `mig`, `fabric_state`,
`fabric_status` are compared as listed (null: doctor must not know it, e.g. a compute capability a driver rejects); a
GPU's `index` and `name` where they are not null (an excerpt that shows neither leaves the replay to number the GPU
and print `[N/A]`). A folder whose verdict differs names itself (the test is parametrized by folder)."""

import os
import re
import subprocess

import pytest
import yaml

from dockerlaunch.backends.docker.probe import Probe, parse_probe, probe_argv
from dockerlaunch.gpu import health
from dockerlaunch.gpu.needs import ImageNeeds
from tests import gpu_standin

# the recommended image's labels (docker image inspect)
LABELS = {"ai.dockerlaunch.pin.cuda": "13.0", "ai.dockerlaunch.cuda-archs": "9.0",
          "ai.dockerlaunch.stack": "swift4.6-mcore0.19-cu13-py313",
          "ai.dockerlaunch.compiled": "transformer-engine-torch,apex,flash-attn"}
ROWS = ("driver", "archs", "gpu health")
FACTS = ("compute_cap", "mig", "fabric_state", "fabric_status")
# the host's other tools, as a host with no engine answers (the machine's own must not count); its kernel log is the
# folder's (gpu_standin.dmesg: a log with nothing in it where the folder has no dmesg.txt)
TOOLS = {"docker": "#!/bin/sh\nexit 1\n"}


def expected(folder: str) -> dict:
    return yaml.safe_load((gpu_standin.REAL / folder / "expected.yaml").read_text(encoding="utf-8"))


def whys(exp: dict) -> list[tuple[str, str]]:
    """expected.yaml's `why` lines as (row, phrase): `ROW: PHRASE`, ROW one of ROWS (a line naming no row is kept
    whole as its row, so that the comparison reports it)."""
    out = []
    for line in exp.get("why") or []:
        row = next((r for r in ROWS if line.startswith(f"{r}: ")), None)
        out.append((row, line[len(row) + 2:]) if row else (line, ""))
    return out


def probed(tmp_path, folder: str) -> Probe:
    """The real probe.sh, run as doctor runs it (probe_argv), with the folder's replay as nvidia-smi and its kernel
    log as dmesg."""
    bin_dir = tmp_path / "bin"
    gpu_standin.install_replay(bin_dir, folder)
    gpu_standin.install_dmesg(bin_dir, folder)
    for name, text in TOOLS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    r = subprocess.run(probe_argv("127.0.0.1"), capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    return parse_probe(r.stdout, folder)


def judged(p: Probe) -> dict[str, tuple[str, str]]:
    """The rows doctor writes for this host's GPUs: {check: (verdict, detail)}."""
    host = p.gpu_host
    assert host is not None, "the probe read no nvidia-smi facts"
    found = [*ImageNeeds.of_image(LABELS).runs_on(host), health.judge(host)]
    return {f.check: (str(f.verdict), f.detail) for f in found}


def differences(folder: str, p: Probe, rows: dict[str, tuple[str, str]], exp: dict | None = None) -> list[str]:
    """What differs from the folder's expected.yaml (or `exp`, given whole), one line each."""
    exp, host = exp or expected(folder), p.gpu_host
    out = []
    for row in ROWS:
        want, got = str(exp["verdicts"][row]), rows.get(row, ("absent", ""))
        if got[0] != want:
            out.append(f"{row}: {got[0]}, expected {want} ({got[1]})")
    for row, phrase in whys(exp):
        if row not in ROWS:
            out.append(f"why {row!r} names no row of {ROWS}")
        elif phrase not in rows.get(row, ("absent", ""))[1]:
            out.append(f"why {row}: {phrase!r} is not in its reason: {rows.get(row, ('absent', ''))[1]!r}")
    if host.driver != exp["driver"]:
        out.append(f"driver {host.driver!r}, expected {exp['driver']!r}")
    if host.cuda != exp["cuda"]:
        out.append(f"cuda {host.cuda!r}, expected {exp['cuda']!r}")
    gpus = sorted(host.gpus, key=lambda g: g.index)
    if len(gpus) != len(exp["gpus"]):
        out.append(f"{len(gpus)} GPU(s), expected {len(exp['gpus'])}")
    for g, want in zip(gpus, exp["gpus"]):
        keys = [*FACTS, *(k for k in ("index", "name") if want.get(k) is not None)]
        for k in keys:
            if getattr(g, k) != want.get(k):
                out.append(f"GPU {g.index} {k} {getattr(g, k)!r}, expected {want.get(k)!r}")
    return out


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """folder -> (probe, rows), each folder probed once for the tests below."""
    seen: dict[str, tuple[Probe, dict[str, tuple[str, str]]]] = {}

    def get(folder: str) -> tuple[Probe, dict[str, tuple[str, str]]]:
        if folder not in seen:
            p = probed(tmp_path_factory.mktemp("smi"), folder)
            seen[folder] = (p, judged(p))
        return seen[folder]

    return get


@pytest.mark.parametrize("folder", gpu_standin.REAL_FOLDERS)
def test_a_real_output_gets_the_verdicts_it_should(replayed, folder):
    p, rows = replayed(folder)
    diffs = differences(folder, p, rows)
    assert not diffs, "\n".join(diffs)


@pytest.mark.parametrize("folder", [f for f in gpu_standin.REAL_FOLDERS
                                    if all(v == "PASS" or v == "WARN" for v in expected(f)["verdicts"].values())])
def test_a_healthy_real_output_has_no_error_row(replayed, folder):
    """The issue's bar: a healthy output (no FAIL expected) gets no ERROR row, whatever its driver does not know."""
    _, rows = replayed(folder)
    assert {k: v for k, v in rows.items() if v[0] in ("ERROR", "FAIL")} == {}, rows


def test_a_why_that_the_reason_does_not_hold_is_a_difference(replayed):
    """The comparison itself: a phrase one character off, another row's phrase, a line naming no row: each is one
    difference; the folder's own whys none."""
    folder = "tesla-t4-515.105-telegraf"
    p, rows = replayed(folder)
    exp = expected(folder)
    assert whys(exp) and differences(folder, p, rows) == []
    for bad in ("archs: GPU 0 Tesla T4 (7.5, sm_76)", "archs: persistence mode off on GPU 0", "persistence mode off"):
        wrong = {**exp, "why": [*exp["why"], bad]}
        got = differences(folder, p, rows, wrong)
        assert len(got) == 1 and got[0].startswith("why"), (bad, got)


KERNEL_LOGS = [f for f in gpu_standin.REAL_FOLDERS if (gpu_standin.REAL / f / "dmesg.txt").exists()]


@pytest.mark.parametrize("folder", KERNEL_LOGS)
def test_a_real_kernel_log_reaches_the_xid_rule(replayed, folder):
    """A folder's dmesg.txt is what the probe's `dmesg` prints: every `[t] NVRM: Xid (PCI:bus): N` line of it comes
    back as one XID (its time, bus and code), and a fatal one on a GPU the output lists fails `gpu health`."""
    p, rows = replayed(folder)
    lines = (gpu_standin.REAL / folder / "dmesg.txt").read_text(encoding="utf-8").splitlines()
    said = [re.match(r"^\[ *(\d+\.\d+)\] NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),", x) for x in lines]
    want = [(float(m.group(1)), m.group(2), int(m.group(3))) for m in said if m]
    assert want, f"{folder}: dmesg.txt holds no NVRM Xid line"
    assert [(x.at_s, x.bus, x.code) for x in p.gpu_host.xids] == want
    fatal = [code for _, _, code in want if code in health.FATAL_XIDS]
    if fatal:
        assert rows["gpu health"][0] == "FAIL" and f"XID {fatal[0]} ({health.FATAL_XIDS[fatal[0]]})" in \
            rows["gpu health"][1], rows["gpu health"]


def test_the_xid_rule_has_a_real_fatal_excerpt():
    """Issue 60: the XID rule is held to at least one real kernel log whose expected `gpu health` is FAIL for an XID."""
    assert any(expected(f)["verdicts"]["gpu health"] == "FAIL"
               and any(r == "gpu health" and "XID" in w for r, w in whys(expected(f))) for f in KERNEL_LOGS)
