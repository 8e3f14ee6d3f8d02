"""Make an image keep its pins (run with the image's own Python: train.Dockerfile's top layer, and the tests).

usage: keep_pins.py CONSTRAINTS REPORT

CONSTRAINTS is the file the image's PIP_CONSTRAINT names: one `name==version` per line (the stack's exact pins,
the CUDA libraries and TE's parts from the lock, and the stack's overrides, marked `# override`). With it, a later
`pip install` in the image that would move torch, TE, cuBLAS or NCCL fails in pip's own words, naming the
constraint, instead of silently breaking the stack (NGC's images do the same with /etc/pip/constraint.txt).

An override is a version the stack sets over a dependency's exact pin: nvidia-cublas 13.3.0.5 over the 13.1.0.3 that
torch 2.11 pins through cuda-toolkit[cublas]==13.0.2, because TE's core needs cuBLAS >= 13.2. Under the constraint
alone every later install would be unresolvable: pip walks torch's requirements again, meets ==13.1.0.3 against the
constraint's ==13.3.0.5 and stops. So each installed distribution's exact requirement on an overridden name is
rewritten in its METADATA to the override's version, which is what the lock's resolver (uv's override) did when the
stack was locked. Every rewrite is listed in REPORT (`dist version: old requirement -> new`), and verify shows it.
"""

import importlib.metadata as md
import os
import re
import sys

NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def overrides(path):
    """{canonical name: version} of the lines marked `# override`."""
    out = {}
    with open(path) as f:
        for line in f:
            req, _, comment = line.partition("#")
            if comment.strip() == "override" and "==" in req:
                name, _, version = req.strip().partition("==")
                out[canonical(name)] = version.strip()
    return out


def rewrite(text, wanted):
    """METADATA with each exact Requires-Dist on an overridden name set to the override's version; the changes."""
    lines, changes = [], []
    for line in text.splitlines(keepends=True):
        m = re.match(r"^(Requires-Dist:\s*)([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?(\s*\(?\s*)===?\s*([^\s;,)]+)"
                     r"(\s*\)?)(.*)$", line.rstrip("\r\n"))
        if m and canonical(m.group(2)) in wanted and m.group(5) != wanted[canonical(m.group(2))]:
            new = wanted[canonical(m.group(2))]
            fixed = f"{m.group(1)}{m.group(2)}{m.group(3) or ''}{m.group(4)}=={new}{m.group(6)}{m.group(7)}"
            changes.append(f"{m.group(2)}=={m.group(5)} -> =={new}")
            line = fixed + line[len(line.rstrip("\r\n")):]
        lines.append(line)
    return "".join(lines), changes


def main(constraints, report):
    wanted = overrides(constraints)
    done = []
    for dist in md.distributions():
        path = getattr(dist, "_path", None)
        if not wanted or path is None or not os.path.isfile(os.path.join(str(path), "METADATA")):
            continue
        meta = os.path.join(str(path), "METADATA")
        with open(meta, encoding="utf-8") as f:
            text = f.read()
        new, changes = rewrite(text, wanted)
        if changes:
            with open(meta + ".tmp", "w", encoding="utf-8") as f:
                f.write(new)
            os.replace(meta + ".tmp", meta)
            done += [f"{dist.metadata['Name']} {dist.version}: {c}" for c in changes]
    os.makedirs(os.path.dirname(report) or ".", exist_ok=True)
    with open(report, "w") as f:
        f.write("".join(line + "\n" for line in sorted(done)))
    for line in sorted(done):
        print(f"keep_pins: {line} (recorded override)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2])
