"""The recorded nvidia-smi outputs of tests/data/nvidia-smi/real/ (issue 51): each folder is one real output read from a
public source, with its address (SOURCE.md), the command outputs it reproduces, and the verdicts doctor should reach
from it (expected.yaml). Only the data's shape is checked here (tests/unit/gpu/test_real_outputs.py compares the
verdicts and the whys with what doctor says)."""

import re
from pathlib import Path

import pytest
import yaml

REAL = Path(__file__).resolve().parents[3] / "data" / "nvidia-smi" / "real"
FOLDERS = sorted(p for p in REAL.iterdir() if p.is_dir()) if REAL.is_dir() else []
SOURCE_FIELDS = ("driver", "cuda", "gpus", "form", "commands", "derived", "redacted", "excerpt", "notes")
SMI_OUTPUTS = {"L.txt", "q.txt", "q-x.xml", "query-gpu.csv", "query-gpu-full.csv", "help-query-gpu.txt",
               "compute-apps.csv", "stdout.txt"}
OUTPUTS = SMI_OUTPUTS | {"dmesg.txt"}  # dmesg.txt: the kernel log, as `dmesg` prints it
ALLOWED = OUTPUTS | {"SOURCE.md", "expected.yaml", "exit"}
VERDICTS = {"PASS", "WARN", "FAIL", "ERROR"}  # every verdict is decided and compared: no `unknown` (issue 60)
ROWS = ("driver", "archs", "gpu health")
UUID = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F-]*")


def test_the_set_covers_at_least_25_outputs():
    assert len(FOLDERS) >= 25, [p.name for p in FOLDERS]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_source_names_its_address_and_facts(folder):
    lines = (folder / "SOURCE.md").read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].startswith("source: https://"), lines[:1]
    keys = {line.split(":", 1)[0] for line in lines if ":" in line}
    assert set(SOURCE_FIELDS) <= keys, sorted(set(SOURCE_FIELDS) - keys)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_expected_says_what_doctor_concludes(folder):
    exp = yaml.safe_load((folder / "expected.yaml").read_text(encoding="utf-8"))
    assert isinstance(exp, dict) and {"driver", "cuda", "gpus", "verdicts", "why"} <= set(exp), exp
    assert exp["driver"] is None or isinstance(exp["driver"], str)
    assert exp["cuda"] is None or isinstance(exp["cuda"], str)
    assert isinstance(exp["gpus"], list)
    for g in exp["gpus"]:
        assert isinstance(g, dict) and "index" in g and "name" in g, g
    verdicts = exp["verdicts"]
    assert isinstance(verdicts, dict) and set(ROWS) <= set(verdicts), verdicts
    assert {str(v) for v in verdicts.values()} <= VERDICTS, verdicts
    why = exp["why"]
    assert isinstance(why, list) and all(isinstance(w, str) for w in why), why
    named = [next((r for r in ROWS if w.startswith(f"{r}: ") and w[len(r) + 2:].strip()), None) for w in why]
    assert None not in named, [w for w, r in zip(why, named) if r is None]  # `ROW: PHRASE`, a phrase to compare
    assert [r for r in ROWS if verdicts[r] != "PASS" and r not in named] == [], why  # each non-PASS row says why


def test_no_verdict_is_left_unknown():
    """Issue 60: `unknown` was a verdict never compared; every expected.yaml now says what its output gives."""
    left = {p.name: r for p in FOLDERS for r, v in
            yaml.safe_load((p / "expected.yaml").read_text(encoding="utf-8"))["verdicts"].items() if v == "unknown"}
    assert left == {}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_outputs_are_named_by_command_and_redacted(folder):
    names = {p.name for p in folder.iterdir()}
    assert names <= ALLOWED, sorted(names - ALLOWED)
    assert names & OUTPUTS, sorted(names)
    if "stdout.txt" in names:
        assert "exit" in names
    if "exit" in names:
        assert re.fullmatch(r"\d+\n?", (folder / "exit").read_text(encoding="utf-8"))
    paired = re.search(r"^smi: *(\S+) *$", (folder / "SOURCE.md").read_text(encoding="utf-8"), re.M)
    if paired:  # nvidia-smi's outputs are another folder's, named (a kernel log of one source paired with them)
        other = REAL / paired.group(1)
        assert not names & SMI_OUTPUTS and other.is_dir() and {p.name for p in other.iterdir()} & SMI_OUTPUTS, names
    else:
        assert names & SMI_OUTPUTS, sorted(names)
    if "dmesg.txt" in names:  # each line as dmesg prints it: `[seconds since boot] text`
        lines = (folder / "dmesg.txt").read_text(encoding="utf-8").splitlines()
        assert lines and all(re.match(r"^\[ *\d+\.\d{6}\] \S", x) for x in lines), lines
    for p in sorted(q for q in folder.iterdir() if q.name != "SOURCE.md"):  # SOURCE.md may name a source's placeholder
        text = p.read_text(encoding="utf-8", errors="replace")
        leaked = [u for u in UUID.findall(text) if not u.startswith("GPU-00000000-")]
        assert not leaked, f"{p.name}: {leaked[:3]}"
