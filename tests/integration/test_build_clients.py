"""`build` with each kind of docker CLI -- (a) a Docker 23+ CLI (a 28.x /usr/local/bin/docker, Debian 13's 26.1)
through the buildx plugin, (b) Debian 12's 20.10 CLI with BuildKit built in; scripts/install-docker puts in
whichever this machine lacks --
on a tiny image that asks BuildKit for everything train.Dockerfile does: RUN --mount cache/secret/bind of the
wheelhouse layer, `--secret` files, build args, labels, --network host, and a plain progress log that
`cached_steps` reads. A few seconds per CLI; the real stack is test_build's."""

import dataclasses
import hashlib
import shutil
import uuid
from pathlib import Path

import pytest

from dockerlaunch import sim
from dockerlaunch.images import build as buildlib
from dockerlaunch.images import build_argv
from dockerlaunch.images import buildkit as builderlib
from dockerlaunch.images import lock as locks
from dockerlaunch.images.build import cached_steps
from dockerlaunch.images.build_argv import BuildOptions
from dockerlaunch.images.buildkit import choose_cli, probe_client
from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix

pytestmark = pytest.mark.integration

# The first RUN of train.Dockerfile, minus pip, in a stage named as `build` targets it: the same mounts, and what
# it saw written into the image (hashes of the secrets, never their values).
TINY_DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS train
ARG PYTHON_VERSION
ARG OFFLINE=0
RUN --mount=type=cache,target=/root/.cache/pip \\
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \\
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \\
    --mount=type=bind,source=lock/1-torch.txt,target=/lock/1-torch.txt \\
    mkdir -p /opt/dockerlaunch \\
 && { echo "python=${PYTHON_VERSION} offline=${OFFLINE}"; ls /wheelhouse/1-torch; sha256sum < /lock/1-torch.txt; \\
      sha256sum < /run/secrets/pip_ca; sha256sum < /run/secrets/pip_index_url; \\
      echo "cache=$(ls /root/.cache/pip | wc -l)"; } > /opt/dockerlaunch/got \\
 && touch "/root/.cache/pip/$(cat /proc/sys/kernel/random/uuid)"
"""


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# Where scripts/install-docker puts the era of CLI this machine lacks (Debian 12's 20.10 or 13's 26.1).
TEST_CLIS = Path("/usr/local/lib/dockerlaunch/docker-clis")


def clients() -> dict[str, builderlib.DockerClient]:
    paths = [*builderlib.docker_candidates(), *map(str, sorted(TEST_CLIS.glob("*/docker")))]
    return {c.path: c for c in map(probe_client, paths)}


def buildx_builder():
    new = [c for c in clients().values() if not c.error and c.release and c.release >= (23, 0)]
    assert new, f"no Docker 23+ CLI on this machine nor in {TEST_CLIS}: run scripts/install-docker"
    assert new[0].buildx, f"{new[0].path} ({new[0].version}) has no buildx plugin: run scripts/install-docker"
    return choose_cli(new[:1])


def built_in_builder():
    old = [c for c in clients().values() if not c.error and c.release and c.release < (23, 0)]
    assert old, f"no docker CLI older than 23 on this machine nor in {TEST_CLIS}: run scripts/install-docker"
    # the plugin is there for this CLI too: hide it, so the built-in BuildKit builds
    return choose_cli([dataclasses.replace(old[0], buildx=None)])


@pytest.mark.parametrize("builder_of", [buildx_builder, built_in_builder], ids=["28-buildx", "20.10-built-in"])
def test_build_with_each_cli(engine, tmp_path, builder_of):
    builder = builder_of()
    assert (builder.prefix[1:] == ("buildx", "build", "--load")) == (builder_of is buildx_builder), builder
    assert (builder.env == {"DOCKER_BUILDKIT": "1"}) == (builder_of is built_in_builder), builder

    stack = load_matrix().get("cpu")
    dockerfiles = tmp_path / "dockerfiles"
    dockerfiles.mkdir()
    (dockerfiles / build_argv.DOCKERFILE).write_text(TINY_DOCKERFILE)
    shutil.copytree(default_dockerfiles_dir() / "locks", dockerfiles / "locks")
    nonce = uuid.uuid4().hex  # a new file in the layer's wheelhouse: the RUN cannot come from an earlier run
    (tmp_path / "wh" / "1-torch").mkdir(parents=True)
    (tmp_path / "wh" / "1-torch" / f"torch-{nonce}.whl").write_text("not a wheel")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot really\n")
    index = f"https://user:{nonce}@pypi.example/simple"
    tag = f"dockerlaunch-test/build-client:{nonce[:12]}"
    opts = BuildOptions(tag=tag, base_image=sim.ensure_base_image(engine), ca_cert=str(ca), pip_index_url=index,
                        wheelhouse=str(tmp_path / "wh"), dockerfiles=dockerfiles)
    try:
        code, log = buildlib.build(stack, opts, verify_after=False, cli=builder)
        assert code == 0, log[-3000:]
        assert index not in log and nonce not in log.replace(f"torch-{nonce}.whl", "")  # secrets stay out

        image = engine.images.get(tag)  # in the local engine, whichever CLI and builder made it
        assert image.labels["ai.dockerlaunch.stack"] == "cpu"
        assert image.labels["ai.dockerlaunch.pin.torch"] == stack.torch
        got = engine.containers.run(tag, ["sh", "-c", "cat /opt/dockerlaunch/got; ls -A /run/secrets 2>/dev/null"],
                                    remove=True).decode().splitlines()
        lock_part = locks.read(stack, default_dockerfiles_dir()).layer_text("1-torch")  # the layer's part
        assert got[:5] == [f"python={stack.python} offline=0", f"torch-{nonce}.whl", f"{sha(lock_part)}  -",
                           f"{sha(ca.read_text())}  -", f"{sha(index)}  -"], got
        assert got[5].startswith("cache=") and got[6:] == [], got  # no secret left in the image

        cached, ran = cached_steps(log)
        assert len(ran) == 1 and cached == [] and "RUN --mount=type=cache" in ran[0], (cached, ran)
        # the same build again: the log says the RUN step came from the cache
        code, log2 = buildlib.build(stack, opts, verify_after=False, cli=builder)
        assert code == 0, log2[-3000:]
        assert cached_steps(log2) == (ran, []), log2[-3000:]
        assert engine.images.get(tag).attrs["RootFS"]["Layers"] == image.attrs["RootFS"]["Layers"]  # same layers
    finally:
        try:
            engine.images.remove(tag, force=True)
        except Exception:
            pass
