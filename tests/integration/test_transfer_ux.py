"""Issue 52 item 5 (and item 4's push/load pieces), run as the issue quotes them, through the CLI on the sim:
render's refusal gives its way out (--drop), push takes the image from where the config has it, a dry run says
when it fills the layer cache, and `dockerlaunch cache` shows and prunes that cache."""

import json
import re

import pytest
import yaml

from tests.integration.helpers import dl, ids_on_nodes, variant

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


def test_push_takes_the_image_from_image_flag_or_the_configs_image(sim_cluster, engine, remotes, fresh_image,
                                                                   tmp_path):
    """`push --help` lists --image but `push --image X` said `missing argument IMAGE`."""
    a, b = fresh_image(mb=1, scratch=True), fresh_image(mb=1, scratch=True)
    try:
        r = dl("push", "--image", a, "--config", str(sim_cluster[1]))
        assert r.returncode == 0, r.stdout + r.stderr
        assert ids_on_nodes(remotes, a) == [engine.images.get(a).id] * 2
        r = dl("push", "--config", variant(sim_cluster, tmp_path, image=b))  # the config's image:
        assert r.returncode == 0, r.stdout + r.stderr
        assert ids_on_nodes(remotes, b) == [engine.images.get(b).id] * 2
        assert ids_on_nodes(remotes, a) == [engine.images.get(a).id] * 2  # and not the flag's of before
    finally:
        for rm in remotes:
            rm.run(["docker", "rmi", "-f", a, b])


def test_a_dry_run_says_it_fills_the_layer_cache_and_cache_shows_and_prunes_it(sim_cluster, fresh_image, tmp_path,
                                                                               monkeypatch):
    """The first `push --dry-run` took 11 s and said nothing (it fills the layer cache); nothing showed the cache's
    size or pruned it."""
    monkeypatch.setenv("DOCKERLAUNCH_CACHE_DIR", str(tmp_path / "cache"))  # a cache of this test's own
    monkeypatch.delenv("DOCKERLAUNCH_LAYER_CACHE_GB", raising=False)  # with the default cap a user has
    ref = fresh_image(mb=4)  # on the tools image, which the nodes have: a thin plan, which reads the new layers
    cfg = str(sim_cluster[1])
    where = str(tmp_path / "cache" / "registry")

    r = dl("cache")
    assert r.returncode == 0 and f"Layer cache: {where}" in r.stdout and "empty" in r.stdout, r.stdout + r.stderr
    assert "127.0.0.1" in r.stdout, r.stdout

    r = dl("push", ref, "--config", cfg, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.splitlines()[-1]
    m = re.fullmatch(r"Layer cache: this run filled it with (\d+) MB of the image's layers in ([\d.]+) s \(the "
                     r"engine read and gzipped them into the launcher's registry, on 127\.0\.0\.1 only while a push "
                     r"runs, stored in (.*)\); the push after it reads them from there\. `dockerlaunch cache` shows "
                     r"or prunes it\.", last)
    assert m and m.group(3) == where and int(m.group(1)) > 4, r.stdout
    if float(m.group(2)) > 1.5:  # a slow fill says what it does while it runs
        assert "into the launcher's layer cache" in r.stderr and "reads and gzips all of it, once" in r.stderr

    r = dl("push", ref, "--config", cfg, "--dry-run", "--output", "json")
    assert r.returncode == 0, r.stderr
    source = json.loads(r.stdout)["layer_source"]
    assert (source["via"], source["added"], source["where"]) == ("cache", 0, where), source
    assert r.stderr == ""  # json: no notes

    r = dl("cache", "--output", "json")
    facts = json.loads(r.stdout)
    assert facts["path"] == where and facts["bytes"] > 4e6 and facts["registry"].startswith("127.0.0.1")
    (entry,) = facts["images"]
    assert ref in entry["names"] and entry["cached"] == entry["layers"] > 1, entry
    r = dl("cache")
    assert re.search(rf"^  \d+ MB in {facts['blobs']} blob\(s\), cap 30\.0 GB", r.stdout, re.M), r.stdout
    assert ref in r.stdout

    r = dl("cache", "prune", "--older-than", "1d")  # everything was used just now
    assert r.returncode == 0 and r.stdout.startswith("removed 0 blob(s) (unused for 1d)"), r.stdout + r.stderr
    r = dl("cache", "prune")
    assert r.returncode == 0 and r.stdout.startswith(f"removed {facts['blobs']} blob(s) (all)"), r.stdout
    assert json.loads(dl("cache", "--output", "json").stdout)["bytes"] == 0
