# The demo job image: torch (CPU), py-spy and a gloo all_reduce script. pip never touches the network:
# every wheel comes from the wheelhouse in the build context (wheels/), downloaded on the host first.
ARG BASE=debian:bookworm-20251229-slim
FROM ${BASE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY wheels/ /tmp/wheels/
ARG TORCH_VERSION=2.13.0
ARG NUMPY=numpy
ARG PYSPY=py-spy
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels "torch==${TORCH_VERSION}" "${NUMPY}" \
      "${PYSPY}"

FROM ${BASE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 netcat-openbsd iproute2 procps \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
# as `dockerlaunch build` labels its images: the launcher sets only the flight-recorder names this torch reads
ARG TORCH_VERSION=2.13.0
LABEL ai.dockerlaunch.pin.torch=${TORCH_VERSION}
COPY allreduce.py /opt/dockerlaunch-demo/allreduce.py
