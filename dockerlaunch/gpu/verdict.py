"""One verdict type for every judgement of an image against a host: what `ImageNeeds.runs_on` returns, and what
doctor's rows and verify's checks are made of. The strings are what users parse in JSON (`"verdict": "FAIL"`)."""

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


@dataclass(frozen=True)
class Finding:
    """One judgement: which check, its verdict, and the one line that says why (with the fix, where there is one)."""

    check: str
    verdict: Verdict
    detail: str
