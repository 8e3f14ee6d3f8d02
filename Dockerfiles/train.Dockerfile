# dockerlaunch training image: one Dockerfile for every stack in stacks.yaml; the Python set arrives as the
# stack's lock in the build context, the rest as build args (`dockerlaunch build --stack NAME --dry-run`).
# Layers run from least to most often changed, so an ms-swift bump rebuilds only the top layer. Each layer bind-mounts only its own part of the build
# context's wheelhouse/ (filled by `dockerlaunch fetch`; empty dirs online), which keeps its cache key
# independent of the layers above it. Needs BuildKit; no syntax directive, so offline builds pull nothing.
ARG BASE_IMAGE=debian:bookworm-20251229-slim
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH

# 1. System: Python, RDMA userspace (without it NCCL silently falls back to TCP), network and debug tools.
ARG PYTHON_VERSION=3.11
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-venv" "python${PYTHON_VERSION}-dev" \
      build-essential ca-certificates git \
      rdma-core libibverbs1 ibverbs-providers infiniband-diags perftest \
      iproute2 netcat-openbsd openssh-client procps \
 && rm -rf /var/lib/apt/lists/* \
 && "python${PYTHON_VERSION}" -m venv /opt/venv \
 && mkdir -p /opt/dockerlaunch

# pip settings for every layer: offline -> only the mounted wheelhouse; online -> the index, with the CA and
# index URL read from BuildKit secrets at run time (never written into a layer).
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
      '# an empty build argument means "not set" (an empty NVTE_WITH_NCCL_EP or arch list is not a default)' \
      '[ -n "${TORCH_CUDA_ARCH_LIST:-}" ] || unset TORCH_CUDA_ARCH_LIST' \
      '[ -n "${NVTE_CUDA_ARCHS:-}" ] || unset NVTE_CUDA_ARCHS' \
      '[ -n "${FLASH_ATTN_CUDA_ARCHS:-}" ] || unset FLASH_ATTN_CUDA_ARCHS' \
      '[ -n "${NVTE_WITH_NCCL_EP:-}" ] || unset NVTE_WITH_NCCL_EP' > /opt/dockerlaunch/pip-env.sh

# Layers 2-8 install the stack's lock (Dockerfiles/locks/<stack>.lock, `dockerlaunch stacks lock`): each mounts
# only its own part, lock/<layer>.txt, and installs it with --no-deps --require-hashes, so every distribution is
# the locked file and nothing is resolved here. Its part is also its cache key: a layer is rebuilt only when the
# distributions it installs change.

# 2. torch and what it pulls (the CUDA runtime wheels), from the registry or, for a local variant (+cpu, +cu128),
#    from the PyTorch index.
ARG TORCH_INDEX_URL=""
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \
    --mount=type=bind,source=lock/1-torch.txt,target=/lock/1-torch.txt \
    . /opt/dockerlaunch/pip-env.sh \
 && pip install --no-deps --require-hashes ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
      -r /lock/1-torch.txt

# 3. What the compiled extensions build with, numpy, and py-spy (dump the stacks of a hung rank).
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/2-build,target=/wheelhouse/2-build \
    --mount=type=bind,source=lock/2-build.txt,target=/lock/2-build.txt \
    . /opt/dockerlaunch/pip-env.sh \
 && pip install --no-deps --require-hashes -r /lock/2-build.txt

# 4. TransformerEngine: compiled against the torch above, so after it and without build isolation.
#    NVTE_PYTORCH_FORCE_BUILD: without it TE's setup.py first downloads a prebuilt binary from GitHub (TE PR
#    #2127), so online and offline builds would differ. NVTE_WITH_NCCL_EP: TE 2.17-2.19 do not build against
#    torch < 2.11 with it on (the build argument says when; rule te-nccl-ep).
# The GPU architectures the extensions are compiled for (torch's, TE's and flash-attn's own variables): without
# a GPU in the build, torch would compile every arch its CUDA knows, which turns an hour into many.
ARG MAX_JOBS=4
ARG TORCH_CUDA_ARCH_LIST=""
ARG NVTE_CUDA_ARCHS=""
ARG FLASH_ATTN_CUDA_ARCHS=""
ARG NVTE_WITH_NCCL_EP=""
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/3-te,target=/wheelhouse/3-te \
    --mount=type=bind,source=lock/3-te.txt,target=/lock/3-te.txt \
    if [ -s /lock/3-te.txt ]; then \
      . /opt/dockerlaunch/pip-env.sh \
      && site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
      && CUDNN_PATH="$site/nvidia/cudnn" CPLUS_INCLUDE_PATH="$site/nvidia/cudnn/include" NVTE_FRAMEWORK=pytorch \
         NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS="$MAX_JOBS" pip install --no-deps --require-hashes --no-build-isolation -r /lock/3-te.txt; \
    fi

# 5. apex at a pinned commit, with its C++ and CUDA extensions (nvcc must match torch.version.cuda).
ARG APEX_SOURCE=""
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/4-apex,target=/wheelhouse/4-apex \
    if [ -n "$APEX_SOURCE" ]; then \
      . /opt/dockerlaunch/pip-env.sh \
      && MAX_JOBS="$MAX_JOBS" pip install -v --no-deps --no-build-isolation \
           --config-settings "--build-option=--cpp_ext" --config-settings "--build-option=--cuda_ext" "$APEX_SOURCE"; \
    fi

# 6. flash-attn: the prebuilt wheel when one matches torch/CUDA/Python, else a MAX_JOBS-limited source build of
#    the locked sdist; what it pulls (einops) from the lock.
ARG FLASH_ATTN_WHEEL=""
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/5-flash,target=/wheelhouse/5-flash \
    --mount=type=bind,source=lock/5-flash.txt,target=/lock/5-flash.txt \
    . /opt/dockerlaunch/pip-env.sh \
 && if [ -s /lock/5-flash.txt ]; then \
      FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS="$MAX_JOBS" pip install --no-deps --require-hashes --no-build-isolation -r /lock/5-flash.txt; \
    fi \
 && if [ -n "$FLASH_ATTN_WHEEL" ]; then pip install --no-deps "$FLASH_ATTN_WHEEL"; fi

# 7. megatron-core and, for stacks whose ms-swift imports megatron.training, Megatron-LM at its pinned ref baked
#    at a fixed path (so ms-swift never clones at run time).
ARG MEGATRON_LM_ARCHIVE=""
ARG MEGATRON_LM_URL=""
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/6-megatron,target=/wheelhouse/6-megatron \
    --mount=type=bind,source=lock/6-megatron.txt,target=/lock/6-megatron.txt \
    . /opt/dockerlaunch/pip-env.sh \
 && pip install --no-deps --require-hashes -r /lock/6-megatron.txt \
 && if [ -n "$MEGATRON_LM_ARCHIVE" ]; then \
      archive="/wheelhouse/6-megatron/${MEGATRON_LM_ARCHIVE}"; \
      if [ ! -f "$archive" ]; then \
        archive=/tmp/megatron-lm.tar.gz \
        && python -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$MEGATRON_LM_URL" "$archive"; \
      fi \
      && mkdir -p /opt/Megatron-LM \
      && tar -xzf "$archive" -C /opt/Megatron-LM --strip-components=1 \
      && rm -f /tmp/megatron-lm.tar.gz; \
    fi
# ms-swift 3.x puts MEGATRON_LM_PATH first on sys.path; empty (unset for it) where nothing was baked.
ARG MEGATRON_LM_PATH=""
ENV MEGATRON_LM_PATH=${MEGATRON_LM_PATH}

# 8. ms-swift and its framework pins, last: the layer that changes most often. `pip check` proves the whole
#    locked set consistent inside the image.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/7-top,target=/wheelhouse/7-top \
    --mount=type=bind,source=lock/7-top.txt,target=/lock/7-top.txt \
    . /opt/dockerlaunch/pip-env.sh \
 && DS_BUILD_OPS=0 pip install --no-deps --require-hashes --no-build-isolation -r /lock/7-top.txt \
 && pip check \
 && pip freeze > /opt/dockerlaunch/pip-freeze.txt
