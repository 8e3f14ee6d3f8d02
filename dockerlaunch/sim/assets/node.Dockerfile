# A simulated GPU-less host for `dockerlaunch sim`: sshd + its own dockerd (Docker-in-Docker).
ARG BASE=debian:bookworm-20251229-slim
FROM ${BASE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openssh-server docker.io iproute2 netcat-openbsd ca-certificates procps zstd \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \
 && mkdir -p /run/sshd /root/.ssh \
 && chmod 700 /root/.ssh
COPY sshd.conf /etc/ssh/sshd_config.d/dockerlaunch-sim.conf
COPY entrypoint.sh /usr/local/bin/sim-node-entrypoint
ENTRYPOINT ["/usr/local/bin/sim-node-entrypoint"]
