"""`render --drop FIELD`: a refused field is left out only when named, and said in each file's header (pure)."""

import json

import pytest

from dockerlaunch.backends import RenderedFile, Unsupported, renderers
from dockerlaunch.backends.refusals import DROPS, drop_fields, drop_named, refused, with_header
from dockerlaunch.errors import ConfigError
from dockerlaunch.job.config import ClusterConfig
from dockerlaunch.job.plan import make_plan

JOB = {"hosts": ["10.0.0.1", "10.0.0.2"], "image": "train:1", "ssh": {"config_file": None},
       "container": {"gpus": 8, "infiniband": "off", "ulimits": {"nofile": "16384"}, "extra_args": ["--foo"]},
       "job": {"name": "sft", "command": "python train.py", "max_restarts": 2, "hang_timeout": 600},
       "spares": ["10.0.0.3"]}


def config(**container) -> ClusterConfig:
    data = json.loads(json.dumps(JOB))
    data["container"].update(container)
    return ClusterConfig.model_validate(data)


def refusals(target: str, cfg: ClusterConfig) -> list[Unsupported]:
    to = renderers.get(target)
    try:
        to.render(make_plan(cfg), to.options({}))
    except Unsupported as e:
        return refused(e)
    return []


def test_every_droppable_refusal_names_its_way_out_and_the_rest_do_not():
    found = refusals("k8s", config(user="alice"))
    by_drop = {getattr(u, "drop", None): u for u in found}
    assert set(by_drop) == {d.field for d in DROPS} | {None}, found
    for d in DROPS:
        assert str(by_drop[d.field]).endswith(f"; or render without it: --drop {d.field}"), by_drop[d.field]
    assert "--drop" not in str(by_drop[None])  # a non-numeric user has no way out but the config


def test_dropping_every_refused_field_renders_with_one_warn_line_each():
    cfg = config()
    drops = [drop_named(n) for n in ("ulimits", "container.extra_args", "hang_timeout", "max_restarts", "spares")]
    cleared, warns = drop_fields(cfg, drops, refusals("k8s", cfg), "k8s")
    assert refusals("k8s", cleared) == []
    assert len(warns) == 5 and all(w.startswith("# WARN dropped ") for w in warns), warns
    assert '# WARN dropped container.ulimits ("nofile=16384") for k8s: ' in warns[0]
    to = renderers.get("k8s")
    text = with_header(to.render(make_plan(cleared), to.options({})), warns)[0].text
    assert text.splitlines()[:5] == warns and "ulimit" not in text.split("apiVersion", 1)[1].lower()


def test_a_field_the_target_expresses_is_not_dropped():
    cfg = config(extra_args=[])
    with pytest.raises(ConfigError, match=r"^render --to compose: --drop container.ulimits: nothing to drop"):
        drop_fields(cfg, [drop_named("ulimits")], refusals("compose", cfg), "compose")


def test_an_unknown_field_lists_what_can_be_dropped():
    with pytest.raises(ConfigError, match=r"^--drop hosts: not a field a render can drop; these can be: "
                                          r"container.ulimits, "):
        drop_named("hosts")


def test_warn_lines_go_after_a_shebang():
    files = [RenderedFile("a.sbatch", "#!/bin/bash\n#SBATCH -N 2\n", True), RenderedFile("b.yaml", "x: 1\n")]
    out = with_header(files, ["# WARN one"])
    assert out[0].text == "#!/bin/bash\n# WARN one\n#SBATCH -N 2\n" and out[0].executable
    assert out[1].text == "# WARN one\nx: 1\n"
    assert with_header(files, []) is files


@pytest.mark.parametrize("target", ["slurm", "k8s"])
def test_a_dropped_value_with_a_line_break_stays_inside_its_comment(target, tmp_path):
    """A line feed (or a control character) in a dropped value is escaped in the WARN comment: raw, it became a live
    line of the sbatch script (a `touch` ran) or of the YAML (issue 60, item 5)."""
    marker = tmp_path / "pwned"
    data = json.loads(json.dumps(JOB))
    data.update(spares=[], job={"name": "sft", "command": "python train.py"})
    data["container"].update(ulimits={}, extra_args=["\x1b]52;c;eA==\x07", "--foo\ntouch " + str(marker) + "\n#"])
    cfg = ClusterConfig.model_validate(data)
    cleared, warns = drop_fields(cfg, [drop_named("container.extra_args")], refusals(target, cfg), target)
    to = renderers.get(target)
    files = with_header(to.render(make_plan(cleared), to.options({})), warns)
    for f in files:
        lines = f.text.splitlines()
        assert not any(line.startswith("touch ") for line in lines), f.text[:500]
        [warn] = [line for line in lines if line.startswith("# WARN dropped container.extra_args")]
        assert "\x1b" not in f.text and "\\n" in warn and "\\u001b" in warn, warn
    sbatch = [f for f in files if f.name.endswith(".sbatch")]
    for f in sbatch:
        script = tmp_path / f.name
        script.write_text(f.text)
        import subprocess

        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
