"""Issue 52 item 5 (and item 4's push/load pieces), run as the issue quotes them, through the CLI on the sim:
render's refusal gives its way out (--drop), push takes the image from where the config has it, a dry run says
when it fills the layer cache, and `dockerlaunch cache` shows and prunes that cache."""

import pytest
import yaml

from tests.integration.helpers import dl

pytestmark = pytest.mark.integration


def test_render_k8s_of_the_sims_own_config_refuses_ulimits_and_names_drop_which_renders_them_out(sim_cluster,
                                                                                                 tmp_path):
    cfg = str(sim_cluster[1])
    assert yaml.safe_load(open(cfg))["container"]["ulimits"], "the sim's config sets ulimits: the quoted case"
    r = dl("render", "--to", "k8s", "--config", cfg, "--", "python", "train.py")
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.strip().endswith("; or render without it: --drop container.ulimits"), r.stderr
    assert "pods have no ulimits" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

    r = dl("render", "--to", "k8s", "--config", cfg, "--drop", "container.ulimits", "--", "python", "train.py")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# ---- ") and lines[1] == (
        "# WARN dropped container.ulimits (nofile=16384) for k8s: the containers get the nodes' runtime limits")
    assert [line for line in lines if "WARN" in line] == [lines[1]], r.stdout
    assert lines[2].startswith("# dockerlaunch job ")  # the target's own header follows
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert [d["kind"] for d in docs] == ["Service", "Job"]

    out = tmp_path / "k8s"  # written files carry the same line; the terminal is told too
    r = dl("render", "--to", "jobset", "--config", cfg, "--drop", "ulimits", "--out", str(out), "--", "python", "x")
    assert r.returncode == 0, r.stderr
    assert "WARN dropped container.ulimits" in r.stderr
    (written,) = out.iterdir()
    assert written.read_text().splitlines()[0].startswith("# WARN dropped container.ulimits (nofile=16384) for jobset")

    # a field the target expresses is never dropped: compose sets ulimits itself
    r = dl("render", "--to", "compose", "--config", cfg, "--drop", "container.ulimits", "--", "python", "x")
    assert r.returncode == 2 and "--drop container.ulimits: nothing to drop" in r.stderr, r.stderr
