"""The excerpts of NVIDIA's tables kept under tests/data/nvidia-tables/ (each file: `address:`, `read:`, `cut:`,
`covers:` lines, then `[section]` headers and `cell | cell | cell` rows), read for the tests that hold the code's
tables to them."""

from __future__ import annotations

from pathlib import Path

TABLES = Path(__file__).parent / "data" / "nvidia-tables"
HEAD = ("address:", "read:", "cut:", "covers:")


def head(name: str) -> list[str]:
    """The file's first four lines (where it was read, when, what was cut, what it covers)."""
    return (TABLES / name).read_text(encoding="utf-8").splitlines()[:4]


def sections(name: str) -> dict[str, list[list[str]]]:
    """{section title: its rows as cells}; a section's first row is its header where the file gives one."""
    out: dict[str, list[list[str]]] = {}
    current = None
    for line in (TABLES / name).read_text(encoding="utf-8").splitlines()[4:]:
        if line.startswith("["):
            current = line[1:line.index("]")]
            out[current] = []
        elif current is not None and " | " in line:
            out[current].append([c.strip() for c in line.split(" | ")])
    return out


def rows(name: str, section: str, header: bool = False) -> list[list[str]]:
    """One section's rows, its header row dropped when `header`."""
    got = sections(name)[section]
    return got[1:] if header else got


def driver(cell: str) -> str | None:
    """'>=595.45.04', '>= 450.51.05' -> the version; 'N/A' -> None."""
    cell = cell.replace(">=", "").strip()
    return None if cell == "N/A" else cell
