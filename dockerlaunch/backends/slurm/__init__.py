"""Slurm: sbatch scripts (pyxis/enroot, or docker on each allocated node) from the job plan (`render --to slurm`)."""
