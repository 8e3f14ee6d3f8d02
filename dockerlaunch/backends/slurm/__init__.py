"""Slurm: sbatch scripts (pyxis/enroot, or docker on each allocated node) from the job plan (`render --to slurm`)."""

FLAGS = ()


def options(target: str, values: dict) -> None:
    return None


def render(plan, options=None) -> list:
    from dockerlaunch.backends.slurm import sbatch as slurm

    return slurm.render(plan)
