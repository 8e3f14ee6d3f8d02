# dockerlaunch training image: one Dockerfile for every stack in stacks.yaml; every pin arrives as a build arg
# (`dockerlaunch build --stack NAME --dry-run` prints them). Layers run from least to most often changed, so
# an ms-swift bump rebuilds only the top layer. Each layer bind-mounts only its own part of the build
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
      'fi' > /opt/dockerlaunch/pip-env.sh

# 2. torch, from the index of its CUDA variant (or CPU).
# Every pip install below is pinned through build args (hadolint cannot see into them): DL3013 is ignored.
ARG TORCH_VERSION
ARG TORCH_INDEX_URL=""
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \
    . /opt/dockerlaunch/pip-env.sh \
 && pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"

# 3. What the compiled extensions build with, and py-spy (dump the stacks of a hung rank).
ARG NUMPY_VERSION=""
ARG BUILD_TOOLS
# hadolint ignore=DL3013,SC3054
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \
    --mount=type=bind,source=wheelhouse/2-build,target=/wheelhouse/2-build \
    . /opt/dockerlaunch/pip-env.sh \
 && read -r -a tools <<< "$BUILD_TOOLS" \
 && pip install "${tools[@]}" ${NUMPY_VERSION:+"numpy==${NUMPY_VERSION}"}

# 4. TransformerEngine: compiled against the torch above, so after it and without build isolation.
ARG TE_VERSION=""
ARG TE_EXTRAS=pytorch
ARG MAX_JOBS=4
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \
    --mount=type=bind,source=wheelhouse/2-build,target=/wheelhouse/2-build \
    --mount=type=bind,source=wheelhouse/3-te,target=/wheelhouse/3-te \
    if [ -n "$TE_VERSION" ]; then \
      . /opt/dockerlaunch/pip-env.sh \
      && site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
      && CUDNN_PATH="$site/nvidia/cudnn" CPLUS_INCLUDE_PATH="$site/nvidia/cudnn/include" NVTE_FRAMEWORK=pytorch \
         MAX_JOBS="$MAX_JOBS" pip install --no-build-isolation "transformer_engine[${TE_EXTRAS}]==${TE_VERSION}"; \
    fi

# 5. apex at a pinned commit, with its C++ and CUDA extensions (nvcc must match torch.version.cuda).
ARG APEX_SOURCE=""
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \
    --mount=type=bind,source=wheelhouse/2-build,target=/wheelhouse/2-build \
    --mount=type=bind,source=wheelhouse/4-apex,target=/wheelhouse/4-apex \
    if [ -n "$APEX_SOURCE" ]; then \
      . /opt/dockerlaunch/pip-env.sh \
      && MAX_JOBS="$MAX_JOBS" pip install -v --no-build-isolation \
           --config-settings "--build-option=--cpp_ext" --config-settings "--build-option=--cuda_ext" "$APEX_SOURCE"; \
    fi

# 6. flash-attn: the prebuilt wheel when one matches torch/CUDA/python, else a MAX_JOBS-limited source build.
ARG FLASH_ATTN_VERSION=""
ARG FLASH_ATTN_WHEEL=""
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \
    --mount=type=bind,source=wheelhouse/2-build,target=/wheelhouse/2-build \
    --mount=type=bind,source=wheelhouse/5-flash,target=/wheelhouse/5-flash \
    if [ -n "$FLASH_ATTN_WHEEL" ]; then \
      . /opt/dockerlaunch/pip-env.sh && pip install "$FLASH_ATTN_WHEEL"; \
    elif [ -n "$FLASH_ATTN_VERSION" ]; then \
      . /opt/dockerlaunch/pip-env.sh \
      && FLASH_ATTENTION_FORCE_BUILD=TRUE MAX_JOBS="$MAX_JOBS" \
         pip install --no-build-isolation "flash-attn==${FLASH_ATTN_VERSION}"; \
    fi

# 7. megatron-core from pip and, for stacks whose ms-swift imports megatron.training, Megatron-LM at its pinned
#    ref baked at a fixed path (so ms-swift never clones at run time).
ARG MCORE_VERSION
ARG MEGATRON_LM_ARCHIVE=""
ARG MEGATRON_LM_URL=""
# hadolint ignore=DL3013
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \
    --mount=type=bind,source=wheelhouse/2-build,target=/wheelhouse/2-build \
    --mount=type=bind,source=wheelhouse/6-megatron,target=/wheelhouse/6-megatron \
    . /opt/dockerlaunch/pip-env.sh \
 && pip install "megatron-core==${MCORE_VERSION}" \
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

# 8. ms-swift and its framework pins, last: the layer that changes most often.
ARG SWIFT_VERSION
ARG TOP_PINS=""
# hadolint ignore=DL3013,SC3054
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_index_url \
    --mount=type=bind,source=wheelhouse/1-torch,target=/wheelhouse/1-torch \
    --mount=type=bind,source=wheelhouse/2-build,target=/wheelhouse/2-build \
    --mount=type=bind,source=wheelhouse/7-top,target=/wheelhouse/7-top \
    . /opt/dockerlaunch/pip-env.sh \
 && read -r -a pins <<< "$TOP_PINS" \
 && DS_BUILD_OPS=0 pip install --no-build-isolation "ms-swift==${SWIFT_VERSION}" "${pins[@]}" "torch==${TORCH_VERSION}" \
 && pip freeze > /opt/dockerlaunch/pip-freeze.txt
