"""The key=value lines every host script prints for the launcher to parse: the contract, and its one reader.

The contract of every script whose output the launcher parses as key=value lines (probe.sh, observe.sh, reach.sh,
mounts.sh, container_probe.sh and hubs.py in backends/docker; inspect.sh, stage_facts.sh, relay.sh and load.sh's
status lines in transfer; ranks.sh and linkspeed.sh in diagnostics) -- later scripts keep it:
- each value is printed as one line `KEY=VALUE` through `kv KEY VALUE` (or `kvl KEY TEXT`, a line of TEXT each) of
  `dockerlaunch/scripts/kv.sh`, which each script includes (`shipped.script`), with `printf '%s'`, never `echo`
  (dash's echo turns a host's `\n` into a line);
- VALUE has `%`, every byte below 0x20 and 0x7f written as `%XX` (upper-case hex): no value can hold a line break
  or a terminal control; `ldconfig -p` lines lose their leading tab first;
- the parser (`parse`) is given the keys a script may say once and refuses an answer that repeats one, holds a raw
  control character or a bad escape, in one line naming the host and the key (`host_error`; doctor: a FAIL row
  `probe`; up: the host's error), never a quiet guess. Lines end at `\n` only. Other keys and lines are ignored (a
  login's rc file).
Each script's keys are named where its answer is read (probe.sh's in backends/docker/probe.py, observe.sh's in
doctor/observations.py, ...): one reader per script, and one parse per answer (doctor's observe.sh and probe.sh
answer in one round trip: parsed once, with both key sets). A host's words stay data: driver files come only from
the `ldconfig -p` section and from `command -v nvidia-smi`, and are used (bind-mounted into the job) only when owned
by root and not writable by group or others (probe.py's `file=` lines).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from dockerlaunch.errors import HostError

_ESCAPE = re.compile(r"%(.{0,2})", re.S)
_HEX = re.compile(r"[0-9A-F]{2}")


class Malformed(ValueError):
    """A host's answer that the contract cannot produce: it is refused, never guessed at."""


def encode(value: str) -> str:
    """What `kv` prints for VALUE (tests; reach.sh's and hubs.py's Python, run in the image, carry a copy)."""
    return "".join(f"%{ord(c):02X}" if c == "%" or ord(c) < 0x20 or ord(c) == 0x7F else c for c in value)


def decode(value: str) -> str:
    """`%XX` back to the character; a `%` that is not followed by two upper-case hex digits is Malformed."""
    def one(m: re.Match) -> str:
        if not _HEX.fullmatch(m.group(1)):
            raise Malformed(f"a bad escape {('%' + m.group(1))!r}")
        return chr(int(m.group(1), 16))
    return _ESCAPE.sub(one, value)


def parse(text: str, single: Iterable[str], lists: Iterable[str] = ()) -> dict[str, list[str]]:
    """KEY=VALUE lines -> {key: [decoded values]} for the keys named (others are left out: a login's rc file may
    print lines of its own). Lines end at `\\n` only (str.splitlines also breaks at \\r, \\x1c-\\x1e, \\x85, U+2028).
    Raises Malformed naming the key: a single-valued key said twice, a raw control character, a bad escape."""
    once, many = frozenset(single), frozenset(lists)
    out: dict[str, list[str]] = {}
    for line in text.split("\n"):
        key, sep, raw = line.partition("=")
        if not sep or (key not in once and key not in many):
            continue
        if key in once and key in out:
            raise Malformed(f"it said {key}= twice")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
            raise Malformed(f"{key}= holds a raw control character")
        try:
            out.setdefault(key, []).append(decode(raw))
        except Malformed as e:
            raise Malformed(f"{key}= holds {e}") from None
    return out


def host_error(host: str, step: str, e: Malformed) -> HostError:
    """A host whose answer broke the contract, in one line that names it and the key."""
    return HostError(host, f"answered in a form the launcher does not write ({e}): something on the host printed "
                           "into the probe (a login file such as ~/.bashrc that prints?); nothing of its answer was "
                           "used", step=step)
