"""The sim's images, built without a registry: the node image per engine kind (from a local Debian image, a
pull, or debootstrap), the demo job image from a local wheelhouse, the Slurm layer, seed tarballs; SSH keys."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import resources
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from dockerlaunch.cache import replacing
from dockerlaunch.engine import engine
from dockerlaunch.images.index import file_sha256
from dockerlaunch.sim.layout import BASE_TAG, DEFAULT_ENGINE, ENGINES, EngineKind, SimError, _log, cache_root


def _new_ed25519() -> tuple[bytes, str]:
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode()


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _add_bytes(
    tar: tarfile.TarFile, name: str, data: bytes, mode: int, mtime: int = 0, uid: int = 0, gid: int = 0
) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.size, info.mode, info.mtime, info.uid, info.gid = len(data), mode, mtime, uid, gid
    tar.addfile(info, io.BytesIO(data))


def _tar_of(files: dict[str, tuple[bytes, int] | tuple[bytes, int, int, int]]) -> bytes:
    """A tar for put_archive: name -> (data, mode) or (data, mode, uid, gid); docker keeps the numeric owner."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mode, *owner) in files.items():
            _add_bytes(tar, name, data, mode, int(time.time()), *owner)
    return buf.getvalue()


def _asset(name: str) -> bytes:
    return resources.files("dockerlaunch.sim.assets").joinpath(name).read_bytes()


def _image_exists(client, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_base_image(client, requested: str | None = None, kind: EngineKind | None = None) -> str:
    """A Debian image of the kind's suite (bookworm by default): the requested one, a local one, a pulled one,
    or one made by debootstrap (cached as an image, so the next `sim up` does not debootstrap again)."""
    kind = kind or ENGINES[DEFAULT_ENGINE]
    if requested:
        if _image_exists(client, requested):
            return requested
        try:
            client.images.pull(requested)
            return requested
        except Exception as e:
            raise SimError(f"base image {requested} is not local and cannot be pulled ({str(e)[:120]})") from None
    for ref in kind.base_candidates:
        if _image_exists(client, ref):
            return ref
    try:
        _log(f"pulling {kind.base_candidates[0]}")
        client.images.pull(kind.base_candidates[0])
        return kind.base_candidates[0]
    except Exception:
        _log(f"no registry reachable; making a Debian {kind.suite} base image with debootstrap")
    return debootstrap_base(client, kind.base_tag, kind.suite)


def debootstrap_base(client, tag: str = BASE_TAG, suite: str = "bookworm") -> str:
    from dockerlaunch.errors import DockerlaunchError
    from dockerlaunch.images.base import debootstrap_rootfs

    with tempfile.TemporaryDirectory(prefix="dockerlaunch-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        t0 = time.monotonic()
        try:
            debootstrap_rootfs(suite, root)
        except DockerlaunchError as e:
            raise SimError(f"no Debian {suite} base image and no registry: {e}") from None
        tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        try:
            client.api.import_image_from_stream(tar.stdout, repository=tag.split(":")[0], tag=tag.split(":")[1])
        finally:
            tar.stdout.close()
            tar.wait()
        _log(f"base image {tag} made by debootstrap in {time.monotonic() - t0:.0f}s")
    return tag


def _build(
    client, dockerfile: str, base: str, repo: str, extra: tuple[str, ...] = (),
    disk: dict[str, Path] | None = None, buildargs: dict[str, str] | None = None,
) -> str:
    """Build a sim image once; its tag hashes every input, so a changed asset or wheel rebuilds.

    `extra` are package assets; `disk` maps context names to local files (e.g. wheels/x.whl).
    """
    base_id = client.images.get(base).id
    files = {dockerfile: _asset(dockerfile), **{n: _asset(n) for n in extra}}
    disk = disk or {}
    digest = hashlib.sha256(base_id.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    for name in sorted(disk):
        st = disk[name].stat()
        digest.update(f"{name}\0{st.st_size}\0{file_sha256(disk[name])}".encode())
    for k, v in sorted((buildargs or {}).items()):
        digest.update(f"{k}={v}".encode())
    tag = f"{repo}:{digest.hexdigest()[:12]}"
    if _image_exists(client, tag):
        return tag
    _log(f"building {tag} from {base}")
    with tempfile.TemporaryFile() as context:
        with tarfile.open(fileobj=context, mode="w") as tar:
            for name, data in files.items():
                _add_bytes(tar, name, data, 0o755 if name.endswith(".sh") else 0o644)
            for name, path in disk.items():
                tar.add(str(path), arcname=name)
        context.seek(0)
        try:
            stream = client.api.build(
                fileobj=context, custom_context=True, dockerfile=dockerfile, tag=tag,
                buildargs={"BASE": base, **(buildargs or {})}, network_mode="host", rm=True, forcerm=True,
                decode=True,
            )
            last: list[str] = []
            for chunk in stream:
                if "error" in chunk:
                    raise SimError(f"building {repo} failed: {chunk['error'].strip()} ({' | '.join(last[-3:])})")
                if chunk.get("stream", "").strip():
                    last.append(chunk["stream"].strip())
        except SimError:
            raise
        except Exception as e:
            raise SimError(f"building {repo} failed: {str(e)[:200]}") from None
    return tag


DEMO_TORCH = "2.13.0"


DEMO_PYTHON = "3.11"  # Debian bookworm's python3


DEMO_NUMPY = "numpy>=1.26,<3"  # torch warns at import without it


DEMO_PYSPY = "py-spy>=0.4,<0.5"  # `dockerlaunch dump` uses the image's own where there is one


def fetch_demo_wheels(dest: Path | None = None) -> Path:
    """torch (CPU) and its dependencies as wheels for the image's Python, via this machine's pip."""
    dest = dest or cache_root() / "wheelhouse-demo"
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
        "--python-version", DEMO_PYTHON, "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
        "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64",
        "--platform", "any", "-d", str(dest), f"torch=={DEMO_TORCH}", DEMO_NUMPY, DEMO_PYSPY,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        errs = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
        raise SimError(f"downloading torch=={DEMO_TORCH} wheels failed: {' '.join(errs)[:300]}")
    return dest


def build_demo_image(base: str | None = None, wheelhouse: Path | None = None) -> str:
    """The demo job image (torch CPU, py-spy + all_reduce script), built with no network for pip."""
    client = engine()
    base_ref = ensure_base_image(client, base)
    wheels = wheelhouse or fetch_demo_wheels()
    disk = {f"wheels/{p.name}": p for p in sorted(Path(wheels).glob("*.whl"))}
    if not any(name.startswith("wheels/torch-") for name in disk):
        raise SimError(f"no torch wheel in {wheels}")
    return _build(client, "demo.Dockerfile", base_ref, "dockerlaunch/demo-torch", ("allreduce.py",), disk,
                  {"TORCH_VERSION": DEMO_TORCH, "NUMPY": DEMO_NUMPY, "PYSPY": DEMO_PYSPY})


def ensure_images(client, base: str | None = None, kinds: list[EngineKind] | None = None
                  ) -> tuple[dict[str, str], str]:
    """The node image of each engine kind (`base` is the bookworm base, for 20.10 nodes) and the tools image.
    Each suite's base and node image are made concurrently (debootstrap and apt wait on the network)."""
    kinds = kinds or [ENGINES[DEFAULT_ENGINE]]
    bookworm = ensure_base_image(client, base)
    suites = {k.suite: k for k in kinds}

    def node_image(kind: EngineKind) -> str:
        base_ref = bookworm if kind.suite == "bookworm" else ensure_base_image(client, None, kind)
        return _build(client, "node.Dockerfile", base_ref, "dockerlaunch/sim-node", ("entrypoint.sh", "sshd.conf"),
                      buildargs={"DOCKER_MAJOR": str(kind.major)})

    with cf.ThreadPoolExecutor(max_workers=len(suites)) as pool:
        by_suite = dict(zip(suites, pool.map(node_image, suites.values())))
    tools = _build(client, "tools.Dockerfile", bookworm, "dockerlaunch/sim-tools")
    return {k.name: by_suite[k.suite] for k in kinds}, tools


def ensure_slurm_image(client, node_image: str) -> str:
    """The node image plus Slurm (slurmctld, slurmd, client commands) and munge; built only for `--slurm`."""
    return _build(client, "slurm.Dockerfile", node_image, "dockerlaunch/sim-slurm", ("slurm-start.sh",))


def _seed_tarball(client, image: str) -> Path:
    """`docker save` of the image, cached on disk once, bind-mounted read-only into every node."""
    cache = cache_root()
    path = cache / (image.replace("/", "_").replace(":", "_") + ".tar")
    if not path.exists():
        with replacing(path) as f:
            # named=image: the tag asked for (named=True would take the image's first tag, another one where
            # two tags share an image ID, and the node would lack this one)
            for chunk in client.images.get(image).save(named=image):
                f.write(chunk)
    return path
