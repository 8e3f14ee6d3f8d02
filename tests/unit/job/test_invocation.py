"""A printed command is the user's own invocation: the config file and --log-dir made absolute (pasted in another
folder), --hosts and --name as given, every plan flag the pasted command takes (a doctor without --image checked
another image), the ones it cannot take named, and no secret-looking --env value; quoted for a shell."""

import shlex

from dockerlaunch.job.flags import Overrides
from dockerlaunch.job.invocation import FIX, TAKES, Invocation
from dockerlaunch.job.load import load_config


def test_a_fix_carries_the_users_config_hosts_and_name():
    inv = Invocation(config="/c.yaml", hosts=("172.30.10.11", "172.30.10.12"), name="ux2")
    assert inv.fix("logs", "--follow", hint="t.i") == ("fix: dockerlaunch logs --follow --config /c.yaml "
                                           "--hosts 172.30.10.11,172.30.10.12 --name ux2")
    assert inv.fix("push", "img:1", name=False, hint="t.i") == ("fix: dockerlaunch push img:1 --config /c.yaml "
                                                    "--hosts 172.30.10.11,172.30.10.12")
    # no config file was read: nothing to repeat
    assert Invocation().fix("down", hint="t.i") == "fix: dockerlaunch down"


def test_what_the_user_typed_comes_back_as_one_word_each():
    inv = Invocation(config="/my configs/c 1.yaml", name="a'b", flags=(("--env", "A=x y"),))
    words = shlex.split(inv.fix("doctor", hint="t.i").removeprefix(FIX + " "))
    assert words == ["dockerlaunch", "doctor", "--config", "/my configs/c 1.yaml", "--name", "a'b", "--env", "A=x y"]


def _load(tmp_path, monkeypatch, path=None, ov=None, log_dir=None, env=None):
    (tmp_path / "dockerlaunch.yaml").write_text("hosts: [h1]\nimage: i:1\n")
    (tmp_path / "ux").mkdir(exist_ok=True)
    (tmp_path / "ux" / "v2.yaml").write_text("hosts: [h1]\nimage: i:1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DOCKERLAUNCH_CONFIG", raising=False)
    if env:
        monkeypatch.setenv("DOCKERLAUNCH_CONFIG", env)
    return load_config(path, ov or Overrides(), log_dir=log_dir).invocation


def test_the_config_file_is_carried_absolute_however_it_was_named(tmp_path, monkeypatch):
    """Quoted: with the default ./dockerlaunch.yaml hints carried no --config (pasted elsewhere: `no hosts to run
    on`), and a relative --config came back as typed."""
    default = _load(tmp_path, monkeypatch)
    assert default.config == str(tmp_path / "dockerlaunch.yaml")
    assert f"--config {tmp_path / 'dockerlaunch.yaml'}" in default.command("doctor", hint="t.i")
    assert _load(tmp_path, monkeypatch, "ux/v2.yaml").config == str(tmp_path / "ux" / "v2.yaml")
    assert _load(tmp_path, monkeypatch, env="ux/v2.yaml").config == str(tmp_path / "ux" / "v2.yaml")
    (tmp_path / "dockerlaunch.yaml").unlink()
    monkeypatch.delenv("DOCKERLAUNCH_CONFIG")
    assert load_config(None, Overrides(hosts=["h1"])).invocation.config is None  # no file: none to name


def test_hints_to_commands_that_read_saved_runs_carry_an_absolute_log_dir(tmp_path, monkeypatch):
    inv = _load(tmp_path, monkeypatch)
    logs = str(tmp_path / "dockerlaunch-logs")
    for words in (("logs", "--follow"), ("status",), ("down",), ("ps",), ("exec", "--rank", "0")):
        assert shlex.split(inv.command(*words, hint="t.i"))[-2:] == ["--log-dir", logs], words
    assert "--log-dir" not in inv.command("doctor", hint="t.i")
    assert "--log-dir" not in inv.command("push", "i:1", hint="t.i")
    assert _load(tmp_path, monkeypatch, log_dir="runs/x").log_dir == str(tmp_path / "runs" / "x")


def test_a_doctor_pointer_repeats_every_plan_flag_it_takes_and_names_the_rest(tmp_path, monkeypatch):
    """Quoted: after `up --image myteam/train:v3` failed pre-flight, the doctor pointer dropped --image (pasted: it
    checked v1 and printed 23 PASS); the same with --master-port 22."""
    ov = Overrides(image="myteam/train:v3", master_port=22, nproc_per_node=2, mounts=["/d:/d:ro"],
                   env=["A=1", "HF_TOKEN=hf_secret", "B=2"], offline=True, push=True, max_restarts=2,
                   hang_timeout="30m", diagnostics=False, spares=["h9"], name="ux4")
    inv = _load(tmp_path, monkeypatch, ov=ov)
    words = shlex.split(inv.command("doctor", hint="t.i"))
    assert words[words.index("--image") + 1] == "myteam/train:v3"
    assert words[words.index("--master-port") + 1] == "22" and words[words.index("--nproc-per-node") + 1] == "2"
    assert words[words.index("--mount") + 1] == "/d:/d:ro" and "--offline" in words
    assert [words[i + 1] for i, w in enumerate(words) if w == "--env"] == ["A=1", "B=2"]
    assert "hf_secret" not in inv.command("doctor", hint="t.i") and "HF_TOKEN" not in inv.command("doctor", hint="t.i")
    for up_only in ("--push", "--max-restarts", "--hang-timeout", "--no-diagnostics", "--spares"):
        assert up_only not in words
    note = inv.left_out_note("doctor")
    assert note == ("leaves out --push, --no-diagnostics, --max-restarts, --spares, --hang-timeout (doctor does not "
                    "take them); --env HF_TOKEN (looks secret: add it yourself)")
    assert "hf_secret" not in note
    # commtest takes the shape flags but not --offline; commands that only find the job take none and name none
    assert "--offline" not in inv.command("commtest", hint="t.i") and "--offline" in inv.left_out_note("commtest")
    for words in (("logs", "--follow"), ("down",), ("push", "i:1"), ("transport",)):
        assert "--image" not in inv.command(*words, hint="t.i") and inv.left_out(*words) == []
    assert set(TAKES) == {"up", "doctor", "commtest", "render", "config show"}
