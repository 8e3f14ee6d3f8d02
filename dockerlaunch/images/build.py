"""Build a stack's image: pins -> build args, a BuildKit `docker build`, then verify inside the image.

`fetch` fills a wheelhouse (one folder per image layer) on a connected machine so that
`build --wheelhouse DIR --offline` needs no network for Python packages. Build context = those
folders (hard links, or empty folders online); CA and index URL go in as BuildKit secrets.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from dockerlaunch import __version__, shipped
from dockerlaunch.errors import BuildError, ConfigError
from dockerlaunch.gpu import labels as labels_
from dockerlaunch.gpu.cuda import DRIVER_MIN, TOOLKIT_DRIVER
from dockerlaunch.images import compiles, sources, wheels
from dockerlaunch.images import lock as locks
from dockerlaunch.images.buildkit import BuildCLI, _one_line, find_cli
from dockerlaunch.images.constraints import check_stack, flash_attn_wheel, flash_attn_wheel_url
from dockerlaunch.images.index import check_credentials, file_sha256
from dockerlaunch.images.layers import LAYERS
from dockerlaunch.images.stacks import Stack, default_dockerfiles_dir

_LOG = logging.getLogger(__name__)  # the CLI shows it (cli/main.py); library use stays quiet


FETCH_STAMPS = ".dockerlaunch-fetch.json"  # in the wheelhouse: each layer's requirements when last fetched




FREEZE_PATH = "/opt/dockerlaunch/pip-freeze.txt"


DOCKERFILE = "train.Dockerfile"


@dataclass
class BuildOptions:
    tag: str | None = None
    base_image: str | None = None
    ca_cert: str | None = None
    pip_index_url: str | None = None
    wheelhouse: str | None = None
    offline: bool = False
    no_cache: bool = False
    max_jobs: int | None = None  # compile jobs; None: per package, from the cores and the memory one job needs
    cuda_archs: list[str] = field(default_factory=list)  # e.g. ["9.0"]; empty: cuda_archs()'s default
    archs_from: str | None = None  # where cuda_archs came from when not --cuda-archs (the cluster's GPUs)
    trust_carried_wheels: bool = False  # take compiled wheels that `wheels build -o` put in --wheelhouse
    force: bool = False
    dockerfiles: Path = field(default_factory=default_dockerfiles_dir)

    def __post_init__(self) -> None:
        # pip in the image sends the URL's user:password@ as Basic auth: over plain http only to this machine
        if self.pip_index_url:
            check_credentials(self.pip_index_url, "--pip-index-url")


def parse_cuda_archs(text: str | None) -> list[str]:
    """`8.0;9.0`, `80,90` or `9.0+PTX` -> ["8.0", "9.0"]; a one-line error for anything else."""
    if not text:
        return []
    out = []
    for part in re.split(r"[;,\s]+", text.strip()):
        m = re.fullmatch(r"(\d{1,2})\.?(\d)(\+PTX|a)?", part)
        if not m:
            raise ConfigError(f"--cuda-archs {text!r}: {part!r} is not a compute capability; write e.g. 8.0;9.0")
        out.append(f"{m.group(1)}.{m.group(2)}")
    return out


DEFAULT_ARCH = "9.0"  # H100/H200: one architecture, since each one more multiplies flash-attn's hours


# What nvcc can target (sm_XY cubins), by CUDA release: 13.0 dropped Maxwell, Pascal and Volta; 12.8 added
# Blackwell (10.0, 12.0). NVIDIA's CUDA toolkit release notes.
ARCHS_BY_CUDA = [
    ((13, 0), {"7.5", "8.0", "8.6", "8.7", "8.8", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1"}),
    ((12, 9), {"5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0",
               "10.0", "10.1", "10.3", "12.0", "12.1"}),
    ((12, 8), {"5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0",
               "10.0", "10.1", "12.0"}),
    ((11, 8), {"3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7",
               "8.9", "9.0"}),
]


def arch_problem(stack: Stack, arch: str) -> str | None:
    """Why nvcc of the stack's CUDA cannot compile for `arch` (None when it can)."""
    if not stack.cuda:
        return None
    cuda = tuple(int(x) for x in stack.cuda.split("."))
    known = next((archs for since, archs in ARCHS_BY_CUDA if cuda >= since), None)
    if known is None or arch in known:
        return None
    return (f"--cuda-archs {arch}: CUDA {stack.cuda}'s nvcc cannot target compute capability {arch} (it can: "
            f"{', '.join(sorted(known, key=lambda a: tuple(int(x) for x in a.split('.'))))})")


def cuda_archs(stack: Stack, opts: BuildOptions, gpus: list[str] | None = None) -> list[str]:
    """The GPU architectures compiled for: --cuda-archs, else this machine's GPUs, else 9.0 (H100/H200). Without a
    GPU in the build torch would compile every arch its CUDA knows, and every arch more multiplies the compile."""
    if not stack.cuda:
        return []
    if opts.cuda_archs:
        return opts.cuda_archs
    return gpus or [DEFAULT_ARCH]


def check_archs(stack: Stack, archs: list[str]) -> None:
    for a in archs:
        problem = arch_problem(stack, a)
        if problem:
            raise ConfigError(problem)


def build_args(stack: Stack, opts: BuildOptions, torch_from_index: bool | None = None,
               base_tag: str | None = None) -> dict[str, str]:
    """`torch_from_index`: the locked torch is a local variant (+cpu, +cu128) that only the PyTorch index has.
    `base_tag`: the made base's local image (images/base.py), for stacks with `base:`."""
    from dockerlaunch.images.base import stack_base_tag

    if torch_from_index is None:
        torch_from_index = "+" in stack.torch
    base = opts.base_image or stack.base_image or base_tag or stack_base_tag(stack)
    args = {
        "BASE_IMAGE": base,
        "PYTHON_VERSION": stack.python,
        "SYSTEM_PACKAGES": "0" if stack.base and not opts.base_image else "1",
        "OFFLINE": "1" if opts.offline else "0",
        "TORCH_INDEX_URL": "" if opts.offline or not torch_from_index else (stack.torch_index_url or ""),
        "MEGATRON_LM_ARCHIVE": stack.megatron_lm.archive_name if stack.megatron_lm else "",
        "MEGATRON_LM_PATH": "/opt/Megatron-LM" if stack.megatron_lm else "",
        "PIP_CHECK_ALLOW": pip_check_allow(stack),
        # NVIDIA_REQUIRE_CUDA for a made base's image (nvidia/cuda bases set their own, which is kept), so the
        # NVIDIA container toolkit refuses it on a driver too old for its CUDA
        "REQUIRE_CUDA": f"cuda>={stack.cuda}" if stack.base and stack.cuda else "",
        **te_wheel_homes(stack),
    }
    return args


def te_wheel_homes(stack: Stack) -> dict[str, str]:
    """Where TE's loader should open cuDNN, NVRTC and cuRAND (it reads <LIB>_HOME before CUDA_HOME): the wheels'
    folders in the image's venv, as each CUDA major's wheels lay them out (scripts/wheels_first.sh says why)."""
    if not (stack.transformer_engine and stack.cuda):
        return {}
    nvidia = f"/opt/venv/lib/python{stack.python}/site-packages/nvidia"
    major = stack.cuda.split(".")[0]
    nvrtc, curand = (f"{nvidia}/cu{major}", f"{nvidia}/cu{major}") if int(major) >= 13 else \
        (f"{nvidia}/cuda_nvrtc", f"{nvidia}/curand")
    return {"NVRTC_HOME_WHEELS": nvrtc, "CURAND_HOME_WHEELS": curand, "CUDNN_HOME_WHEELS": f"{nvidia}/cudnn"}


def pip_check_allow(stack: Stack) -> str:
    """The `pip check` lines the stack's recorded overrides and drops cause, one fixed string per line (the top
    layer refuses every other line)."""
    lines = [f"but you have {' '.join(o.split('=='))}." for o in stack.overrides]
    lines += [f"requires {n}, which is not installed." for n in stack.drop]
    lines += [f"requires {n.replace('-', '_')}, which is not installed." for n in stack.drop]
    if stack.transformer_engine and stack.python != "3.10" and stack.cuda:
        # TE's core wheel says cp310 in its WHEEL file but holds no Python extension (verify shows it as WARN)
        core = f"transformer_engine_cu{stack.cuda.split('.')[0]}"
        lines += [f"{name} {stack.transformer_engine} is not supported on this platform"
                  for name in (core, core.replace("_", "-"))]
    return "\n".join(lines)


def driver_labels(stack: Stack) -> dict[str, str]:
    if not stack.cuda:
        return {}
    out = {labels_.DRIVER_MIN: DRIVER_MIN.get(stack.cuda.split(".")[0], "")}
    if stack.cuda in TOOLKIT_DRIVER:
        out[labels_.DRIVER_TOOLKIT] = TOOLKIT_DRIVER[stack.cuda]
    return {k: v for k, v in out.items() if v}


def image_labels(stack: Stack, build_date: str | None = None) -> dict[str, str]:
    labels = {
        "org.opencontainers.image.title": f"dockerlaunch {stack.name}",
        "org.opencontainers.image.description": stack.description,
        "org.opencontainers.image.created": build_date or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        labels_.STACK: stack.name,
        labels_.VERSION: __version__,
        labels_.PIP_FREEZE: FREEZE_PATH,
        labels_.COMPONENTS: ",".join(components(stack)),
    }
    if stack.overrides:
        labels[labels_.OVERRIDES] = " ".join(stack.overrides)
    if stack.drop:
        labels[labels_.DROP] = " ".join(stack.drop)
    for key, value in stack.pins().items():
        labels[labels_.pin(key)] = value
    return {**labels, **driver_labels(stack)}


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


def render_build(stack: Stack, opts: BuildOptions, lock: locks.Lock, context: str = "<context>",
                 docker: str = "docker", build_date: str | None = None, target: str = "train",
                 tag: str | None = None) -> list[str]:
    """The full `docker build` argv (what --dry-run prints). Secrets are files, never values. The Python set is
    the lock's, in the context as lock/<layer>.txt. `target`: `builder` is the stage compiled packages build in."""
    tag = tag or opts.tag or stack.tag
    argv = [docker, "build", "--progress=plain", "--network", "host", "-f", str(opts.dockerfiles / DOCKERFILE),
            "--target", target, "-t", tag]
    torch = lock.get("torch")
    for k, v in build_args(stack, opts, torch_from_index=bool(torch and "+" in torch.version)).items():
        argv += ["--build-arg", f"{k}={v}"]
    labels = {**image_labels(stack, build_date), labels_.LOCK_SHA: lock.header.get("body-sha256", "")}
    if stack.cuda:
        labels[labels_.CUDA_ARCHS] = ";".join(cuda_archs(stack, opts))
        # what holds code for exactly those architectures (doctor names them when a host's GPU is not among them)
        labels[labels_.COMPILED] = ",".join(p.name for p in wheels.compiled_packages(
            stack, lock, cuda_archs(stack, opts), flash_prebuilt=bool(prebuilt_flash(stack))))
    if target != "train":  # a stage is not the stack's image: no pins or components for verify to expect
        labels = {labels_.STAGE: f"{target} of {stack.name}",
                  labels_.LOCK_SHA: labels[labels_.LOCK_SHA]}
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    if opts.ca_cert:
        argv += ["--secret", f"id=pip_ca,src={opts.ca_cert}"]
    if opts.pip_index_url:
        argv += ["--secret", "id=pip_index_url,src=<0600 temp file holding --pip-index-url>"]
    if opts.no_cache:
        argv.append("--no-cache")
    argv.append(context)
    return argv


def prebuilt_flash(stack: Stack) -> str | None:
    """The prebuilt flash-attn wheel the build uses: one that exists for the stack's torch/CUDA/Python and whose
    sha256 the stack pins (flash_attn_wheel_sha256). Without the pin, flash-attn compiles from the lock's
    hash-checked PyPI sdist through the compiled-wheel cache, as the recommended stack's does: every stack builds
    as shipped, and nothing unverified is installed."""
    name = flash_attn_wheel(stack)
    return name if name and stack.flash_attn_wheel_sha256 else None


def flash_drop(stack: Stack) -> frozenset[str]:
    """Where a prebuilt flash-attn wheel is used, the lock's flash-attn sdist is not installed."""
    return frozenset({"flash-attn"}) if prebuilt_flash(stack) else frozenset()


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
        raise ConfigError("--offline needs --wheelhouse DIR (made by: dockerlaunch fetch --stack NAME -o DIR)")
    wh = Path(opts.wheelhouse)
    fix = f"run: dockerlaunch fetch --stack {stack.name} -o {wh}"
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
                                 f"{len(e.hashes)}); a wheelhouse file was changed: fetch again (dockerlaunch fetch "
                                 f"--stack {stack.name} -o {wh}); nothing was tagged")


def hash_mismatch(log: str) -> str | None:
    """pip's `THESE PACKAGES DO NOT MATCH THE HASHES` in a build log -> `name==version (expected .., got ..)`."""
    if "DO NOT MATCH THE HASHES" not in log:
        return None
    tail = log.split("DO NOT MATCH THE HASHES", 1)[1]
    pkg = re.search(r"(\S+==\S+) from \S+", tail)
    want = re.search(r"Expected sha256 ([0-9a-f]{64})", tail)
    got = re.search(r"Got\s+([0-9a-f]{64})", tail)
    what = pkg.group(1) if pkg else "a locked distribution"
    if want and got:
        return f"{what} (expected sha256 {want.group(1)[:12]}..., got {got.group(1)[:12]}...)"
    return what


SYSTEM_CA = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")


def system_ca() -> str | None:
    """This machine's CA bundle: pip in the image trusts what this machine trusts (a TLS-intercepting proxy's CA
    that the site installed), as a build secret, never in a layer."""
    return next((p for p in SYSTEM_CA if Path(p).is_file()), None)


def ensure_registry_base(docker: str, ref: str) -> None:
    """A registry base that is neither on this engine nor pullable fails here in one line (BuildKit would say it
    in 18 lines of `failed to solve`)."""
    if subprocess.run([docker, "image", "inspect", ref], capture_output=True).returncode == 0:
        return
    try:
        r = subprocess.run([docker, "pull", ref], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        r = subprocess.CompletedProcess([], 1, "", "no answer in 600 s")
    if r.returncode != 0:
        why = _one_line(r.stderr or r.stdout, 200)
        raise BuildError(f"base image {ref} is not on this engine and cannot be pulled ({why}): `docker load` it "
                         "here, or build a stack whose base is made without a registry (base: {debian: trixie}, "
                         "e.g. swift4.6-mcore0.19-cu13-py313)")


def flash_attn_prebuilt(stack: Stack, opts: BuildOptions, log, dest_dir: Path | None = None) -> list[Path]:
    """flash-attn's prebuilt GitHub wheel, where the stack uses one, checked against its pinned sha256 (a stack
    without one is refused: GitHub's release files are not in any lock)."""
    name = prebuilt_flash(stack)
    if not name:
        return []
    src = sources.Source(f"stack {stack.name}: flash-attn {stack.flash_attn}'s prebuilt wheel", "5-flash", name,
                        stack.flash_attn_wheel_sha256 or "", "file", flash_attn_wheel_url(stack))
    wh = Path(opts.wheelhouse) if opts.wheelhouse else None
    return [sources.get_source(src, wh, None, opts.offline, log, dest_dir=dest_dir)]


def megatron_archive(stack: Stack, opts: BuildOptions, log) -> list[Path]:
    """Megatron-LM's pinned source, checked against its tree hash, for the layer that bakes it."""
    pin = stack.megatron_lm
    if not pin:
        return []
    src = sources.Source(f"Megatron-LM {pin.ref[:12]} source", "6-megatron", pin.archive_name, pin.sha256 or "",
                        "archive", pin.archive_url)
    wh = Path(opts.wheelhouse) if opts.wheelhouse else None
    return [sources.get_source(src, wh, opts.pip_index_url, opts.offline, log)]


def _stream(argv: list[str], env: dict[str, str], out) -> tuple[int, str]:
    log: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            log.append(line)
            out.write(line)
            out.flush()
    except BaseException:
        proc.terminate()
        raise
    return proc.wait(), "".join(log)


@dataclass
class BuildSession:
    """What every phase of a build shares: the checked lock, the architectures, the docker CLI that builds, where
    log lines go, and the secret file of --pip-index-url (written once, 0600, removed with the session)."""

    stack: Stack
    opts: BuildOptions
    lock: locks.Lock
    cli: BuildCLI
    out: object
    work: Path
    archives: list[Path] = field(default_factory=list)
    prebuilt: list[Path] = field(default_factory=list)  # flash-attn's checked prebuilt wheel
    where: compiles.Here | None = None  # where packages compile: here (None) or a cluster host (--on HOST)

    def say(self, msg: str) -> None:
        self.out.write(f"[dockerlaunch] {msg}\n")
        self.out.flush()

    def argv(self, ctx: Path, target: str, tag: str | None = None) -> list[str]:
        argv = [*self.cli.prefix, *render_build(self.stack, self.opts, self.lock, str(ctx), target=target,
                                                    tag=tag)[2:]]
        secret = self.work / "pip_index_url"
        if self.opts.pip_index_url and not secret.exists():
            fd = os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.opts.pip_index_url)
        return [a if not a.startswith("id=pip_index_url,") else f"id=pip_index_url,src={secret}" for a in argv]

    def run(self, argv: list[str]) -> tuple[int, str]:
        return _stream(argv, {**os.environ, **self.cli.env}, self.out)


def start(stack: Stack, opts: BuildOptions, out, work: Path, cli: BuildCLI | None = None,
          where: compiles.Here | None = None) -> BuildSession:
    """Everything checked before anything runs (rules, lock, wheelhouse, architectures), then the base (made, or
    a registry image that must be here or pullable) and the pinned source archives. `where` compiles elsewhere
    (`--on HOST`): its GPUs set the default architectures."""
    from dockerlaunch.images import base as bases

    lock = locks.checked(stack, opts.dockerfiles)
    violations = [v for v in check_stack(stack, lock=lock) if v.rule.severity == "error"]
    if violations and not opts.force:
        raise BuildError(f"stack {stack.name} violates {len(violations)} rule(s): {violations[0].line()} "
                         "(dockerlaunch stacks check; --force to build anyway)")
    for v in violations:
        _LOG.warning("warning: building despite: %s", v.line())
    check_wheelhouse(stack, opts, lock)
    if opts.ca_cert and not Path(opts.ca_cert).is_file():
        raise ConfigError(f"--ca-cert {opts.ca_cert}: no such file")
    if not opts.ca_cert and not opts.offline:
        opts = replace(opts, ca_cert=system_ca())
    gpus = (where.gpu_archs() if where else compiles.local_gpu_archs()) if stack.cuda and not opts.cuda_archs else []
    archs = cuda_archs(stack, opts, gpus)
    check_archs(stack, archs)
    s = BuildSession(stack, replace(opts, cuda_archs=archs), lock, cli or find_cli(), out, work, where=where)
    if stack.cuda and opts.archs_from:
        s.say(f"compiling for compute capability {';'.join(archs)} ({opts.archs_from})")
    elif stack.cuda and not opts.cuda_archs:
        what = where.what if where else "this machine"
        why = f"{what}'s GPUs" if gpus else f"H100/H200; no GPU on {what} to ask"
        s.say(f"compiling for compute capability {';'.join(archs)} ({why}); --cuda-archs '8.0;9.0;10.0' adds A100 "
              "and B200 (each architecture more multiplies the compile time)")
    s.say(f"building with {s.cli.what}")
    if stack.base and not opts.base_image:
        base_tag, found = bases.ensure_base(stack.base.debian, s.cli.docker, log=s.say)
        gcc = next((v for k, v in sorted(found.items()) if k.startswith("gcc")), "?")
        s.say(f"base {base_tag}: Debian {stack.base.debian}, gcc {gcc}, glibc {found.get('libc6', '?')}, Python "
              f"{found.get('python', '?')}")
    else:
        ensure_registry_base(s.cli.docker, opts.base_image or stack.base_image)
    return s


def builder_tag(stack: Stack) -> str:
    return f"dockerlaunch/builder:{stack.name}"


def build_wheels(s: BuildSession) -> list[tuple[Path, str]]:
    """The builder stage, then each compiled package from the wheel cache or compiled now: (wheel, sha256) each."""
    pkgs = wheels.compiled_packages(s.stack, s.lock, s.opts.cuda_archs, flash_prebuilt=bool(prebuilt_flash(s.stack)))
    if not pkgs:
        return []
    tag = builder_tag(s.stack)
    s.say(f"builder stage {tag} (system, CUDA toolkit, torch, build tools, TE's core); "
          f"{', '.join(p.label for p in pkgs)} compile in it")
    code, text = s.run(s.argv(prepare_context(s.stack, s.opts, s.lock, s.work / "builder"), "builder", tag))
    if code != 0:
        _fail(s.stack, s.opts, text)
        raise BuildError(f"build of stack {s.stack.name}: the builder stage failed (exit {code}); its log is above")
    facts = wheels.probe_builder(tag, s.cli.docker)
    wh = Path(s.opts.wheelhouse) if s.opts.wheelhouse else None
    return [compiles.ensure_wheel(pkg, facts, s.lock, tag, wheelhouse=wh, index_url=s.opts.pip_index_url,
                                offline=s.opts.offline, max_jobs=s.opts.max_jobs, docker=s.cli.docker,
                                log=s.say, trust_carried=s.opts.trust_carried_wheels, where=s.where)
            for pkg in pkgs]


def build(stack: Stack, opts: BuildOptions, out=None, verify_after: bool = True,
          cli: BuildCLI | None = None, stage: str = "train", where: compiles.Here | None = None) -> tuple[int, str]:
    """Run the build; returns (exit code, full log). `out` (the CLI passes stdout) gets the log as it comes.
    `cli`: default `find_cli()`. Order: base (made or checked), the builder stage, each compiled package
    from the wheel cache or compiled now, then the image, which installs those wheels; then verify. `stage` cuda
    or builder stops there (tagged --tag, else dockerlaunch/<stage>:<stack>; nothing compiled or verified)."""
    out = out or io.StringIO()
    with tempfile.TemporaryDirectory(prefix="dockerlaunch-build-") as tmp:
        s = start(stack, opts, out, Path(tmp), cli, where)
        if stage != "train":
            tag = opts.tag or (builder_tag(stack) if stage == "builder" else f"dockerlaunch/cuda:{stack.name}")
            code, text = s.run(s.argv(prepare_context(stack, s.opts, s.lock, s.work / stage), stage, tag))
            return code, _fail(stack, opts, text) if code else text
        s.archives = megatron_archive(stack, s.opts, s.say)  # checked before the compiles: a wrong pin fails now
        s.prebuilt = flash_attn_prebuilt(stack, s.opts, s.say)
        compiled = build_wheels(s)
        ctx = prepare_context(stack, s.opts, s.lock, s.work / "train", compiled, s.archives, s.prebuilt)
        code, text = s.run(s.argv(ctx, "train"))
    if code != 0:
        return code, _fail(stack, opts, text)
    if verify_after:
        from dockerlaunch.images.verify import verify

        tag = opts.tag or stack.tag
        report = verify(tag, docker=s.cli.docker, cuda_archs=s.opts.cuda_archs or None)
        out.write(report.render() + "\n")
        if not report.ok:
            return 1, text
        with tempfile.TemporaryDirectory(prefix="dockerlaunch-report-") as tmp:
            stamp_report(s, tag, report, Path(tmp))
    return 0, text


REPORT_DIR = "/opt/dockerlaunch"


def stamp_report(s: BuildSession, tag: str, report, ctx: Path) -> None:
    """The verify report into the image it describes (/opt/dockerlaunch/verify.txt and .json, a small top layer),
    so whoever runs the image later can read what was proven when it was built."""
    (ctx / "verify.txt").write_text(report.render() + "\n")
    (ctx / "verify.json").write_text(report.to_json() + "\n")
    (ctx / "Dockerfile").write_text(f"FROM {tag}\nCOPY verify.txt verify.json {REPORT_DIR}/\n"
                                    f"LABEL {labels_.VERIFY}={REPORT_DIR}/verify.json\n")
    before = subprocess.run([s.cli.docker, "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True,
                            text=True).stdout.strip()
    r = subprocess.run([*s.cli.prefix, "--network", "none", "-t", tag, str(ctx)], capture_output=True, text=True,
                       env={**os.environ, **s.cli.env})
    if r.returncode != 0:
        raise BuildError(f"{tag} built and verified, but its report could not be added to it: "
                         f"{_one_line(r.stderr or r.stdout, 300)}")
    if before:  # the unstamped image, now untagged: its layers live on in the stamped one; no dangling copy
        subprocess.run([s.cli.docker, "rmi", before], capture_output=True)
    s.say(f"verify report in the image: {REPORT_DIR}/verify.txt and verify.json")


def _fail(stack: Stack, opts: BuildOptions, text: str) -> str:
    """A failed `docker build`: pip's hash mismatch becomes one line naming the file; else the log as it is."""
    bad = hash_mismatch(text)
    if bad:
        fix = (f"a wheelhouse file was changed: fetch again (dockerlaunch fetch --stack {stack.name} -o "
               f"{opts.wheelhouse})" if opts.offline else
               "the index served another file than the lock was resolved from: check --pip-index-url, or "
               f"lock again (dockerlaunch stacks lock --stack {stack.name})")
        raise BuildError(f"build of stack {stack.name}: {bad} does not match the lock's hash; {fix}; "
                         "nothing was tagged")
    return text


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
