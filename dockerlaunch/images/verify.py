"""`dockerlaunch verify IMAGE`: prove an image without a GPU, inside the image, with nothing installed into it.

What runs in the image (scripts/verify_image.py, with scripts/elfscan.py, pyelftools and cuobjdump mounted
read-only beside it: images/verify_tools.py) collects facts; images/verify_judges.py judges them (symbols, loads,
cubins per architecture, pip check, the pins the image keeps, imports, versions, cuda-compat). This module runs
the container, keeps cuobjdump's answers by file hash, and records what doctor judges each host against (the
device code and cuda-compat of the image, by Image ID).

A check that was asked for and could not run is a row with verdict ERROR and the reason, never a silent pass: the
report is then not ok (verify exits 1, `build` stamps nothing), and its last line says ERROR.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import tempfile
from pathlib import Path

from dockerlaunch import shipped
from dockerlaunch.cache import cache_root, load_image_needs, save_image_needs
from dockerlaunch.container import BindMount
from dockerlaunch.docker_run import tool_argv
from dockerlaunch.errors import ConfigError, EngineError
from dockerlaunch.gpu import labels as labels_
from dockerlaunch.gpu.cuda import runtime_cuda
from dockerlaunch.gpu.needs import DeviceCode, ImageNeeds
from dockerlaunch.images.verify_judges import CHECKS, VerifyReport, compat_of_scan, judge
from dockerlaunch.images.verify_tools import CUOBJDUMP, PYELFTOOLS, VerifyError, ensure_tool

MOUNT = "/opt/dockerlaunch-verify"  # where the scripts and tools appear inside the verify container


# ---------------------------------------------------------------- labels


def parse_archs(text: str | None) -> list[str]:
    """'8.0;9.0' / '8.0,9.0' / '90' / 'sm_90' -> ['8.0', '9.0'] (empty when unknown)."""
    out = []
    for part in re.split(r"[;,\s]+", (text or "").strip()):
        if not part:
            continue
        p = part.lower().removeprefix("sm_").removeprefix("compute_").removesuffix("+ptx")
        m = re.match(r"^(\d+)\.(\d+)([af]?)$", p) or re.match(r"^(\d+?)(\d)([af]?)$", p)
        if not m:
            raise ConfigError(f"cuda archs {text!r}: {part!r} is not a compute capability; write e.g. 9.0 or 8.0;9.0")
        arch = f"{int(m.group(1))}.{m.group(2)}{m.group(3)}"
        if arch not in out:
            out.append(arch)
    return out


# ---------------------------------------------------------------- running it


def _docker(argv: list[str], **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, **kw)
    except FileNotFoundError:
        raise EngineError(f"{argv[0]} not found: install Docker (on Debian `sudo scripts/install-docker`)") from None


def image_facts(image: str, docker: str = "docker") -> tuple[dict, str, str]:
    """(labels, architecture, Image ID) of a local image, or one line naming the image and the fix."""
    r = _docker([docker, "image", "inspect", "--format", "{{json .Config.Labels}} {{.Architecture}} {{.Id}}", image],
                timeout=120)
    if r.returncode != 0:
        err = r.stderr.strip()
        if re.search(r"Cannot connect to the Docker daemon|Is the docker daemon running|error during connect|"
                     r"permission denied while trying to connect", err):
            raise EngineError(f"verify {image}: the Docker engine is not usable ({err.splitlines()[-1][:160]}); "
                              "start it (on Debian `sudo scripts/install-docker`) or fix DOCKER_HOST")
        if re.search(r"No such (image|object)", err, re.I):
            raise VerifyError(f"image {image} is not on this machine: build it (dockerlaunch build), pull it, or "
                              "load it (docker load -i FILE)")
        raise VerifyError(f"verify {image}: docker image inspect failed: {err[:200]}")
    text, _, image_id = r.stdout.strip().rpartition(" ")
    text, _, arch = text.rpartition(" ")
    return json.loads(text or "null") or {}, arch, image_id


def scripts_folder(tmp: Path, *names: str) -> Path:
    """`tmp`/scripts with the named shipped scripts, readable by an image's own user through a read-only mount."""
    scripts = tmp / "scripts"
    scripts.mkdir()
    for name in names:
        (scripts / name).write_text(shipped.script("dockerlaunch.images", name))
    for p in (tmp, scripts, *scripts.iterdir()):
        p.chmod(0o755)
    return scripts


def _cubin_cache_path() -> Path:
    return cache_root() / "verify" / "cubins.json"


def verify(image: str, gpus: bool = False, docker: str = "docker", cuda_archs: str | list[str] | None = None,
           checks: tuple[str, ...] | None = None, timeout: int = 1800) -> VerifyReport:
    """Every check that needs no GPU (with `gpus`, the container also gets --gpus all and a missing driver is a
    FAIL). `cuda_archs` overrides the image's ai.dockerlaunch.cuda-archs label. `checks`: a subset of CHECKS."""
    labels, arch, image_id = image_facts(image, docker)
    if isinstance(cuda_archs, list):
        cuda_archs = ";".join(cuda_archs)
    archs = parse_archs(cuda_archs) if cuda_archs else parse_archs(labels.get(labels_.CUDA_ARCHS))
    source = "--cuda-archs" if cuda_archs else f"label {labels_.CUDA_ARCHS}"
    wanted = tuple(checks or CHECKS)
    bad = [c for c in wanted if c not in CHECKS]
    if bad:
        raise ConfigError(f"verify: unknown check {bad[0]!r} (known: {', '.join(CHECKS)})")
    pyelf = ensure_tool(PYELFTOOLS)
    cuobj = None
    if "archs" in wanted:
        tool = CUOBJDUMP.get(arch)
        if tool is not None:
            cuobj = ensure_tool(tool)
    with tempfile.TemporaryDirectory(prefix="dockerlaunch-verify-") as tmp:
        scripts = scripts_folder(Path(tmp), "verify_image.py", "elfscan.py")
        name = f"dl-verify-{secrets.token_hex(4)}"
        env: dict[str, str | None] = {"DL_LABELS": None, "DL_CHECKS": ",".join(wanted),
                                      "DL_PYELFTOOLS": f"{MOUNT}/py"}
        mounts = [BindMount(str(pyelf), f"{MOUNT}/py", True), BindMount(str(scripts), f"{MOUNT}/scripts", True)]
        if cuobj:
            env["DL_CUOBJDUMP"] = f"{MOUNT}/bin/cuobjdump"
            mounts.append(BindMount(str(cuobj), f"{MOUNT}/bin", True))
        cache = _cubin_cache_path()
        if cuobj and cache.is_file():
            env["DL_CUBIN_CACHE"] = f"{MOUNT}/cubins.json"
            mounts.append(BindMount(str(cache), f"{MOUNT}/cubins.json", True))
        result, last_err = None, ""
        for python in ("python3", "python"):
            run = tool_argv(image, [f"{MOUNT}/scripts/verify_image.py"], entrypoint=python, name=name,
                            labels={"dockerlaunch.probe": "1"}, env=env, mounts=mounts, gpus=gpus, docker=docker)
            try:
                proc = _docker(run, timeout=timeout, env={**os.environ, "DL_LABELS": json.dumps(labels)})
            except subprocess.TimeoutExpired:
                _docker([docker, "rm", "-f", name], timeout=60)
                raise VerifyError(f"verify {image}: no answer within {timeout} s (a hung import?)") from None
            except BaseException:
                _docker([docker, "rm", "-f", name], timeout=60)
                raise
            err = proc.stderr.strip()
            if proc.returncode in (126, 127) and re.search(r"executable file not found|no such file", err, re.I):
                last_err = err
                continue
            last = (proc.stdout.strip().splitlines() or [""])[-1]
            try:
                result = json.loads(last)
            except json.JSONDecodeError:
                tail = (err or proc.stdout.strip()).splitlines()[-1:] or [f"exit {proc.returncode}"]
                if "exec format error" in err:
                    raise VerifyError(f"image {image} is for {arch}, which this machine cannot run") from None
                raise VerifyError(f"verify could not run its checks in {image} (exit {proc.returncode}): "
                                  f"{tail[0][:300]}") from None
            break
        if result is None:
            why = last_err.splitlines()[-1][:160] if last_err else ""
            raise VerifyError(f"image {image} has no python (neither python3 nor python on its PATH): verify runs "
                              f"its checks with the image's own Python ({why})")
    if "archs" in wanted and cuobj is None:
        result["cubins"] = {"error": f"no cuobjdump is pinned for {arch} images (dockerlaunch knows amd64 and arm64)"}
    _save_cubins(result.get("cubin_cache_new") or {})
    report = judge(image, labels, result, archs, source, gpus=gpus, wanted=wanted)
    cubins = result.get("cubins")
    compat = compat_of_scan(result.get("compat"))
    if image_id and isinstance(cubins, dict) and "error" not in cubins:
        # for doctor, by Image ID: what each library with device code holds, the CUDA of the runtime wheel, and the
        # image's cuda-compat
        save_image_needs(image_id, ImageNeeds(
            image=image, cuda=runtime_cuda(result.get("dists") or {}),
            code=tuple(DeviceCode(lib, (result.get("device_dists") or {}).get(lib), tuple(c.get("elf", [])),
                                  tuple(c.get("ptx", [])))
                       for lib, c in cubins.items() if not c.get("none") and "error" not in c), compat=compat))
    elif image_id and compat is not None:
        # no device code read this time (--checks without archs): the record keeps what an earlier verify read
        old = load_image_needs(image_id)
        save_image_needs(image_id, ImageNeeds(
            image=image, cuda=(old.cuda if old else None) or runtime_cuda(result.get("dists") or {}),
            code=old.code if old else (), compat=compat))
    return report


def _save_cubins(new: dict) -> None:
    if not new:
        return
    path = _cubin_cache_path()
    try:
        old = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        old = {}
    merged = {**old, **new}
    if len(merged) > 5000:
        merged = dict(list(merged.items())[-5000:])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(merged))
    tmp.replace(path)
