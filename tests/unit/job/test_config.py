import json

import pytest
from pydantic import ValidationError

from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import ClusterConfig, parse_host_string, parse_mount_string
from dockerlaunch.job.flags import Overrides, apply_overrides
from dockerlaunch.job.load import load_config
from dockerlaunch.job.plan import make_plan


@pytest.mark.parametrize(
    "text,expected",
    [
        ("10.0.0.1", {"address": "10.0.0.1"}),
        ("gpu1", {"address": "gpu1"}),
        ("root@gpu1", {"address": "gpu1", "user": "root"}),
        ("ubuntu@10.0.0.1:2222", {"address": "10.0.0.1", "user": "ubuntu", "port": 2222}),
        ("fe80::1", {"address": "fe80::1"}),
        ("[fe80::1]:22", {"address": "fe80::1", "port": 22}),
        ("a@[::1]", {"address": "::1", "user": "a"}),
    ],
)
def test_parse_host_string(text, expected):
    assert parse_host_string(text) == expected


@pytest.mark.parametrize("text", ["h:port", "[::1", "[::1]x", "@h"])
def test_parse_host_string_rejects(text):
    with pytest.raises(ValueError):
        parse_host_string(text)


def test_mount_string_forms():
    assert parse_mount_string("/a:/b") == {"source": "/a", "target": "/b"}
    assert parse_mount_string("/a:/b:ro") == {"source": "/a", "target": "/b", "read_only": True}
    for bad in ["/a", "/a:/b:rx", ":/b", "/a:/b:ro:x"]:
        with pytest.raises(ValueError):
            parse_mount_string(bad)


def test_full_config_round_trip():
    cfg = ClusterConfig.model_validate(
        {
            "hosts": [
                "10.0.0.1", "ubuntu@gpu2:2222", {"address": "gpu3", "advertise_addr": "10.0.0.3", "gpus": [0, 1]}
            ],
            "ssh": {"user": "root", "host_key_policy": "accept-new", "connect_timeout": 5},
            "image": "reg/img:tag",
            "container": {
                "mounts": ["/data:/data:ro", {"source": "/ckpt", "target": "/ckpt", "shared": True}],
                "env": {"A": 1, "B": True, "C": None},
                "gpus": "0,1",
                "ulimits": {"memlock": -1, "nofile": "1048576:1048576"},
                "cap_add": ["sys_ptrace", "CAP_IPC_LOCK"],
            },
            "job": {"name": "sft", "nproc_per_node": 8, "command": "torchrun train.py"},
        }
    )
    assert cfg.hosts[1].user == "ubuntu" and cfg.hosts[1].port == 2222
    assert cfg.hosts[2].gpus == ["0", "1"]
    assert cfg.container.gpus == ["0", "1"]
    assert cfg.container.env == {"A": "1", "B": "true", "C": ""}
    assert cfg.container.ulimits == {"memlock": "-1", "nofile": "1048576:1048576"}
    assert cfg.container.cap_add == ["SYS_PTRACE", "IPC_LOCK"]
    assert cfg.container.mounts[0].read_only and cfg.container.mounts[1].shared
    assert cfg.container.ipc is None and make_plan(cfg).hosts[0].container.ipc == "host"  # host unless asked
    # what `config show` prints validates again to the same thing
    assert ClusterConfig.model_validate(cfg.model_dump(mode="json")) == cfg


@pytest.mark.parametrize(
    "data,needle",
    [
        ({"hosts": ["a"], "container": {"shm_size": "16g", "ipc": "host"}}, "shm_size has no effect with ipc: host"),
        ({"hosts": ["a", "a"]}, "listed twice"),
        ({"hosts": ["a"], "container": {"mounts": ["data:/data"]}}, "not an absolute path"),
        ({"hosts": ["a"], "container": {"env": {"BAD-KEY": "x"}}}, "not a valid environment variable name"),
        ({"hosts": ["a"], "job": {"name": "-x"}}, "job.name"),
        ({"hosts": ["a"], "job": {"master_port": 70000}}, "job.master_port"),
        ({"hosts": [{"address": "a", "advertise_addr": "gpu1"}]}, "not an IP address"),
        ({"hosts": ["a"], "container": {"gpu_mode": "cdi", "gpus": 2}}, "cdi"),
        ({"hosts": ["a"], "container": {"ulimits": {"memlock": "lots"}}}, "memlock"),
        ({"hosts": ["a"], "container": {"ulimits": {"nofile": -1}}}, "open files cannot be unlimited"),
        ({"hosts": ["a"], "container": {"ulimits": {"nofile": "65536:-1"}}}, "open files cannot be unlimited"),
        ({"hosts": ["a"], "container": {"ulimits": {"nofile": "65536:1024"}}}, "soft limit is above the hard one"),
        ({"hosts": ["a"], "contianer": {}}, "contianer: unknown field"),
        ({"hosts": ["a"], "container": {"gpus": "many"}}, "container.gpus"),
    ],
)
def test_invalid_config_names_the_field(data, needle, tmp_path):
    path = tmp_path / "c.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    msg = str(e.value)
    assert needle in msg
    assert "\n" not in msg
    assert str(path) in msg
    assert e.value.exit_code == 2


def test_overrides_replace_and_extend():
    data = {
        "hosts": [{"address": "h1", "advertise_addr": "10.0.0.1"}, "h2"],
        "image": "old",
        "container": {"mounts": ["/a:/a"], "env": {"X": "1"}},
        "job": {"name": "j"},
    }
    merged = apply_overrides(
        data,
        Overrides(hosts=["h1", "root@h3:23"], image="new", mounts=["/b:/b:ro"], env=["Y=2", "X=3"], master_port=1234,
                  command=["python", "t.py"]),
    )
    cfg = ClusterConfig.model_validate(merged)
    assert [h.address for h in cfg.hosts] == ["h1", "h3"]
    assert cfg.hosts[0].advertise_addr == "10.0.0.1"  # per-host settings kept for a host named again
    assert cfg.hosts[1].user == "root" and cfg.hosts[1].port == 23
    assert cfg.image == "new"
    assert [m.target for m in cfg.container.mounts] == ["/a", "/b"]
    assert cfg.container.env == {"X": "3", "Y": "2"}
    assert cfg.job.master_port == 1234 and cfg.job.name == "j" and cfg.job.command == ["python", "t.py"]
    assert data["image"] == "old"  # the input mapping is not changed


def test_offline_flag_sets_job_offline_and_its_absence_keeps_the_file():
    assert ClusterConfig.model_validate(apply_overrides({"hosts": ["h"]}, Overrides(offline=True))).job.offline
    kept = apply_overrides({"hosts": ["h"], "job": {"offline": True}}, Overrides())
    assert ClusterConfig.model_validate(kept).job.offline
    assert not ClusterConfig.model_validate({"hosts": ["h"]}).job.offline


def test_override_errors_name_the_flag():
    with pytest.raises(ConfigError, match="--env"):
        apply_overrides({}, Overrides(env=["NOEQUALS"]))
    with pytest.raises(ConfigError, match="--hosts"):
        apply_overrides({}, Overrides(hosts=["h:notaport"]))


def test_no_hosts_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="no hosts to run on: pass --hosts h1,h2"):
        load_config(None, Overrides())


def test_missing_explicit_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))


def test_default_config_file_is_read(tmp_path, monkeypatch):
    (tmp_path / "dockerlaunch.yaml").write_text("hosts: [10.1.1.1]\nimage: x\n")
    monkeypatch.chdir(tmp_path)
    assert load_config().hosts[0].address == "10.1.1.1"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("hosts: [a\nimage: x\n", "invalid YAML"),
        ("- just\n- a list\n", "top level must be a mapping"),
        ("hosts:\n  - address: a\n    gpus: -3\n", "hosts[0].gpus"),
        ("hosts: [a]\nssh:\n  host_key_policy: yolo\n", "ssh.host_key_policy"),
    ],
)
def test_malformed_file_via_cli_is_one_line_exit_2(cli, tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    r = cli("config", "show", "--config", str(path))
    assert r.returncode == 2, r
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and needle in lines[0]
    assert "Traceback" not in r.stderr


def test_schema_is_json_schema(cli):
    r = cli("schema")
    assert r.returncode == 0
    schema = json.loads(r.stdout)
    assert schema["type"] == "object"
    assert {"hosts", "ssh", "image", "container", "job"} <= set(schema["properties"])
    assert schema["required"] == ["hosts"]


def test_config_show_merges_flags(cli, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("hosts: [10.0.0.1]\nimage: a\n")
    r = cli("config", "show", "--config", str(path), "--hosts", "10.0.0.5,10.0.0.6", "--env", "K=v", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [h["address"] for h in data["hosts"]] == ["10.0.0.5", "10.0.0.6"]
    assert data["container"]["env"] == {"K": "v"} and data["image"] == "a"


def test_validation_error_is_flat(tmp_path):
    """Several problems at once read as one line, each naming its field."""
    from dockerlaunch.errors import describe_validation_error

    with pytest.raises(ValidationError) as info:
        ClusterConfig.model_validate({"hosts": [], "job": {"master_port": 0}, "bogus": 1})
    line = describe_validation_error(info.value)
    assert "\n" not in line and line.count("; ") >= 2, line
    assert "hosts:" in line and "job.master_port:" in line and "bogus: unknown field" in line, line
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("hosts: [h1]\njob:\n  master_port: 0\ncontainer:\n  shm_size: lots\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(cfg))
    msg = str(err.value)
    assert "\n" not in msg and "job.master_port" in msg and "container.shm_size" in msg, msg


def test_documented_example_config_is_valid():
    """docs/dockerlaunch.example.yaml must stay true."""
    from pathlib import Path

    from dockerlaunch.job.plan import make_plan

    path = Path(__file__).resolve().parents[3] / "docs" / "dockerlaunch.example.yaml"
    cfg = load_config(str(path))
    assert cfg.hosts[2].user == "ubuntu" and cfg.hosts[2].port == 2222
    plan = make_plan(cfg)
    assert plan.master_addr == "10.0.0.1"
    assert plan.hosts[2].container.env["NPROC_PER_NODE"] == "4"
    assert cfg.container.selinux == "auto" and plan.hosts[0].container.unresolved()[-1].startswith("selinux: ")


def test_mapping_address_may_carry_user_and_port_but_not_contradict():
    h = ClusterConfig.model_validate({"hosts": [{"address": "u@h:2", "nproc_per_node": 1}]}).hosts[0]
    assert (h.address, h.user, h.port) == ("h", "u", 2)
    with pytest.raises(ValidationError, match="says port 2"):
        ClusterConfig.model_validate({"hosts": [{"address": "h:2", "port": 3}]})


def test_a_spare_named_in_hosts_is_a_host_of_this_run_with_its_own_settings(tmp_path):
    """`up` prints `push IMAGE --hosts SPARE --config FILE` for a spare no host can copy the image onto; pasted, it
    said `spare ... is listed twice (hosts[0] and spares[0])`. The spare's settings (user, port) come with it."""
    path = tmp_path / "c.yaml"
    path.write_text("hosts: [10.0.0.1]\nimage: x:1\nspares:\n  - {address: 10.0.0.9, port: 2200, user: ops}\n"
                    "  - 10.0.0.8\n")
    cfg = load_config(str(path), Overrides(hosts=["10.0.0.9"]))
    assert [(h.address, h.port, h.user) for h in cfg.hosts] == [("10.0.0.9", 2200, "ops")]
    assert [s.address for s in cfg.spares] == ["10.0.0.8"]


@pytest.mark.parametrize("entry", ["ops@10.0.0.1:2200", "{address: 'ops@10.0.0.1:2200'}",
                                   "{address: 10.0.0.1, user: ops, port: 2200}"])
def test_a_host_named_in_hosts_keeps_the_files_user_and_port_however_the_file_writes_it(tmp_path, entry):
    """`--hosts 10.0.0.1` for a host the file lists as `ops@10.0.0.1:2200` (a string, or a mapping's address) kept
    only a mapping's settings before: the string's user and port were lost and the run went to root@:22."""
    path = tmp_path / "c.yaml"
    path.write_text(f"hosts:\n  - {entry}\n  - 10.0.0.2\nimage: x:1\n")
    cfg = load_config(str(path), Overrides(hosts=["10.0.0.1", "10.0.0.2"]))
    assert [(h.address, h.user, h.port) for h in cfg.hosts] == [("10.0.0.1", "ops", 2200), ("10.0.0.2", None, None)]
    cfg = load_config(str(path), Overrides(hosts=["root@10.0.0.1"]))  # what the flag says wins
    assert [(h.address, h.user, h.port) for h in cfg.hosts] == [("10.0.0.1", "root", 2200)]
