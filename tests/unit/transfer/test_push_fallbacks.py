"""What a push decides after a host fails, and the facts it decides from (issue 61): each rule of push_plan is a pure
function of typed facts -- a host's `Outcome`, its planned transfer -- checked here on hand-built values, with no
host, no SSH and no engine. `push.apply_plan` is run too, its senders replaced by fakes that answer with outcomes,
to show it does what the rules say and nothing else. Every result here carries a detail that would mislead a rule
that read text: none does.
"""

import json
from dataclasses import replace

import pytest

from dockerlaunch.transfer import push
from dockerlaunch.transfer.image_facts import CONTAINERD, LayerSource, LocalImage
from dockerlaunch.transfer.push_plan import (
    Action,
    Fallback,
    HostResult,
    HostTransfer,
    HostView,
    Outcome,
    PushState,
    Route,
    RouteChoice,
    Strategy,
    after_fallback,
    chain_again,
    judge,
    links_to_check,
    load_outcome,
    needs_store_id,
    plan_push,
    route_as_read,
    send_whole,
    senders,
    stage_goes,
    star_after_chain,
    star_fallback,
)
from tests.unit.transfer.test_push_plan import CHAINS, DIFFS, c8d_image, sha

IMAGE = LocalImage(ref="app:2", id=sha("config-app-2"), size=10_000, diff_ids=DIFFS)
LAYERS = [("aaa/layer.tar", 1000), ("bbb/layer.tar", 2000), ("ccc/layer.tar", 3000), ("ddd/layer.tar", 4000)]
MISLEADING = "load failed: (a detail that reads like a refusal)"  # what a text-matching rule would have acted on


def view(host: str, **kw) -> HostView:
    defaults = dict(address=f"10.0.0.{host[-1]}", tag_id=sha("old"), zstd=True, relay=True,
                    chain_ids=frozenset(CHAINS[:2]))
    return HostView(host, **{**defaults, **kw})


def thin_star(host: str = "h1") -> HostTransfer:
    return HostTransfer(host, Action.SEND, strategy=Strategy.STAR, compression="zstd", layers=4, layers_skipped=2,
                        skip_files=["aaa/layer.tar", "bbb/layer.tar"], expect_id=IMAGE.id, bytes_to_send=7000)


def failed(host: str, outcome: Outcome, detail: str = MISLEADING, sent: int = 0) -> HostResult:
    return HostResult.of(host, outcome, detail, sent)


# ---------------------------------------------------------------- outcomes


def test_every_outcome_names_the_state_the_table_and_json_show():
    states = {o: o.state for o in Outcome}
    assert {o for o, s in states.items() if s != PushState.FAILED} == {
        Outcome.SKIPPED, Outcome.TAGGED, Outcome.DELIVERED, Outcome.SENT, Outcome.RESUMED, Outcome.LOADED}
    assert all(o.value.startswith("failed") for o, s in states.items() if s == PushState.FAILED)
    assert (Outcome.DELIVERED.state, Outcome.RESUMED.state) == (PushState.TAGGED, PushState.PUSHED)


def test_a_result_is_named_by_its_outcome_and_its_json_keeps_its_keys():
    r = HostResult.of("h1", Outcome.RESUMED, "zstd, resumed", 10, 1.0, 0.5)
    assert (r.status, r.outcome, r.failed) == (PushState.PUSHED, Outcome.RESUMED, False)
    assert r.to_dict() == {"host": "h1", "status": "pushed", "detail": "zstd, resumed", "bytes_sent": 10,
                           "seconds": 1.0, "stream_seconds": 0.5}
    # by its state alone (load, an unreachable host): the state's own outcome
    assert HostResult("h2", PushState.FAILED, "ssh: no route").outcome == Outcome.FAILED
    assert HostResult("h3", PushState.LOADED).outcome == Outcome.LOADED
    with pytest.raises(ValueError):
        HostResult("h4", PushState.PUSHED, outcome=Outcome.FAILED_CUT)


@pytest.mark.parametrize(("status", "cut", "disk_full", "outcome"), [
    (3, False, False, Outcome.FAILED_LOAD),  # load.sh / relay.sh: docker load refused the stream
    (4, False, False, Outcome.FAILED_VERIFY),  # a different Image ID, or none, after the load
    (5, False, False, Outcome.FAILED_TAG),
    (9, False, False, Outcome.FAILED_CUT),  # a relay whose stream stopped short
    (3, True, False, Outcome.FAILED_CUT),  # the chain's head, before the launcher's stream ended
    (3, False, True, Outcome.FAILED_DISK_FULL),  # docker load said ENOSPC
    (8, False, True, Outcome.FAILED_DISK_FULL),
    (7, False, False, Outcome.FAILED),  # a stranger on a link
    (255, False, False, Outcome.FAILED),  # ssh
    (-1, False, False, Outcome.FAILED),
])
def test_an_exit_status_and_what_the_launcher_saw_make_the_outcome(status, cut, disk_full, outcome):
    assert load_outcome(status, cut=cut, disk_full=disk_full) == outcome


# ---------------------------------------------------------------- stage removal


@pytest.mark.parametrize(("outcome", "whole", "goes"), [
    (Outcome.FAILED_LOAD, True, True),  # all of it arrived and did not load: resuming would load it again
    (Outcome.FAILED_VERIFY, True, True),
    (Outcome.FAILED_LOAD, False, False),  # the load stopped before the stream's end: its prefix may still serve
    (Outcome.FAILED_VERIFY, False, False),
    (Outcome.FAILED_DISK_FULL, False, True),  # the stage took the space the load needed
    (Outcome.FAILED_DISK_FULL, True, True),
    (Outcome.FAILED_CUT, True, False),  # the next push resumes from it
    (Outcome.FAILED_CUT, False, False),
    (Outcome.FAILED_TAG, True, False),
    (Outcome.FAILED, True, False),
])
def test_a_stage_goes_only_when_resuming_it_cannot_help(outcome, whole, goes):
    assert stage_goes(outcome, whole) is goes


# ---------------------------------------------------------------- a chain that breaks


def test_a_chain_runs_again_only_over_the_hosts_it_cut_off():
    chained = [HostResult.of("h1", Outcome.SENT, "chain (head of chain)"),
               failed("h2", Outcome.FAILED_CUT, "no data from h1 within 30s"),
               failed("h3", Outcome.FAILED_LOAD, "cut: the stream stopped"),  # words of a cut, outcome of a refusal
               failed("h4", Outcome.FAILED_CUT),
               failed("h5", Outcome.FAILED)]
    assert chain_again(chained) == ["h2", "h4"]
    assert chain_again([HostResult.of("h1", Outcome.SENT)]) == []


def test_every_chain_host_still_failed_gets_its_star_push_in_chain_order():
    chained = [failed("h3", Outcome.FAILED_CUT), HostResult.of("h1", Outcome.RESUMED, MISLEADING),
               failed("h2", Outcome.FAILED_VERIFY), HostResult.of("h4", Outcome.DELIVERED)]
    assert star_after_chain(chained) == ["h3", "h2"]


def test_the_chain_plan_holds_each_hosts_star_fallback_and_its_json_does_not():
    views = [view("h1"), view("h2", chain_ids=frozenset(CHAINS[:3])), view("h3", zstd=False),
             view("h4", tag_id=IMAGE.id)]
    plan = plan_push(IMAGE, views, layers=LAYERS)
    assert plan.strategy == Strategy.CHAIN
    assert list(plan.fallback) == ["h1", "h2", "h3"]  # every chain host, none that skips
    assert plan.fallback == {t.host: t for t in star_fallback(plan, views, ["h1", "h2", "h3"], "auto", True,
                                                              LAYERS).hosts}
    assert [(t.strategy, t.compression, t.bytes_to_send) for t in plan.fallback.values()] == [
        (Strategy.STAR, "zstd", 7000), (Strategy.STAR, "zstd", 4000), (Strategy.STAR, "none", 7000)]
    assert "fallback" not in plan.to_dict() and "fallback" not in json.loads(plan.to_json())
    assert plan_push(IMAGE, views[:2], layers=LAYERS).fallback == {}  # star: nothing to fall back from


# ---------------------------------------------------------------- a thin stream refused


def test_a_refused_thin_star_stream_is_sent_whole_once():
    t = thin_star()
    whole = send_whole(t, failed("h1", Outcome.FAILED_LOAD, "an engine's own words, any words"), IMAGE)
    assert (whole.skip_files, whole.layers_skipped, whole.bytes_to_send) == ([], 0, IMAGE.size)
    assert (whole.host, whole.compression, whole.expect_id, whole.strategy) == (t.host, "zstd", IMAGE.id,
                                                                                Strategy.STAR)


@pytest.mark.parametrize("outcome", [o for o in Outcome if o != Outcome.FAILED_LOAD])
def test_no_other_outcome_is_a_reason_to_send_everything(outcome):
    assert send_whole(thin_star(), HostResult.of("h1", outcome, MISLEADING), IMAGE) is None


def test_a_stream_that_left_nothing_out_is_not_sent_again():
    full = replace(thin_star(), skip_files=[], layers_skipped=0, bytes_to_send=IMAGE.size)
    assert send_whole(full, failed("h1", Outcome.FAILED_LOAD), IMAGE) is None


def test_a_recovery_says_what_it_recovered_from_and_keeps_its_steps_in_order():
    cut = failed("h2", Outcome.FAILED_CUT, "cut: the stream stopped after 5 bytes", sent=5)
    again = after_fallback(cut, Fallback.CHAIN_AGAIN, failed("h2", Outcome.FAILED_LOAD, "load failed: x", sent=7))
    assert again.detail == "chain again after a cut (cut: the stream stopped after 5 bytes): load failed: x"
    assert (again.outcome, again.bytes_sent, again.fallbacks) == (Outcome.FAILED_LOAD, 7, (Fallback.CHAIN_AGAIN,))
    thin = failed("h2", Outcome.FAILED_LOAD, "load failed: a layer", sent=300)
    whole = after_fallback(thin, Fallback.WHOLE, HostResult.of("h2", Outcome.SENT, "zstd, verified", 900))
    assert whole.detail == "the thin stream was refused (load failed: a layer); sent in full: zstd, verified"
    assert (whole.bytes_sent, whole.fallbacks) == (1200, (Fallback.WHOLE,))  # both streams' bytes
    star = after_fallback(again, Fallback.STAR, whole)
    assert star.detail.startswith("star after the chain failed (chain again after a cut (cut: the stream stopped ")
    assert star.detail.endswith("; the thin stream was refused (load failed: a layer); sent in full: zstd, verified")
    assert (star.status, star.outcome, star.bytes_sent) == (PushState.PUSHED, Outcome.SENT, 1200)
    assert star.fallbacks == (Fallback.CHAIN_AGAIN, Fallback.STAR, Fallback.WHOLE)
    assert after_fallback(failed("h1", Outcome.FAILED, "x" * 400), Fallback.STAR, HostResult.of(
        "h1", Outcome.SENT, "ok")).detail == f"star after the chain failed ({'x' * 160}); ok"


# ---------------------------------------------------------------- apply follows the rules (no host: fake senders)


class FakeRemote:
    def __init__(self, name: str):
        self.name = name


def test_apply_runs_the_chain_again_then_star_then_whole_by_outcomes_alone(monkeypatch):
    views = [view(f"h{i}") for i in range(1, 5)]
    plan = plan_push(IMAGE, views, layers=LAYERS)
    assert plan.strategy == Strategy.CHAIN and all(t.skip_files for t in plan.fallback.values())
    calls: list[tuple[str, list[str]]] = []
    chains = iter([
        # the first chain: h1 loads; h2 and h3 are cut off, h4 refuses (its words read like a cut)
        {"h1": HostResult.of("h1", Outcome.SENT, "chain (head of chain)", 100),
         "h2": failed("h2", Outcome.FAILED_CUT, "no data from h1", 40),
         "h3": failed("h3", Outcome.FAILED_CUT, "no data from h1"),
         "h4": failed("h4", Outcome.FAILED_VERIFY, "cut: the stream stopped after 1 bytes")},
        # the second chain, over h2 and h3: h2 resumes, h3 refuses the stream (whole, checked)
        {"h2": HostResult.of("h2", Outcome.RESUMED, "chain (head of chain), resumed at 0 MB", 60),
         "h3": failed("h3", Outcome.FAILED_LOAD, "load failed: chain")},
    ])

    def send_chain(client, remotes, image, links, on_read=None):
        calls.append(("chain", [t.host for t in links]))
        said = next(chains)
        return [said[t.host] for t in links]

    def send_star(client, remote, image, t, on_read=None, on_sent=None):
        calls.append(("star" if t.skip_files else "whole", [t.host]))
        if t.host == "h3" and t.skip_files:  # the thin star stream: its engine lacks a layer
            return failed("h3", Outcome.FAILED_LOAD, "an engine's refusal", 20)
        if t.host == "h4":  # its star push fails with the words of a refusal: not a reason to send it whole
            return failed("h4", Outcome.FAILED_DISK_FULL, "load failed: no space left")
        return HostResult.of(t.host, Outcome.SENT, "zstd, verified", 30)

    monkeypatch.setattr(push, "send_chain", send_chain)
    monkeypatch.setattr(push, "send_star", send_star)
    results = push.apply_plan(None, [FakeRemote(v.host) for v in views], plan)
    assert calls[:2] == [("chain", ["h1", "h2", "h3", "h4"]), ("chain", ["h2", "h3"])]
    assert sorted(calls[2:4]) == [("star", ["h3"]), ("star", ["h4"])]  # side by side
    assert calls[4:] == [("whole", ["h3"])]
    got = {r.host: r for r in results}
    assert [r.host for r in results] == ["h1", "h2", "h3", "h4"]
    assert (got["h1"].outcome, got["h1"].fallbacks) == (Outcome.SENT, ())
    assert (got["h2"].outcome, got["h2"].fallbacks) == (Outcome.RESUMED, (Fallback.CHAIN_AGAIN,))
    assert got["h2"].detail == "chain again after a cut (no data from h1): chain (head of chain), resumed at 0 MB"
    assert (got["h3"].outcome, got["h3"].bytes_sent) == (Outcome.SENT, 50)
    assert got["h3"].fallbacks == (Fallback.CHAIN_AGAIN, Fallback.STAR, Fallback.WHOLE)
    assert got["h3"].detail == ("star after the chain failed (chain again after a cut (no data from h1): load failed: "
                                "chain); the thin stream was refused (an engine's refusal); sent in full: zstd, "
                                "verified")
    assert (got["h4"].status, got["h4"].outcome, got["h4"].fallbacks) == (
        PushState.FAILED, Outcome.FAILED_DISK_FULL, (Fallback.STAR,))


def test_apply_reports_planned_skips_and_failures_and_sends_nothing_for_them(monkeypatch):
    views = [view("h1", tag_id=IMAGE.id), view("h2", error="docker is not usable")]
    plan = plan_push(IMAGE, views)
    monkeypatch.setattr(push, "send_star", lambda *a, **k: pytest.fail("nothing to send"))
    results = push.apply_plan(None, [FakeRemote("h1"), FakeRemote("h2")], plan)
    assert [(r.status, r.outcome, r.detail) for r in results] == [
        (PushState.SKIPPED, Outcome.SKIPPED, f"already has {IMAGE.id[7:19]}"),
        (PushState.FAILED, Outcome.FAILED_PLANNED, "docker is not usable")]


# ---------------------------------------------------------------- decided once, before anything is sent


def test_a_containerd_host_is_asked_once_and_judged_from_its_ids_once_the_facts_are_read():
    image = c8d_image(IMAGE, LAYERS)
    manifest = image.facts.manifest_digest
    # asked before the launcher could name the image's ID in containerd's store: the host lists every image ID
    text = f"store=containerd\ntag=\nhas={IMAGE.id}\nid={sha('other')}\nid={manifest}\nzstd=1\nrelay=1\n"
    before = push.parse_host_view("c8d", "10.0.0.9", text, IMAGE)
    assert (before.store, before.has_id, before.ids) == (CONTAINERD, False, frozenset({sha("other"), manifest}))
    graph = view("g1")
    assert needs_store_id(IMAGE, [graph, before]) and not needs_store_id(image, [graph, before])
    assert not needs_store_id(IMAGE, [graph, view("c2", store=CONTAINERD, error="down")])
    after = judge(before, image)  # no second question: the list it gave decides
    assert after.has_id is True and judge(graph, image) == graph
    [t] = plan_push(image, [after]).hosts
    assert (t.action, t.expect_id) == (Action.TAG, manifest)
    # a host whose list lacks it needs the image; one whose tag is it is up to date (the tag was said the first time)
    assert judge(replace(before, ids=frozenset({sha("other")})), image).has_id is False
    tagged = judge(replace(before, tag_id=manifest), image)
    assert plan_push(image, [tagged]).hosts[0].action == Action.SKIP
    # asked with the facts known: no list, judged by has= as before
    known = push.parse_host_view("c8d", "10.0.0.9", f"store=containerd\ntag=\nhas={manifest}\n", image)
    assert (known.ids, known.has_id) == (None, True)


def test_only_an_auto_chain_has_its_links_probed_and_in_the_plans_order():
    views = [view("h1"), view("h2", tag_id=IMAGE.id), view("h3"), view("h4", error="down"), view("h5"),
             view("h6", zstd=False)]
    assert [v.host for v in senders(IMAGE, views)] == ["h1", "h3", "h5", "h6"]
    assert [v.host for v in senders(IMAGE, views, "zstd")] == ["h1", "h3", "h5"]
    assert [v.host for v in links_to_check("auto", IMAGE, views)] == ["h1", "h3", "h5", "h6"]
    assert [v.host for v in links_to_check("auto", IMAGE, views, "zstd")] == ["h1", "h3", "h5"]
    assert links_to_check("star", IMAGE, views) == [] and links_to_check("chain", IMAGE, views) == []
    assert links_to_check("auto", IMAGE, views[:3]) == []  # 2 senders: star without asking
    assert links_to_check("auto", IMAGE, [*views[:3], view("h5", relay=False)]) == []
    # the probe's answer is the one the plan is made with: broken links make it star, once
    chain = [v.host for v in links_to_check("auto", IMAGE, views)]
    plan = plan_push(IMAGE, views, broken_links=[f"{chain[0]} cannot reach {chain[1]} (10.0.0.3:40000)"])
    assert plan.strategy == Strategy.STAR and plan.fallback == {}


def test_a_cache_route_whose_read_fell_back_to_the_save_is_told_as_the_save():
    route = RouteChoice(Route.CACHE, "the layer cache holds all 4 of its layers", holds=10_000)
    fell = replace(IMAGE, source=LayerSource("save", 1.0, why="docker-registry did not start"))
    assert route_as_read(route, fell) == replace(route, route=Route.SAVE, reason="the layer cache could not serve: "
                                                 "docker-registry did not start")
    served = replace(IMAGE, source=LayerSource("cache", 1.0))
    assert route_as_read(route, served) == route and route_as_read(route, IMAGE) == route
    assert route_as_read(None, fell) is None
    save = RouteChoice(Route.SAVE, "--full", fill_later=True)
    assert route_as_read(save, fell) == save


def test_push_plan_asks_each_host_once_probes_once_and_plans_once(monkeypatch):
    """Push.plan's sequence with its I/O replaced: the first push of an image whose save was never read, to a
    containerd-store host among classic ones, as an auto chain whose probe finds a broken link."""
    image = c8d_image(IMAGE, LAYERS)
    manifest = image.facts.manifest_digest
    asked: list[str] = []
    probed: list[list[str]] = []
    planned: list[str] = []

    def observe(remote, img, address, thin=True):
        asked.append(remote.name)
        assert img.facts is None  # asked before the save was read: the containerd host lists its IDs
        if remote.name == "c8d":
            return push.parse_host_view("c8d", address, f"store=containerd\ntag=\nid={manifest}\nrelay=1\n", img)
        return view(remote.name, address=address)

    def check_links(chain, timeout=10.0):
        probed.append([r.name for r, _ in chain])
        return ["h1 cannot reach h2 (10.0.0.2:40000)"]

    real_plan_push = push.plan_push

    def plan_push(*a, **k):
        planned.append(k.get("strategy", "auto"))
        return real_plan_push(*a, **k)

    monkeypatch.setattr(push, "observe", observe)
    monkeypatch.setattr(push, "with_facts", lambda client, img, on_bytes=None: image)
    monkeypatch.setattr(push, "check_links", check_links)
    monkeypatch.setattr(push, "plan_push", plan_push)
    remotes = [FakeRemote(n) for n in ("h1", "h2", "c8d", "h3")]
    job = push.Push(None, remotes, replace(IMAGE, facts=None), addresses=["a1", "a2", "a3", "a4"], thin=False)
    plan = job.plan()
    assert job.plan() is plan  # apply carries out this plan: never a second one
    assert sorted(asked) == ["c8d", "h1", "h2", "h3"]  # each host once
    assert probed == [["h1", "h2", "h3"]] and planned == ["auto"]  # c8d had it untagged: tagged, not linked
    assert plan.strategy == Strategy.STAR and plan.fallback == {}
    assert [(t.host, t.action) for t in plan.hosts] == [("h1", Action.SEND), ("h2", Action.SEND),
                                                        ("c8d", Action.TAG), ("h3", Action.SEND)]
    assert all("h1 cannot reach h2" in t.reason for t in plan.hosts if t.action == Action.SEND)
    assert plan.hosts[2].expect_id == manifest and plan.image is image
