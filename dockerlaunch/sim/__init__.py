"""The simulated cluster: hosts as Docker-in-Docker containers with sshd, for rehearsing launches for real.

Only the CLI and the tests import this package; product code never depends on the simulator. Its rooms: `layout`
(pure: names, addresses, labels, engine kinds, the written config), `images` (node, demo and Slurm images without
a registry), `slurm`, `shaping`, and `cluster`: `create` (`sim up`), `create_light` (`sim up --light`), `remove`
(`sim down`), `inventory` (`sim status`). What callers use is named here.
"""

from dockerlaunch.sim.cluster import create, create_light, engine_nofile, inventory, light_engines, node_engine, remove
from dockerlaunch.sim.images import _add_bytes, build_demo_image, ensure_base_image, fetch_demo_wheels
from dockerlaunch.sim.layout import (
    BASE_TAG,
    DEFAULT_LIGHT_SUBNET,
    DEFAULT_NAME,
    DEFAULT_SUBNET,
    ENGINES,
    MAX_LIGHT_NODES,
    MAX_NODES,
    SHARED_DIR,
    SIM_LABEL,
    SIM_USERS,
    SimError,
    SimNode,
    default_light_engines,
    light_layout,
    network_name,
    node_layout,
    parse_engine_info,
    parse_engines,
    render_cluster_config,
    state_root,
)
from dockerlaunch.sim.shaping import parse_rate, shape, tbf_argv
from dockerlaunch.sim.slurm import parse_slurmd_hw, render_slurm_conf, slurm_node_states

__all__ = [
    "BASE_TAG", "DEFAULT_LIGHT_SUBNET", "DEFAULT_NAME", "DEFAULT_SUBNET", "ENGINES", "MAX_LIGHT_NODES", "MAX_NODES",
    "SHARED_DIR", "SIM_LABEL", "SIM_USERS", "SimError", "SimNode", "_add_bytes", "build_demo_image", "create",
    "create_light",
    "default_light_engines", "engine_nofile", "ensure_base_image", "fetch_demo_wheels", "inventory",
    "light_engines", "light_layout", "network_name", "node_engine", "node_layout", "parse_engine_info",
    "parse_engines", "parse_rate", "parse_slurmd_hw", "remove", "render_cluster_config", "render_slurm_conf",
    "shape", "slurm_node_states", "state_root", "tbf_argv",
]
