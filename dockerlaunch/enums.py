"""`StrEnum` for Python 3.10 (3.11 has enum.StrEnum): states and verdicts that print and serialize as their value."""

from enum import Enum


class StrEnum(str, Enum):
    def __str__(self) -> str:
        return self.value
