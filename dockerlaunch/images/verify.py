"""`dockerlaunch verify IMAGE`: prove an image without a GPU, inside the image, with nothing installed into it.

What runs in the image (scripts/verify_image.py, with scripts/elfscan.py, pyelftools and cuobjdump mounted
read-only beside it: images/verify_tools.py) collects facts; images/verify_judges.py judges them (symbols, loads,
cubins per architecture, pip check, the pins the image keeps, imports, versions, cuda-compat). This module runs
the container (by the Image ID it read from the engine first), keeps cuobjdump's answers for that image only, and
records what doctor judges each host against (the device code and cuda-compat of the image, by Image ID).

What the scan says is the image's word (it runs under the image's own python3): cuobjdump's answers it reports go
into a cache of that Image ID's own, read again only when that same image is verified (an image could otherwise
plant answers for the files of public base layers and forge another image's architectures); its stdout is read
in chunks up to SCAN_OUTPUT_LIMIT (past it: the container is removed and verify ends in one ERROR line), its
stderr kept to its last SCAN_STDERR_KEEP bytes.

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
import threading
import time
from pathlib import Path

from dockerlaunch import hints, shipped
from dockerlaunch.cache import cache_root, load_image_needs, save_image_needs, write_whole
from dockerlaunch.container import BindMount
from dockerlaunch.docker_run import tool_argv
from dockerlaunch.errors import ConfigError, EngineError
from dockerlaunch.gpu import labels as labels_
from dockerlaunch.gpu.cuda import runtime_cuda
from dockerlaunch.gpu.needs import DeviceCode, ImageNeeds
from dockerlaunch.images.verify_judges import CHECKS, VerifyReport, compat_of_scan, judge
from dockerlaunch.images.verify_tools import CUOBJDUMP, PYELFTOOLS, VerifyError, ensure_tool

MOUNT = "/opt/dockerlaunch-verify"  # where the scripts and tools appear inside the verify container
SCAN_OUTPUT_LIMIT = 8 * 2**20  # the scan's stdout (its answer is one JSON line, well under 1 MB for a CUDA stack)
SCAN_STDERR_KEEP = 64 * 2**10  # the last bytes of the scan's stderr: what says why it failed
CUBIN_CACHES = 64  # images whose cuobjdump answers are kept (the least recently verified go first)
CUBIN_ENTRIES = 5000  # answers kept per image
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")


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


def _scan(argv: list[str], timeout: float, env: dict[str, str], image: str) -> tuple[int, str, str]:
    """(exit status, stdout, the end of stderr) of the scan's `docker run`: stdout read in chunks, at most
    SCAN_OUTPUT_LIMIT bytes (past it the client is stopped and VerifyError raised: an image must not fill the
    launcher's memory), stderr kept to its last SCAN_STDERR_KEEP bytes. subprocess.TimeoutExpired past `timeout`."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except FileNotFoundError:
        raise EngineError(f"{argv[0]} not found: install Docker (on Debian `sudo scripts/install-docker`)") from None
    out, err = bytearray(), bytearray()
    over = threading.Event()

    def read_out() -> None:
        for chunk in iter(lambda: proc.stdout.read1(1 << 16), b""):  # type: ignore[union-attr]
            if len(out) + len(chunk) > SCAN_OUTPUT_LIMIT:
                over.set()
                proc.kill()
                return
            out.extend(chunk)

    def read_err() -> None:
        for chunk in iter(lambda: proc.stderr.read1(1 << 16), b""):  # type: ignore[union-attr]
            err.extend(chunk)
            del err[:-SCAN_STDERR_KEEP]

    readers = [threading.Thread(target=f, daemon=True, name="dl-verify-read") for f in (read_out, read_err)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and not over.is_set():
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(argv, timeout)
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for t in readers:
            t.join(timeout=10)
        for f in (proc.stdout, proc.stderr):
            f.close()  # type: ignore[union-attr]
    if over.is_set():
        raise VerifyError(f"verify {image}: the checks in the image printed more than {SCAN_OUTPUT_LIMIT // 2**20} MB "
                          "on stdout (their answer is one JSON line, far smaller): stopped there, nothing judged")
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


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
            raise VerifyError(f"image {image} is not on this machine: build it "
                              f"({hints.dockerlaunch('build', '--stack', 'NAME', hint='verify.build')}), pull it "
                              f"({hints.command('docker', 'pull', image, hint='verify.pull')}), or load it "
                              f"({hints.command('docker', 'load', '-i', 'FILE', hint='verify.load')}; a bundle: "
                              "`load`)")
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


def _cubin_cache_path(image_id: str) -> Path | None:
    """cuobjdump's answers for one image, by the Image ID the launcher read from the engine before the scan (None:
    no such ID, no cache). Never shared: an answer is what that image's scan said."""
    if not _IMAGE_ID.fullmatch(image_id or ""):
        return None
    return cache_root() / "verify" / "cubins" / f"{image_id[7:]}.json"


def _drop_shared_cache() -> None:
    """The one cache every image shared (as older dockerlaunch versions kept it): any image may have written into it."""
    try:
        (cache_root() / "verify" / "cubins.json").unlink(missing_ok=True)
    except OSError:
        pass


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
        _drop_shared_cache()
        cache = _cubin_cache_path(image_id)
        if cuobj and cache is not None and cache.is_file():
            env["DL_CUBIN_CACHE"] = f"{MOUNT}/cubins.json"
            mounts.append(BindMount(str(cache), f"{MOUNT}/cubins.json", True))
        result, last_err = None, ""
        # the image the ID names (a tag moved meanwhile scans nothing else under this ID's cache)
        ran = image_id if _IMAGE_ID.fullmatch(image_id or "") else image
        for python in ("python3", "python"):
            run = tool_argv(ran, [f"{MOUNT}/scripts/verify_image.py"], entrypoint=python, name=name,
                            labels={"dockerlaunch.probe": "1"}, env=env, mounts=mounts, gpus=gpus, docker=docker)
            try:
                status, stdout, stderr = _scan(run, timeout, {**os.environ, "DL_LABELS": json.dumps(labels)}, image)
            except subprocess.TimeoutExpired:
                _docker([docker, "rm", "-f", name], timeout=60)
                raise VerifyError(f"verify {image}: no answer within {timeout} s (a hung import?)") from None
            except BaseException:
                _docker([docker, "rm", "-f", name], timeout=60)
                raise
            err = stderr.strip()
            if status in (126, 127) and re.search(r"executable file not found|no such file", err, re.I):
                last_err = err
                continue
            last = (stdout.strip().splitlines() or [""])[-1]
            try:
                result = json.loads(last)
            except json.JSONDecodeError:
                tail = (err or stdout.strip()).splitlines()[-1:] or [f"exit {status}"]
                if "exec format error" in err:
                    raise VerifyError(f"image {image} is for {arch}, which this machine cannot run") from None
                raise VerifyError(f"verify could not run its checks in {image} (exit {status}): "
                                  f"{tail[0][:300]}") from None
            if not isinstance(result, dict):
                raise VerifyError(f"verify could not run its checks in {image}: its answer is not an object")
            break
        if result is None:
            why = last_err.splitlines()[-1][:160] if last_err else ""
            raise VerifyError(f"image {image} has no python (neither python3 nor python on its PATH): verify runs "
                              f"its checks with the image's own Python ({why})")
    if "archs" in wanted and cuobj is None:
        result["cubins"] = {"error": f"no cuobjdump is pinned for {arch} images (dockerlaunch knows amd64 and arm64)"}
    _save_cubins(image_id, result.get("cubin_cache_new"))
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


def _save_cubins(image_id: str, new: object) -> None:
    """The answers this image's scan read now, into this image's own cache (never another's)."""
    path = _cubin_cache_path(image_id)
    if path is None or not isinstance(new, dict) or not new:
        return
    try:
        old = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        old = {}
    merged = {**(old if isinstance(old, dict) else {}), **new}
    if len(merged) > CUBIN_ENTRIES:
        merged = dict(list(merged.items())[-CUBIN_ENTRIES:])
    write_whole(path, json.dumps(merged))
    caches = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime)
    for stale in caches[:-CUBIN_CACHES]:
        stale.unlink(missing_ok=True)
