"""Issue 52: `push --help` lists --image and push takes it; `load --help` says where a bundle goes (it said
`(default: locally)` and then loaded onto the config's hosts); `cache --help` says where the layer cache is."""

import subprocess

from tests import cli


def dl(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return cli.dl(*args, timeout=60, cwd=cwd)


def squeeze(text: str) -> str:
    return " ".join(text.split())


def test_load_help_says_local_without_config_or_hosts_and_the_config_hosts_with_it():
    r = dl("load", "--help")
    assert r.returncode == 0, r.stderr
    out = squeeze(r.stdout)
    assert "(default: locally)" not in out
    assert "into this machine's engine, or with --config/--hosts onto those hosts over SSH" in out, out
    assert "Without --config and --hosts it goes into the local engine only" in out, out
    assert "--config PATH Load onto this config's hosts" in out, out


def test_push_help_gives_three_places_for_the_image_and_the_image_is_optional():
    r = dl("push", "--help")
    assert r.returncode == 0, r.stderr
    out = squeeze(r.stdout)
    assert out.startswith("Usage: dockerlaunch push [OPTIONS] [IMAGE]"), out
    assert "The image: IMAGE, else --image, else the config's `image:`." in out, out
    assert "--image IMAGE" in out


def test_push_with_two_different_images_or_none_is_one_line(tmp_path):
    r = dl("push", "a:1", "--image", "b:1", "--hosts", "h1", cwd=tmp_path)
    assert r.returncode == 2 and "Error: two images: a:1 and --image b:1; give one" in r.stderr, r.stderr
    r = dl("push", "--hosts", "h1", cwd=tmp_path)  # no ./dockerlaunch.yaml here
    assert r.returncode == 2 and "which image? give IMAGE or --image IMAGE, or set image: in the config" in r.stderr


def test_cache_help_says_where_the_registry_runs_and_how_big_it_grows():
    out = squeeze(dl("cache", "--help").stdout)
    for words in ("~/.cache/dockerlaunch/registry", "127.0.0.1", "only while it runs", "30 GB",
                  "DOCKERLAUNCH_LAYER_CACHE_GB", "prune"):
        assert words in out, (words, out)
    out = squeeze(dl("cache", "prune", "--help").stdout)
    assert "--older-than AGE" in out and "Refused while a push fills the cache; one streaming from it keeps" in out, out
