"""What a made base gives the libraries of the wheels installed on it (run inside the base image by
`dockerlaunch stacks base-tables`; standard library + elfscan + the mounted pyelftools).

Prints one JSON object: the dynamic facts (soname, needed, defined symbols and versions; no undefined ones, they
are the base's own business) of every shared object in the folders the loader searches, the interpreter, the
symbolic links among them (merged /usr: /lib -> usr/lib), `ldconfig -p`, and LD_LIBRARY_PATH.
"""

import json
import os
import subprocess
import sys

sys.path[:0] = [p for p in (os.environ.get("DL_PYELFTOOLS"), os.path.dirname(os.path.abspath(__file__))) if p]

import elfscan  # noqa: E402

DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
        "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib")


def link_chain(path, links):
    """Record every symbolic link on the way to `path` (its folders' too)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        p = "/" + "/".join(parts[:i])
        if os.path.islink(p) and p not in links:
            links[p] = os.readlink(p)


def main():
    objects, links, errors = {}, {}, {}
    for d in DIRS:
        if not os.path.isdir(d):
            continue
        link_chain(d, links)
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name)
            if not elfscan.is_shared_object_name(name):
                continue
            if os.path.islink(p):
                links[p] = os.readlink(p)
                continue
            real = os.path.realpath(p)
            if real in objects or not os.path.isfile(real):
                continue
            try:
                objects[real] = elfscan.obj_to_dict(elfscan.read_elf(real), undefined=False)
            except Exception as e:  # noqa: BLE001 - a file that is not ELF (a linker script) is recorded, not fatal
                errors[real] = f"{type(e).__name__}: {e}"
    exe = sys.executable
    link_chain(exe, links)
    real = os.path.realpath(exe)
    objects[real] = elfscan.obj_to_dict(elfscan.read_elf(real), undefined=False)
    ldconfig = ""
    for tool in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.path.exists(tool):
            ldconfig = subprocess.run([tool, "-p"], capture_output=True, text=True).stdout
            break
    json.dump({"python": exe, "objects": objects, "links": links, "errors": errors, "ldconfig": ldconfig,
               "ld_library_path": os.environ.get("LD_LIBRARY_PATH", "")}, sys.stdout)


if __name__ == "__main__":
    main()
