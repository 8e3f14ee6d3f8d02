"""What a stack's `docker build` is told: the options, build args and labels from the pins, and the full argv
(what --dry-run prints). Secrets are files, never values; the context folder is images/build_context.py's."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from dockerlaunch import __version__
from dockerlaunch.gpu import labels as labels_
from dockerlaunch.gpu.cuda import DRIVER_MIN, TOOLKIT_DRIVER
from dockerlaunch.images import lock as locks
from dockerlaunch.images import wheels
from dockerlaunch.images.archs import DEFAULT_ARCH
from dockerlaunch.images.buildkit import cli_no_proxy
from dockerlaunch.images.constraints import flash_attn_wheel
from dockerlaunch.images.index import check_credentials, is_loopback
from dockerlaunch.images.stacks import Stack, default_dockerfiles_dir

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


def cuda_archs(stack: Stack, opts: BuildOptions, gpus: list[str] | None = None) -> list[str]:
    """The GPU architectures compiled for: --cuda-archs, else this machine's GPUs, else 9.0 (H100/H200). Without a
    GPU in the build torch would compile every arch its CUDA knows, and every arch more multiplies the compile."""
    if not stack.cuda:
        return []
    if opts.cuda_archs:
        return opts.cuda_archs
    return gpus or [DEFAULT_ARCH]


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
    return {**args, **direct_to_loopback(opts.pip_index_url, args["TORCH_INDEX_URL"])}


def direct_to_loopback(*indexes: str | None, env=None) -> dict[str, str]:
    """NO_PROXY and no_proxy for pip in the build's steps when an index it asks is on this machine (a plain-http
    token is allowed only there, images/index.check_credentials): the docker CLI gives every build the proxies of
    its config.json, and pip would hand a loopback index's requests, token and all, to that proxy (another machine)
    where the config's noProxy does not name the host. The config's own noProxy is kept: a --build-arg replaces it.
    Proxy build args stay out of the build cache's keys (Docker's predefined ARGs). {} when no index is local."""
    import urllib.parse

    local = []
    for url in indexes:
        if not url or "://" not in url:
            continue
        try:
            host = urllib.parse.urlsplit(url).hostname or ""
        except ValueError:
            continue
        if is_loopback(host) and host not in local:
            local.append(host)
    if not local:
        return {}
    kept = [x.strip() for x in cli_no_proxy(env).split(",") if x.strip()]
    direct = ",".join([*kept, *(h for h in local if h not in kept)])
    return {"NO_PROXY": direct, "no_proxy": direct}


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
