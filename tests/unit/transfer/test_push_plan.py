"""The push planner (transfer/push_plan.py) and inspect.sh's parser (push.parse_host_view), on hand-built inputs.

No SSH, no Docker, no mocks: `plan_push` is pure, so every decision is checked on `HostView`s built here.
"""

import hashlib
import json
from dataclasses import replace

import pytest

from dockerlaunch.transfer.image_facts import CONTAINERD, GRAPHDRIVER, LayerSource, LocalImage
from dockerlaunch.transfer.oci import Blob, SaveFacts, chain_ids
from dockerlaunch.transfer.push import parse_host_view
from dockerlaunch.transfer.push_plan import (
    FILL_COST,
    SOURCE_ENV,
    Action,
    CacheState,
    HostResult,
    HostTransfer,
    HostView,
    PushPlan,
    PushState,
    Route,
    Strategy,
    choose_route,
    choose_strategy,
    needs_layer_map,
    plan_push,
    size_text,
    star_fallback,
)


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


DIFFS = tuple(sha(f"diff-{i}") for i in range(4))
CHAINS = chain_ids(list(DIFFS))
IMAGE = LocalImage(ref="registry.local/app:1.2", id=sha("config-app-1.2"), size=12_345, diff_ids=DIFFS)
OLD_ID = sha("config-app-1.1")
# the save's layer map, RootFS order; the files sum to 10_000, not IMAGE.size, so "everything" is told apart
LAYERS = [("aaa/layer.tar", 1000), ("bbb/layer.tar", 2000), ("ccc/layer.tar", 3000), ("ddd/layer.tar", 4000)]
RELAY_REASON = "cannot relay (needs OpenBSD nc -N and mkfifo)"


def view(host: str, **kw) -> HostView:
    """A host that needs the image (its tag points at an older ID), can relay and has zstd, unless told."""
    defaults = dict(address=f"10.0.0.{host[-1]}", tag_id=OLD_ID, zstd=True, relay=True)
    return HostView(host, **{**defaults, **kw})


def by_host(plan: PushPlan) -> dict[str, HostTransfer]:
    return {h.host: h for h in plan.hosts}


def test_the_fixture_chain_ids_are_not_the_diff_ids():
    assert CHAINS[0] == DIFFS[0]
    assert all(c != d for c, d in zip(CHAINS[1:], DIFFS[1:]))
    assert len(set(CHAINS)) == 4


# ---------------------------------------------------------------- per-host decisions


def test_skip_when_the_tag_already_points_at_the_image_id():
    plan = plan_push(IMAGE, [view("h1", tag_id=IMAGE.id, has_id=True)], layers=LAYERS)
    [t] = plan.hosts
    assert t.action == Action.SKIP
    assert t.reason == f"already has {IMAGE.id[7:19]}"
    assert (t.strategy, t.compression, t.link, t.bytes_to_send, t.layers, t.skip_files) == (None, None, None, 0, 0, [])
    assert plan.sending() == []
    assert plan.launcher_bytes == 0


@pytest.mark.parametrize("tag_id", [OLD_ID, ""], ids=["stale-tag", "no-tag"])
def test_tag_only_when_the_id_is_there_under_another_name(tag_id):
    plan = plan_push(IMAGE, [view("h1", tag_id=tag_id, has_id=True)], layers=LAYERS)
    [t] = plan.hosts
    assert t.action == Action.TAG
    assert t.reason == f"had {IMAGE.id[7:19]} untagged; tagged registry.local/app:1.2"
    assert (t.strategy, t.bytes_to_send) == (None, 0)
    assert plan.launcher_bytes == 0


def test_fail_when_the_host_could_not_be_inspected_even_if_its_tag_matches():
    views = [view("h1", error="ssh: connect to host h1 port 22: Connection refused"),
             view("h2", tag_id=IMAGE.id, has_id=True, error="docker is not usable: permission denied")]
    plan = plan_push(IMAGE, views, layers=LAYERS)
    assert [(t.action, t.reason) for t in plan.hosts] == [
        (Action.FAIL, "ssh: connect to host h1 port 22: Connection refused"),
        (Action.FAIL, "docker is not usable: permission denied"),
    ]
    assert all(t.strategy is None and t.bytes_to_send == 0 for t in plan.hosts)


def test_compress_zstd_fails_a_sender_without_zstd_but_not_a_host_that_skips_or_tags():
    views = [view("h1", zstd=False), view("h2"), view("h3", zstd=False, tag_id=IMAGE.id, has_id=True),
             view("h4", zstd=False, has_id=True)]
    t = by_host(plan_push(IMAGE, views, compress="zstd"))
    assert t["h1"].action == Action.FAIL
    assert t["h1"].reason == "--compress zstd but zstd is not installed there"
    assert (t["h2"].action, t["h2"].strategy, t["h2"].compression) == (Action.SEND, Strategy.STAR, "zstd")
    assert t["h3"].action == Action.SKIP
    assert t["h4"].action == Action.TAG


@pytest.mark.parametrize("tag_id", [OLD_ID, ""], ids=["stale-tag", "no-tag"])
def test_send_when_the_id_is_absent(tag_id):
    plan = plan_push(IMAGE, [view("h1", tag_id=tag_id, has_id=False)])
    [t] = plan.hosts
    assert (t.action, t.strategy, t.compression, t.layers) == (Action.SEND, Strategy.STAR, "zstd", 4)
    assert t.bytes_to_send == IMAGE.size
    assert plan.sending() == [t]


def test_hosts_keep_the_order_they_were_given_in():
    views = [view("h5"), view("h1", error="x"), view("h3", tag_id=IMAGE.id), view("h2", has_id=True)]
    plan = plan_push(IMAGE, views)
    assert [(t.host, t.action) for t in plan.hosts] == [
        ("h5", Action.SEND), ("h1", Action.FAIL), ("h3", Action.SKIP), ("h2", Action.TAG)]


# ---------------------------------------------------------------- strategy


@pytest.mark.parametrize("n", [1, 2])
def test_auto_is_star_for_one_or_two_senders(n):
    plan = plan_push(IMAGE, [view(f"h{i}") for i in range(1, n + 1)])
    assert plan.strategy == Strategy.STAR
    assert [(t.action, t.strategy, t.link) for t in plan.hosts] == [(Action.SEND, Strategy.STAR, None)] * n
    assert {t.reason for t in plan.hosts} == {f"star ({n} host(s) need the image (chain from 3))"}


@pytest.mark.parametrize("n", [3, 5])
def test_auto_is_chain_for_three_or_more_senders_that_all_relay(n):
    plan = plan_push(IMAGE, [view(f"h{i}") for i in range(1, n + 1)])
    assert plan.strategy == Strategy.CHAIN
    assert [(t.strategy, t.link) for t in plan.hosts] == [(Strategy.CHAIN, i) for i in range(n)]
    assert plan.hosts[0].reason == f"chain ({n} hosts need the image)"


def test_auto_is_star_naming_the_hosts_that_cannot_relay():
    plan = plan_push(IMAGE, [view("h1"), view("h2", relay=False), view("h3")])
    assert plan.strategy == Strategy.STAR
    assert {t.strategy for t in plan.hosts} == {Strategy.STAR}
    assert {t.reason for t in plan.hosts} == {f"star (h2 {RELAY_REASON})"}

    plan = plan_push(IMAGE, [view("h1", relay=False), view("h2"), view("h3", relay=False), view("h4")])
    assert plan.strategy == Strategy.STAR
    assert plan.hosts[0].reason == f"star (h1, h3 {RELAY_REASON})"


def test_hosts_that_skip_tag_or_fail_do_not_count_toward_a_chain():
    views = [view("h1"), view("h2", tag_id=IMAGE.id, has_id=True), view("h3", has_id=True),
             view("h4", error="timed out"), view("h5", zstd=False), view("h6")]
    plan = plan_push(IMAGE, views, compress="zstd")
    assert plan.strategy == Strategy.STAR
    assert [t.host for t in plan.sending()] == ["h1", "h6"]
    assert plan.hosts[0].reason == "star (2 host(s) need the image (chain from 3))"


def test_a_host_that_cannot_relay_but_does_not_need_the_image_does_not_stop_a_chain():
    views = [view("h1"), view("h2", relay=False, tag_id=IMAGE.id), view("h3", relay=False, has_id=True),
             view("h4", relay=False, error="unreachable"), view("h5"), view("h6")]
    plan = plan_push(IMAGE, views)
    assert plan.strategy == Strategy.CHAIN
    assert [(t.host, t.link) for t in plan.sending(Strategy.CHAIN)] == [("h1", 0), ("h5", 1), ("h6", 2)]


def test_explicit_star_is_honoured_for_many_relaying_hosts():
    plan = plan_push(IMAGE, [view(f"h{i}") for i in range(1, 5)], strategy="star")
    assert plan.strategy == Strategy.STAR
    assert [(t.strategy, t.link, t.next_host) for t in plan.hosts] == [(Strategy.STAR, None, None)] * 4
    assert {t.reason for t in plan.hosts} == {"star (asked for)"}


def test_explicit_chain_is_honoured_for_two_hosts_even_one_that_cannot_relay():
    plan = plan_push(IMAGE, [view("h1"), view("h2", relay=False)], strategy="chain")
    assert plan.strategy == Strategy.CHAIN
    assert [(t.host, t.strategy, t.link, t.next_host) for t in plan.hosts] == [
        ("h1", Strategy.CHAIN, 0, "h2"), ("h2", Strategy.CHAIN, 1, None)]
    assert plan.hosts[0].reason == "chain (asked for)"


def test_explicit_chain_with_nobody_to_send_to_plans_no_link():
    plan = plan_push(IMAGE, [view("h1", tag_id=IMAGE.id)], strategy="chain")
    assert plan.strategy == Strategy.CHAIN
    assert plan.sending() == []
    assert plan.launcher_bytes == 0


def test_choose_strategy_directly():
    three = [view("h1"), view("h2"), view("h3")]
    assert choose_strategy("star", three) == (Strategy.STAR, "asked for")
    assert choose_strategy("chain", three[:1]) == (Strategy.CHAIN, "asked for")
    assert choose_strategy("auto", []) == (Strategy.STAR, "0 host(s) need the image (chain from 3)")
    assert choose_strategy("auto", three[:2]) == (Strategy.STAR, "2 host(s) need the image (chain from 3)")
    assert choose_strategy("auto", three) == (Strategy.CHAIN, "3 hosts need the image")
    assert choose_strategy("auto", [*three[:2], view("h3", relay=False)]) == (Strategy.STAR, f"h3 {RELAY_REASON}")


# ---------------------------------------------------------------- chain links


def test_chain_links_order_index_next_host_and_address():
    views = [view("h1", address="10.1.0.1"), view("h2", tag_id=IMAGE.id), view("h3", address="h3.lan"),
             view("h4", address="10.1.0.4"), view("h5", address="10.1.0.5")]
    plan = plan_push(IMAGE, views)
    assert plan.strategy == Strategy.CHAIN
    links = plan.sending(Strategy.CHAIN)
    assert [(t.host, t.link, t.next_host, t.address) for t in links] == [
        ("h1", 0, "h3", "10.1.0.1"), ("h3", 1, "h4", "h3.lan"), ("h4", 2, "h5", "10.1.0.4"),
        ("h5", 3, None, "10.1.0.5")]
    assert [t.reason for t in links] == ["chain (4 hosts need the image)", "chain, relayed from h1",
                                        "chain, relayed from h3", "chain, relayed from h4"]
    skipped = by_host(plan)["h2"]
    assert (skipped.action, skipped.link, skipped.strategy, skipped.address) == (Action.SKIP, None, None, "")


def test_chain_is_zstd_under_auto_only_when_every_link_has_it():
    all_zstd = plan_push(IMAGE, [view("h1"), view("h2"), view("h3")])
    assert [t.compression for t in all_zstd.hosts] == ["zstd"] * 3
    one_without = plan_push(IMAGE, [view("h1"), view("h2", zstd=False), view("h3")])
    assert one_without.strategy == Strategy.CHAIN
    assert [t.compression for t in one_without.hosts] == ["none"] * 3


def test_chain_compress_none_and_compress_zstd():
    none = plan_push(IMAGE, [view("h1"), view("h2"), view("h3")], compress="none")
    assert [t.compression for t in none.hosts] == ["none"] * 3
    views = [view("h1"), view("h2"), view("h3", zstd=False), view("h4")]
    zstd = plan_push(IMAGE, views, compress="zstd")
    assert zstd.strategy == Strategy.CHAIN
    assert [(t.host, t.action, t.compression, t.link) for t in zstd.hosts] == [
        ("h1", Action.SEND, "zstd", 0), ("h2", Action.SEND, "zstd", 1), ("h3", Action.FAIL, None, None),
        ("h4", Action.SEND, "zstd", 2)]


def test_chain_thin_leaves_out_only_the_layers_every_link_has():
    other = chain_ids([DIFFS[0], DIFFS[1], sha("other-2")])
    views = [view("h1", chain_ids=frozenset(CHAINS[:3])),
             view("h2", chain_ids=frozenset(CHAINS[:2]) | frozenset(other)),
             view("h3", chain_ids=frozenset(CHAINS))]
    plan = plan_push(IMAGE, views, layers=LAYERS)
    assert plan.strategy == Strategy.CHAIN
    for t in plan.hosts:
        assert (t.layers, t.layers_skipped) == (4, 2)
        assert t.skip_files == ["aaa/layer.tar", "bbb/layer.tar"]
        assert t.bytes_to_send == 3000 + 4000
    assert plan.launcher_bytes == 7000  # the head only: the others get their copy from a peer


@pytest.mark.parametrize("empty", [frozenset(), frozenset({sha("unrelated")}), None],
                         ids=["empty", "unrelated", "not-asked"])
def test_chain_leaves_nothing_out_when_one_link_has_none_of_the_layers_or_was_not_asked(empty):
    views = [view("h1", chain_ids=frozenset(CHAINS)), view("h2", chain_ids=empty),
             view("h3", chain_ids=frozenset(CHAINS[:2]))]
    plan = plan_push(IMAGE, views, layers=LAYERS)
    assert plan.strategy == Strategy.CHAIN
    assert [(t.layers_skipped, t.skip_files, t.bytes_to_send) for t in plan.hosts] == [(0, [], IMAGE.size)] * 3


def test_chain_full_sends_everything():
    views = [view(f"h{i}", chain_ids=frozenset(CHAINS)) for i in range(1, 4)]
    plan = plan_push(IMAGE, views, thin=False, layers=LAYERS)
    assert plan.strategy == Strategy.CHAIN
    assert [(t.layers, t.layers_skipped, t.skip_files, t.bytes_to_send) for t in plan.hosts] == [
        (4, 0, [], IMAGE.size)] * 3
    assert plan.launcher_bytes == IMAGE.size


def test_launcher_bytes_counts_star_streams_and_the_chain_head_only():
    hosts = [
        HostTransfer("s1", Action.SEND, strategy=Strategy.STAR, bytes_to_send=100),
        HostTransfer("s2", Action.SEND, strategy=Strategy.STAR, bytes_to_send=20),
        HostTransfer("c0", Action.SEND, strategy=Strategy.CHAIN, link=0, bytes_to_send=3000),
        HostTransfer("c1", Action.SEND, strategy=Strategy.CHAIN, link=1, bytes_to_send=3000),
        HostTransfer("c2", Action.SEND, strategy=Strategy.CHAIN, link=2, bytes_to_send=3000),
        HostTransfer("k", Action.SKIP, bytes_to_send=50_000),
        HostTransfer("f", Action.FAIL, strategy=Strategy.STAR, bytes_to_send=70_000),
    ]
    plan = PushPlan(IMAGE, Strategy.CHAIN, hosts)
    assert plan.launcher_bytes == 3120
    assert [t.host for t in plan.sending(Strategy.STAR)] == ["s1", "s2"]
    assert [t.host for t in plan.sending(Strategy.CHAIN)] == ["c0", "c1", "c2"]


def test_launcher_bytes_of_a_star_plan_is_every_stream():
    views = [view("h1", chain_ids=frozenset(CHAINS[:1])), view("h2", relay=False), view("h3")]
    plan = plan_push(IMAGE, views, layers=LAYERS)
    assert plan.strategy == Strategy.STAR
    assert [t.bytes_to_send for t in plan.hosts] == [9000, IMAGE.size, IMAGE.size]
    assert plan.launcher_bytes == 9000 + 2 * IMAGE.size


# ---------------------------------------------------------------- star


def test_star_thin_is_per_host():
    views = [view("h1", chain_ids=frozenset(CHAINS[:1])), view("h2", chain_ids=frozenset(CHAINS[:3])),
             view("h3", chain_ids=frozenset()), view("h4", chain_ids=frozenset(CHAINS))]
    plan = plan_push(IMAGE, views, strategy="star", layers=LAYERS)
    t = by_host(plan)
    assert (t["h1"].skip_files, t["h1"].layers_skipped, t["h1"].bytes_to_send) == (["aaa/layer.tar"], 1, 9000)
    assert (t["h2"].skip_files, t["h2"].layers_skipped, t["h2"].bytes_to_send) == (
        ["aaa/layer.tar", "bbb/layer.tar", "ccc/layer.tar"], 3, 4000)
    assert (t["h3"].skip_files, t["h3"].layers_skipped, t["h3"].bytes_to_send) == ([], 0, IMAGE.size)
    assert (t["h4"].skip_files, t["h4"].layers_skipped, t["h4"].bytes_to_send) == (
        ["aaa/layer.tar", "bbb/layer.tar", "ccc/layer.tar", "ddd/layer.tar"], 4, 0)
    assert {x.layers for x in plan.hosts} == {4}
    assert plan.launcher_bytes == 9000 + 4000 + IMAGE.size + 0


def test_thin_matches_chain_ids_not_diff_ids():
    # h1 has layer 2's diff ID, but on another base: not the same chain, so it cannot be left out
    other = chain_ids([sha("another-base"), DIFFS[1], DIFFS[2]])
    plan = plan_push(IMAGE, [view("h1", chain_ids=frozenset(other) | {DIFFS[1], DIFFS[2]})], layers=LAYERS)
    [t] = plan.hosts
    assert (t.skip_files, t.layers_skipped, t.bytes_to_send) == ([], 0, IMAGE.size)
    # same base only: the base layer is left out, the rest is sent
    plan = plan_push(IMAGE, [view("h1", chain_ids=frozenset(chain_ids([DIFFS[0], sha("x")])))], layers=LAYERS)
    [t] = plan.hosts
    assert (t.skip_files, t.bytes_to_send) == (["aaa/layer.tar"], 9000)


def test_star_compression_is_per_host():
    views = [view("h1"), view("h2", zstd=False)]
    assert [t.compression for t in plan_push(IMAGE, views).hosts] == ["zstd", "none"]
    assert [t.compression for t in plan_push(IMAGE, views, compress="none").hosts] == ["none", "none"]


def test_full_sends_everything_and_leaves_nothing_out():
    views = [view("h1", chain_ids=frozenset(CHAINS[:3])), view("h2", chain_ids=frozenset(CHAINS))]
    plan = plan_push(IMAGE, views, thin=False, layers=LAYERS)
    assert [(t.action, t.layers, t.layers_skipped, t.skip_files, t.bytes_to_send) for t in plan.hosts] == [
        (Action.SEND, 4, 0, [], IMAGE.size)] * 2
    assert plan.launcher_bytes == 2 * IMAGE.size


def test_without_a_layer_map_nothing_is_left_out():
    plan = plan_push(IMAGE, [view("h1", chain_ids=frozenset(CHAINS[:3]))], layers=None)
    [t] = plan.hosts
    assert (t.layers, t.layers_skipped, t.skip_files, t.bytes_to_send) == (4, 0, [], IMAGE.size)


def test_a_layer_file_shared_by_two_layers_is_not_left_out_while_a_layer_still_needs_it():
    # Two layers with the same diff ID (e.g. `COPY x /x` twice) share one blob in the save
    # (OCI layout: blobs/sha256/<diff>; the legacy layout makes the second a symlink to the first).
    # A host with the first layer's chain but not the second's still needs that blob to load the image.
    diffs = (sha("base"), sha("copy-x"), sha("run"), sha("copy-x"))
    image = LocalImage("app:dup", sha("config-dup"), 9_999, diffs)
    chains = chain_ids(list(diffs))
    layers = [(f"blobs/sha256/{d[7:]}", n) for d, n in zip(diffs, (1000, 200, 3000, 200))]
    plan = plan_push(image, [view("h1", chain_ids=frozenset(chains[:2]))], layers=layers)
    [t] = plan.hosts
    assert f"blobs/sha256/{diffs[1][7:]}" not in t.skip_files
    assert t.skip_files == [f"blobs/sha256/{diffs[0][7:]}"]
    assert t.bytes_to_send == 3000 + 200


# ---------------------------------------------------------------- needs_layer_map


def test_needs_layer_map_only_when_some_host_has_one_of_the_image_chain_ids():
    assert needs_layer_map(IMAGE, [view("h1", chain_ids=frozenset({CHAINS[2]}))]) is True
    assert needs_layer_map(IMAGE, [view("h1"), view("h2", chain_ids=frozenset({CHAINS[0], sha("z")}))]) is True
    assert needs_layer_map(IMAGE, []) is False
    assert needs_layer_map(IMAGE, [view("h1"), view("h2", chain_ids=frozenset())]) is False
    assert needs_layer_map(IMAGE, [view("h1", chain_ids=frozenset({sha("unrelated"), DIFFS[1], DIFFS[3]}))]) is False
    assert needs_layer_map(IMAGE, [view("h1", error="down")]) is False
    assert needs_layer_map(LocalImage("x:1", sha("x"), 10), [view("h1", chain_ids=frozenset(CHAINS))]) is False
    # hosts that skip or only tag receive nothing: their layers do not make the layer map worth a full read
    up_to_date = view("h1", tag_id=IMAGE.id, has_id=True, chain_ids=frozenset(CHAINS))
    untagged = view("h2", has_id=True, chain_ids=frozenset(CHAINS))
    assert needs_layer_map(IMAGE, [up_to_date, untagged, view("h3")]) is False


# ---------------------------------------------------------------- star fallback


def test_star_fallback_plans_only_the_named_hosts_as_star():
    views = [view("h1", chain_ids=frozenset(CHAINS[:1])), view("h2", chain_ids=frozenset(CHAINS[:3])),
             view("h3", chain_ids=frozenset(CHAINS[:2]), zstd=False), view("h4", chain_ids=frozenset(CHAINS[:1]))]
    chain = plan_push(IMAGE, views, layers=LAYERS)
    assert chain.strategy == Strategy.CHAIN
    assert {t.bytes_to_send for t in chain.hosts} == {9000}
    assert {t.compression for t in chain.hosts} == {"none"}

    star = star_fallback(chain, views, ["h2", "h3"], "auto", True, LAYERS)
    assert star.strategy == Strategy.STAR
    assert [(t.host, t.action, t.strategy, t.link, t.compression, t.bytes_to_send) for t in star.hosts] == [
        ("h2", Action.SEND, Strategy.STAR, None, "zstd", 4000),
        ("h3", Action.SEND, Strategy.STAR, None, "none", 7000)]
    assert star.hosts[1].skip_files == ["aaa/layer.tar", "bbb/layer.tar"]
    assert {t.reason for t in star.hosts} == {"star (asked for)"}
    assert star.launcher_bytes == 11_000


def test_star_fallback_honours_full_and_compress():
    views = [view(f"h{i}", chain_ids=frozenset(CHAINS)) for i in range(1, 5)]
    chain = plan_push(IMAGE, views, thin=False, compress="none", layers=None)
    star = star_fallback(chain, views, ["h4", "h1", "h2"], "none", False, LAYERS)
    assert [(t.host, t.compression, t.bytes_to_send, t.skip_files) for t in star.hosts] == [
        ("h1", "none", IMAGE.size, []), ("h2", "none", IMAGE.size, []), ("h4", "none", IMAGE.size, [])]
    assert star.strategy == Strategy.STAR


# ---------------------------------------------------------------- JSON


def test_push_plan_to_dict_and_to_json():
    views = [view("h1", chain_ids=frozenset(CHAINS[:2])), view("h2", chain_ids=frozenset(CHAINS)),
             view("h3", chain_ids=frozenset(CHAINS[:3])), view("h4", tag_id=IMAGE.id)]
    plan = plan_push(IMAGE, views, layers=LAYERS)
    d = plan.to_dict()
    assert list(d) == ["image", "image_id", "image_bytes", "strategy", "launcher_bytes", "hosts",
                       "layer_source", "layer_route"]
    assert d["layer_source"] is None  # a plan that read no layers (a thin one says how: via cache or save)
    assert d["layer_route"] is None  # nor decided where to read them (choose_route; its JSON is tested below)
    assert (d["image"], d["image_id"], d["image_bytes"], d["launcher_bytes"]) == (
        "registry.local/app:1.2", IMAGE.id, 12_345, 7000)
    assert type(d["strategy"]) is str and d["strategy"] == "chain"
    head = d["hosts"][0]
    assert "skip_files" not in head
    assert head == {
        "host": "h1", "action": "send", "address": "10.0.0.1", "strategy": "chain", "compression": "zstd",
        "link": 0, "next_host": "h2", "layers": 4, "layers_skipped": 2, "bytes_to_send": 7000,
        "expect_id": IMAGE.id, "reason": "chain (3 hosts need the image)"}
    assert all(type(h["action"]) is str for h in d["hosts"])
    assert all(type(h["strategy"]) is str for h in d["hosts"][:3])
    assert [h["action"] for h in d["hosts"]] == ["send", "send", "send", "skip"]
    assert d["hosts"][3]["strategy"] is None
    assert json.loads(plan.to_json()) == d
    # skip_files is left out of the JSON only: the plan still carries it for apply
    assert plan.hosts[0].skip_files == ["aaa/layer.tar", "bbb/layer.tar"]


def test_star_plan_to_dict_strategy_is_a_plain_string():
    d = plan_push(IMAGE, [view("h1", error="down"), view("h2")]).to_dict()
    assert type(d["strategy"]) is str and d["strategy"] == "star"
    assert [(h["action"], h["strategy"]) for h in d["hosts"]] == [("fail", None), ("send", "star")]
    assert all(type(h["action"]) is str and "skip_files" not in h for h in d["hosts"])


def test_host_result_to_dict_status_is_a_plain_string():
    d = HostResult("h1", PushState.PUSHED, "zstd, Image ID verified", 1234, 2.5, 1.5).to_dict()
    assert d == {"host": "h1", "status": "pushed", "detail": "zstd, Image ID verified", "bytes_sent": 1234,
                 "seconds": 2.5, "stream_seconds": 1.5}
    assert type(d["status"]) is str
    assert json.loads(json.dumps(d)) == d
    assert HostResult("h2", PushState.FAILED).to_dict()["status"] == "failed"


# ---------------------------------------------------------------- parse_host_view (inspect.sh's output)


def layers_line(diffs) -> str:
    return "layers=" + json.dumps(list(diffs))


def test_parse_host_view_of_a_host_with_a_stale_tag_and_layers():
    base = [DIFFS[0], DIFFS[1]]
    other = [DIFFS[0], sha("other-1"), sha("other-2")]
    text = "\n".join([f"tag={OLD_ID}", "has=", "zstd=1", "relay=0", layers_line(base), layers_line(other),
                      layers_line(base)]) + "\n"
    v = parse_host_view("node-1", "10.0.0.7", text, IMAGE)
    assert (v.host, v.address, v.tag_id, v.has_id, v.zstd, v.relay, v.error) == (
        "node-1", "10.0.0.7", OLD_ID, False, True, False, None)
    assert v.chain_ids == frozenset(chain_ids(base)) | frozenset(chain_ids(other))
    assert len(v.chain_ids) == 4
    assert CHAINS[1] in v.chain_ids and DIFFS[1] not in v.chain_ids


def test_parse_host_view_of_a_host_that_has_the_id_untagged_and_no_layer_lines():
    text = f"tag=\nhas={IMAGE.id}\nzstd=0\nrelay=1\n"
    v = parse_host_view("node-2", "node-2.lan", text, IMAGE)
    assert (v.tag_id, v.has_id, v.zstd, v.relay, v.chain_ids) == ("", True, False, True, None)
    [t] = plan_push(IMAGE, [v]).hosts
    assert t.action == Action.TAG


def test_parse_host_view_then_plan_skips_a_host_that_is_up_to_date():
    text = f"tag={IMAGE.id}\nhas={IMAGE.id}\nzstd=1\nrelay=1\n{layers_line(DIFFS)}\n"
    v = parse_host_view("node-3", "10.0.0.3", text, IMAGE)
    assert v.chain_ids == frozenset(CHAINS)
    [t] = plan_push(IMAGE, [v]).hosts
    assert t.action == Action.SKIP


def test_parse_host_view_then_plan_thins_by_the_parsed_layers():
    text = "\n".join([f"tag={OLD_ID}", "has=", "zstd=1", "relay=1", layers_line(DIFFS[:3]),
                      layers_line([sha("busybox")])])
    v = parse_host_view("node-4", "10.0.0.4", text, IMAGE)
    [t] = plan_push(IMAGE, [v], layers=LAYERS).hosts
    assert (t.action, t.skip_files, t.bytes_to_send) == (
        Action.SEND, ["aaa/layer.tar", "bbb/layer.tar", "ccc/layer.tar"], 4000)


def test_parse_host_view_of_a_host_with_no_images():
    v = parse_host_view("node-5", "10.0.0.5", "tag=\nhas=\nzstd=0\nrelay=0\n", IMAGE)
    assert (v.tag_id, v.has_id, v.zstd, v.relay, v.chain_ids) == ("", False, False, False, None)
    v = parse_host_view("node-5", "10.0.0.5", "tag=\nhas=\nzstd=0\nrelay=0\nlayers=[]\n", IMAGE)
    assert v.chain_ids == frozenset()


def test_parse_host_view_of_an_image_without_layers():
    # `docker image inspect --format '{{json .RootFS.Layers}}'` prints `null` for an image with no layers
    # (RootFS.Layers is `omitempty`; e.g. `FROM scratch` + `LABEL`/`CMD` only). One such image on a host
    # must not break inspecting it.
    text = f"tag=\nhas=\nzstd=1\nrelay=1\nlayers=null\n{layers_line(DIFFS[:2])}\n"
    v = parse_host_view("node-6", "10.0.0.6", text, IMAGE)
    assert v.chain_ids == frozenset(CHAINS[:2])


def test_auto_is_star_when_a_probed_link_is_broken():
    views = [view(f"h{i}") for i in range(1, 4)]
    assert plan_push(IMAGE, views).strategy == Strategy.CHAIN
    broken = ["h2 cannot reach h3 (10.0.0.3:41000)"]
    plan = plan_push(IMAGE, views, broken_links=broken)
    assert plan.strategy == Strategy.STAR
    assert all(t.strategy == Strategy.STAR and "h2 cannot reach h3" in t.reason for t in plan.hosts)
    # an explicit chain is not second-guessed here: a dead link falls back to star while it runs
    assert plan_push(IMAGE, views, strategy="chain", broken_links=broken).strategy == Strategy.CHAIN


# ---------------------------------------------------------------- containerd's image store


def c8d_image(image: LocalImage = IMAGE, layers=LAYERS) -> LocalImage:
    """`image` as a containerd-store launcher reads it: its save's facts (config and layer blobs)."""
    facts = SaveFacts(Blob("cfg.json", image.id, 1234, "application/vnd.oci.image.config.v1+json"),
                      tuple(Blob(f, d, n) for (f, n), d in zip(layers, image.diff_ids)))
    return replace(image, facts=facts)


def test_a_containerd_store_host_is_judged_by_the_manifest_digest_of_our_stream():
    image = c8d_image()
    manifest = image.facts.manifest_digest
    assert manifest.startswith("sha256:") and manifest != IMAGE.id
    assert image.expected_id(CONTAINERD) == manifest and image.expected_id(GRAPHDRIVER) == IMAGE.id
    # the classic store's ID (the config digest) under the tag of a containerd host is not "up to date"
    text = f"store=containerd\ntag={IMAGE.id}\nhas={IMAGE.id}\nzstd=1\nrelay=1\n"
    v = parse_host_view("c8d", "10.0.0.9", text, image)
    assert (v.store, v.has_id) == (CONTAINERD, False)
    [t] = plan_push(image, [v]).hosts
    assert (t.action, t.expect_id) == (Action.SEND, manifest)
    up = parse_host_view("c8d", "10.0.0.9", f"store=containerd\ntag={manifest}\nhas={manifest}\n", image)
    assert plan_push(image, [up]).hosts[0].action == Action.SKIP
    untagged = parse_host_view("c8d", "10.0.0.9", f"store=containerd\ntag=\nhas={manifest}\n", image)
    [t] = plan_push(image, [untagged]).hosts
    assert (t.action, t.expect_id) == (Action.TAG, manifest)


def test_without_the_save_facts_a_containerd_host_is_never_taken_as_up_to_date():
    text = f"store=containerd\ntag={IMAGE.id}\nhas={IMAGE.id}\n"
    v = parse_host_view("c8d", "10.0.0.9", text, IMAGE)
    assert IMAGE.expected_id(CONTAINERD) == "" and v.has_id is False
    assert plan_push(IMAGE, [v]).hosts[0].action == Action.SEND


# ---------------------------------------------------------------- staging a push (disk space)

GIB = 2**30


def probe_text(staged="", present="", cache="2049 262144000 41943040", docker="2049 262144000 41943040",
               root="/var/lib/docker", fs="ext2/ext3"):
    """stage_facts.sh's output as a host prints it (no staged file: no `staged=` line)."""
    return ((f"staged={staged}\n" if staged else "") + f"id={present}\ncache={cache}\ndocker={docker}\nroot={root}\n"
            + (f"fs={fs}\n" if fs is not None else ""))


def test_the_stage_facts_are_parsed_by_key():
    from dockerlaunch.transfer.staging import parse_stage_facts

    p = parse_stage_facts(probe_text(staged=f"123 {'a' * 64}", present="sha256:" + "b" * 64))
    assert (p.staged, p.digest, p.present_id) == (123, "a" * 64, "sha256:" + "b" * 64)
    assert p.cache.free == 41943040 * 1024 and p.cache.total == 262144000 * 1024
    assert p.cache.shares(p.docker) and p.docker_root == "/var/lib/docker"
    bare = parse_stage_facts("id=\ncache= \n")  # no df, no docker info: nothing made up
    assert (bare.staged, bare.present_id, bare.cache, bare.docker) == (0, None, None, None)


def test_a_push_stages_only_where_the_stage_the_load_and_a_reserve_fit():
    from dockerlaunch.transfer.staging import parse_stage_facts, stage_choice

    # one 250 GiB disk with 40 GiB free: a 3 GiB image stages (3 + 6 + 12.5 reserve)
    assert stage_choice("h", 3 * GIB, parse_stage_facts(probe_text())) == (True, "")
    # 15 GiB free: the load fits, staging beside it would not -> streamed straight in, and the reason says why
    tight = probe_text(cache="2049 262144000 15728640", docker="2049 262144000 15728640")
    ok, why = stage_choice("h", 3 * GIB, parse_stage_facts(tight))
    assert not ok and "not staged" in why and "15.0 GiB free" in why and "starts over" in why
    # the staging folder on its own disk: the load does not count against it
    apart = probe_text(cache="2050 10485760 8388608", docker="2049 262144000 15728640")
    assert stage_choice("h", 3 * GIB, parse_stage_facts(apart)) == (True, "")
    # an overlay root over the docker volume's disk (another device, the same sizes) is one disk
    overlay = probe_text(cache="77 262144000 15728640", docker="2049 262144000 15728640")
    assert not stage_choice("h", 3 * GIB, parse_stage_facts(overlay))[0]
    # what is staged already need not fit again
    half = probe_text(staged=f"{2 * GIB} {'a' * 64}", cache="2049 262144000 20971520",
                      docker="2049 262144000 20971520")
    assert stage_choice("h", 3 * GIB, parse_stage_facts(half))[0]
    assert not stage_choice("h", 3 * GIB, parse_stage_facts(half.replace(str(2 * GIB), "1")))[0]


def test_an_image_that_cannot_fit_where_docker_keeps_images_is_refused_before_a_byte_is_sent():
    from dockerlaunch.errors import TransferError
    from dockerlaunch.transfer.staging import parse_stage_facts, stage_choice

    full = probe_text(docker="2049 262144000 5242880")  # 5 GiB free: the load takes 6
    with pytest.raises(TransferError, match=r"host gpu7: 5.0 GiB free in /var/lib/docker.*6.0 GiB.*docker image prune"):
        stage_choice("gpu7", 3 * GIB, parse_stage_facts(full))


@pytest.mark.parametrize("fs, stages", [("nfs", False), ("nfs4", False), ("lustre", False), ("ceph", False),
                                        ("cifs", False), ("gpfs", False),
                                        # the names GNU stat prints for BeeGFS, SMB3, 9p, AFS and StorNext (issue 50)
                                        ("fhgfs", False), ("smb3", False), ("v9fs", False), ("k-afs", False),
                                        ("snfs", False),
                                        ("ext2/ext3", True), ("xfs", True), ("overlayfs", True), ("btrfs", True)])
def test_a_home_on_shared_storage_is_never_staged_on(fs, stages):
    """issue 42, finding 4: on a cluster whose homes are NFS, every host would stage in one folder (one lock, one
    growing file, one host's cleanup deleting the others' stages): a network file system is not staged on."""
    from dockerlaunch.transfer.staging import parse_stage_facts, stage_choice

    ok, why = stage_choice("h", 3 * GIB, parse_stage_facts(probe_text(fs=fs)))
    assert ok is stages
    if not stages:
        assert why == f"not staged ($HOME/.cache is on {fs}, shared storage: hosts would share one stage)"


# what GNU stat (coreutils' src/stat.c) prints for storage several hosts mount as one, beyond the names above
@pytest.mark.parametrize("fs", ["fuseblk", "gfs/gfs2", "acfs", "ibrix", "coda", "vmhgfs", "prl_fs", "vboxsf", "vxfs",
                                "novell", "smb", "smb2", "afs"])
def test_every_fuse_mount_and_the_other_shared_types_gnu_stat_names_are_never_staged_on(fs):
    """Issue 60, item 10: `stat -f -c %T` prints `fuseblk` for every FUSE mount (sshfs, JuiceFS, ceph-fuse,
    glusterfs: one magic number), never the `fuse.*` the list looked for, and `gfs/gfs2` for GFS2: a home on any of
    them was staged on, one stage for every host."""
    from dockerlaunch.transfer.staging import parse_stage_facts, stage_choice

    ok, why = stage_choice("h", 3 * GIB, parse_stage_facts(probe_text(fs=fs)))
    assert not ok and why == f"not staged ($HOME/.cache is on {fs}, shared storage: hosts would share one stage)"


@pytest.mark.parametrize("fs", ["UNKNOWN (0x19830327)", "", None])
def test_a_file_system_stat_does_not_know_is_never_staged_on(fs):
    """issue 50, finding 9: a type GNU stat has no name for may be shared storage too."""
    from dockerlaunch.transfer.staging import parse_stage_facts, stage_choice

    ok, why = stage_choice("h", 3 * GIB, parse_stage_facts(probe_text(fs=fs)))
    assert not ok and why.startswith("not staged ($HOME/.cache is on a file system stat does not know: "), why


def test_two_hosts_never_share_a_stage_key():
    from dockerlaunch.transfer.push_plan import Action, HostTransfer
    from dockerlaunch.transfer.staging import stage_key

    def to(host):
        return HostTransfer(host, Action.SEND, expect_id="sha256:" + "a" * 64)

    assert stage_key(to("10.0.0.1")) != stage_key(to("10.0.0.2"))  # two hosts, one shared home: two files
    assert stage_key(to("10.0.0.1")) == stage_key(to("10.0.0.1"))


# ---------------------------------------------------------------- where the layers are read (issue 58, item 6)

BASE = frozenset(CHAINS[:3])  # hosts that have the image's base: a bump of the top layer
TOP = {d: n for d, n in zip(DIFFS, (4000, 4000, 4000, 345))}  # engine sizes: they sum to IMAGE.size


def cold(**kw) -> CacheState:
    return CacheState(held={}, **kw)


def warm_but_top(**kw) -> CacheState:
    return CacheState(held={d: TOP[d] for d in DIFFS[:3]}, **kw)


def test_a_cold_cache_for_a_bump_goes_by_docker_save_and_is_filled_after_the_push():
    """The issue: the first push after a 2 kB change filled the cache with the whole image first (135 s) where one
    docker save per stream costs less; the route is the save's, and the cache is filled after the push."""
    views = [view("h1", chain_ids=BASE), view("h2", chain_ids=BASE)]
    r = choose_route(IMAGE, views, cold())
    assert (r.route, r.lacks, r.holds, r.save_reads, r.fill_later) == (Route.SAVE, IMAGE.size, 0, 3, True)
    assert r.reason == ("the layer cache lacks 12 kB of the image's 12 kB (4 of its 4 layers): filling it first "
                        "(the engine reads and gzips it, about 5 x a docker save's time per byte) would cost more "
                        "than the 3 docker save read(s) of the whole image (its layer map, 2 star stream(s)) this "
                        "push makes; the cache is filled in the background after the push")
    # an earlier read left its layer map (a dry run): one read less, the same route
    r = choose_route(IMAGE, views, cold(), facts_known=True)
    assert (r.route, r.save_reads) == (Route.SAVE, 2) and "(2 star stream(s))" in r.reason


def test_a_warm_cache_lacking_only_the_new_layer_is_the_route():
    r = choose_route(IMAGE, [view("h1", chain_ids=BASE)], warm_but_top())
    assert (r.route, r.holds, r.lacks, r.fill_later) == (Route.CACHE, 12_000, 345, False)
    assert r.reason == ("the layer cache lacks 345 bytes of the image's 12 kB (1 of its 4 layers): the engine reads "
                        "and gzips that for less than the 2 docker save read(s) of the whole image (its layer map, "
                        "1 star stream(s)) the save route makes")
    r = choose_route(IMAGE, [view("h1", chain_ids=BASE)], CacheState(held=TOP))
    assert (r.route, r.lacks) == (Route.CACHE, 0)
    assert r.reason == "the layer cache holds all 4 of its layers: the engine reads none of them"


def test_the_route_weighs_the_fill_against_every_read_of_the_save():
    """Each star stream reads the whole save: enough of them outweigh one fill, a chain never does."""
    star = [view(f"h{i}", chain_ids=BASE) for i in range(1, 6)]
    assert choose_route(IMAGE, star, cold(), strategy="star").route == Route.CACHE  # 5 x size <= 6 reads
    assert choose_route(IMAGE, star[:3], cold(), strategy="star").route == Route.SAVE  # 5 x size > 4 reads
    r = choose_route(IMAGE, star, cold())  # auto: a chain of 5, one stream
    assert (r.route, r.save_reads) == (Route.SAVE, 2) and "(its layer map, one chain)" in r.reason
    r = choose_route(IMAGE, star, cold(), broken_links=["h1 cannot reach h2"])  # a chain that cannot be: 5 streams
    assert (r.route, r.save_reads) == (Route.CACHE, 6)


@pytest.mark.parametrize("lacks, route", [(2 * IMAGE.size // 5, Route.CACHE), (2 * IMAGE.size // 5 + 1, Route.SAVE)])
def test_a_fill_that_costs_exactly_the_saves_reads_is_the_cache(lacks, route):
    held = {DIFFS[0]: IMAGE.size - lacks}  # FILL_COST x lacks against 2 reads (the map, 1 stream)
    assert FILL_COST == 5
    assert choose_route(IMAGE, [view("h1", chain_ids=BASE)], CacheState(held=held)).route == route


def test_a_containerd_store_launcher_copies_its_blobs_into_the_cache_so_even_a_cold_one_is_the_route():
    r = choose_route(IMAGE, [view("h1", chain_ids=BASE)], cold(copies=True))
    assert (r.route, r.lacks, r.fill_later) == (Route.CACHE, IMAGE.size, False)
    read = replace(IMAGE, source=LayerSource("cache", 1.0, 100, "/c"))  # source_image read it through the cache
    r = choose_route(read, [view("h1", chain_ids=BASE)], None)
    assert r.route == Route.CACHE and r.reason.startswith("read through the layer cache when the image was read")


def test_a_cache_that_cannot_serve_or_is_being_filled_is_the_saves_with_the_reason_and_no_fill():
    views = [view("h1", chain_ids=BASE)]
    r = choose_route(IMAGE, views, CacheState(unavailable="no docker-registry on this machine"))
    assert (r.route, r.fill_later) == (Route.SAVE, False)
    assert r.reason == "the layer cache cannot serve here: no docker-registry on this machine"
    r = choose_route(IMAGE, views, warm_but_top(filling="pid 7, app:1.1, 10 MB read in 3 s"))
    assert (r.route, r.fill_later) == (Route.SAVE, False)  # a push never waits for a fill
    assert r.reason == ("the layer cache is being filled now (pid 7, app:1.1, 10 MB read in 3 s): a push does not "
                        "wait for it")
    r = choose_route(IMAGE, views, cold(forced=True))
    assert (r.route, r.lacks) == (Route.CACHE, IMAGE.size)
    assert r.reason.startswith(f"{SOURCE_ENV}=cache; the layer cache lacks 12 kB")


def test_a_stream_of_the_whole_image_or_none_has_no_cache_to_weigh():
    r = choose_route(IMAGE, [view("h1", chain_ids=frozenset())], cold())  # the host has none of its layers
    assert (r.route, r.fill_later) == (Route.SAVE, False)
    assert r.reason.startswith("no host that needs the image has any of its layers")
    r = choose_route(IMAGE, [view("h1", chain_ids=BASE)], cold(), thin=False)
    assert (r.route, r.reason, r.fill_later) == (Route.SAVE, "--full: every layer is sent, read by one docker save "
                                                             "per stream", False)
    assert choose_route(IMAGE, [view("h1", tag_id=IMAGE.id), view("h2", has_id=True)], cold()) is None


def test_the_plan_carries_the_route_into_its_json_and_its_star_fallback():
    views = [view(f"h{i}", chain_ids=BASE) for i in range(1, 4)]
    route = choose_route(IMAGE, views, cold())
    plan = plan_push(IMAGE, views, layers=LAYERS, route=route)
    d = json.loads(plan.to_json())["layer_route"]
    assert d == {"route": "save", "reason": route.reason, "holds": 0, "lacks": IMAGE.size, "save_reads": 2,
                 "fill_later": True}
    assert star_fallback(plan, views, ["h2"], "auto", True, LAYERS).route == route


def test_sizes_read_as_a_person_reads_them():
    assert [size_text(n) for n in (512, 2048, 383_000_000, 12_300_000_000)] == ["512 bytes", "2 kB", "383 MB",
                                                                               "12.3 GB"]
