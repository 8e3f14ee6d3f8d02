"""The simulated cluster: hosts as Docker-in-Docker containers with sshd, for rehearsing launches for real.

Only the CLI and the tests import this package; product code never depends on the simulator.
"""
