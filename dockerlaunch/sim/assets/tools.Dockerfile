# A small image with nc/ip/ps that `dockerlaunch sim` preloads into every node's dockerd.
ARG BASE=debian:bookworm-20251229-slim
FROM ${BASE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      netcat-openbsd iproute2 procps \
 && rm -rf /var/lib/apt/lists/*
