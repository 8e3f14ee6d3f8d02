"""The stack matrix: exact pins per training stack (Dockerfiles/stacks.yaml), validated and tagged.

A stack is the unit users choose (`build --stack NAME`); every pin is a version or a commit, never
a branch, so two builds of one stack are the same software.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dockerlaunch import hints
from dockerlaunch.errors import ConfigError, describe_validation_error

FLOATING = {"master", "main", "stable", "latest", "head", "develop", "dev", "nightly", "trunk"}
EXACT_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[A-Za-z0-9.]+)?\Z")
COMMIT = re.compile(r"^[0-9a-f]{40}\Z")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9_,-]+\])?==(.+)\Z")


def default_dockerfiles_dir() -> Path:
    """DOCKERLAUNCH_DOCKERFILES, else the Dockerfiles/ shipped in the package (the checkout's own folder in
    an editable install, a copy inside site-packages otherwise)."""
    env = os.environ.get("DOCKERLAUNCH_DOCKERFILES")
    if env:
        return Path(env)
    return shipped_dockerfiles_dir()


def shipped_dockerfiles_dir() -> Path:
    """The Dockerfiles/ that came with this dockerlaunch: the checkout's own folder in an editable install, the copy
    inside site-packages otherwise."""
    checkout = Path(__file__).resolve().parents[2] / "Dockerfiles"
    if (checkout / "stacks.yaml").is_file():
        return checkout
    spec = importlib.util.find_spec("dockerlaunch.images.dockerfiles")  # a folder without __init__.py
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "stacks.yaml").is_file():
            return Path(location)
    return checkout  # reported as missing by load_matrix, with the hint


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _exact(v: str | None, what: str) -> str | None:
    if v is None:
        return v
    v = str(v)
    if v.lower() in FLOATING or not EXACT_VERSION.match(v):
        raise ValueError(f"{what} {v!r} is not an exact version (no ranges, wildcards or branches)")
    return v


def _sha256(v: str | None, what: str) -> str | None:
    if v is not None and not re.fullmatch(r"[0-9a-f]{64}", v):
        raise ValueError(f"{what} {v!r} is not 64 lowercase hex digits")
    return v


class GitPin(_Model):
    """A source archive at a tag or commit: fetched as a tarball, so offline builds need no git. `sha256` pins its
    content (`sources.tree_sha256`: the unpacked files, so GitHub's archive and a `git archive` of the same commit
    agree), which a tag alone cannot: its owner can move it."""

    repo: str = Field(..., description="owner/name on GitHub")
    ref: str = Field(..., description="A tag (e.g. core_v0.13.0) or a 40-hex commit; never a branch.")
    sha256: str | None = Field(None, description="sha256 of the unpacked source tree (dockerlaunch sources hash)")
    tag: str | None = Field(None, description="The tag this commit had when pinned (shown, never fetched)")

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: str | None, info) -> str | None:
        return _sha256(v, info.field_name)

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        if v.lower() in FLOATING:
            raise ValueError(f"{v!r} is a floating ref: pin a tag or a 40-hex commit")
        if not (COMMIT.match(v) or re.match(r"^[A-Za-z0-9_.+-]*[0-9][A-Za-z0-9_.+-]*$", v)):
            raise ValueError(f"{v!r} is neither a version tag nor a 40-hex commit")
        return v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$", v):
            raise ValueError(f"{v!r} is not owner/name")
        return v

    @property
    def archive_url(self) -> str:
        return f"https://codeload.github.com/{self.repo}/tar.gz/{self.ref}"

    @property
    def archive_name(self) -> str:
        return f"{self.repo.split('/')[1]}-{self.ref}.tar.gz"


# Debian suites a made base can be (debootstrap), with the Python each one has: Debian carries one python3 per
# suite, so a stack on a made base takes that one (no python3.12 anywhere in Debian).
DEBIAN_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}


class MadeBase(_Model):
    """A base dockerlaunch makes itself (debootstrap from a Debian mirror, no registry): `images/base.py`."""

    debian: str = Field(..., description="The Debian suite: " + ", ".join(DEBIAN_PYTHON))

    @field_validator("debian")
    @classmethod
    def _suite(cls, v: str) -> str:
        if v not in DEBIAN_PYTHON:
            raise ValueError(f"debian {v!r} is not a suite dockerlaunch can make ({', '.join(DEBIAN_PYTHON)})")
        return v


class Stack(_Model):
    name: str
    description: str
    base_image: str | None = Field(None, description="name:tag (or @sha256 digest) from a registry; never :latest")
    base: MadeBase | None = Field(None, description="A base dockerlaunch makes (no registry); instead of base_image")
    cuda: str | None = Field(None, description="CUDA major.minor of the base image's nvcc; null for CPU stacks")
    cuda_toolkit: str | None = Field(None, description="The PyPI cuda-toolkit release installed as /usr/local/cuda "
                                                       "(made bases only), e.g. 13.0.2")
    overrides: list[str] = Field(default_factory=list,
                                 description="name==version replacing what a dependency pins exactly (the lock's "
                                             "override; pip check reports it, verify lists it as recorded)")
    drop: list[str] = Field(default_factory=list,
                            description="Distributions a dependency names that the image must not install (e.g. a "
                                        "TE core wheel of another CUDA major than torch's)")
    python: str
    torch: str
    torch_index_url: str | None = Field(None, description="PyTorch wheel index for this CUDA (or CPU) variant")
    transformer_engine: str | None = None
    apex: GitPin | None = None
    flash_attn: str | None = None
    flash_attn_wheel_sha256: str | None = Field(None, description="sha256 of flash-attn's prebuilt GitHub wheel, "
                                                                   "where the stack uses one")
    megatron_core: str
    megatron_lm: GitPin | None = Field(None, description="Cloned and baked at /opt/Megatron-LM (ms-swift 3.x)")
    ms_swift: str
    transformers: str
    peft: str
    trl: str
    deepspeed: str | None = None
    numpy: str | None = None
    extra: list[str] = Field(default_factory=list, description="More exact pins, name==version, top layer")
    sources: list[str] = Field(default_factory=list, description="Where the pins come from")

    @field_validator("torch", "transformer_engine", "flash_attn", "megatron_core", "ms_swift", "transformers", "peft",
                     "trl", "deepspeed", "numpy", "cuda_toolkit", mode="before")
    @classmethod
    def _pins(cls, v, info):
        return _exact(v, info.field_name)

    @field_validator("python", "cuda", mode="before")
    @classmethod
    def _minor(cls, v, info):
        if v is None:
            return v
        v = str(v)
        if not re.match(r"^[0-9]+\.[0-9]+$", v):
            raise ValueError(f"{info.field_name} {v!r}: give major.minor, e.g. 3.11")
        return v

    @field_validator("base_image")
    @classmethod
    def _base(cls, v: str | None) -> str | None:
        if v is None or "@sha256:" in v:
            return v
        if ":" not in v.rsplit("/", 1)[-1]:
            raise ValueError(f"{v!r} has no tag: pin one (e.g. nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04)")
        if v.rsplit(":", 1)[1].lower() in FLOATING:
            raise ValueError(f"{v!r} uses a floating tag")
        return v

    @field_validator("extra", "overrides")
    @classmethod
    def _extra(cls, v: list[str], info) -> list[str]:
        for pin in v:
            m = PIN.match(pin)
            if not m:
                raise ValueError(f"{info.field_name} {pin!r}: write name==version")
            _exact(m.group(3), f"{info.field_name} {m.group(1)}")
        return v

    @field_validator("flash_attn_wheel_sha256")
    @classmethod
    def _fa_sha(cls, v: str | None, info) -> str | None:
        return _sha256(v, info.field_name)

    @field_validator("drop")
    @classmethod
    def _drop(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
                raise ValueError(f"drop {name!r}: write a distribution name, e.g. transformer-engine-cu13")
        return v

    @model_validator(mode="after")
    def _base_kind(self) -> Stack:
        if (self.base_image is None) == (self.base is None):
            raise ValueError("give exactly one of base_image (a registry image) and base (e.g. {debian: trixie}: "
                             "made here, no registry)")
        if self.cuda_toolkit is not None:
            if self.base is None:
                raise ValueError("cuda_toolkit is for a made base (base: {debian: ...}); a base_image brings its own "
                                 "CUDA")
            if self.cuda is None or ".".join(self.cuda_toolkit.split(".")[:2]) != self.cuda:
                raise ValueError(f"cuda_toolkit {self.cuda_toolkit} is not CUDA {self.cuda}: the toolkit's "
                                 "major.minor is the stack's cuda")
        elif self.base is not None and self.cuda is not None:
            raise ValueError("a made base has no CUDA of its own: give cuda_toolkit (the PyPI cuda-toolkit release, "
                             f"e.g. {self.cuda}.2)")
        if self.base is not None and self.python != DEBIAN_PYTHON[self.base.debian]:
            raise ValueError(f"python {self.python}: Debian {self.base.debian} has Python "
                             f"{DEBIAN_PYTHON[self.base.debian]} only (" + ", ".join(
                                 f"{k}: {v}" for k, v in DEBIAN_PYTHON.items()) + "); set python: "
                             f"{DEBIAN_PYTHON[self.base.debian]}, or use a base_image that has {self.python}")
        return self

    @model_validator(mode="after")
    def _gpu_parts(self) -> Stack:
        gpu = [self.transformer_engine, self.apex, self.flash_attn]
        if self.cuda is None and any(gpu):
            raise ValueError("a CPU stack (cuda: null) cannot pin transformer_engine, apex or flash_attn")
        return self

    # ------------------------------------------------------------ derived

    @property
    def is_cuda(self) -> bool:
        return self.cuda is not None

    @property
    def tag(self) -> str:
        """An image tag that encodes the stack: what is inside is readable from the name."""
        parts = [("cu" + self.cuda.replace(".", "")) if self.cuda else "cpu",
                 "py" + self.python.replace(".", ""), "torch" + self.torch.split("+")[0]]
        if self.transformer_engine:
            parts.append("te" + self.transformer_engine)
        parts += ["mcore" + self.megatron_core, "swift" + self.ms_swift]
        return "dockerlaunch/train:" + "-".join(parts)

    @property
    def base_ref(self) -> str:
        """What the Dockerfile starts FROM as a pin: the registry image, or `debian:<suite> (made)`."""
        return self.base_image or f"debian:{self.base.debian} (made by dockerlaunch)"

    def pins(self) -> dict[str, str]:
        """Every pin as a flat name -> value map (OCI labels, verify)."""
        out = {
            "base_image": self.base_ref, "python": self.python, "torch": self.torch,
            "megatron_core": self.megatron_core, "ms_swift": self.ms_swift, "transformers": self.transformers,
            "peft": self.peft, "trl": self.trl,
        }
        for key in ("cuda", "cuda_toolkit", "transformer_engine", "flash_attn", "deepspeed", "numpy"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.apex:
            out["apex"] = f"{self.apex.repo}@{self.apex.ref}"
        if self.megatron_lm:
            out["megatron_lm"] = f"{self.megatron_lm.repo}@{self.megatron_lm.ref}"
        for pin in [*self.extra, *self.overrides]:
            name, version = pin.split("==")
            out[name] = version
        return out


class StackMatrix(_Model):
    stacks: dict[str, Stack]
    recommended: str | None = None  # the stack to start from (`stacks list` marks it; docs/STACKS.md says why)

    @model_validator(mode="after")
    def _recommended_is_a_stack(self) -> StackMatrix:
        if self.recommended is not None and self.recommended not in self.stacks:
            raise ValueError(f"recommended: {self.recommended!r} is not a stack of this matrix")
        return self

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data):
        if isinstance(data, dict) and isinstance(data.get("stacks"), dict):
            data = {**data, "stacks": {k: ({**v, "name": k} if isinstance(v, dict) else v)
                                       for k, v in data["stacks"].items()}}
        return data

    def get(self, name: str) -> Stack:
        if name not in self.stacks:
            raise ConfigError(f"unknown stack {name!r}; known: {', '.join(self.stacks)} "
                              f"({hints.dockerlaunch('stacks', 'list', hint='stacks.list')})")
        return self.stacks[name]


def load_matrix(path: Path | None = None) -> StackMatrix:
    path = path or default_dockerfiles_dir() / "stacks.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(
            f"cannot read the stack matrix {path}: {e.strerror} (set DOCKERLAUNCH_DOCKERFILES?)"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {str(e).splitlines()[0]}") from None
    try:
        return StackMatrix.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{path}: {describe_validation_error(e)}") from None
