# dockerlaunch training image: one Dockerfile for every stack in stacks.yaml; the Python set arrives as the
# stack's lock in the build context, the rest as build args (`dockerlaunch build --stack NAME --dry-run`).
# Layers run from least to most often changed, so an ms-swift bump rebuilds only the top layer. Each layer bind-mounts only its own part of the build
# context's wheelhouse/ (filled by `dockerlaunch fetch`; empty dirs online), which keeps its cache key
# independent of the layers above it. Needs BuildKit; no syntax directive, so offline builds pull nothing.
# Stages: `cuda` (system and, on a made base, the CUDA toolkit from PyPI), `builder` (+ torch, build tools, TE's
# prebuilt core) where `dockerlaunch wheels` compiles TE's torch binding, apex and flash-attn into cached wheels,
# outside BuildKit; `train` installs those wheels with their hashes and compiles nothing.
ARG BASE_IMAGE=debian:bookworm-20251229-slim
FROM ${BASE_IMAGE} AS cuda

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH

# 1. System: Python, RDMA userspace (without it NCCL silently falls back to TCP), network and debug tools. A base
#    made by dockerlaunch (debootstrap) has them baked in already (SYSTEM_PACKAGES=0): an offline build runs no apt.
ARG PYTHON_VERSION=3.11
ARG SYSTEM_PACKAGES=1
# hadolint ignore=DL3008
RUN if [ "$SYSTEM_PACKAGES" = 1 ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends \
        "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv" "python${PYTHON_VERSION}-dev" \
        build-essential ca-certificates git \
        rdma-core libibverbs1 ibverbs-providers infiniband-diags perftest \
        iproute2 netcat-openbsd openssh-client procps \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && "python${PYTHON_VERSION}" -m venv /opt/venv \
 && mkdir -p /opt/dockerlaunch

# pip settings for every layer: offline -> only the mounted wheelhouse; online -> the index, with the CA and
# index URL read from BuildKit secrets at run time (never written into a layer). `settle`: what a builder layer
# installed gets one fixed mtime (1980, the zip epoch; .py/.pyc keep theirs for Python's bytecode check), so a
# builder stage rebuilt from the same lock has the same header mtimes and a resumed compile's objects stay valid
# (ninja rebuilds every object whose headers look newer than its log entry).
ARG OFFLINE=0
# hadolint ignore=SC2016
RUN printf '%s\n' \
      'set -eu' \
      'if [ "${OFFLINE:-0}" = 1 ]; then' \
      '  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$(find /wheelhouse -mindepth 1 -maxdepth 1 -type d | sort | tr "\n" " ")"' \
      'else' \
      '  if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca SSL_CERT_FILE=/run/secrets/pip_ca; fi' \
      '  if [ -s /run/secrets/pip_index_url ]; then PIP_INDEX_URL="$(cat /run/secrets/pip_index_url)"; export PIP_INDEX_URL; fi' \
      'fi' \
      'settle() {' \
      '  find /opt/venv /usr/local -newer /opt/dockerlaunch/pip-env.sh ! -type d ! -name "*.py" ! -name "*.pyc" -exec touch -h -d @315532800 {} +' \
      '}' > /opt/dockerlaunch/pip-env.sh

# Layers 2-8 install the stack's lock (Dockerfiles/locks/<stack>.lock, `dockerlaunch stacks lock`): each mounts
# only its own part, lock/<layer>.txt, and installs it with --no-deps --require-hashes, so every distribution is
# the locked file and nothing is resolved here. Its part is also its cache key: a layer is rebuilt only when the
# distributions it installs change.

# 1b. On a made base, the CUDA toolkit from PyPI's wheels (nvcc, cicc, crt, cudart, cccl: all in one prefix,
#    site-packages/nvidia/cuNN), made a real CUDA_HOME at /usr/local/cuda: nvcc links -lcudart_static from lib64,
#    torch's cpp_extension links -lcudart (the wheels ship only versioned sonames).
ENV CUDA_HOME=/usr/local/cuda
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/0-cuda,target=/wheelhouse/0-cuda \
    --mount=type=bind,source=lock/0-cuda.txt,target=/lock/0-cuda.txt \
    if [ -s /lock/0-cuda.txt ]; then \
      . /opt/dockerlaunch/pip-env.sh \
      && pip install --no-deps --require-hashes -r /lock/0-cuda.txt \
      && site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
      && cu="$(find "$site/nvidia" -mindepth 1 -maxdepth 1 -type d -name 'cu[0-9]*' | head -n 1)" \
      && test -x "$cu/bin/nvcc" \
      && ln -s lib "$cu/lib64" \
      && ln -s "$(basename "$(find "$cu/lib" -maxdepth 1 -name 'libcudart.so.[0-9]*' | head -n 1)")" "$cu/lib/libcudart.so" \
      && ln -sfn "$cu" /usr/local/cuda \
      && settle \
      && /usr/local/cuda/bin/nvcc --version | tail -n 2; \
    fi
ENV PATH=/opt/venv/bin:/usr/local/cuda/bin:$PATH

FROM cuda AS builder
ARG OFFLINE=0
# 2. torch and what it pulls (the CUDA runtime wheels), from the registry or, for a local variant (+cpu, +cu128),
#    from the PyTorch index.
ARG TORCH_INDEX_URL=""
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \
    --mount=type=bind,source=lock/1-torch.txt,target=/lock/1-torch.txt \
    . /opt/dockerlaunch/pip-env.sh \
 && pip install --no-deps --require-hashes ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
      -r /lock/1-torch.txt \
 && settle

# 3. What the compiled extensions build with, numpy, and py-spy (dump the stacks of a hung rank).
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/2-build,target=/wheelhouse/2-build \
    --mount=type=bind,source=lock/2-build.txt,target=/lock/2-build.txt \
    . /opt/dockerlaunch/pip-env.sh \
 && pip install --no-deps --require-hashes -r /lock/2-build.txt \
 && settle

# 4. TransformerEngine's prebuilt parts: the core wheel (all of TE's CUDA kernels) and what it pulls. Its torch
#    binding is compiled against the torch above by `dockerlaunch wheels` in this stage, so the lock part here
#    leaves it out.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/3-te,target=/wheelhouse/3-te \
    --mount=type=bind,source=lock/3-te.txt,target=/lock/3-te.txt \
    if [ -s /lock/3-te.txt ]; then \
      . /opt/dockerlaunch/pip-env.sh && pip install --no-deps --require-hashes -r /lock/3-te.txt && settle; \
    fi

FROM builder AS train
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG OFFLINE=0

# 5. The compiled packages (TE's torch binding, apex, flash-attn) as the wheels `dockerlaunch wheels` built in a
#    container of the builder stage, each checked against the sha256 the wheel cache recorded: nothing compiles
#    here, so a pin bump above or a lost BuildKit cache costs seconds, not hours.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse/compiled,target=/wheelhouse/compiled \
    --mount=type=bind,source=lock/compiled.txt,target=/lock/compiled.txt \
    if [ -s /lock/compiled.txt ]; then \
      pip install --no-index --find-links /wheelhouse/compiled --no-deps --require-hashes -r /lock/compiled.txt; \
    fi

# The lock's CUDA libraries win in every import order (verify imports each component alone, TE before torch and
# torch before TE, and names the file each library came from): wheels_first.sh puts the wheels' library folders
# first in /etc/ld.so.conf, so TE's core finds the lock's cuBLAS even before torch has loaded it, and TE's loader,
# which opens cuDNN, NVRTC and cuRAND by path from <LIB>_HOME before CUDA_HOME and /usr/local/cuda, is pointed at
# the wheels. Without this an nvidia/cuda base's own, older copies win when TE is imported first (its cuBLAS 13.1
# lacks the symbol TE's core needs); a made base's CUDA_HOME is the wheels' prefix already.
ARG NVRTC_HOME_WHEELS=""
ARG CURAND_HOME_WHEELS=""
ARG CUDNN_HOME_WHEELS=""
RUN --mount=type=bind,source=lock/wheels_first.sh,target=/lock/wheels_first.sh sh /lock/wheels_first.sh
ENV NVRTC_HOME=${NVRTC_HOME_WHEELS:-$NVRTC_HOME} \
    CURAND_HOME=${CURAND_HOME_WHEELS:-$CURAND_HOME} \
    CUDNN_HOME=${CUDNN_HOME_WHEELS:-$CUDNN_HOME}

# 6. flash-attn's prebuilt wheel where one matches torch/CUDA/Python (else it is one of the compiled wheels), with
#    the sha256 stacks.yaml pins for it, and what the flash layer pulls (einops) from the lock.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/5-flash,target=/wheelhouse/5-flash \
    --mount=type=bind,source=lock/5-flash.txt,target=/lock/5-flash.txt \
    --mount=type=bind,source=lock/flash-prebuilt.txt,target=/lock/flash-prebuilt.txt \
    . /opt/dockerlaunch/pip-env.sh \
 && if [ -s /lock/5-flash.txt ]; then pip install --no-deps --require-hashes -r /lock/5-flash.txt; fi \
 && if [ -s /lock/flash-prebuilt.txt ]; then \
      pip install --no-index --find-links /wheelhouse/5-flash --no-deps --require-hashes -r /lock/flash-prebuilt.txt; \
    fi

# 7. megatron-core and, for stacks whose ms-swift imports megatron.training, Megatron-LM at its pinned commit baked
#    at a fixed path (so ms-swift never clones at run time). `build` puts the archive into the context after
#    checking its content hash (stacks.yaml's sha256): nothing is downloaded here.
ARG MEGATRON_LM_ARCHIVE=""
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/6-megatron,target=/wheelhouse/6-megatron \
    --mount=type=bind,source=lock/6-megatron.txt,target=/lock/6-megatron.txt \
    . /opt/dockerlaunch/pip-env.sh \
 && pip install --no-deps --require-hashes -r /lock/6-megatron.txt \
 && if [ -n "$MEGATRON_LM_ARCHIVE" ]; then \
      mkdir -p /opt/Megatron-LM \
      && tar -xzf "/wheelhouse/6-megatron/${MEGATRON_LM_ARCHIVE}" -C /opt/Megatron-LM --strip-components=1; \
    fi
# ms-swift 3.x puts MEGATRON_LM_PATH first on sys.path; empty (unset for it) where nothing was baked.
ARG MEGATRON_LM_PATH=""
ENV MEGATRON_LM_PATH=${MEGATRON_LM_PATH}

ARG PIP_CHECK_ALLOW=""
# 8. ms-swift and its framework pins, last: the layer that changes most often. Then the image keeps its pins: the
#    binary core's versions (torch, TE, flash-attn, the CUDA libraries) and the stack's overrides go to
#    /etc/dockerlaunch/constraints.txt, which PIP_CONSTRAINT names, and installed metadata is made to agree with the
#    overrides (keep_pins.py says why). `pip check` then proves the whole locked set consistent inside the image,
#    except for the stack's recorded drops (PIP_CHECK_ALLOW: the fixed strings of the lines they cause).
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/7-top,target=/wheelhouse/7-top \
    --mount=type=bind,source=lock/7-top.txt,target=/lock/7-top.txt \
    --mount=type=bind,source=lock/keep-pins.txt,target=/lock/keep-pins.txt \
    --mount=type=bind,source=lock/keep_pins.py,target=/lock/keep_pins.py \
    . /opt/dockerlaunch/pip-env.sh \
 && DS_BUILD_OPS=0 pip install --no-deps --require-hashes --no-build-isolation -r /lock/7-top.txt \
 && mkdir -p /etc/dockerlaunch && cp /lock/keep-pins.txt /etc/dockerlaunch/constraints.txt \
 && python /lock/keep_pins.py /etc/dockerlaunch/constraints.txt /opt/dockerlaunch/overrides-applied.txt \
 && { pip check > /tmp/pip-check.txt || true; } \
 && printf '%s\n' "$PIP_CHECK_ALLOW" | sed '/^$/d' > /tmp/allow.txt \
 && if grep -v -F -f /tmp/allow.txt /tmp/pip-check.txt | grep -v '^No broken requirements found' | grep .; then \
      echo "pip check: the lines above are not recorded overrides" >&2; exit 1; \
    fi \
 && rm -f /tmp/pip-check.txt /tmp/allow.txt \
 && pip freeze > /opt/dockerlaunch/pip-freeze.txt
ENV PIP_CONSTRAINT=/etc/dockerlaunch/constraints.txt
# 9. What the image needs of a host's driver, where its base does not say it (a made base): the NVIDIA container
#    toolkit refuses to start it on a driver too old for its CUDA. An nvidia/cuda base's own value is kept (an ARG
#    of the same name would replace it, even empty: measured on BuildKit).
ARG REQUIRE_CUDA=""
ENV NVIDIA_REQUIRE_CUDA=${REQUIRE_CUDA:-$NVIDIA_REQUIRE_CUDA}
