"""A build's context folder: each layer's part of the committed lock and its wheelhouse files (hard links), the
compiled wheels with the sha256 the cache recorded, checked source archives, and the pins the image keeps
(PIP_CONSTRAINT). Offline, the wheelhouse is checked against the lock before anything is built."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from dockerlaunch import hints, shipped
from dockerlaunch.errors import BuildError, ConfigError
from dockerlaunch.images import lock as locks
from dockerlaunch.images import wheels
from dockerlaunch.images.build_argv import BuildOptions, flash_drop
from dockerlaunch.images.index import file_sha256
from dockerlaunch.images.layers import LAYERS
from dockerlaunch.images.stacks import Stack

# What an image's PIP_CONSTRAINT holds still: what is compiled against torch or CUDA, and the CUDA libraries, whose
# versions must move together or the binaries break (TE's core needs the cuBLAS it was built for, TE's binding and
# flash-attn the torch they were compiled against). Pure-Python framework packages (transformers, peft, ms-swift)
# stay free: users update them for a new model, and build tools (setuptools) too, since pip hands PIP_CONSTRAINT to
# the isolated build environments of whatever a user installs.
KEPT_NAMES = re.compile(r"^(torch|triton|flash-attn|transformer-engine(-.*)?|nvidia-.*|cuda-.*)$")


def keep_pins_text(stack: Stack, lock: locks.Lock) -> str:
    """The image's /etc/dockerlaunch/constraints.txt: the lock's versions of the binary core (KEPT_NAMES) and the
    stack's overrides, marked `# override` (scripts/keep_pins.py makes installed metadata agree with them)."""
    overrides = {locks.pin_name(o): o.split("==", 1)[1] for o in stack.overrides}
    drop = {locks.normalize(d) for d in stack.drop}
    lines = [f"# dockerlaunch: stack {stack.name}; PIP_CONSTRAINT names this file: pip keeps these versions. To "
             "move one on purpose: PIP_CONSTRAINT= pip install ...\n"]
    for e in sorted(lock.entries, key=lambda e: e.name):
        if e.name in overrides:  # the lock already holds the override's version (uv's override)
            lines.append(f"{e.name}=={overrides.pop(e.name)}  # override\n")
        elif KEPT_NAMES.match(e.name) and e.name not in drop:
            lines.append(f"{e.name}=={e.version}\n")
    lines += [f"{name}=={version}  # override\n" for name, version in sorted(overrides.items())]
    return "".join(lines)


def not_from_index(stack: Stack, lock: locks.Lock) -> frozenset[str]:
    """The lock's distributions that no layer installs from the index or wheelhouse: a prebuilt flash-attn wheel
    replaces the sdist, and the compiled packages come as wheels from the compiled-wheel cache."""
    return flash_drop(stack) | wheels.compiled_names(stack, lock)


def prepare_context(stack: Stack, opts: BuildOptions, lock: locks.Lock, workdir: Path,
                    compiled: list[tuple[Path, str]] = (), archives: list[Path] = (),
                    prebuilt: list[Path] = ()) -> Path:
    """wheelhouse/<layer>/ (hard links into the fetched wheelhouse, else empty) and lock/<layer>.txt: the committed
    lock's part of each layer (pip checks each file against its hashes, online or off);
    wheelhouse/compiled/ and lock/compiled.txt: the compiled wheels with the sha256 the cache recorded;
    `archives`: source archives already checked against their pins (Megatron-LM), for the layer that bakes them."""
    ctx = workdir / "context"
    (ctx / "lock").mkdir(parents=True)
    drop = not_from_index(stack, lock)
    for layer in LAYERS:
        dest = ctx / "wheelhouse" / layer
        dest.mkdir(parents=True, exist_ok=True)
        (ctx / "lock" / f"{layer}.txt").write_text(lock.layer_text(layer, drop))
        if not opts.wheelhouse:
            continue
        src = Path(opts.wheelhouse) / layer
        if not src.is_dir():
            continue
        for f in src.iterdir():
            if f.is_file() and f.suffix in (".whl", ".gz", ".zip") and not f.name.startswith(
                    tuple(n.replace("-", "_") + "-" for n in drop)):
                _link(f, dest / f.name)
    out = ctx / "wheelhouse" / "compiled"
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for wheel, sha in compiled:
        _link(wheel, out / wheel.name)
        name, version = _dist_of(wheel.name) or (wheel.name, "")
        lines.append(f"{name}=={version} --hash=sha256:{sha}\n")
    (ctx / "lock" / "compiled.txt").write_text("".join(lines))
    for archive in archives:
        _link(archive, ctx / "wheelhouse" / "6-megatron" / archive.name)
    lines = []
    for wheel in prebuilt:  # installed --require-hashes like every other file (checked on this machine before)
        _link(wheel, ctx / "wheelhouse" / "5-flash" / wheel.name)
        lines.append(f"flash-attn=={stack.flash_attn} --hash=sha256:{stack.flash_attn_wheel_sha256}\n")
    (ctx / "lock" / "flash-prebuilt.txt").write_text("".join(lines))
    (ctx / "lock" / "keep-pins.txt").write_text(keep_pins_text(stack, lock))
    (ctx / "lock" / "keep_pins.py").write_text(shipped.script("dockerlaunch.images", "keep_pins.py"))
    (ctx / "lock" / "wheels_first.sh").write_text(shipped.script("dockerlaunch.images", "wheels_first.sh"))
    return ctx


def _link(src: Path, dest: Path) -> None:
    if dest.exists():
        return
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def check_wheelhouse(stack: Stack, opts: BuildOptions, lock: locks.Lock) -> None:
    """Offline: every locked distribution is in the wheelhouse and is the locked file, its sha256 one of those the
    committed lock lists (the wheelhouse's own `<layer>.lock` only says which file is which: a swapped file with
    its line edited to match is still caught). One line naming the file, before anything is built."""
    if not opts.offline:
        return
    if not opts.wheelhouse:
        raise ConfigError(f"--offline needs --wheelhouse DIR (made by: {fetch_again(stack, None)})")
    wh = Path(opts.wheelhouse)
    fix = f"run: {fetch_again(stack, wh)}"
    for layer in LAYERS:
        want = [e for e in lock.layer(layer) if e.name not in flash_drop(stack)]
        if not want:
            continue
        part = wh / f"{layer}.lock"
        if not part.is_file():
            raise ConfigError(f"--wheelhouse {wh}: layer {layer} was never fetched; {fix}")
        have = {}
        for line in part.read_text().splitlines():
            m = re.match(r"^(\S+)==(\S+) --hash=sha256:[0-9a-f]{64}\s+# (\S+)$", line)
            if m:
                have[(m.group(1), m.group(2))] = m.group(3)
        for e in want:
            filename = have.get((e.name, e.version))
            if filename is None:
                raise ConfigError(f"--wheelhouse {wh}: {e.name}=={e.version} (layer {layer}) is not in it; it was "
                                  f"fetched for other pins; {fix}")
            path = wh / layer / filename
            if not path.is_file():
                raise ConfigError(f"--wheelhouse {wh}: {layer}/{filename} ({e.name}=={e.version}) is missing; {fix}")
            got = file_sha256(path)
            if f"sha256:{got}" not in e.hashes:
                raise BuildError(f"build of stack {stack.name}: {layer}/{filename} ({e.name}=={e.version}) does not "
                                 f"match the lock's hash (got sha256 {got[:12]}..., not one of the lock's "
                                 f"{len(e.hashes)}); a wheelhouse file was changed: fetch again "
                                 f"({fetch_again(stack, wh)}); nothing was tagged")


def fetch_again(stack: Stack, wheelhouse: str | Path | None) -> str:
    """The fetch that makes the wheelhouse again, its folder absolute (the command is pasted in another folder)."""
    folder = os.path.abspath(wheelhouse) if wheelhouse else "DIR"
    return hints.dockerlaunch("fetch", "--stack", stack.name, "-o", folder, hint="fetch.again")


def _dist_of(filename: str) -> tuple[str, str] | None:
    """(normalized name, version) of a wheel or sdist file name."""
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        else:
            name, version = parse_sdist_filename(filename)
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return locks.normalize(name), str(version)
