"""One verdict enum and one row type for every judgement dockerlaunch makes: doctor's rows, verify's checks, the
smoke's rows and what `ImageNeeds.runs_on` returns. The strings are what users parse in JSON (`"verdict": "FAIL"`)."""

from __future__ import annotations

from dataclasses import dataclass

from dockerlaunch.enums import StrEnum


class Verdict(StrEnum):
    PASS = "PASS"
    NOTE = "NOTE"  # worth knowing, nothing to fix (verify: a recorded override explains a pip check line)
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"  # nothing to judge (the job asks for no GPUs; the image does not say)
    ERROR = "ERROR"  # the check could not run (a tool failed): not a pass, and it stops `up` as a FAIL does
    NEEDS_DRIVER = "NEEDS-DRIVER"  # verify: the check needs a GPU driver this machine lacks (run it on a GPU host)


@dataclass(frozen=True)
class Finding:
    """One judgement: which check, its verdict, and the one line that says why (with the fix, where there is one);
    on which host, where it was judged on one (doctor, the smoke), and that host's rank (two hosts may share an
    address behind one gateway, by port)."""

    check: str
    verdict: Verdict
    detail: str
    host: str = ""
    rank: int = -1
