"""What the job's own containers show: NCCL's real transport, every rank's stack, the network's real speed, and the
image on the GPUs (the smoke, whose rows join doctor's report).

The smoke is a pre-flight, yet it lives here, above backends/, with commtest: both are an ordinary `up` of a short
job (`<job>-smoke`, `<job>-commtest`) in the job's image and containers, read through the same marked lines and
NCCL logs, so they run exactly the path the training job will take. Beside doctor (backends/docker/doctor/) it
would have to import `up` and commtest from below them."""

from dockerlaunch import shipped


def script(name: str) -> str:
    return shipped.script(__name__, name)
