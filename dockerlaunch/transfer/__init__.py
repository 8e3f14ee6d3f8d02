"""Images to hosts without a registry: streams, the push planner, star and chain pushes, bundles."""

import re

from dockerlaunch import shipped

# `. ./NAME.sh  # included ...` in a shipped script: the fragment's text goes there (a script runs as `sh -c TEXT`)
_INCLUDE = re.compile(r"^\. \./([a-z_]+\.sh)  # included.*$", re.M)


def script(name: str) -> str:
    text = shipped.script(__name__, name)
    return _INCLUDE.sub(lambda m: shipped.script(__name__, m.group(1)), text)
