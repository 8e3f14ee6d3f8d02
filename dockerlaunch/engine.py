"""The local Docker engine (the launcher's own), through the docker SDK.

Used by push/save/load (the images leave from here), doctor (is the image here?) and the simulator; kept apart so
that product code never imports the simulator, and the SDK is imported only when an engine is really wanted.
"""

from __future__ import annotations

import os

from dockerlaunch.errors import EngineError


def engine():
    """The local Docker engine, or a one-line error that says how to get one."""
    import docker  # local import: the plan/config path must not need the docker SDK

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as e:  # docker raises DockerException / requests errors / FileNotFoundError
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        reason = str(e).splitlines()[0][:160]
        raise EngineError(
            f"no usable Docker engine at {host} ({reason}); on Debian run `sudo scripts/install-docker` "
            "(installs docker.io and starts dockerd)"
        ) from None
    return client
