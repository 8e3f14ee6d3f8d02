"""dockerlaunch: pinned Docker images for LLM training, launched across GPU hosts over SSH."""

__version__ = "0.1.0"
