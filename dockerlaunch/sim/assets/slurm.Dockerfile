# The optional Slurm layer of a sim node (Debian 12's slurm-wlm 22.05 + munge), built on the node image:
# only `dockerlaunch sim up --slurm` builds and uses it. `sim up` writes slurm.conf and the cluster's munge key
# (the package's own key is removed, so no two clusters share one), then runs sim-slurm-start.
ARG BASE
FROM ${BASE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      slurmctld slurmd slurm-client munge \
 && rm -rf /var/lib/apt/lists/* /etc/munge/munge.key
COPY slurm-start.sh /usr/local/bin/sim-slurm-start
