"""The GPU model: what a host's GPUs are (host.py, read from nvidia-smi by smi.py), what an image needs of them
(needs.py, from labels.py's labels or verify's record), CUDA's rules joining the two (cuda.py), their health
(health.py), how a container on the host reaches them (access.py), and the verdict every judgement returns
(verdict.py). Types and rules only: nothing here runs a command, opens a connection or reads a file; probe.py,
verify and doctor bring the words in."""
