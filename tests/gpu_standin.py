"""A stand-in `nvidia-smi` made from one case of tests/data/nvidia-smi/ (the only stand-in the project allows, while
no GPU is lent): a shell script with the case's outputs inside it, so that it also answers where it is bind-mounted
alone (doctor's GPU container in device mode mounts the host's nvidia-smi under /usr/local/nvidia/bin)."""

from pathlib import Path

CASES = Path(__file__).parent / "data" / "nvidia-smi"
# real/: outputs recorded on real GPUs, from public sources (issue 51), in a layout of their own (SOURCE.md, ...)
WRITTEN = sorted(p.name for p in CASES.iterdir() if p.is_dir() and p.name != "real")
QUERY_GPU = ("index", "pci.bus_id", "name", "compute_cap", "driver_version", "memory.used", "memory.total",
             "persistence_mode", "mig.mode.current", "ecc.errors.uncorrected.volatile.total",
             "ecc.errors.uncorrected.aggregate.total", "remapped_rows.pending")


def _heredoc(text: str) -> str:
    return f"cat <<'DL_SMI_EOF'\n{text}{'' if text.endswith(chr(10)) or not text else chr(10)}DL_SMI_EOF\n"


def script(case: str, pid: int | None = None) -> str:
    """`pid`: the process the case's compute-apps line names instead of its recorded 4242 (a real one, so that the
    probe's `ps` finds its owner)."""
    d = CASES / case
    status = (d / "exit").read_text().strip() if (d / "exit").exists() else "0"
    out = "\n".join([
        "#!/bin/sh",
        f"# stand-in nvidia-smi (tests only): case {case} of tests/data/nvidia-smi, written from NVIDIA's formats",
        'case "$1" in',
        "  -L)", _heredoc((d / "L.txt").read_text()), "    ;;",
        "  -q)", _heredoc((d / "q.txt").read_text()), "    ;;",
        "  --query-compute-apps=*)",
        _heredoc((d / "compute-apps.csv").read_text().replace(", 4242,", f", {pid}," if pid else ", 4242,")),
        "    ;;",
        # the columns asked for, by name, from the case's columns (in probe.sh's SMI_GPU order)
        "  --query-gpu=*)",
        f"    cols='{','.join(QUERY_GPU)}'",
        "    want=${1#--query-gpu=}",
        "    " + _heredoc((d / "query-gpu.csv").read_text()).replace(
            "cat <<'DL_SMI_EOF'", "cat <<'DL_SMI_EOF' | awk -F', ' -v cols=\"$cols\" -v want=\"$want\" "
            "'BEGIN {n = split(cols, c, \",\"); m = split(want, w, \",\"); for (i = 1; i <= m; i++) {k[i] = 0; "
            "for (j = 1; j <= n; j++) if (c[j] == w[i]) k[i] = j; if (!k[i]) {print \"Field \\\"\" w[i] "
            "\"\\\" is not a valid field to query.\"; exit 2}}} NF < n {print; next} "
            "{s = \"\"; for (i = 1; i <= m; i++) s = s (i > 1 ? \", \" : \"\") $k[i]; print s}' || exit 2", 1),
        "    ;;",
        '  *) echo "stand-in nvidia-smi: $* is not recorded" >&2; exit 2 ;;',
        "esac",
        f"exit {status}",
        "",
    ])
    return out


def install(directory: Path, case: str, pid: int | None = None) -> Path:
    """The stand-in as `directory/nvidia-smi`, executable."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    path.write_text(script(case, pid))
    path.chmod(0o755)
    return path
