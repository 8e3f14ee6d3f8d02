"""Issue 52 item 5 (and item 4's push/load pieces), run as the issue quotes them, through the CLI on the sim:
render's refusal gives its way out (--drop), push takes the image from where the config has it, a dry run says
where the layers are read and why (issue 58), and `dockerlaunch cache` fills, shows and prunes the layer cache."""

import json
import re

import pytest
import yaml

from tests.cli import paste
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
        "# WARN dropped container.ulimits (\"nofile=16384\") for k8s: the containers get the nodes' runtime limits")
    assert [line for line in lines if "WARN" in line] == [lines[1]], r.stdout
    assert lines[2].startswith("# dockerlaunch job ")  # the target's own header follows
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert [d["kind"] for d in docs] == ["Service", "Job"]

    out = tmp_path / "k8s"  # written files carry the same line; the terminal is told too
    r = dl("render", "--to", "jobset", "--config", cfg, "--drop", "ulimits", "--out", str(out), "--", "python", "x")
    assert r.returncode == 0, r.stderr
    assert "WARN dropped container.ulimits" in r.stderr
    (written,) = out.iterdir()
    first = written.read_text().splitlines()[0]
    assert first.startswith('# WARN dropped container.ulimits ("nofile=16384") for jobset'), first

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


@pytest.mark.hint("push.cache", "cache.prune")
def test_a_dry_run_says_where_the_layers_are_read_and_cache_fills_shows_and_prunes_it(sim_cluster, fresh_image,
                                                                                       tmp_path, monkeypatch):
    """The first `push --dry-run` took 11 s and said nothing (it filled the layer cache); nothing showed the cache's
    size or pruned it. Since issue 58 a cold cache is not filled by a plan: the dry run says the push reads by
    docker save and fills the cache after it, and `cache fill` fills it now, with a bar of its own."""
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
    assert re.search(r"^Layers: read by docker save: the layer cache lacks \d+ MB of the image's \d+ MB \((\d+) of its "
                     r"\1 layers\): filling it first .* would cost more than the 3 docker save read\(s\) of the whole "
                     r"image \(its layer map, 2 star stream\(s\)\) this push makes", r.stdout, re.M), r.stdout
    assert "This run: docker save read the whole image for its layer map in " in r.stdout, r.stdout
    assert "After the push, the layer cache is filled with the image in the background" in r.stdout, r.stdout
    shows = re.search(r"layers; `(dockerlaunch [^`]+)` shows it\.", r.stdout)
    assert shows, r.stdout
    shown = paste(shows.group(1), tmp_path)  # the pointer, run as printed
    assert shown.returncode == 0 and f"Layer cache: {where}" in shown.stdout, shown.stdout + shown.stderr
    r = dl("push", ref, "--config", cfg, "--dry-run", "--output", "json")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # json: no notes, no bars
    plan = json.loads(r.stdout)
    route, source = plan["layer_route"], plan["layer_source"]
    assert (route["route"], route["holds"], route["fill_later"], source["via"]) == ("save", 0, True, "save"), plan
    assert route["lacks"] > 4e6 and route["save_reads"] == 2, route  # the layer map was kept: 2 star streams
    assert json.loads(dl("cache", "--output", "json").stdout)["bytes"] == 0  # a plan fills nothing

    r = dl("cache", "fill", ref)
    m = re.fullmatch(rf"Layer cache: filled with (\d+) MB of {re.escape(ref)} in [\d.]+ s \({re.escape(where)}\); a "
                     r"push of its lineage reads only the layers it lacks\.", r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and m and int(m.group(1)) > 4, r.stdout + r.stderr

    r = dl("push", ref, "--config", cfg, "--dry-run", "--output", "json")
    plan = json.loads(r.stdout)
    route, source = plan["layer_route"], plan["layer_source"]
    assert (route["route"], route["lacks"], route["fill_later"]) == ("cache", 0, False), route
    assert route["reason"].startswith("the layer cache holds all ") and route["holds"] > 4e6, route
    assert (source["via"], source["added"], source["where"]) == ("cache", 0, where), source

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
    prune = re.search(r"^Prune: (dockerlaunch .+?) \(--older-than", dl("cache").stdout, re.M)
    assert prune, "no prune command under the table"
    r = paste(prune.group(1), tmp_path)  # as printed under the table
    assert r.returncode == 0 and r.stdout.startswith(f"removed {facts['blobs']} blob(s) (all)"), r.stdout
    assert json.loads(dl("cache", "--output", "json").stdout)["bytes"] == 0
