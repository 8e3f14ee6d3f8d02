# A simulated GPU-less host for `dockerlaunch sim`: sshd + its own dockerd (Docker-in-Docker), the engine of
# BASE's Debian suite (bookworm: 20.10, trixie: 26, sid: 28); DOCKER_MAJOR is the one `sim up` asked for.
# Besides root, two logins as the seed users have them: no root, in the docker group (layout.SIM_USERS).
# Since trixie the CLI is a package of its own (docker-cli, only recommended by docker.io).
ARG BASE=debian:bookworm-20251229-slim
FROM ${BASE}
ARG DOCKER_MAJOR=20
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Check-Valid-Until off: the development suite's Release file carries a one-week Valid-Until, which a mirror
# that lags (or a snapshot) outlives; the packages are still checked against the archive's signature.
# hadolint ignore=DL3008
RUN apt-get -o Acquire::Check-Valid-Until=false update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openssh-server docker.io iproute2 netcat-openbsd ca-certificates procps zstd \
 && { command -v docker >/dev/null \
      || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker-cli; } \
 && { dockerd --version | grep -q "version ${DOCKER_MAJOR}\." \
      || { echo "this suite's docker.io is $(dockerd --version), not ${DOCKER_MAJOR}.x: the engine kind is out of date"; exit 1; }; } \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \
 && mkdir -p /run/sshd /root/.ssh \
 && chmod 700 /root/.ssh \
 && for u in alice:1001 bob:1002; do \
      useradd --create-home --password '*' --shell /bin/sh --uid "${u#*:}" --groups docker "${u%%:*}" \
      && install -d -m 700 -o "${u%%:*}" -g "${u%%:*}" "/home/${u%%:*}/.ssh"; \
    done
COPY sshd.conf /etc/ssh/sshd_config.d/dockerlaunch-sim.conf
COPY entrypoint.sh /usr/local/bin/sim-node-entrypoint
ENTRYPOINT ["/usr/local/bin/sim-node-entrypoint"]
