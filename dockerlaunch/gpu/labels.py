"""The image labels dockerlaunch writes and reads: one place for every `ai.dockerlaunch.*` name, so that a fact
crossing the image/host seam (what build knew, what verify and doctor read) is spelled once. The stdlib-only scripts
that run inside images (images/scripts/) spell the few they read themselves: they cannot import this package."""

from __future__ import annotations

PREFIX = "ai.dockerlaunch."

# what `dockerlaunch build` writes on a stack's image
STACK = PREFIX + "stack"  # the stack's name
VERSION = PREFIX + "version"  # dockerlaunch's version that built it
PIP_FREEZE = PREFIX + "pip-freeze"  # where in the image the frozen package list is
COMPONENTS = PREFIX + "components"  # the modules verify imports, in dependency order
OVERRIDES = PREFIX + "overrides"  # the stack's recorded dependency overrides (pip check lines they explain)
DROP = PREFIX + "drop"  # packages the stack removes on purpose
PIN = PREFIX + "pin."  # + a pin's key (pin.torch, pin.cuda, pin.transformer_engine, ...)
LOCK_SHA = PREFIX + "lock-sha256"  # the lock's body digest
CUDA_ARCHS = PREFIX + "cuda-archs"  # '8.0;9.0' (+PTX, a/f suffixes): what the compiled packages hold code for
COMPILED = PREFIX + "compiled"  # the packages compiled for exactly those architectures
DRIVER_MIN = PREFIX + "driver-min"  # the least driver the image's CUDA major runs on
DRIVER_TOOLKIT = PREFIX + "driver-toolkit"  # the driver the image's CUDA toolkit shipped with
STAGE = PREFIX + "stage"  # a build stage's image (not a stack's): '<target> of <stack>'
VERIFY = PREFIX + "verify"  # where a build-time verify report is kept in the image
COMPILE = PREFIX + "compile"  # a compile container's build folder (compiles.py)
BASE = PREFIX + "base"  # the made base image (images/base.py): base.suite, base.format, base.version.<pkg>


def pin(key: str) -> str:
    return PIN + key


TORCH = pin("torch")
CUDA = pin("cuda")


def pins(labels: dict[str, str]) -> dict[str, str]:
    """The pins an image's labels carry, by key."""
    return {k[len(PIN):]: v for k, v in labels.items() if k.startswith(PIN)}
