import json

import pytest

from dockerlaunch.container import Deferred, UnresolvedError
from dockerlaunch.docker_run import argv as docker_argv
from dockerlaunch.docker_run import run_argv
from dockerlaunch.errors import ConfigError
from dockerlaunch.hosts.targets import resolve_all, resolve_target
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.facts import HostFacts
from dockerlaunch.job.plan import make_plan


def cfg(**kw) -> ClusterConfig:
    """Two hosts; GPUs through `--gpus` (the toolkit) unless a test picks another gpu_mode."""
    data = {"hosts": ["10.0.0.1", "10.0.0.2"], "image": "img:tag", "ssh": {"config_file": None}}
    data.update(kw)
    data["container"] = {"gpu_mode": "gpus", **data.get("container", {})}
    return ClusterConfig.model_validate(data)


def flag_values(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_done_when_dry_run(cli):
    r = cli("up", "--dry-run", "--hosts", "10.0.0.1,10.0.0.2", "--image", "img:tag", "--", "python", "train.py")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.count("# rank ") == 2
    assert "# rank 0: 10.0.0.1" in out and "# rank 1: 10.0.0.2" in out
    assert out.count("--network host") == 2
    assert "--env NODE_RANK=0" in out and "--env NODE_RANK=1" in out
    assert out.count("--env MASTER_ADDR=10.0.0.1") == 2
    assert out.count("--env NNODES=2") == 2
    assert out.count("img:tag python train.py") == 2
    assert "no host was contacted" in out


def test_done_when_loopback_refused(cli):
    r = cli("up", "--dry-run", "--hosts", "127.0.0.1,10.0.0.2", "--image", "img:tag", "--", "python", "train.py")
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1
    assert "loopback" in r.stderr and "127.0.0.1" in r.stderr and "advertise_addr" in r.stderr


def test_dry_run_json_matches_plan(cli):
    r = cli("up", "--dry-run", "--output", "json", "--hosts", "10.0.0.1,10.0.0.2", "--image", "i", "--", "a", "b c")
    data = json.loads(r.stdout)
    assert [h["env"]["NODE_RANK"] for h in data["hosts"]] == ["0", "1"]
    assert data["hosts"][1]["argv"][-3:] == ["i", "a", "b c"]


def test_rank_env_and_names():
    plan = make_plan(cfg(job={"name": "sft", "master_port": 12345, "nproc_per_node": 8}))
    assert plan.nnodes == 2 and plan.master_addr == "10.0.0.1"
    for rank, h in enumerate(plan.hosts):
        env = h.container.env
        assert env["NNODES"] == "2" and env["NODE_RANK"] == str(rank)
        assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "12345"
        assert env["NPROC_PER_NODE"] == "8"
        assert h.container.name == f"sft-{rank}"
        argv = docker_argv(h.container)
        assert flag_values(argv, "--network") == ["host"]
        assert flag_values(argv, "--ipc") == ["host"]
        assert flag_values(argv, "--restart") == ["no"]
        assert f"dockerlaunch.rank={rank}" in flag_values(argv, "--label")
        assert "dockerlaunch.job=sft" in flag_values(argv, "--label")
        assert "--privileged" not in argv


def test_master_addr_rules():
    assert make_plan(cfg(hosts=[{"address": "gpu1", "advertise_addr": "10.9.9.9"}, "gpu2"])).master_addr == "10.9.9.9"
    named = make_plan(cfg(hosts=["gpu1", "gpu2"])).master_addr
    assert isinstance(named, Deferred)
    facts = {0: HostFacts(master_addr="10.1.2.3")}
    assert make_plan(cfg(hosts=["gpu1", "gpu2"]), facts=facts).master_addr == "10.1.2.3"
    # one host may use loopback; several may not, whatever the spelling
    assert make_plan(cfg(hosts=["127.0.0.1"])).master_addr == "127.0.0.1"
    for bad in (["localhost", "10.0.0.2"], ["::1", "10.0.0.2"],
                [{"address": "gpu1", "advertise_addr": "127.0.0.2"}, "g2"]):
        with pytest.raises(ConfigError, match="loopback"):
            make_plan(cfg(hosts=bad))


def test_ssh_config_hostname_gives_master_addr():
    import paramiko

    sc = paramiko.SSHConfig.from_text("Host gpu1\n  HostName 10.5.5.5\n  User ubuntu\n")
    config = cfg(hosts=["gpu1", "gpu2"])
    target = resolve_target(config.hosts[0], config.ssh, sc)
    assert target.user == "ubuntu" and target.hostname == "10.5.5.5"
    assert make_plan(config, master_hostname=target.hostname).master_addr == "10.5.5.5"
    assert isinstance(make_plan(config).master_addr, Deferred)  # a name, not an address: resolved at launch


@pytest.mark.parametrize(
    "gpus,mode,gpu_flag,devices,nproc",
    [
        ("all", "gpus", "all", [], None),
        (4, "gpus", "4", [], 4),
        (["0", "3"], "gpus", '"device=0,3"', [], 2),
        ("none", "gpus", None, [], 1),
        ("all", "cdi", None, ["nvidia.com/gpu=all"], None),
        (["1"], "cdi", None, ["nvidia.com/gpu=1"], 1),
    ],
)
def test_gpu_flags(gpus, mode, gpu_flag, devices, nproc):
    h = make_plan(cfg(container={"gpus": gpus, "gpu_mode": mode, "infiniband": "off"})).hosts[0]
    argv = docker_argv(h.container)
    assert flag_values(argv, "--gpus") == ([gpu_flag] if gpu_flag else [])
    assert flag_values(argv, "--device") == devices
    if nproc is None:
        assert isinstance(h.nproc_per_node, Deferred)
        assert make_plan(cfg(container={"gpus": gpus}), facts={0: HostFacts(gpu_count=8)}).hosts[0].nproc_per_node == 8
    else:
        assert h.nproc_per_node == nproc


def test_per_host_overrides():
    plan = make_plan(cfg(hosts=["10.0.0.1", {"address": "10.0.0.2", "gpus": 2, "nproc_per_node": 3}],
                         job={"nproc_per_node": 8}))
    assert plan.hosts[0].container.env["NPROC_PER_NODE"] == "8"
    assert plan.hosts[1].container.env["NPROC_PER_NODE"] == "3"
    assert flag_values(docker_argv(plan.hosts[1].container), "--gpus") == ["2"]


def test_infiniband_modes():
    on = make_plan(cfg(container={"infiniband": "on"}), facts={0: HostFacts(ib_hca="mlx5_0:1,mlx5_1:1")}).hosts[0]
    argv = docker_argv(on.container)
    assert "/dev/infiniband" in flag_values(argv, "--device")
    assert "IPC_LOCK" in flag_values(argv, "--cap-add")
    assert "memlock=-1:-1" in flag_values(argv, "--ulimit")
    assert on.container.env["NCCL_IB_HCA"] == "mlx5_0:1,mlx5_1:1"

    off = make_plan(cfg(container={"infiniband": "off"})).hosts[0].container
    assert "/dev/infiniband" not in docker_argv(off) and "NCCL_IB_HCA" not in off.env and off.infiniband is False

    auto = make_plan(cfg()).hosts[0].container
    assert isinstance(auto.infiniband, Deferred) and isinstance(auto.env["NCCL_IB_HCA"], Deferred)
    auto_no_ib = make_plan(cfg(), facts={0: HostFacts(infiniband=False)}).hosts[0].container
    assert auto_no_ib.infiniband is False and "/dev/infiniband" not in docker_argv(auto_no_ib)
    auto_ib = make_plan(cfg(), facts={0: HostFacts(infiniband=True, ib_hca="")}).hosts[0].container
    assert "/dev/infiniband" in docker_argv(auto_ib) and "NCCL_IB_HCA" not in auto_ib.env

    # the user's memlock wins (the sim VMs refuse memlock=-1)
    mine = make_plan(cfg(container={"infiniband": "on", "ulimits": {"memlock": "8192"}})).hosts[0].container
    assert flag_values(docker_argv(mine), "--ulimit") == ["nofile=1048576:1048576", "memlock=8192:8192"]


def test_every_job_container_gets_a_high_open_files_limit():
    """Docker 29 gives containers 1024 open files (moby#51485): the plan asks for 1048576, shown by the dry run."""
    plan = make_plan(cfg(container={"infiniband": "off"}))
    for hp in plan.hosts:
        assert flag_values(docker_argv(hp.container), "--ulimit") == ["nofile=1048576:1048576"]
    assert plan.to_dict()["hosts"][0]["ulimits"] == {"nofile": "1048576:1048576"}
    ib = make_plan(cfg(container={"infiniband": "on"})).hosts[0].container
    assert flag_values(docker_argv(ib), "--ulimit") == ["memlock=-1:-1", "nofile=1048576:1048576"]
    resolved = make_plan(cfg(), facts={0: HostFacts(infiniband=False), 1: HostFacts(infiniband=False)}).hosts[1]
    assert "nofile=1048576:1048576" in flag_values(docker_argv(resolved.container), "--ulimit")


@pytest.mark.parametrize("mine,flag", [("65536", "nofile=65536:65536"), ("4096:20000", "nofile=4096:20000")])
def test_the_users_open_files_limit_wins(mine, flag):
    """An engine that cannot raise its own hard limit (rootless Docker, the sim's nodes) needs a lower value."""
    plan = make_plan(cfg(container={"infiniband": "on", "ulimits": {"nofile": mine}}))
    assert flag_values(docker_argv(plan.hosts[0].container), "--ulimit") == ["memlock=-1:-1", flag]
    assert plan.to_dict()["hosts"][1]["ulimits"]["nofile"] == flag.removeprefix("nofile=")


def test_user_env_wins_but_rank_env_is_reserved():
    c = make_plan(cfg(container={"env": {"NCCL_SOCKET_IFNAME": "ib0", "PYTHONUNBUFFERED": "0"}})).hosts[0].container
    assert c.env["NCCL_SOCKET_IFNAME"] == "ib0" and c.env["PYTHONUNBUFFERED"] == "0"
    assert isinstance(c.env["GLOO_SOCKET_IFNAME"], Deferred)
    with pytest.raises(ConfigError, match="container.env.NODE_RANK"):
        make_plan(cfg(container={"env": {"NODE_RANK": "3"}}))


def test_ipc_and_shm():
    c = make_plan(cfg(container={"shm_size": "64g"})).hosts[0].container
    assert flag_values(docker_argv(c), "--ipc") == ["private"] and flag_values(docker_argv(c), "--shm-size") == ["64g"]


def test_command_forms():
    assert make_plan(cfg(job={"command": ["python", "t.py"]})).hosts[0].container.command == ["python", "t.py"]
    assert make_plan(cfg(job={"command": "torchrun --node_rank $NODE_RANK t.py"})).hosts[0].container.command == [
        "/bin/sh", "-c", "torchrun --node_rank $NODE_RANK t.py"]
    assert make_plan(cfg()).hosts[0].container.command == []


def test_no_image_is_an_error():
    with pytest.raises(ConfigError, match="no image"):
        make_plan(ClusterConfig.model_validate({"hosts": ["10.0.0.1"]}))


def test_mounts_and_extras():
    c = make_plan(cfg(container={"mounts": ["/data:/data:ro", "/ckpt:/ckpt"], "workdir": "/w", "user": "1000:1000",
                                 "extra_args": ["--pids-limit", "-1"], "cap_add": ["SYS_PTRACE"],
                                 "infiniband": "off"})).hosts[0].container
    argv = docker_argv(c)
    diag = "/var/tmp/dockerlaunch/dockerlaunch"
    assert flag_values(argv, "--volume") == ["/data:/data:ro", "/ckpt:/ckpt", f"{diag}:{diag}"]
    assert flag_values(argv, "--workdir") == ["/w"] and flag_values(argv, "--user") == ["1000:1000"]
    assert flag_values(argv, "--cap-add") == ["SYS_PTRACE"]
    assert argv[argv.index("--pids-limit") + 1] == "-1" and argv.index("--pids-limit") < argv.index("img:tag")


def test_resolved_plan_has_no_placeholders_and_unresolved_is_refused():
    dry = make_plan(cfg())
    assert dry.unresolved()
    with pytest.raises(UnresolvedError):
        run_argv(dry.hosts[0].container)
    facts = {r: HostFacts(interface="eth0", gpu_count=8, infiniband=False, selinux=False) for r in range(2)}
    no_run = make_plan(cfg(), facts=facts)
    assert [u.split(":")[0] for u in no_run.unresolved()] == ["rank 0 (10.0.0.1) label dockerlaunch.run",
                                                              "rank 1 (10.0.0.2) label dockerlaunch.run"]
    with pytest.raises(UnresolvedError, match="dockerlaunch.run"):
        run_argv(no_run.hosts[0].container)
    full = make_plan(cfg(), facts=facts, run_id="r1")
    assert full.unresolved() == []
    assert all(h.container.labels["dockerlaunch.run"] == "r1" for h in full.hosts)
    for h in full.hosts:
        argv = run_argv(h.container)
        assert not any(isinstance(a, Deferred) or "<resolved at launch" in a for a in argv)
        assert h.container.env["NCCL_SOCKET_IFNAME"] == "eth0" == h.container.env["GLOO_SOCKET_IFNAME"]


def test_env_files_are_never_inlined():
    plan = make_plan(cfg(container={"env_files": ["/home/me/secrets.env"], "infiniband": "off"}))
    c = plan.hosts[0].container
    assert any("secrets.env" in u for u in c.unresolved())
    facts = {r: HostFacts(interface="eth0", gpu_count=1, env_files=(f"/tmp/dl-{r}.env",), selinux=False)
             for r in range(2)}
    c = make_plan(cfg(container={"env_files": ["/home/me/secrets.env"], "infiniband": "off"}),
                  facts=facts, run_id="r1").hosts[1].container
    assert flag_values(run_argv(c), "--env-file") == ["/tmp/dl-1.env"]


# ---------------------------------------------------------------- diagnostics


@pytest.mark.parametrize("login, folder", [
    ("root", "/var/tmp/dockerlaunch/qwen"), ("alice", "/var/tmp/dockerlaunch-alice/qwen"),
    ("bad/../name", "/var/tmp/dockerlaunch/qwen"),  # never a path from a login's name: the default, diagdir.sh checks
])
def test_each_ssh_login_gets_a_diagnostics_folder_of_its_own_by_default(login, folder):
    """Two logins without root on one host: a folder one made is refused to the other (it could swap the job's
    folder in it), so they never share one; the plan says which, and the container's flags and env follow it."""
    from types import SimpleNamespace

    from dockerlaunch.job.plan import plan_job

    plan = plan_job(cfg(job={"name": "qwen"}), [SimpleNamespace(hostname="10.0.0.1", user=login)])
    assert plan.diag_dir == folder and plan.config.diagnostics.dir == folder.rsplit("/", 1)[0]
    c = plan.hosts[1].container
    assert f"{folder}:{folder}" in flag_values(docker_argv(c), "--volume")
    assert c.env["NCCL_DEBUG_FILE"].startswith(folder + "/nccl/")
    own = plan_job(cfg(job={"name": "qwen"}, diagnostics={"dir": "/scratch/dl"}),
                   [SimpleNamespace(hostname="10.0.0.1", user=login)])
    assert own.diag_dir == "/scratch/dl/qwen"  # the user's own setting is never changed


def test_diagnostics_are_on_by_default_and_write_into_the_job_folder():
    plan = make_plan(cfg(job={"name": "qwen"}, diagnostics={"dir": "/scratch/dl/"}))
    c = plan.hosts[1].container
    assert plan.diag_dir == "/scratch/dl/qwen"
    assert "/scratch/dl/qwen:/scratch/dl/qwen" in flag_values(docker_argv(c), "--volume")
    assert "SYS_PTRACE" in c.cap_add
    assert c.env["NCCL_DEBUG"] == "INFO" and c.env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert c.env["NCCL_DEBUG_FILE"] == "/scratch/dl/qwen/nccl/nccl.1.%h.%p.log"  # host 1's container
    assert c.env["TORCH_FR_BUFFER_SIZE"] == c.env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert c.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert c.env["TORCH_FR_DUMP_TEMP_FILE"] == c.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/scratch/dl/qwen/fr/rank_"
    assert c.env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/scratch/dl/qwen/fr-pipe/rank_"


def test_user_values_win_over_diagnostics_and_each_part_turns_off():
    c = make_plan(cfg(container={"env": {"NCCL_DEBUG": "WARN", "TORCH_FR_BUFFER_SIZE": "0"}})).hosts[0].container
    assert c.env["NCCL_DEBUG"] == "WARN" and c.env["TORCH_FR_BUFFER_SIZE"] == "0"
    assert "NCCL_DEBUG_FILE" in c.env  # the rest stays
    off = make_plan(cfg(diagnostics={"ptrace": False, "nccl_log": False})).hosts[0].container
    assert "SYS_PTRACE" not in off.cap_add and "NCCL_DEBUG" not in off.env and "TORCH_FR_BUFFER_SIZE" in off.env
    cap = make_plan(cfg(container={"cap_add": ["SYS_PTRACE"]})).hosts[0].container
    assert cap.cap_add.count("SYS_PTRACE") == 1


def test_no_diagnostics_flag_turns_everything_off():
    from dockerlaunch.job.flags import Overrides, apply_overrides
    from dockerlaunch.job.load import validate_config

    data = apply_overrides({"hosts": ["10.0.0.1"], "image": "i", "diagnostics": {"dir": "/d"}},
                           Overrides(diagnostics=False))
    plan = make_plan(validate_config(data))
    c = plan.hosts[0].container
    assert plan.diag_dir is None and not any(v.startswith("/d") for v in flag_values(docker_argv(c), "--volume"))
    assert "SYS_PTRACE" not in c.cap_add and not any(k.startswith(("NCCL_DEBUG", "TORCH_")) for k in c.env)


@pytest.mark.parametrize("bad", ["relative/dir", "/", "/a:b", "/a b", "/a,b"])
def test_diagnostics_dir_must_be_an_absolute_plain_path(bad):
    from dockerlaunch.job.load import validate_config

    with pytest.raises(ConfigError, match="diagnostics.dir"):
        validate_config({"hosts": ["10.0.0.1"], "diagnostics": {"dir": bad}})


# ---------------------------------------------------------------- GPU access modes (facts as probe.sh reports them)

LIBS = (("libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"),
        ("libnvidia-ml.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1"),
        ("libnvidia-ptxjitcompiler.so.1", "/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1"))
NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl")


def gpu_host(**kw):
    from dockerlaunch.gpu.access import HostGpuAccess

    base = dict(device_nodes=NODES, libs=LIBS, nvidia_smi="/usr/bin/nvidia-smi", engine="20.10.24",
                image_env=("PATH=/usr/bin", "LD_LIBRARY_PATH=/opt/lib"))
    return HostGpuAccess(**{**base, **kw})


def planned(container=None, gpu=None, hosts=("10.0.0.1",)):
    config = cfg(hosts=list(hosts), container={"gpu_mode": "auto", **(container or {})})
    return make_plan(config, facts={0: HostFacts(gpu_count=2, access=gpu or gpu_host())}).hosts[0]


def test_auto_prefers_the_toolkit_then_cdi_then_device_nodes():
    toolkit = planned(gpu=gpu_host(nvidia_runtime=True, cdi_specs=("/etc/cdi/nvidia.yaml",), engine="27.3.1"))
    assert toolkit.gpu_mode == "gpus" and flag_values(docker_argv(toolkit.container), "--gpus") == ["all"]
    on = ("/etc/cdi", "/var/run/cdi")
    cdi = planned(gpu=gpu_host(cdi_specs=("/etc/cdi/nvidia.yaml",), engine="28.5.2", cdi_dirs=on))
    assert cdi.gpu_mode == "cdi" and flag_values(docker_argv(cdi.container), "--device") == ["nvidia.com/gpu=all"]
    assert cdi.gpu_why == "CDI spec /etc/cdi/nvidia.yaml, Docker 28.5.2"
    old_engine = planned(gpu=gpu_host(cdi_specs=("/etc/cdi/nvidia.yaml",), engine="24.0.7"))
    assert old_engine.gpu_mode == "devices" and "Docker 24.0.7 has no CDI (it needs 25 or later)" in old_engine.gpu_why
    bare = planned()
    assert bare.gpu_mode == "devices" and "no toolkit runtime" in bare.gpu_why


# What a real engine's `docker info --format '{{json .CDISpecDirs}}'` said (test_engines checks it on the sim):
# Docker 26.1.5 prints [] (CDI off unless "features": {"cdi": true}), 28.5.2 the two default dirs.
@pytest.mark.parametrize("kw, usable, words", [
    (dict(engine="26.1.5", cdi_dirs=(), cdi_specs=("/etc/cdi/nvidia.yaml",)), False,
     ['CDI is off in Docker 26.1.5', '"features": {"cdi": true} to /etc/docker/daemon.json']),
    (dict(engine="28.5.2", cdi_dirs=("/etc/cdi", "/var/run/cdi")), False,
     ["no CDI spec names nvidia.com/gpu in /etc/cdi, /var/run/cdi", "nvidia-ctk cdi generate"]),
    (dict(engine="28.5.2", cdi_dirs=("/var/run/cdi",), cdi_specs=("/etc/cdi/nvidia.yaml",)), False,
     ["no CDI spec names nvidia.com/gpu in /var/run/cdi"]),  # a spec in a dir this dockerd does not read
    (dict(engine="20.10.24", cdi_dirs=None), False, ["Docker 20.10.24 has no CDI"]),
    (dict(engine="28.5.2", cdi_dirs=("/etc/cdi",), cdi_specs=("/etc/cdi/nvidia.yaml",)), True,
     ["CDI spec /etc/cdi/nvidia.yaml, Docker 28.5.2"]),
])
def test_cdi_state_says_why_cdi_is_or_is_not_usable(kw, usable, words):
    from dockerlaunch.gpu.access import HostGpuAccess, cdi_state

    ok, why = cdi_state(HostGpuAccess(**kw))
    assert ok is usable and all(w in why for w in words), why


def test_gpu_mode_cdi_on_an_engine_with_cdi_off_is_a_one_line_error_naming_the_host():
    with pytest.raises(ConfigError, match=r"hosts\[0\] 10.0.0.1: gpu_mode cdi, but CDI is off in Docker 26"):
        planned(container={"gpu_mode": "cdi", "gpus": "all"},
                gpu=gpu_host(engine="26.1.5", cdi_dirs=(), cdi_specs=("/etc/cdi/nvidia.yaml",)))


def test_device_mode_passes_nodes_driver_libraries_and_the_loader_path():
    hp = planned()
    argv = docker_argv(hp.container)
    assert flag_values(argv, "--device") == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                             "/dev/nvidia0", "/dev/nvidia1"]
    vols = flag_values(argv, "--volume")
    assert "/usr/local/nvidia/lib64/libcuda.so.1:/usr/local/nvidia/lib64/libcuda.so.1:ro" in vols
    assert "/usr/bin/nvidia-smi:/usr/local/nvidia/bin/nvidia-smi:ro" in vols
    assert hp.container.env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64:/opt/lib"  # the image's path kept
    assert "--gpus" not in argv and "--privileged" not in argv


def test_device_mode_passes_every_gpu_node_and_chooses_with_cuda_visible_devices():
    """NCCL P2P between two containers of one machine needs the peer's node (recorded: 'invalid device ordinal')."""
    one = planned(container={"gpus": ["1"]}).container
    assert [d for d in flag_values(docker_argv(one), "--device") if d[-1].isdigit()] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert one.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert planned(container={"gpus": 1}).container.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "CUDA_VISIBLE_DEVICES" not in planned().container.env  # all of them
    mine = planned(container={"gpus": ["1"], "env": {"CUDA_VISIBLE_DEVICES": "0"}}).container.env
    assert mine["CUDA_VISIBLE_DEVICES"] == "0"


def test_device_mode_keeps_the_users_loader_path_and_an_image_that_already_looks_there():
    mine = planned(container={"env": {"LD_LIBRARY_PATH": "/mine"}}).container.env
    assert mine["LD_LIBRARY_PATH"] == "/mine"
    cuda_image = planned(gpu=gpu_host(image_env=("LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",)))
    assert "LD_LIBRARY_PATH" not in cuda_image.container.env


@pytest.mark.parametrize("container,gpu,words", [
    ({"gpus": ["2"]}, None, "asks for GPUs ['2'] but the host has GPU device nodes: /dev/nvidia0, /dev/nvidia1"),
    ({"gpus": 3}, None, "asks for GPUs 3"),
    ({"gpus": ["GPU-1234abcd"]}, None, "takes GPU indices"),
    ({}, {"libs": ()}, "no NVIDIA driver libraries found"),
    ({"gpus": 2}, {"cdi_specs": ("/etc/cdi/nvidia.yaml",), "engine": "28.5.2", "cdi_dirs": ("/etc/cdi",)},
     "CDI (chosen for this host) takes"),
])
def test_impossible_gpu_requests_name_the_host_and_the_fix(container, gpu, words):
    with pytest.raises(ConfigError, match=r"hosts\[0\] 10.0.0.1") as e:
        planned(container=container, gpu=gpu_host(**(gpu or {})))
    assert words in str(e.value)


def test_dry_run_defers_gpu_access_and_fixed_modes_do_not():
    auto = make_plan(cfg(container={"gpu_mode": "auto"})).hosts[0]
    assert isinstance(auto.gpu_mode, Deferred) and "GPU access of the host" in auto.container.gpu
    fixed = make_plan(cfg(container={"gpu_mode": "gpus"})).hosts[0]
    assert fixed.gpu_mode == "gpus" and flag_values(docker_argv(fixed.container), "--gpus") == ["all"]
    devices = make_plan(cfg(container={"gpu_mode": "devices"})).hosts[0]
    assert "device nodes and driver libraries" in devices.container.gpu
    none = make_plan(cfg(container={"gpus": "none", "gpu_mode": "auto"})).hosts[0]
    assert none.gpu_mode == "none" and none.container.gpu is None
    assert not any(u.startswith("gpus") for u in none.container.unresolved())


# ---------------------------------------------------------------- the local host


def test_local_host_runs_without_ssh_on_loopback():
    plan = make_plan(cfg(hosts=["local"], container={"gpus": "none"}))
    assert plan.master_addr == "127.0.0.1" and plan.hosts[0].host.local
    assert resolve_all(plan.config)[0].describe() == "local (no SSH)"
    two = make_plan(cfg(hosts=[{"address": "local", "gpus": ["0"]}, {"address": "local", "gpus": ["1"]}]))
    assert two.master_addr == "127.0.0.1" and [h.container.name for h in two.hosts] == ["dockerlaunch-0",
                                                                                          "dockerlaunch-1"]


def test_local_beside_ssh_hosts_needs_its_advertise_addr():
    from dockerlaunch.job.load import validate_config

    with pytest.raises(ConfigError, match=r"hosts\[0\] local: in a job with SSH hosts, give its advertise_addr"):
        validate_config({"hosts": ["local", "10.0.0.2"]})
    plan = make_plan(cfg(hosts=[{"address": "local", "advertise_addr": "10.0.0.1"}, "10.0.0.2"]))
    assert plan.master_addr == "10.0.0.1"


@pytest.mark.parametrize("torch,old", [(None, True), ("2.7.1", True), ("2.10.0", True), ("2.11.0+cu130", False),
                                       ("2.13.0+cpu", False), ("garbage", True)])
def test_flight_recorder_names_follow_the_images_torch(torch, old):
    facts = {0: HostFacts(interface="eth0", gpu_count=1, infiniband=False, torch=torch)}
    env = make_plan(cfg(), facts=facts).hosts[0].container.env
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert ("TORCH_NCCL_TRACE_BUFFER_SIZE" in env) is old and ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in env) is old


def test_probe_reads_the_images_labels_and_gpu_facts():
    from dockerlaunch.backends.docker.probe import parse_probe

    p = parse_probe('route=10.0.0.1 dev eth0 src 10.0.0.2 uid 0\nhas_ip=1\ngpus=2\n'
                    'image_labels={"ai.dockerlaunch.pin.torch":"2.11.0"}\n'
                    'gpu_dev=/dev/nvidia0\ngpu_dev=/dev/nvidiactl\n'
                    'docker_info={"ServerVersion":"20.10.24","Runtimes":{"io.containerd.runc.v2":{},"runc":{}}}\n'
                    'lib=libcuda.so.1 (libc6,x86-64) => /usr/lib/libcuda.so.1\n'
                    'image_env=["PATH=/usr/bin"]\nnvidia_smi=/usr/bin/nvidia-smi\n')
    assert p.image_labels == {"ai.dockerlaunch.pin.torch": "2.11.0"} and p.gpu_count == 2
    assert p.access.device_nodes == ("/dev/nvidia0", "/dev/nvidiactl") and not p.access.nvidia_runtime
    assert p.access.libs == (("libcuda.so.1", "/usr/lib/libcuda.so.1"),) and p.access.image_env == ("PATH=/usr/bin",)
    with_toolkit = parse_probe('docker_info={"Runtimes":{"nvidia":{"path":"nvidia-container-runtime"},"runc":{}}}\n')
    assert with_toolkit.access.nvidia_runtime and with_toolkit.image_labels is None


# ---------------------------------------------------------------- job.offline


def test_offline_sets_the_hubs_switches_and_the_user_wins():
    from dockerlaunch.job.plan import OFFLINE_ENV

    plan = make_plan(ClusterConfig.model_validate({
        "hosts": ["h1", "h2"], "image": "img", "ssh": {"config_file": None}, "job": {"offline": True},
        "container": {"env": {"HF_DATASETS_OFFLINE": "0"}}}))
    for hp in plan.hosts:
        env = hp.container.env
        assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1" and env["HF_DATASETS_OFFLINE"] == "0"
    online = make_plan(ClusterConfig.model_validate({"hosts": ["h1"], "image": "img", "ssh": {"config_file": None}}),)
    assert not set(OFFLINE_ENV) & set(online.hosts[0].container.env) and online.advice == []


@pytest.mark.parametrize("command,advised", [
    (["swift", "sft", "--model", "/m"], True),
    ("megatron rlhf --rlhf_type dpo --model /m", True),
    ("cd /w && /opt/venv/bin/swift pt --model /m 2>&1 | tee log", True),
    (["swift", "sft", "--model", "/m", "--check_model", "false"], False),
    ("swift sft --check_model=false", False),
    (["swift", "infer", "--model", "/m"], False),  # no trainer: no ModelScope check
    (["torchrun", "pretrain_gpt.py"], False),
    ("swift sft 'unbalanced", True),  # not shell-parsable: read word by word
    (None, False),
])
def test_offline_advice_names_check_model_for_ms_swift_trainers(command, advised):
    from dockerlaunch.job.plan import offline_advice

    note = offline_advice(command)
    assert (note is not None) == advised, note
    if advised:
        assert "--check_model false" in note


def test_offline_advice_reaches_the_plan_and_the_dry_run():
    from dockerlaunch.cli.console import render_plan

    data = {"hosts": ["h1"], "image": "img", "ssh": {"config_file": None},
            "job": {"offline": True, "command": ["swift", "sft", "--model", "/m"]}}
    plan = make_plan(ClusterConfig.model_validate(data))
    assert len(plan.advice) == 1 and "note: job.offline: ms-swift" in render_plan(plan, resolve_all(plan.config))
    assert plan.to_dict()["advice"] == plan.advice
    data["job"]["offline"] = False
    assert make_plan(ClusterConfig.model_validate(data)).advice == []


@pytest.mark.parametrize("container", [
    {"gpu_mode": "auto", "infiniband": "auto"},
    {"gpu_mode": "gpus", "infiniband": "on", "ulimits": {"memlock": "8192"}},
    {"gpus": "none", "infiniband": "off", "env_files": []},
])
@pytest.mark.parametrize("ib", [True, False])
def test_up_applies_the_dry_run_plan_with_only_its_placeholders_filled(container, ib):
    """`up --dry-run` prints the plan `up` applies: `resolve` may fill what was `<resolved at launch>` (and add what
    a deferred GPU or IB decision brings), never change a value the dry run showed."""
    from dockerlaunch.docker_run import argv as docker_argv
    from dockerlaunch.gpu.access import HostGpuAccess
    from dockerlaunch.job.plan import resolve

    dry = make_plan(cfg(container=container))
    gpu = HostGpuAccess(device_nodes=("/dev/nvidiactl", "/dev/nvidia0"), nvidia_runtime=True)
    facts = {r: HostFacts(interface="eth0", gpu_count=1, infiniband=ib, ib_hca="mlx5_0:1" if ib else "",
                          master_addr="10.0.0.1" if r == 0 else None, access=gpu, selinux=ib) for r in range(2)}
    applied = resolve(dry, facts, run_id="r1")
    assert not applied.unresolved()
    for d, a in zip(dry.hosts, applied.hosts):
        for k, v in d.container.env.items():
            if not isinstance(v, Deferred):
                assert a.container.env[k] == v, k
        shown = [x for x in docker_argv(d.container) if not isinstance(x, Deferred)]
        real = docker_argv(a.container)
        # every flag value the dry run showed is in the applied argv (placeholder lines aside)
        assert all(x in real for x in shown if "<resolved at launch" not in x), set(shown) - set(real)
        assert docker_argv(a.container)[-3:] == docker_argv(d.container)[-3:]  # image and command


def test_finding_a_job_needs_no_image_but_starting_one_does():
    """down/status/logs plan without an image; the placeholder they get can never start a container."""
    from dockerlaunch.docker_run import run_argv

    config = ClusterConfig.model_validate({"hosts": ["10.0.0.1"], "ssh": {"config_file": None},
                                           "container": {"gpus": "none", "infiniband": "off"}})
    with pytest.raises(ConfigError, match="no image"):
        make_plan(config)
    plan = make_plan(config, require_image=False, facts={0: HostFacts(interface="eth0", gpu_count=1, selinux=False)},
                     run_id="r")
    assert plan.hosts[0].container.name == "dockerlaunch-0"
    assert plan.hosts[0].container.unresolved() == ["image: the job image: --image or image: (not needed to find "
                                                    "a job's containers)"]
    with pytest.raises(UnresolvedError, match="image"):
        run_argv(plan.hosts[0].container)


def test_status_without_an_image_reaches_for_the_hosts(cli):
    r = cli("status", "--hosts", "127.0.0.1:1", "--name", "j")
    assert r.returncode != 0 and "no image" not in r.stderr and "127.0.0.1" in r.stderr, r.stderr


def test_the_text_dry_run_says_the_images_cmd_runs_when_no_command_is_given():
    """A shell comment, so the printed `docker run` still pastes and runs as it is."""
    import shlex

    from dockerlaunch.cli.console import render_plan

    data = {"hosts": ["h1"], "image": "img:1", "ssh": {"config_file": None}}
    plan = make_plan(ClusterConfig.model_validate(data))
    text = render_plan(plan, resolve_all(plan.config))
    last = next(line for line in text.splitlines() if "img:1" in line and not line.startswith("Plan"))
    assert last.endswith("img:1  # <the image's CMD>") and shlex.split(last, comments=True) == ["img:1"], last
    data["job"] = {"command": ["echo", "hi"]}
    plan = make_plan(ClusterConfig.model_validate(data))
    assert "<the image's CMD>" not in render_plan(plan, resolve_all(plan.config))


# ---------------------------------------------------------------- SELinux (container.selinux, issue 58 item 5)

LABEL_DISABLE = ["--security-opt", "label=disable"]


def has_label_disable(argv) -> bool:
    return any(argv[i:i + 2] == LABEL_DISABLE for i in range(len(argv)))


def test_auto_is_decided_per_host_from_its_engine_and_the_dry_run_says_so(cli):
    dry = make_plan(cfg())
    shown = docker_argv(dry.hosts[0].container)
    placeholder = [a for a in shown if isinstance(a, Deferred) and a.key == "selinux"]
    assert placeholder and "label=disable" in placeholder[0] and "SELinux" in placeholder[0]
    assert any(u.startswith("selinux: ") for u in dry.hosts[0].container.unresolved())
    base = {"interface": "eth0", "gpu_count": 8, "infiniband": False}
    facts = {0: HostFacts(**base, selinux=True), 1: HostFacts(**base, selinux=False)}
    labelled, plain = (run_argv(h.container) for h in make_plan(cfg(), facts=facts, run_id="r").hosts)
    assert has_label_disable(labelled) and not has_label_disable(plain)
    assert labelled.index("--security-opt") < labelled.index("img:tag")
    r = cli("up", "--dry-run", "--hosts", "10.0.0.1,10.0.0.2", "--image", "img:tag", "--", "python", "train.py")
    assert r.returncode == 0 and r.stdout.count("label=disable where the engine of the host labels containers") == 2, \
        r.stdout


@pytest.mark.parametrize("mode, engine_labels, expected", [
    ("disable", False, True), ("disable", None, True),  # always: nothing to ask
    ("keep", True, False), ("keep", None, False),  # never: the engine's labels (and Docker's own rules) stay
    ("auto", True, True), ("auto", False, False),
])
def test_disable_and_keep_need_no_host(mode, engine_labels, expected):
    facts = {r: HostFacts(interface="eth0", gpu_count=8, infiniband=False, selinux=engine_labels) for r in range(2)}
    for h in make_plan(cfg(container={"selinux": mode}), facts=facts, run_id="r").hosts:
        assert h.container.label_disable is expected
        assert has_label_disable(run_argv(h.container)) is expected


def test_selinux_takes_three_words():
    with pytest.raises(ValueError, match="selinux"):
        cfg(container={"selinux": "z"})  # relabelling (:z) is never offered: on a shared home it relabels files
