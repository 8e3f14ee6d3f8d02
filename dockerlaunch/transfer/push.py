"""`push`: images to hosts over SSH without a registry -- observe each host, plan, then apply the plan.

Safety rule: an image travels by ID (a `docker save <id>` tar carries no tag), the target loads it,
its Image ID is checked, and only then is the tag set. A broken stream therefore leaves the tag
absent or pointing where it pointed before -- never at a partial or different image.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from dockerlaunch import keyvalue
from dockerlaunch.errors import DockerlaunchError, HostError, TransferError
from dockerlaunch.hosts.fleet import each
from dockerlaunch.hosts.ssh import Remote
from dockerlaunch.reporting import Reporter
from dockerlaunch.transfer import cache_server, layer_cache, script
from dockerlaunch.transfer.chain import push_chain
from dockerlaunch.transfer.image_facts import (
    CONTAINERD,
    DOCKER_SAVE,
    GRAPHDRIVER,
    LayerSource,
    LocalImage,
    facts_known,
    layer_map,
    local_image,
    with_facts,
)
from dockerlaunch.transfer.oci import chain_ids
from dockerlaunch.transfer.pipes import CountingReader, prefetched, stream_seconds
from dockerlaunch.transfer.push_plan import (
    CANNOT,
    Action,
    CacheState,
    Fallback,
    HostResult,
    HostTransfer,
    HostView,
    Outcome,
    PushPlan,
    Route,
    RouteChoice,
    Strategy,
    after_fallback,
    chain_again,
    choose_route,
    judge,
    links_to_check,
    load_outcome,
    needs_layer_map,
    needs_store_id,
    plan_push,
    route_as_read,
    send_whole,
    size_text,
    stage_goes,
    star_after_chain,
)
from dockerlaunch.transfer.restream import untagged_chunks
from dockerlaunch.transfer.staging import (
    StageFacts,
    StagePick,
    chain_key,
    pick_stage,
    remove_stage,
    resume_points,
    stage_key,
    stage_min,
)
from dockerlaunch.transfer.streams import outgoing

STAR_WINDOW = 32  # image streams from this machine at once: each reads the image and fills a link of its own

# ---------------------------------------------------------------- observe


def parse_host_view(host: str, address: str, text: str, image: LocalImage) -> HostView:
    """inspect.sh's output -> HostView (pure); `has_id`: the host has the ID `image` gets in its store. An answer
    that breaks the key=value contract (dockerlaunch/keyvalue.py) is the host's error, never a guess."""
    try:
        kv = keyvalue.parse(text, ("store", "tag", "zstd", "relay"), ("has", "layers", "id"))
        have = None if "layers" not in kv else set().union(
            *(chain_ids(json.loads(v) or []) for v in kv["layers"]))  # null: an image with no layers
    except keyvalue.Malformed as e:
        return HostView(host, address, error=keyvalue.host_error(host, "inspecting images", e).reason)
    except (ValueError, TypeError, AttributeError):
        return HostView(host, address, error="inspecting images failed: its layers= lines are not Docker's JSON")
    one = {k: v[0].strip() for k, v in kv.items()}
    present = {v.strip() for v in kv.get("has", [])}
    store = CONTAINERD if one.get("store") == CONTAINERD else GRAPHDRIVER
    want = image.expected_id(store)
    view = HostView(host=host, address=address, tag_id=one.get("tag", ""), has_id=bool(want) and want in present,
                    store=store, zstd=one.get("zstd") == "1", relay=one.get("relay") == "1",
                    chain_ids=frozenset(have) if have is not None else None,
                    ids=frozenset(v.strip() for v in kv["id"]) if "id" in kv else None)
    return judge(view, image)


def observe(remote: Remote, image: LocalImage, address: str, thin: bool = True) -> HostView:
    """One round trip: its image store, where its tag points, whether it has the image (by the ID its store would
    give it; a containerd store lists its image IDs while the launcher cannot name that ID yet), zstd, relay
    tools, its layers."""
    ids = [i for i in dict.fromkeys((image.config_digest, image.expected_id(CONTAINERD))) if i]
    list_ids = "0" if image.expected_id(CONTAINERD) else "1"
    try:
        r = remote.check(["sh", "-c", script("inspect.sh"), "sh", image.ref, "1" if thin else "0", list_ids, *ids],
                         "inspecting images", timeout=120)
    except HostError as e:
        return HostView(remote.name, address, error=e.reason)
    view = parse_host_view(remote.name, address, r.stdout, image)
    if thin and view.chain_ids is None:
        view = HostView(**{**view.__dict__, "chain_ids": frozenset()})
    return view


class Push:
    """One push of `image` to `remotes`, the one entry point (`push`, `up --push`, `compile --on`, the tests):

    `plan()` asks every host once and decides everything before a byte is sent: what each host gets, star or chain
    (an auto chain's links are checked first), where the layers are read (push_plan.choose_route), and the star push
    each chain host falls back to; it sends nothing, tags nothing, and is what `push --dry-run` prints. `apply()`
    carries that plan out; after a failure the fallback rules (push_plan: chain_again, star_after_chain,
    send_whole, stage_goes) decide what follows, from each host's Outcome. Then, with `fill_cache`, the layer
    cache is filled in the background where the plan's route said so (`fill_pid`).

    The image's ID in a containerd-store engine is the digest of the manifest our stream carries, known from a
    read of the local save: on the first push of an image to such a host the host lists its image IDs, the save is
    read once (cached) and the host judged from its list (push_plan.judge), not asked again. `reporter` shows the
    layer read's progress (the cache's fill, or the save read for the layer map) and each stream's, `note` what a
    read does when it is slow."""

    def __init__(self, client, remotes: list[Remote], image: LocalImage, *, addresses: list[str] | None = None,
                 strategy: str = "auto", compress: str = "auto", thin: bool = True, fill_cache: bool = True,
                 note: Callable[[str], None] | None = None, reporter: Reporter | None = None):
        self.client, self.remotes, self.image = client, remotes, image
        self.addresses = addresses or [r.target.hostname for r in remotes]
        self.strategy, self.compress, self.thin, self.fill_cache = strategy, compress, thin, fill_cache
        self.note, self.reporter = note, reporter or Reporter()
        self.fill_pid: int | None = None
        self._plan: PushPlan | None = None

    def plan(self) -> PushPlan:
        if self._plan is None:
            self._plan = self._decide()
        return self._plan

    def apply(self) -> list[HostResult]:
        """Carry out the plan (made now if `plan()` was not called), then start the cache's fill if it says so."""
        results = apply_plan(self.client, self.remotes, self.plan(), self.reporter)
        if self.fill_cache:
            self.fill_pid = fill_later(self.plan())  # the hosts are done: the cache fills without delaying them
        return results

    def _decide(self) -> PushPlan:
        client, image, thin = self.client, self.image, self.thin
        remotes, addresses = self.remotes, self.addresses
        views = [o.value if o.ok else HostView(remotes[o.item].name, addresses[o.item], error=str(o.error))
                 for o in each(lambda i: observe(remotes[i], image, addresses[i], thin), list(range(len(remotes))))]
        if needs_store_id(image, views):
            image = with_facts(client, image)
            views = [judge(v, image) for v in views]
        by_name = {r.name: r for r in remotes}
        chain = links_to_check(self.strategy, image, views, self.compress)
        broken = check_links([(by_name[v.host], v.address) for v in chain]) if chain else None
        layers = None
        thinned = thin and needs_layer_map(image, views)
        cache = _cache_state(client, image) if thinned and image.tar_source == DOCKER_SAVE else None
        route = choose_route(image, views, cache, strategy=self.strategy, thin=thin, facts_known=facts_known(image),
                             broken_links=broken)
        if thinned:  # the facts of a thin stream: from the launcher's registry, or a read of the save
            image = thin_source(client, image, self.note, route=route, reporter=self.reporter)
            layers = layer_map(client, image)
            route = route_as_read(route, image)
        return plan_push(image, views, strategy=self.strategy, compress=self.compress, thin=thin, layers=layers,
                         broken_links=broken, route=route)


def _cache_state(client, image: LocalImage) -> CacheState:
    try:
        info = client.info()
    except Exception:  # noqa: BLE001 - the engine's push says what is wrong, if anything
        info = None
    try:
        return layer_cache.cache_state(image, info)
    except OSError as e:  # a cache folder that cannot be read: the save route, and why
        return CacheState(unavailable=f"the layer cache cannot be read: {str(e)[:160]}")


def source_image(client, ref: str, note: Callable[[str], None] | None = None) -> LocalImage:
    """The image a push sends. A containerd-store engine's Image ID is not its config digest, and hosts name the
    image by its save's facts: those come from the launcher's registry where it serves (the engine reads only the
    blobs the registry lacks, and copies them: no gzip), else from one read of the save (cached per ID)."""
    image = local_image(client, ref, facts=False)
    if image.store == CONTAINERD and image.facts is None:
        image = thin_source(client, image, note)
    return image


SLOW_NOTE_S = 1.0  # a layer read that takes longer than this says what it does while it runs


def thin_source(client, image: LocalImage, note: Callable[[str], None] | None = None,
                route: RouteChoice | None = None, reporter: Reporter | None = None) -> LocalImage:
    """The image as a thin push reads it, by `route` (push_plan.choose_route; None: the cache where it can serve):
    from the launcher's registry (the engine reads and gzips only the layers it lacks), else the save's facts (one
    read of the whole image, cached), with the reason. `reporter` shows that read as a bar of its own bytes and
    rate; `note` hears one line when it is still running after SLOW_NOTE_S. Where the push's bytes come from is
    decided here, once: the image's `tar_source` (streams.outgoing reads it)."""
    if image.tar_source != DOCKER_SAVE:  # the layer cache serves it already (source_image chose)
        return image
    bars = (reporter or Reporter()).progress()
    with bars as tasks:
        if route is not None and route.route == Route.SAVE:
            return _save_source(client, image, note, tasks, route.reason.removeprefix(CANNOT), route)
        try:
            info = client.info()
        except Exception:  # noqa: BLE001 - the engine's push says what is wrong, if anything
            info = None
        why = cache_server.unavailable(image, info)
        if why is not None:
            return _save_source(client, image, note, tasks, why)
        lacks = route.lacks if route is not None else image.size
        t0 = time.monotonic()
        bar = tasks.add("layer cache fill (engine gzip)", lacks or None) if lacks else None
        timer = _slow_note(note, f"the engine reads and gzips the {size_text(lacks)} of {image.ref} the launcher's "
                                 f"layer cache lacks ({layer_cache.root()}, served by docker-registry on 127.0.0.1 "
                                 "during the push) ...") if lacks else None
        try:
            got = layer_cache.registry_image(client, image, bar.advance if bar else None)
            took = time.monotonic() - t0
            added = got.source.added if got.source else 0
            if bar:
                bar.done(f"filled, {size_text(added)} added")
            filled = f"; filled the layer cache with {size_text(added)}" if added else ""
            return replace(got, source_note=f"new layers read through the launcher's registry ({took:.0f} s{filled})",
                           source=LayerSource("cache", took, added, str(layer_cache.root())))
        except (DockerlaunchError, OSError, ValueError) as e:
            if bar:
                bar.done("failed", ok=False)
            why = str(e)[:200]
        finally:
            if timer:
                timer.cancel()
        return _save_source(client, image, note, tasks, why)


def _save_source(client, image: LocalImage, note: Callable[[str], None] | None, tasks, why: str,
                 route: RouteChoice | None = None) -> LocalImage:
    """The save's facts (one read of the whole image unless cached) for a thin stream, with why the cache was not
    used: the route's reason (the rule chose it), or what kept the cache from serving."""
    t0 = time.monotonic()
    known = facts_known(image)
    bar = None if known else tasks.add("docker save (for the layer map)", image.size or None)
    timer = None if known else _slow_note(note, f"docker save is reading all of {image.ref} for its layer map "
                                                "(where its layers are in the stream) ...")
    try:
        got = with_facts(client, image, bar.advance if bar else None)
    finally:
        if timer:
            timer.cancel()
        if bar:
            bar.done("done")
    if route is not None and route.lacks:
        said = (f"docker save read the whole image; the layer cache lacked {size_text(route.lacks)} of it"
                + (", filled after the push" if route.fill_later else ""))
    else:
        said = f"docker save read the whole image ({why})"
    return replace(got, source_note=said, source=LayerSource("save", time.monotonic() - t0, why=why))


def fill_later(plan: PushPlan) -> int | None:
    """After a push whose route was the save only because the layer cache was cold (RouteChoice.fill_later): a fill
    of the cache with the image in the background (layer_cache.start_fill), so that the next push of its lineage
    reads only its new layers; the push has ended for its hosts. The fill's pid, or None when none was started."""
    if plan.route is None or not plan.route.fill_later or not plan.sending():
        return None
    try:
        return layer_cache.start_fill(plan.image)
    except OSError:  # a cache folder that cannot be written: the next push takes the save route again
        return None


def _slow_note(note: Callable[[str], None] | None, line: str) -> threading.Timer | None:
    if note is None:
        return None
    timer = threading.Timer(SLOW_NOTE_S, note, args=(line,))
    timer.daemon = True
    timer.start()
    return timer


def check_links(chain: list[tuple[Remote, str]], timeout: float = 10.0) -> list[str]:
    """`A cannot reach B:port` for every link of a would-be chain whose TCP connection fails (a firewall,
    a route) -- all links at once, each with a short-lived listener on a port of its own."""
    import secrets

    base = 40000 + secrets.randbelow(19000)
    links = list(zip(chain, chain[1:]))

    def check(k: int) -> str | None:
        (src, _), (dst, addr) = links[k]
        port = str(base + k)
        listener = threading.Thread(target=dst.run, daemon=True, args=(
            ["sh", "-c", 'timeout "$1" nc -l "$2" "$3" >/dev/null 2>&1; true', "sh", f"{timeout:g}", addr, port],),
            kwargs={"timeout": timeout + 30})
        listener.start()
        r = src.run(["sh", "-c", 'i=0; while [ "$i" -lt 8 ]; do nc -z -w 1 "$1" "$2" && exit 0; i=$((i + 1)); '
                     'sleep 0.25; done; exit 1', "sh", addr, port], timeout=timeout + 30)
        listener.join(timeout + 30)
        return None if r.ok else f"{src.name} cannot reach {dst.name} ({addr}:{port})"

    return [o.value if o.ok else f"{links[o.item][0][0].name}: {o.error}"
            for o in each(check, list(range(len(links)))) if not o.ok or o.value]


# ---------------------------------------------------------------- apply


def _tag(remote: Remote, image: LocalImage, t: HostTransfer, delivered: bool = False) -> HostResult:
    """Tag the Image ID the host has (untagged, or `delivered` by an earlier push whose load finished after its cut)."""
    r = remote.run(["docker", "tag", t.expect_id, image.ref], timeout=60)
    if not r.ok:
        return HostResult.of(t.host, Outcome.FAILED_TAG, f"tagging: {r.last_line()}")
    said = f"had {t.expect_id[7:19]} untagged; tagged {image.ref}"
    if delivered:
        return HostResult.of(t.host, Outcome.DELIVERED, f"{said} (an earlier push had delivered it)")
    return HostResult.of(t.host, Outcome.TAGGED, said)


def _thin_note(t: HostTransfer, image: LocalImage | None = None) -> str:
    if not t.layers_skipped:
        return ""
    source = f" ({image.source_note})" if image is not None and image.source_note else ""
    return f", thin: {t.layers_skipped} of {t.layers} layers already there{source}"


def _resume_point(client, image: LocalImage, t: HostTransfer, facts: StageFacts,
                  on_read: Callable[[int], None] | None = None) -> tuple[int, Iterator[bytes]]:
    """(offset, the stream's chunks after it, compressed as it travels): the host's staged prefix is used when its
    bytes are this stream's own (sha256 of the same prefix, computed here from a fresh stream: zstd's output is the
    same for the same input, however it is chunked and however many threads make it), else the stream starts at 0."""
    offsets, chunks, _ = resume_points(lambda: outgoing(client, image, set(t.skip_files), t.compression or "none",
                                                        on_bytes=on_read), [(facts.staged, facts.digest)])
    return offsets[0], chunks


def send_chain(client, remotes: list[Remote], image: LocalImage, links: list[HostTransfer],
               on_bytes: Callable[[int], None] | None = None,
               on_read: Callable[[int], None] | None = None) -> list[HostResult]:
    """A chain push (chain.push_chain) whose hosts keep what they receive, from STAGE_MIN bytes, as a star
    push's do: a chain cut anywhere (a link, a relay, the launcher) leaves each host the prefix it got, and the
    next chain over them sends each only the rest. A host whose load finished after the cut is only tagged.
    `on_bytes` hears the bytes the head's stream carries, `on_read` those it reads of the image (streams.outgoing)."""
    results: dict[str, HostResult] = {}
    go: list[int] = []
    stages: list[tuple[str, int, str]] = []  # key ("-": not staged), staged size, its sha256
    notes: dict[str, str] = {}
    if image.size >= stage_min():
        def look(i: int) -> StagePick:
            t = links[i]
            return pick_stage(remotes[i], chain_key(t), t.expect_id, t.bytes_to_send)

        for i, (t, o) in enumerate(zip(links, each(look, list(range(len(links)))))):
            if not o.ok:
                results[t.host] = HostResult.of(t.host, Outcome.FAILED, str(o.error)[:300])
                continue
            pick: StagePick = o.value
            if pick.delivered:
                results[t.host] = _tag(remotes[i], image, t, delivered=True)
                continue
            if pick.note:
                notes[t.host] = f"; {pick.note}"
            go.append(i)
            stages.append((chain_key(t), pick.facts.staged, pick.facts.digest) if pick.staged else ("-", 0, "-"))
    else:
        go = list(range(len(links)))
        stages = [("-", 0, "-")] * len(links)
    if go:
        head = links[go[0]]
        mode = head.compression or "none"
        offsets, chunks, sha = resume_points(lambda: outgoing(client, image, set(head.skip_files), mode,
                                                              on_bytes=on_read),
                                             [(size, digest) for _, size, digest in stages])
        chained = push_chain(client, [remotes[i] for i in go], image, [links[i] for i in go], on_bytes=on_bytes,
                             stages=[(key, off) for (key, _, _), off in zip(stages, offsets)], chunks=chunks,
                             sha=sha)
        for i, r, (key, _, _), off in zip(go, chained, stages, offsets):
            if not r.failed:
                resumed = f", resumed at {off / 1e6:.0f} MB staged on the host" if off else ""
                r = replace(r, detail=r.detail + resumed + notes.get(r.host, ""),
                            outcome=Outcome.RESUMED if off else r.outcome)
            elif key != "-" and stage_goes(r.outcome, whole=True):  # a chain host that was not cut had it all
                remove_stage(remotes[i], key)
            results[r.host] = r
    return [results[t.host] for t in links]


def send_star(client, remote: Remote, image: LocalImage, t: HostTransfer,
              on_bytes: Callable[[int], None] | None = None, stop: threading.Event | None = None,
              on_read: Callable[[int], None] | None = None, on_sent: Callable[[], None] | None = None) -> HostResult:
    """One star stream: save (thinned, compressed) -> SSH stdin -> load.sh (load, verify ID, tag). From
    STAGE_MIN bytes the host stages the stream as it arrives, and a push cut off resumes where it stopped.
    `on_bytes` hears the bytes on the wire, `on_read` those it reads of the image (streams.outgoing); `on_sent` is
    called once the stream's last byte has left (the host's docker load and ID check follow)."""
    t0 = time.monotonic()
    mode = t.compression or "none"
    staged = image.size >= stage_min()
    extra: list[str] = []
    offset, note = 0, ""
    if staged:
        key = stage_key(t)
        try:
            pick = pick_stage(remote, key, t.expect_id, t.bytes_to_send)
        except DockerlaunchError as e:
            return HostResult.of(remote.name, Outcome.FAILED, str(e)[:300])
        if pick.delivered:
            return replace(_tag(remote, image, t, delivered=True), host=remote.name)
        staged, note = pick.staged, pick.note
        if staged:
            offset, chunks = _resume_point(client, image, t, pick.facts, on_read)
            extra = [key, str(offset)]
        else:
            note = f"; {note}"
    if not staged:
        chunks = outgoing(client, image, set(t.skip_files), mode, on_bytes=on_read)
    chunks = prefetched(chunks)
    reader = CountingReader(_ended(chunks, on_sent) if on_sent else chunks, on_bytes)
    out, err = bytearray(), bytearray()
    status = remote.stream(["sh", "-c", script("load.sh"), "sh", t.expect_id, image.ref, mode, *extra],
                           out.extend, err.extend, stdin=reader, stop=stop, bulk=True)
    took, streamed = time.monotonic() - t0, stream_seconds(reader, t0)
    if status != 0:
        reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {status}"]
        # the engine's own words are the only sign of a full disk (ENOSPC): read once, here, into the outcome
        outcome = load_outcome(status, disk_full="no space left" in reason[0])
        if outcome == Outcome.FAILED_DISK_FULL:
            reason = [f"the host's disk filled up during docker load: free space there (docker image prune, "
                      f"docker builder prune) and push again ({reason[0][-120:]})"]
        if staged and stage_goes(outcome, whole=reader.finished is not None):
            remove_stage(remote, extra[0])
        return HostResult.of(remote.name, outcome, reason[0][:300] + note, reader.count, took, streamed)
    resumed = f", resumed at {offset / 1e6:.0f} MB staged on the host" if offset else ""
    resumed += _carrier(remote)
    return HostResult.of(remote.name, Outcome.RESUMED if offset else Outcome.SENT,
                         f"{t.compression}{_thin_note(t, image)}, image {image.size / 1e6:.0f} MB, "
                         f"Image ID {t.expect_id[7:19]} verified{resumed}{note}",
                         reader.count, took, streamed)


def _read_total(image: LocalImage, t: HostTransfer) -> int | None:
    """What a stream reads (its bar's total): the whole save for `docker save`, the layers it sends for the cache."""
    return (image.size if image.tar_source == DOCKER_SAVE else t.bytes_to_send) or None


def _ended(chunks: Iterator[bytes], on_end: Callable[[], None]) -> Iterator[bytes]:
    yield from chunks
    on_end()


def _carrier(remote: Remote) -> str:
    from dockerlaunch.hosts import openssh

    if remote.target.local:
        return ""  # this machine: a local process, no SSH at all
    why = openssh.unusable(remote.target)
    return ", over OpenSSH" if why is None else f", over paramiko ({why[:80]})"


def push_to_host(client, remote: Remote, image: LocalImage, compress: str = "auto", thin: bool = True,
                 on_bytes: Callable[[int], None] | None = None) -> HostResult:
    """Plan and push one host (star); the layer cache is left as it is."""
    return Push(client, [remote], image, strategy="star", compress=compress, thin=thin, fill_cache=False).apply()[0]


def apply_plan(client, remotes: list[Remote], plan: PushPlan, reporter: Reporter | None = None) -> list[HostResult]:
    """Carry out a plan (Push.apply): tags, the chain, star streams; what follows a failure is the fallback rules'
    (push_plan): a cut chain runs once more over the hosts it cut off, a chain host still failed gets its planned
    star push, a thin star stream the engine refused is sent whole once."""
    reporter = reporter or Reporter()
    image = plan.image
    by_name = {r.name: r for r in remotes}
    # each bar counts what its stream reads (streams.outgoing), at the rate it reads it: `docker save` reads the
    # whole image however little of it goes (a thin stream to 2 kB is a read of the image), the cache only the layers
    # it sends
    results: dict[str, HostResult] = {}
    for t in plan.hosts:
        if t.action == Action.SKIP:
            results[t.host] = HostResult.of(t.host, Outcome.SKIPPED, t.reason)
        elif t.action == Action.FAIL:
            results[t.host] = HostResult.of(t.host, Outcome.FAILED_PLANNED, t.reason)
    tags = [t for t in plan.hosts if t.action == Action.TAG]
    for t, o in zip(tags, each(lambda t: _tag(by_name[t.host], image, t), tags)):
        results[t.host] = o.value if o.ok else HostResult.of(t.host, Outcome.FAILED_TAG, str(o.error))

    with reporter.progress() as bars:
        star = plan.sending(Strategy.STAR)
        chain_failed: dict[str, HostResult] = {}
        links = plan.sending(Strategy.CHAIN)
        if links:
            bar = bars.add(f"chain of {len(links):<9}", _read_total(image, links[0]))

            def chain(links: list[HostTransfer]) -> list[HostResult]:
                try:
                    return send_chain(client, [by_name[t.host] for t in links], image, links, on_read=bar.advance)
                except DockerlaunchError as e:
                    return [HostResult.of(t.host, Outcome.FAILED, str(e)) for t in links]

            chained = chain(links)
            again = chain_again(chained)
            if again:
                second = {r.host: r for r in chain([t for t in links if t.host in again])}
                chained = [after_fallback(r, Fallback.CHAIN_AGAIN, second[r.host]) if r.host in second else r
                           for r in chained]
            bar.done(ok=not any(r.failed for r in chained))
            for r in chained:
                if r.failed:
                    chain_failed[r.host] = r
                else:
                    results[r.host] = r
            star = star + [plan.fallback[h] for h in star_after_chain(chained)]

        def one(t: HostTransfer) -> HostResult:
            bar = bars.add(f"{t.host:<18}", _read_total(image, t))
            try:
                res = send_star(client, by_name[t.host], image, t, on_read=bar.advance,
                                on_sent=lambda: bar.phase("sent; docker load on the host"))
            except DockerlaunchError as e:
                res = HostResult.of(t.host, Outcome.FAILED, str(e))
            bar.done(str(res.status), ok=not res.failed)
            return res

        for t, o in zip(star, each(one, star, max_workers=STAR_WINDOW)):
            results[t.host] = o.value if o.ok else HostResult.of(t.host, Outcome.FAILED, str(o.error))

        whole = [w for w in (send_whole(t, results[t.host], image) for t in star) if w is not None]
        for t, o in zip(whole, each(one, whole, max_workers=STAR_WINDOW)):
            res = o.value if o.ok else HostResult.of(t.host, Outcome.FAILED, str(o.error))
            results[t.host] = after_fallback(results[t.host], Fallback.WHOLE, res)
    for host, r in chain_failed.items():  # said last: the whole resend above reads the star push's own outcome
        results[host] = after_fallback(r, Fallback.STAR, results.get(host) or HostResult.of(
            host, Outcome.FAILED, "no star push was planned"))
    return [results[t.host] for t in plan.hosts]


def push(client, remotes: list[Remote], ref: str, compress: str = "auto", reporter: Reporter | None = None,
         thin: bool = True, strategy: str = "auto", addresses: list[str] | None = None) -> list[HostResult]:
    """`Push` of the local image `ref`, planned and applied (the layer cache is left as it is): star (the launcher
    streams to every host) or chain (one copy leaves the launcher, each host relays it to the next)."""
    return Push(client, remotes, source_image(client, ref), addresses=addresses, strategy=strategy,
                compress=compress, thin=thin, fill_cache=False, reporter=reporter).apply()


IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
COPY_STDERR_KEEP = 4096  # of each host's stderr during a copy: its first bytes (the line that says why)


def _first_bytes(into: bytearray) -> Callable[[bytes], None]:
    return lambda chunk: into.extend(chunk[:max(0, COPY_STDERR_KEEP - len(into))])


def copy_between(src: Remote, dst: Remote, ref: str, *, expect_id: str | None = None) -> str:
    """The image from one host's engine to another's, through the launcher (no registry, no docker here): `docker
    save <id>` on `src`, re-streamed here by untagged_chunks (one image, no tag of the source's stream: its
    RepoTags, `repositories` and index annotations never reach `dst`'s engine), into `dst`'s load.sh, which checks
    the Image ID before it sets the tag; then `dst`'s `ref` is read back and must be that ID. For a spare that
    takes a rank: the launcher's machine may have no engine, a host of the job has the image.

    `expect_id`: the Image ID the run was planned with (the caller's, never the source's word): a source whose
    `ref` is another ID is refused in one line naming both, before anything is sent. Without it, the source's ID
    (as before); the stream is re-streamed and the spare checked all the same."""
    where = f"copying {ref} from {src.name} to {dst.name}"
    if expect_id is not None and not IMAGE_ID.fullmatch(expect_id):
        raise TransferError(f"{where}: the expected Image ID {expect_id[:80]!r} is not a sha256 digest")
    r = src.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], timeout=60)
    if not r.ok:
        raise TransferError(f"host {src.name}: no image {ref} to copy from: {r.last_line()}")
    held = r.stdout.strip()
    if not IMAGE_ID.fullmatch(held):
        raise TransferError(f"{where}: {src.name}'s engine named no Image ID for it ({held[:80]!r})")
    if expect_id is not None and held != expect_id:
        raise TransferError(f"{where}: {src.name} holds {ref} as {held}, not the run's {expect_id}: not copied")
    image_id = held
    q: queue.Queue = queue.Queue(maxsize=16)
    save_failed: list[BaseException] = []
    refused: list[TransferError] = []
    stop = threading.Event()  # the copy is over: the save stops, what it still sends is dropped

    def put(item: bytes | None) -> None:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def save() -> None:
        err = bytearray()
        try:
            status = src.stream(["docker", "save", image_id], lambda b: put(bytes(b)), _first_bytes(err), stop=stop)
            if status != 0 and not stop.is_set():
                save_failed.append(TransferError(f"host {src.name}: docker save: "
                                                 f"{err.decode(errors='replace').strip()[-200:] or status}"))
        except Exception as e:  # noqa: BLE001 - reported below
            save_failed.append(e)
        finally:
            put(None)

    def saved() -> Iterator[bytes]:
        while True:
            try:
                item = q.get(timeout=0.2)
            except queue.Empty:
                if stop.is_set():
                    raise TransferError("the copy stopped") from None
                continue
            if item is None:
                if save_failed:
                    raise TransferError(str(save_failed[0]))
                return
            yield item

    def recorded(chunks: Iterator[bytes]) -> Iterator[bytes]:
        try:
            yield from chunks
        except TransferError as e:
            if not stop.is_set():  # a refusal, not the end of a copy already over
                refused.append(e)
            raise

    t0 = time.monotonic()
    reader = CountingReader(recorded(untagged_chunks(saved(), image_id=image_id)))
    saver = threading.Thread(target=save, daemon=True, name="dl-copy-save")
    saver.start()
    out, err = bytearray(), bytearray()
    failed = ""
    try:
        status = dst.stream(["sh", "-c", script("load.sh"), "sh", image_id, ref, "none"], _first_bytes(out),
                            _first_bytes(err), stdin=reader)
    except DockerlaunchError as e:
        status, failed = -1, str(e)
    finally:
        stop.set()
        saver.join(timeout=30)
        _drain(reader)
    if save_failed:
        raise TransferError(f"{where}: {str(save_failed[0])[:300]}; nothing was tagged")
    if refused:
        why = str(refused[0]).removeprefix("re-streaming the image failed: ")
        raise TransferError(f"{where}: the image tar {src.name} sent was refused: {why[:300]}; nothing was tagged")
    if status != 0:
        why = failed or (err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {status}"])[0]
        raise TransferError(f"{where}: {why[:300]}")
    got = dst.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], timeout=60)
    now = got.stdout.strip() if got.ok else ""
    if now != image_id:
        raise TransferError(f"{where}: after the load, {dst.name}'s {ref} is "
                            f"{now[:71] if IMAGE_ID.fullmatch(now) else 'not an image it can name'}, not {image_id}")
    return (f"{ref} copied from {src.name} to {dst.name}: {reader.count / 1e6:.0f} MB in "
            f"{time.monotonic() - t0:.1f}s, Image ID {image_id[7:19]} verified")


def _drain(reader: CountingReader) -> None:
    """What a load that ended early left of the re-streamed tar, read to its end (the save has stopped: a few
    chunks), so the re-streaming thread ends; a reader another thread is still inside is left to it."""
    for _ in range(100):
        try:
            while reader.read(1 << 20):
                pass
            return
        except ValueError:  # the SSH writer thread is still inside the generator
            time.sleep(0.05)
        except Exception:  # noqa: BLE001 - the truncated stream's own error, reported by its cause above
            return
