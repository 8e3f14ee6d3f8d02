"""Build a stack's image: pins -> build args, a BuildKit `docker build`, then verify inside the image.

`fetch` fills a wheelhouse (one folder per image layer) on a connected machine so that
`build --wheelhouse DIR --offline` needs no network for Python packages. Build context = those
folders (hard links, or empty folders online); CA and index URL go in as BuildKit secrets.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from dockerlaunch import __version__, shipped
from dockerlaunch.errors import ConfigError, DockerlaunchError
from dockerlaunch.images.constraints import check_stack, flash_attn_wheel, flash_attn_wheel_url
from dockerlaunch.images.stacks import Stack, default_dockerfiles_dir

_LOG = logging.getLogger(__name__)  # the CLI shows it (cli/main.py); library use stays quiet

LAYERS = ["1-torch", "2-build", "3-te", "4-apex", "5-flash", "6-megatron", "7-top"]
BUILD_TOOLS = ["pybind11==3.0.1", "ninja==1.13.0", "packaging==25.0", "setuptools==80.9.0", "wheel==0.45.1",
               "py-spy==0.4.1"]
# sdists that must compile against the image's torch/CUDA: fetched as sources, built in the image
BUILD_IN_IMAGE = {"transformer-engine-torch", "transformer_engine_torch", "flash-attn", "flash_attn", "deepspeed",
                  "apex"}
LABEL_PREFIX = "ai.dockerlaunch"
FREEZE_PATH = "/opt/dockerlaunch/pip-freeze.txt"
DOCKERFILE = "train.Dockerfile"


class BuildError(DockerlaunchError):
    pass


@dataclass
class BuildOptions:
    tag: str | None = None
    base_image: str | None = None
    ca_cert: str | None = None
    pip_index_url: str | None = None
    wheelhouse: str | None = None
    offline: bool = False
    no_cache: bool = False
    max_jobs: int = 4
    force: bool = False
    dockerfiles: Path = field(default_factory=default_dockerfiles_dir)


# ---------------------------------------------------------------- pure rendering


def top_pins(stack: Stack) -> list[str]:
    pins = [f"transformers=={stack.transformers}", f"peft=={stack.peft}", f"trl=={stack.trl}"]
    if stack.deepspeed:
        pins.append(f"deepspeed=={stack.deepspeed}")
    if stack.numpy:
        pins.append(f"numpy=={stack.numpy}")
    return pins + list(stack.extra)


def te_extras(stack: Stack) -> str:
    """TE's `core` extra is the CUDA 12 build; CUDA 13 images need `core_cu13`."""
    if stack.cuda and stack.cuda.split(".")[0] == "13":
        return "pytorch,core_cu13"
    return "pytorch"


def build_args(stack: Stack, opts: BuildOptions) -> dict[str, str]:
    args = {
        "BASE_IMAGE": opts.base_image or stack.base_image,
        "PYTHON_VERSION": stack.python,
        "OFFLINE": "1" if opts.offline else "0",
        "TORCH_VERSION": stack.torch,
        "TORCH_INDEX_URL": "" if opts.offline else (stack.torch_index_url or ""),
        "NUMPY_VERSION": stack.numpy or "",
        "BUILD_TOOLS": " ".join(BUILD_TOOLS),
        "TE_VERSION": stack.transformer_engine or "",
        "TE_EXTRAS": te_extras(stack),
        "MAX_JOBS": str(opts.max_jobs),
        "APEX_SOURCE": "",
        "FLASH_ATTN_VERSION": stack.flash_attn or "",
        "FLASH_ATTN_WHEEL": "",
        "MCORE_VERSION": stack.megatron_core,
        "MEGATRON_LM_ARCHIVE": stack.megatron_lm.archive_name if stack.megatron_lm else "",
        "MEGATRON_LM_URL": stack.megatron_lm.archive_url if stack.megatron_lm else "",
        "MEGATRON_LM_PATH": "/opt/Megatron-LM" if stack.megatron_lm else "",
        "SWIFT_VERSION": stack.ms_swift,
        "TOP_PINS": " ".join(top_pins(stack)),
    }
    if stack.apex:
        args["APEX_SOURCE"] = (f"/wheelhouse/4-apex/{stack.apex.archive_name}" if opts.offline
                               else stack.apex.archive_url)
    wheel = flash_attn_wheel(stack)
    if wheel:
        args["FLASH_ATTN_WHEEL"] = f"/wheelhouse/5-flash/{wheel}" if opts.offline else flash_attn_wheel_url(stack)
    return args


def image_labels(stack: Stack, build_date: str | None = None) -> dict[str, str]:
    labels = {
        "org.opencontainers.image.title": f"dockerlaunch {stack.name}",
        "org.opencontainers.image.description": stack.description,
        "org.opencontainers.image.created": build_date or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        f"{LABEL_PREFIX}.stack": stack.name,
        f"{LABEL_PREFIX}.version": __version__,
        f"{LABEL_PREFIX}.pip-freeze": FREEZE_PATH,
        f"{LABEL_PREFIX}.components": ",".join(components(stack)),
    }
    for key, value in stack.pins().items():
        labels[f"{LABEL_PREFIX}.pin.{key}"] = value
    return labels


def components(stack: Stack) -> list[str]:
    """The modules `verify` imports, in dependency order."""
    out = ["torch"]
    if stack.transformer_engine:
        out.append("transformer_engine.pytorch")
    if stack.flash_attn:
        out.append("flash_attn")
    if stack.apex:
        out.append("apex")
    out.append("megatron.core")
    if stack.megatron_lm:
        out.append("megatron.training")
    out.append("swift")
    return out


def render_build(stack: Stack, opts: BuildOptions, context: str = "<context>", docker: str = "docker",
                 build_date: str | None = None) -> list[str]:
    """The full `docker build` argv (what --dry-run prints). Secrets are files, never values."""
    tag = opts.tag or stack.tag
    argv = [docker, "build", "--progress=plain", "--network", "host", "-f", str(opts.dockerfiles / DOCKERFILE),
            "-t", tag]
    for k, v in build_args(stack, opts).items():
        argv += ["--build-arg", f"{k}={v}"]
    for k, v in image_labels(stack, build_date).items():
        argv += ["--label", f"{k}={v}"]
    if opts.ca_cert:
        argv += ["--secret", f"id=pip_ca,src={opts.ca_cert}"]
    if opts.pip_index_url:
        argv += ["--secret", "id=pip_index_url,src=<0600 temp file holding --pip-index-url>"]
    if opts.no_cache:
        argv.append("--no-cache")
    argv.append(context)
    return argv


# ---------------------------------------------------------------- builder detection


def find_builder() -> tuple[list[str], dict[str, str]]:
    """A docker client that can run BuildKit builds: `docker buildx build`, else a client with BuildKit
    built in (Docker < 23, e.g. Debian's docker.io) under DOCKER_BUILDKIT=1."""
    candidates = []
    for path in (shutil.which("docker"), "/usr/bin/docker"):
        if path and os.path.exists(path) and path not in candidates:
            candidates.append(path)
    for docker in candidates:
        if subprocess.run([docker, "buildx", "version"], capture_output=True).returncode == 0:
            return [docker, "buildx", "build", "--load"], {}
    for docker in candidates:
        r = subprocess.run([docker, "version", "--format", "{{.Client.Version}}"], capture_output=True, text=True)
        m = re.match(r"(\d+)\.", r.stdout.strip())
        if m and int(m.group(1)) < 23:
            return [docker, "build"], {"DOCKER_BUILDKIT": "1"}
    raise BuildError("no BuildKit-capable docker client: install the buildx plugin (docker-buildx) "
                     "or Debian's docker.io client")


# ---------------------------------------------------------------- context and secrets


def prepare_context(opts: BuildOptions, workdir: Path) -> Path:
    """wheelhouse/<layer>/ for every layer: hard links into the fetched wheelhouse (offline), else empty."""
    ctx = workdir / "context"
    for layer in LAYERS:
        dest = ctx / "wheelhouse" / layer
        dest.mkdir(parents=True, exist_ok=True)
        if not opts.wheelhouse:
            continue
        src = Path(opts.wheelhouse) / layer
        if not src.is_dir():
            continue
        for f in src.iterdir():
            if f.is_file():
                try:
                    os.link(f, dest / f.name)
                except OSError:
                    shutil.copy2(f, dest / f.name)
    return ctx


def check_wheelhouse(stack: Stack, opts: BuildOptions) -> None:
    if not opts.offline:
        return
    if not opts.wheelhouse:
        raise ConfigError("--offline needs --wheelhouse DIR (made by: dockerlaunch fetch --stack NAME -o DIR)")
    wh = Path(opts.wheelhouse)
    torch_files = list((wh / "1-torch").glob("torch-*")) if (wh / "1-torch").is_dir() else []
    if not torch_files:
        raise ConfigError(f"--wheelhouse {wh}: no torch in {wh}/1-torch; "
                          f"run: dockerlaunch fetch --stack {stack.name} -o {wh}")
    swift = list((wh / "7-top").glob(f"ms_swift-{stack.ms_swift}-*")) if (wh / "7-top").is_dir() else []
    if not swift:
        raise ConfigError(f"--wheelhouse {wh}: no ms-swift {stack.ms_swift}; "
                          f"run: dockerlaunch fetch --stack {stack.name} -o {wh}")


# ---------------------------------------------------------------- build


def build(stack: Stack, opts: BuildOptions, out=None, verify_after: bool = True) -> tuple[int, str]:
    """Run the build; returns (exit code, full log). `out` (the CLI passes stdout) gets the log as it comes."""
    out = out or io.StringIO()
    violations = [v for v in check_stack(stack) if v.rule.severity == "error"]
    if violations and not opts.force:
        raise BuildError(f"stack {stack.name} violates {len(violations)} rule(s): {violations[0].line()} "
                         "(dockerlaunch stacks check; --force to build anyway)")
    for v in violations:
        _LOG.warning("warning: building despite: %s", v.line())
    check_wheelhouse(stack, opts)
    if opts.ca_cert and not Path(opts.ca_cert).is_file():
        raise ConfigError(f"--ca-cert {opts.ca_cert}: no such file")
    prefix, env = find_builder()
    with tempfile.TemporaryDirectory(prefix="dockerlaunch-build-") as tmp:
        work = Path(tmp)
        ctx = prepare_context(opts, work)
        argv = render_build(stack, opts, str(ctx), docker=prefix[0])
        argv = prefix + argv[2:]
        if opts.pip_index_url:
            secret = work / "pip_index_url"
            fd = os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(opts.pip_index_url)
            argv = [a if not a.startswith("id=pip_index_url,") else f"id=pip_index_url,src={secret}" for a in argv]
        log: list[str] = []
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **env})
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            out.write(line)
            out.flush()
        code = proc.wait()
    text = "".join(log)
    if code != 0:
        return code, text
    if verify_after:
        report = verify(opts.tag or stack.tag)
        out.write(report.render() + "\n")
        if not report.ok:
            return 1, text
    return 0, text


def cached_steps(build_log: str) -> tuple[list[str], list[str]]:
    """(cached, executed) RUN steps, as `N/M RUN ...`, from a BuildKit plain-progress log."""
    names: dict[str, str] = {}
    cached: set[str] = set()
    for line in build_log.splitlines():
        m = re.match(r"^#(\d+) \[(?:\S+\s+)?(\d+/\d+)\] (RUN .*)$", line)
        if m:
            names[m.group(1)] = f"{m.group(2)} {m.group(3)[:70]}"
            continue
        m = re.match(r"^#(\d+) CACHED", line)
        if m:
            cached.add(m.group(1))
    order = sorted(names, key=lambda i: int(names[i].split("/")[0]))
    return [names[i] for i in order if i in cached], [names[i] for i in order if i not in cached]


# ---------------------------------------------------------------- fetch


def fetch(stack: Stack, out_dir: Path, log=None) -> dict[str, int]:
    """Download every wheel/sdist per layer, and source archives of git pins, for offline builds.

    Runs pip on this machine, so its Python must be the stack's (wheels are per Python version).
    Pure-Python sdists become wheels here; sdists that compile against torch/CUDA stay sources.
    """
    log = log or (lambda msg: _LOG.info("[fetch] %s", msg))
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != stack.python:
        raise BuildError(f"fetch for stack {stack.name} needs Python {stack.python} (this is {here}): "
                         f"run python{stack.python} -m dockerlaunch fetch --stack {stack.name}")
    out_dir.mkdir(parents=True, exist_ok=True)
    torch_index = ["--extra-index-url", stack.torch_index_url] if stack.torch_index_url else []
    # Later layers find torch in 1-torch rather than asking the torch index again for every package.
    local_torch = ["--find-links", str(out_dir / "1-torch")]
    plan: dict[str, list[str]] = {
        "1-torch": torch_index + [f"torch=={stack.torch}"],
        "2-build": BUILD_TOOLS + ([f"numpy=={stack.numpy}"] if stack.numpy else []),
        "3-te": local_torch + [f"transformer_engine[{te_extras(stack)}]=={stack.transformer_engine}"]
        if stack.transformer_engine else [],
        "5-flash": [],
        "6-megatron": local_torch + [f"megatron-core=={stack.megatron_core}", f"torch=={stack.torch}"],
        "7-top": local_torch + [f"ms-swift=={stack.ms_swift}", *top_pins(stack), f"torch=={stack.torch}"],
    }
    counts = {}
    for layer in LAYERS:
        dest = out_dir / layer
        dest.mkdir(exist_ok=True)
        reqs = plan.get(layer, [])
        if reqs:
            log(f"{layer}: pip download {' '.join(r for r in reqs if not r.startswith(('http', '/', '--')))}")
            _pip(["download", "--dest", str(dest), *reqs])
            _wheelify(dest)
        counts[layer] = len(list(dest.iterdir()))
    for pin, layer in ((stack.apex, "4-apex"), (stack.megatron_lm, "6-megatron")):
        if pin:
            target = out_dir / layer / pin.archive_name
            if not target.exists():
                log(f"{layer}: {pin.archive_url}")
                _download(pin.archive_url, target)
    if flash_attn_wheel(stack):
        target = out_dir / "5-flash" / flash_attn_wheel(stack)
        if not target.exists():
            _download(flash_attn_wheel_url(stack), target)
    elif stack.flash_attn:
        _pip(["download", "--no-deps", "--no-binary", ":all:", "--dest", str(out_dir / "5-flash"),
              f"flash-attn=={stack.flash_attn}"])
    _dedupe(out_dir)
    return {layer: len(list((out_dir / layer).iterdir())) for layer in LAYERS}


def _pip(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", *args[:1], "--quiet", "--disable-pip-version-check", *args[1:]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        errs = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()[-2:]
        raise BuildError(f"pip {args[0]} failed: {' '.join(errs)[:400]}")


def _wheelify(dest: Path) -> None:
    """Turn pure-Python sdists into wheels here, so the image's pip needs no build backends offline."""
    for sdist in sorted(dest.glob("*.tar.gz")) + sorted(dest.glob("*.zip")):
        name = re.split(r"-\d", sdist.name, maxsplit=1)[0].lower().replace("_", "-")
        if name in {n.replace("_", "-") for n in BUILD_IN_IMAGE}:
            continue
        # --use-pep517: an isolated build env with setuptools and wheel, whatever this venv has (a plain
        # Debian venv has no `wheel`, and old pips then fail with "invalid command 'bdist_wheel'")
        _pip(["wheel", "--no-deps", "--use-pep517", "--wheel-dir", str(dest), str(sdist)])
        sdist.unlink()


def _dedupe(out_dir: Path) -> None:
    """A file in 1-torch or 2-build (mounted by every later layer) is not kept again above them."""
    base = {f.name for layer in ("1-torch", "2-build") for f in (out_dir / layer).iterdir()}
    for layer in LAYERS[2:]:
        for f in (out_dir / layer).iterdir():
            if f.name in base:
                f.unlink()
    for f in (out_dir / "2-build").iterdir():
        if f.name in {g.name for g in (out_dir / "1-torch").iterdir()}:
            f.unlink()


def _download(url: str, target: Path) -> None:
    import urllib.request

    tmp = target.with_suffix(target.suffix + ".part")
    try:
        urllib.request.urlretrieve(url, tmp)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"downloading {url} failed: {e}") from None
    tmp.rename(target)


# ---------------------------------------------------------------- verify



@dataclass
class VerifyReport:
    image: str
    lines: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.lines)

    def render(self) -> str:
        out = [f"verify {self.image}:"]
        out += [f"  {'PASS' if ok else 'FAIL'}  {what}: {detail}" for what, ok, detail in self.lines]
        out.append(f"verify: {'PASS' if self.ok else 'FAIL'}")
        return "\n".join(out)


def version_matches(want: str, got: str | None) -> bool:
    """torch 2.13.0 matches 2.13.0+cpu; otherwise exact."""
    return got is not None and (got == want or got.split("+")[0] == want.split("+")[0] and "+" in got)


def parse_verify(image: str, result: dict) -> VerifyReport:
    report = VerifyReport(image)
    for mod, status in result.get("imports", {}).items():
        report.lines.append((f"import {mod}", status == "ok", status))
    for key, (want, got) in result.get("versions", {}).items():
        report.lines.append((f"{key} version", version_matches(want, got), f"pinned {want}, installed {got}"))
    if "mcore-clone" in result.get("checks", {}):
        pip_mm, clone_mm = result["checks"]["mcore-clone"]
        report.lines.append(("megatron-core pip vs clone", pip_mm == clone_mm,
                             f"pip {pip_mm[0]}.{pip_mm[1]}, clone package_info {clone_mm[0]}.{clone_mm[1]}"))
    return report


def verify(image: str, gpus: bool = False, docker: str = "docker") -> VerifyReport:
    """Import every declared component inside the image and compare versions with the pins in its labels."""
    r = subprocess.run([docker, "image", "inspect", "--format", "{{json .Config.Labels}}", image],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"image {image} not found locally: {r.stderr.strip()[:200]}")
    labels = json.loads(r.stdout or "{}") or {}
    if f"{LABEL_PREFIX}.stack" not in labels:
        raise BuildError(f"image {image} has no {LABEL_PREFIX} labels: was it built by dockerlaunch build?")
    argv = [docker, "run", "--rm", "--network", "none", "-e", "DL_LABELS"]
    if gpus:
        argv += ["--gpus", "all"]
    argv += ["--entrypoint", "python", image, "-c", shipped.script("dockerlaunch.images", "verify_image.py")]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "DL_LABELS": json.dumps(labels)},
                          timeout=900)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    try:
        result = json.loads(last)
    except json.JSONDecodeError:
        raise BuildError(
            f"verify could not run python in {image}: {(proc.stderr or proc.stdout).strip()[-300:]}"
        ) from None
    return parse_verify(image, result)
