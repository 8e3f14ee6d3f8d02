"""A CUDA stack's locked Python set, installed for real on a machine with no CUDA and no GPU.

No CUDA base image is reachable here and nothing compiles without nvcc, so this is as far as these machines go:
every distribution of the stack's lock that needs no compiler (torch's CUDA build and its CUDA runtime wheels,
TransformerEngine's prebuilt core wheel, megatron-core, ms-swift, transformers, peft, trl, deepspeed without
its ops) goes into an image built from the local Debian base with `pip install --no-deps --require-hashes`, layer
by layer as train.Dockerfile does, then each module that can import without a GPU is imported. Left out: what
compiles against CUDA (transformer-engine-torch, flash-attn, apex).

    .venv/bin/python benchmarks/lock_install.py --stack swift4.0-mcore0.15

Prints what was installed (count, download and image size, time), `pip check`, and each import.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dockerlaunch import sim  # noqa: E402
from dockerlaunch.images import lock as locks  # noqa: E402
from dockerlaunch.images.layers import LAYERS  # noqa: E402
from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix  # noqa: E402

NEEDS_NVCC = frozenset({"transformer-engine-torch", "flash-attn"})
IMPORTS = ["torch", "transformer_engine", "megatron.core", "transformers", "peft", "trl", "deepspeed", "modelscope",
           "swift"]

PROBE = r"""
import importlib, json, sys, traceback
out = {"python": sys.version.split()[0], "imports": {}}
for mod in sys.argv[1:]:
    try:
        m = importlib.import_module(mod)
        out["imports"][mod] = "ok " + str(getattr(m, "__version__", ""))
    except BaseException as e:
        out["imports"][mod] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
import torch
out["torch_cuda"] = torch.version.cuda
out["cuda_available"] = torch.cuda.is_available()
out["matmul"] = float((torch.ones(64, 64) @ torch.ones(64, 64)).sum())
print(json.dumps(out))
"""

DOCKERFILE = """FROM {base}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends "python{py}" "python{py}-venv" "python{py}-dev" \\
      build-essential ca-certificates && rm -rf /var/lib/apt/lists/* && "python{py}" -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY lock /lock
# the CA of a TLS-intercepting proxy, as a BuildKit secret (as `dockerlaunch build --ca-cert` does)
RUN --mount=type=secret,id=pip_ca \\
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \\
 && for part in {parts}; do \\
      DS_BUILD_OPS=0 pip install --no-cache-dir --no-deps --require-hashes --no-build-isolation \\
        -r "/lock/$part.txt" || exit 1; \\
    done && pip check
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", default="swift4.0-mcore0.15")
    ap.add_argument("--keep", action="store_true", help="keep the image")
    ap.add_argument("--ca-cert", default=os.environ.get("PIP_CERT"),
                    help="CA bundle for pip in the build (default: $PIP_CERT, as pip here uses it)")
    args = ap.parse_args()
    stack = load_matrix().get(args.stack)
    lock = locks.checked(stack, default_dockerfiles_dir())
    here = subprocess.run(["python3", "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                          capture_output=True, text=True).stdout.strip()
    import docker

    base = sim.ensure_base_image(docker.from_env())
    tag = f"dockerlaunch-lockproof:{stack.name}"
    left_out = sorted(e.name + "==" + e.version for e in lock.entries if e.name in NEEDS_NVCC)
    with tempfile.TemporaryDirectory(prefix="lockproof-") as tmp:
        ctx = Path(tmp)
        (ctx / "lock").mkdir()
        parts = []
        for layer in LAYERS:
            text = lock.layer_text(layer, NEEDS_NVCC)
            if text:
                (ctx / "lock" / f"{layer}.txt").write_text(text)
                parts.append(layer)
        (ctx / "Dockerfile").write_text(DOCKERFILE.format(base=base, py=stack.python, parts=" ".join(parts)))
        t0 = time.time()
        ca = [a for c in (args.ca_cert,) if c for a in ("--secret", f"id=pip_ca,src={c}")]
        r = subprocess.run(["docker", "build", "--network", "host", *ca, "-t", tag, str(ctx)], capture_output=True,
                           text=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/local/bin:/usr/bin:/bin"})
        build_s = time.time() - t0
    if r.returncode != 0:
        print(f"build failed after {build_s:.0f} s:\n{(r.stdout + r.stderr)[-4000:]}")
        return 1
    size = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", tag], capture_output=True,
                          text=True).stdout.strip()
    run = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, "python", "-c", PROBE, *IMPORTS],
                         capture_output=True, text=True, timeout=900)
    try:
        probe = json.loads(run.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        print(f"probe failed: {(run.stdout + run.stderr)[-3000:]}")
        return 1
    installed = len([e for e in lock.entries if e.name not in NEEDS_NVCC])
    print(f"stack {stack.name}: lock {lock.header.get('body-sha256', '')[:12]} ({lock.header.get('resolved')}), "
          f"{installed} of {len(lock.entries)} distributions installed with --require-hashes in {build_s:.0f} s "
          f"(image {int(size) / 1e9:.1f} GB; pip check passed); left out, they compile against CUDA: "
          f"{', '.join(left_out) or 'none'}")
    print(f"python {probe['python']} (this machine: {here}); torch.version.cuda {probe['torch_cuda']}, "
          f"cuda available: {probe['cuda_available']}, a CPU matmul: {probe['matmul']}")
    ok = True
    for mod, status in probe["imports"].items():
        print(f"  import {mod}: {status}")
        ok = ok and status.startswith("ok")
    if not args.keep:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
    print("command: .venv/bin/python benchmarks/lock_install.py --stack " + stack.name)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
