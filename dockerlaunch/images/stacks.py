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

from dockerlaunch.errors import ConfigError, describe_validation_error

FLOATING = {"master", "main", "stable", "latest", "head", "develop", "dev", "nightly", "trunk"}
EXACT_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[A-Za-z0-9.]+)?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9_,-]+\])?==(.+)$")


def default_dockerfiles_dir() -> Path:
    """DOCKERLAUNCH_DOCKERFILES, else the Dockerfiles/ shipped in the package (the checkout's own folder in
    an editable install, a copy inside site-packages otherwise)."""
    env = os.environ.get("DOCKERLAUNCH_DOCKERFILES")
    if env:
        return Path(env)
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


class GitPin(_Model):
    """A source archive at a tag or commit: fetched as a tarball, so offline builds need no git."""

    repo: str = Field(..., description="owner/name on GitHub")
    ref: str = Field(..., description="A tag (e.g. core_v0.13.0) or a 40-hex commit; never a branch.")

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


class Stack(_Model):
    name: str
    description: str
    base_image: str = Field(..., description="name:tag (or @sha256 digest); never :latest")
    cuda: str | None = Field(None, description="CUDA major.minor of the base image's nvcc; null for CPU stacks")
    python: str
    torch: str
    torch_index_url: str | None = Field(None, description="PyTorch wheel index for this CUDA (or CPU) variant")
    transformer_engine: str | None = None
    apex: GitPin | None = None
    flash_attn: str | None = None
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
                     "trl", "deepspeed", "numpy", mode="before")
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
    def _base(cls, v: str) -> str:
        if "@sha256:" in v:
            return v
        if ":" not in v.rsplit("/", 1)[-1]:
            raise ValueError(f"{v!r} has no tag: pin one (e.g. nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04)")
        if v.rsplit(":", 1)[1].lower() in FLOATING:
            raise ValueError(f"{v!r} uses a floating tag")
        return v

    @field_validator("extra")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for pin in v:
            m = PIN.match(pin)
            if not m:
                raise ValueError(f"extra {pin!r}: write name==version")
            _exact(m.group(3), f"extra {m.group(1)}")
        return v

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

    def pins(self) -> dict[str, str]:
        """Every pin as a flat name -> value map (OCI labels, verify)."""
        out = {
            "base_image": self.base_image, "python": self.python, "torch": self.torch,
            "megatron_core": self.megatron_core, "ms_swift": self.ms_swift, "transformers": self.transformers,
            "peft": self.peft, "trl": self.trl,
        }
        for key in ("cuda", "transformer_engine", "flash_attn", "deepspeed", "numpy"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.apex:
            out["apex"] = f"{self.apex.repo}@{self.apex.ref}"
        if self.megatron_lm:
            out["megatron_lm"] = f"{self.megatron_lm.repo}@{self.megatron_lm.ref}"
        for pin in self.extra:
            name, version = pin.split("==")
            out[name] = version
        return out


class StackMatrix(_Model):
    stacks: dict[str, Stack]

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data):
        if isinstance(data, dict) and isinstance(data.get("stacks"), dict):
            data = {**data, "stacks": {k: ({**v, "name": k} if isinstance(v, dict) else v)
                                       for k, v in data["stacks"].items()}}
        return data

    def get(self, name: str) -> Stack:
        if name not in self.stacks:
            raise ConfigError(f"unknown stack {name!r}; known: {', '.join(self.stacks)} (dockerlaunch stacks list)")
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
