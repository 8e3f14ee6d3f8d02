"""Push, planned: what each host gets (nothing, a tag, a star stream or a chain link), how, and how much, and what
follows when a host fails.

Pure: `HostView`s (what each host told us, see `push.observe`) + the local image + the user's choices
in, a `PushPlan` out. `push --dry-run` prints it; `push.Push.apply` carries it out, and after a failure asks the
fallback rules at the end of this file (a cut chain runs again, a broken chain falls back to star, a refused thin
stream is sent whole, a stage goes), which read each host's `Outcome`, never its words. Deciding here, apart from
the I/O, is what lets every choice (auto strategy, compression, thin layers, fallbacks) be unit-tested.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import Enum

from dockerlaunch.enums import StrEnum
from dockerlaunch.transfer.image_facts import CONTAINERD, GRAPHDRIVER, LocalImage
from dockerlaunch.transfer.oci import chain_ids

CHAIN_MIN_HOSTS = 3  # below this a chain saves nothing over star: the launcher's uplink carries <= 2 copies


class Action(StrEnum):
    SKIP = "skip"  # the tag already points at this Image ID
    TAG = "tag"  # the Image ID is there under another name: tag only
    SEND = "send"  # stream the image
    FAIL = "fail"  # cannot be done (the reason says why)


class Strategy(StrEnum):
    STAR = "star"  # the launcher streams to each host
    CHAIN = "chain"  # one stream to the first host; each host relays to the next


class PushState(StrEnum):
    """How a host ended (push and load)."""

    PUSHED = "pushed"
    LOADED = "loaded"
    SKIPPED = "skipped"
    TAGGED = "tagged"
    FAILED = "failed"


class Outcome(StrEnum):
    """How one host ended, finer than its PushState (the word the table and `--output json` show): what the fallback
    rules below read. Set from what happened (the plan, the scripts' exit statuses), never from a message."""

    SKIPPED = "skipped"  # its tag already pointed at the Image ID
    TAGGED = "tagged"  # the Image ID was there under another name: tagged only
    DELIVERED = "delivered"  # an earlier push's load had finished after that push was cut: tagged only
    SENT = "sent"  # a stream (star or chain link) loaded, its Image ID checked, then tagged
    RESUMED = "resumed"  # the same, after the prefix of the stream the host had staged
    LOADED = "loaded"  # a bundle loaded (`load`)
    FAILED_PLANNED = "failed_planned"  # the plan could not send to it (not asked, no zstd): nothing was tried
    FAILED_CUT = "failed_cut"  # its stream stopped before its end: what arrived is staged, the next try sends the rest
    FAILED_LOAD = "failed_load"  # its docker load refused the stream (a thin stream with a layer the engine lacks)
    FAILED_VERIFY = "failed_verify"  # loaded, but not as the planned Image ID (or not at all)
    FAILED_DISK_FULL = "failed_disk_full"  # the host's disk filled up during docker load
    FAILED_TAG = "failed_tag"  # the image is there; setting its tag failed
    FAILED = "failed"  # anything else: SSH, a stage question, a chain that could not start, a stranger on a link

    @property
    def state(self) -> PushState:
        return _STATE.get(self, PushState.FAILED)


_STATE = {Outcome.SKIPPED: PushState.SKIPPED, Outcome.TAGGED: PushState.TAGGED, Outcome.DELIVERED: PushState.TAGGED,
          Outcome.SENT: PushState.PUSHED, Outcome.RESUMED: PushState.PUSHED, Outcome.LOADED: PushState.LOADED}
_DEFAULT_OUTCOME = {PushState.PUSHED: Outcome.SENT, PushState.LOADED: Outcome.LOADED,
                    PushState.SKIPPED: Outcome.SKIPPED, PushState.TAGGED: Outcome.TAGGED,
                    PushState.FAILED: Outcome.FAILED}


class Fallback(StrEnum):
    """What apply did after a host failed (the rules below decide it), carried on its result in order."""

    CHAIN_AGAIN = "chain again"  # a cut chain: one more chain of the hosts it cut off, each resuming from its stage
    STAR = "star after the chain"  # a chain host that still failed: the star push its plan holds for it
    WHOLE = "sent in full"  # a thin star stream its engine refused: the whole image, once


@dataclass
class HostResult:
    """How one host ended, for the summary table and `--output json` (`outcome` and `fallbacks` are not in it)."""

    host: str
    status: PushState
    detail: str = ""
    bytes_sent: int = 0
    seconds: float = 0.0
    stream_seconds: float = 0.0  # until the last byte left the launcher; the rest is the host's docker load
    outcome: Outcome | None = None  # None: the status's own (SENT for pushed, FAILED for failed, ...)
    fallbacks: tuple[Fallback, ...] = ()  # what apply did after failures, in order (the detail says why)

    def __post_init__(self) -> None:
        if self.outcome is None:
            self.outcome = _DEFAULT_OUTCOME[self.status]
        elif self.outcome.state != self.status:
            raise ValueError(f"outcome {self.outcome} is not {self.status}")

    @classmethod
    def of(cls, host: str, outcome: Outcome, detail: str = "", bytes_sent: int = 0, seconds: float = 0.0,
           stream_seconds: float = 0.0) -> HostResult:
        """A result named by its outcome (its status follows from it)."""
        return cls(host, outcome.state, detail, bytes_sent, seconds, stream_seconds, outcome)

    @property
    def failed(self) -> bool:
        return self.status == PushState.FAILED

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("outcome")
        d.pop("fallbacks")
        return {**d, "status": str(self.status)}


@dataclass(frozen=True)
class HostView:
    """What one host told us before a push (`push.observe`); `error` if it could not be asked."""

    host: str
    address: str = ""  # where the previous host of a chain reaches it
    tag_id: str = ""  # the Image ID its tag points at ("" if the tag is absent)
    has_id: bool = False  # the pushed Image ID is present (under any name)
    store: str = GRAPHDRIVER  # its engine's image store: which ID the image has there (LocalImage.expected_id)
    zstd: bool = False
    relay: bool = False  # OpenBSD nc -N and mkfifo: can be a chain link
    chain_ids: frozenset[str] | None = None  # every layer chain ID it has (None: not asked, --full)
    error: str | None = None
    # every image ID its store holds, listed only while the launcher cannot name the image's ID in that store (a
    # containerd store before the save's facts are read): `judge` tells `has_id` from it once they are
    ids: frozenset[str] | None = None


@dataclass
class HostTransfer:
    """The plan for one host."""

    host: str
    action: Action
    address: str = ""  # where the previous link of a chain reaches this host
    strategy: Strategy | None = None
    compression: str | None = None  # zstd | none
    link: int | None = None  # position in the chain (0 = head)
    next_host: str | None = None  # the chain's next host (None for the tail)
    layers: int = 0
    layers_skipped: int = 0
    skip_files: list[str] = field(default_factory=list)  # layer files left out of the stream
    expect_id: str = ""  # the Image ID the host must show after loading (its store's; "" when not sending)
    bytes_to_send: int = 0  # before compression; from the launcher for star/chain head, from a peer for links
    reason: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("skip_files")
        return {k: (str(v) if isinstance(v, Enum) else v) for k, v in d.items()}


@dataclass
class PushPlan:
    image: LocalImage
    strategy: Strategy
    hosts: list[HostTransfer]
    route: RouteChoice | None = None  # where the stream's layers are read (None: nothing is sent)
    # per chain host, the star push it gets if the chain does not reach it (planned with the chain: `star_fallback`)
    fallback: dict[str, HostTransfer] = field(default_factory=dict)

    def sending(self, strategy: Strategy | None = None) -> list[HostTransfer]:
        return [h for h in self.hosts if h.action == Action.SEND and (strategy is None or h.strategy == strategy)]

    @property
    def launcher_bytes(self) -> int:
        """What leaves the launcher: every star stream plus the chain's head stream."""
        return sum(h.bytes_to_send for h in self.sending() if h.strategy == Strategy.STAR or h.link == 0)

    def to_dict(self) -> dict:
        return {
            "image": self.image.ref, "image_id": self.image.id, "image_bytes": self.image.size,
            "strategy": str(self.strategy), "launcher_bytes": self.launcher_bytes,
            "hosts": [h.to_dict() for h in self.hosts],
            # how a thin plan read the new layers: through the layer cache (bytes it added) or docker save
            "layer_source": self.image.source.to_dict() if self.image.source else None,
            # where the layers are read, decided before any was (choose_route), and why
            "layer_route": self.route.to_dict() if self.route else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _compression(choice: str, views: list[HostView]) -> str:
    """auto: zstd if every receiver of one stream has it; zstd: required (checked per host before)."""
    if choice == "none":
        return "none"
    return "zstd" if all(v.zstd for v in views) else "none"


def thin_layers(image: LocalImage, have: frozenset[str] | None, layers: list[tuple[str, int]] | None
          ) -> tuple[list[str], int]:
    """(layer files to leave out, bytes to send) given the chain IDs the receivers all have.

    Two layers with the same content share one file in the save tar: a file is left out only when no
    layer that the receivers lack uses it, and it is counted once."""
    if not have or layers is None:
        return [], image.size
    chains = chain_ids(list(image.diff_ids))
    needed = {f: n for (f, n), c in zip(layers, chains) if c not in have}
    skip = sorted({f for (f, _), c in zip(layers, chains) if c in have and f not in needed})
    if not skip:
        return [], image.size
    return skip, sum(needed.values())


def needs_layer_map(image: LocalImage, views: list[HostView]) -> bool:
    """Only a thin push that can skip a layer for a host that needs the image needs the save's layer map
    (one full local read, cached per Image ID)."""
    chains = set(chain_ids(list(image.diff_ids)))
    receivers = [v for v in views if not v.error and not _up_to_date(image, v) and not v.has_id]
    return any(v.chain_ids and chains & v.chain_ids for v in receivers)


def _up_to_date(image: LocalImage, v: HostView) -> bool:
    return bool(v.tag_id) and v.tag_id == image.expected_id(v.store)


def senders(image: LocalImage, views: list[HostView], compress: str = "auto") -> list[HostView]:
    """The hosts the image is streamed to, in order (a chain links them so): every host that answered and lacks it,
    but one that --compress zstd cannot reach."""
    return [v for v in views if not v.error and not _up_to_date(image, v) and not v.has_id
            and not (compress == "zstd" and not v.zstd)]


def needs_store_id(image: LocalImage, views: list[HostView]) -> bool:
    """A host with containerd's store answered, and the launcher cannot name the image's ID there yet (the digest
    of the manifest the stream carries: the save's facts, read once and cached). Such a host listed its image IDs
    (`HostView.ids`): with the facts read, `judge` decides it without asking it again."""
    return not image.expected_id(CONTAINERD) and any(v.store == CONTAINERD and not v.error for v in views)


def judge(view: HostView, image: LocalImage) -> HostView:
    """`has_id` of a host that listed its image IDs, now that `image` names its ID in the host's store."""
    if view.ids is None or view.error:
        return view
    want = image.expected_id(view.store)
    return replace(view, has_id=bool(want) and (view.has_id or want in view.ids))


def links_to_check(requested: str, image: LocalImage, views: list[HostView], compress: str = "auto"
                   ) -> list[HostView]:
    """The hosts an auto chain would link, in order, whose links are checked over TCP before anything is decided
    (`choose_strategy` takes the answer as `broken_links`); none when no chain is in question (star asked for, a
    chain asked for, fewer than CHAIN_MIN_HOSTS senders, a host that cannot relay)."""
    if requested != "auto":
        return []
    chain = senders(image, views, compress)
    return chain if choose_strategy(requested, chain)[0] == Strategy.CHAIN else []


def choose_strategy(requested: str, senders: list[HostView], broken_links: list[str] | None = None
                    ) -> tuple[Strategy, str]:
    """auto: chain for 3+ hosts that need the image, when every one of them can relay and (once checked,
    `broken_links`) each reaches the next over TCP."""
    if requested == "star":
        return Strategy.STAR, "asked for"
    if requested == "chain":
        return Strategy.CHAIN, "asked for"
    if len(senders) < CHAIN_MIN_HOSTS:
        return Strategy.STAR, f"{len(senders)} host(s) need the image (chain from {CHAIN_MIN_HOSTS})"
    cannot = [v.host for v in senders if not v.relay]
    if cannot:
        return Strategy.STAR, f"{', '.join(cannot)} cannot relay (needs OpenBSD nc -N and mkfifo)"
    if broken_links:
        return Strategy.STAR, f"{'; '.join(broken_links)} over TCP (a chain needs each host to reach the next)"
    return Strategy.CHAIN, f"{len(senders)} hosts need the image"


# ---------------------------------------------------------------- where the layers are read


class Route(StrEnum):
    CACHE = "cache"  # the engine pushes what the launcher's layer cache lacks into it; streams are made of its blobs
    SAVE = "save"  # `docker save`: the whole image read once per stream (and once before, for its layer map)


# What the engine's push into the layer cache costs per byte it lacks (read and gzip, one core a layer) against a
# `docker save` read of a byte: 3.7 on the 7.7 GB CUDA image, 6 on the sim's demo image (benchmarks/RESULTS.md,
# "Issue 43, step 1" and "Issue 58: the first push of a new image"). A containerd-store engine copies its blobs: 1.
FILL_COST = 5
SOURCE_ENV = "DOCKERLAUNCH_LAYER_SOURCE"  # auto (this rule), cache (always through the cache), save (never)
CANNOT = "the layer cache cannot serve here: "  # a route's reason, then why (cache_server.unavailable's words)


@dataclass(frozen=True)
class CacheState:
    """What the launcher's layer cache can do for one image now (`layer_cache.cache_state` reads it; I/O there)."""

    unavailable: str | None = None  # why it cannot serve here (no docker-registry, a remote engine, ...); None: it can
    held: Mapping[str, int] = field(default_factory=dict)  # diff ID -> bytes, for every layer it holds
    filling: str = ""  # a fill in the background holds it now (who, what): a push never waits for one
    forced: bool = False  # DOCKERLAUNCH_LAYER_SOURCE=cache: through the cache, whatever it lacks
    copies: bool = False  # the launcher's engine pushes its blobs as they are (containerd's store): no gzip


@dataclass(frozen=True)
class RouteChoice:
    """Where a push reads the image's layers, and why (`choose_route`)."""

    route: Route
    reason: str
    holds: int = 0  # bytes of the image's layers the cache holds
    lacks: int = 0  # bytes the engine would read and gzip into the cache first
    save_reads: int = 0  # whole-image `docker save` reads the save route makes for this push
    fill_later: bool = False  # the cache lacks what makes it dearer now: it is filled after the push, in the background

    def to_dict(self) -> dict:
        return {**asdict(self), "route": str(self.route)}


def size_text(n: int) -> str:
    """Bytes for a person: kB below 1 MB (a bump of a few kB is not "0 MB"), MB below 10 GB, GB above."""
    if n < 1e6:
        return f"{n / 1e3:.0f} kB" if n >= 1e3 else f"{n} bytes"
    return f"{n / 1e6:.0f} MB" if n < 1e10 else f"{n / 1e9:.1f} GB"


def choose_route(image: LocalImage, views: list[HostView], cache: CacheState | None, *, strategy: str = "auto",
                 thin: bool = True, facts_known: bool = False, broken_links: list[str] | None = None
                 ) -> RouteChoice | None:
    """Through the layer cache or by `docker save`, decided by what the cache holds and what the hosts lack (None:
    no host needs the image). The save route reads the whole image once per stream the launcher sends (one for a
    chain, one per host for star) and once before, for the layer map a thin stream needs (unless an earlier read
    left it: `facts_known`). The cache route first has the engine read and gzip every layer the cache lacks, at
    about FILL_COST times a save's time per byte, then makes each stream of only the layers its hosts lack. The
    cache route is taken when that fill costs no more than the save route's reads, so a push is never slower for
    a cold cache than `docker save`; when the cache is dearer only because it is cold, `fill_later` says to fill it
    after the push, in the background, so that the next push of the lineage reads only its new layers."""
    receivers = [v for v in views if not v.error and not _up_to_date(image, v) and not v.has_id]
    if not receivers:
        return None
    if not thin:
        return RouteChoice(Route.SAVE, "--full: every layer is sent, read by one docker save per stream")
    if image.source is not None and image.source.via == "cache":
        return RouteChoice(Route.CACHE, "read through the layer cache when the image was read (a containerd-store "
                                        "engine pushes its blobs into it as they are, and only so are its facts "
                                        "known without a read of the save)")
    if not needs_layer_map(image, views):
        return RouteChoice(Route.SAVE, "no host that needs the image has any of its layers: each stream is the "
                                       "whole image, read by docker save")
    if cache is None or cache.unavailable:
        return RouteChoice(Route.SAVE, CANNOT + (cache.unavailable if cache else "?"))
    wanted = list(dict.fromkeys(image.diff_ids))
    holds = sum(cache.held[d] for d in wanted if d in cache.held)
    lacks = 0 if all(d in cache.held for d in wanted) else max(1, image.size - holds)
    chained = choose_strategy(strategy, receivers, broken_links)[0] == Strategy.CHAIN
    streams = 1 if chained else len(receivers)
    reads = streams + (0 if facts_known else 1)
    what = (f"{reads} docker save read(s) of the whole image ({'' if facts_known else 'its layer map, '}"
            f"{'one chain' if chained else f'{streams} star stream(s)'})")
    sizes = dict(holds=holds, lacks=lacks, save_reads=reads)
    missing = sum(1 for d in wanted if d not in cache.held)
    short = (f"the layer cache lacks {size_text(lacks)} of the image's {size_text(image.size)} ({missing} of its "
             f"{len(wanted)} layers)")
    if cache.forced:
        return RouteChoice(Route.CACHE, f"{SOURCE_ENV}=cache; {short}", **sizes)
    if cache.filling:
        return RouteChoice(Route.SAVE, f"the layer cache is being filled now ({cache.filling}): a push does not wait "
                                       "for it", **sizes)
    cost = 1 if cache.copies else FILL_COST
    if not lacks:
        return RouteChoice(Route.CACHE, f"the layer cache holds all {len(wanted)} of its layers: the engine reads "
                                        "none of them", **sizes)
    if lacks * cost <= image.size * reads:
        return RouteChoice(Route.CACHE, f"{short}: the engine reads and gzips that for less than the {what} the "
                                        "save route makes", **sizes)
    return RouteChoice(Route.SAVE, f"{short}: filling it first (the engine reads and gzips it, about {cost} x a "
                                   f"docker save's time per byte) would cost more than the {what} this push makes; "
                                   "the cache is filled in the background after the push", fill_later=True, **sizes)


def plan_push(
    image: LocalImage, views: list[HostView], *, strategy: str = "auto", compress: str = "auto",
    thin: bool = True, layers: list[tuple[str, int]] | None = None, broken_links: list[str] | None = None,
    route: RouteChoice | None = None,
) -> PushPlan:
    """Per host: skip / tag / star / chain link, compression and the layers left out.

    `layers` is the save's layer map ((file, bytes) in RootFS order); without it nothing is left out. `route`
    (choose_route) is carried as it is: where the layers were read was decided before they were.
    """
    out: list[HostTransfer] = []
    sending = senders(image, views, compress)
    streamed = {v.host for v in sending}
    for v in views:
        if v.error:
            out.append(HostTransfer(v.host, Action.FAIL, reason=v.error))
        elif _up_to_date(image, v):
            out.append(HostTransfer(v.host, Action.SKIP, reason=f"already has {v.tag_id[7:19]}"))
        elif v.has_id:
            have = image.expected_id(v.store)
            out.append(HostTransfer(v.host, Action.TAG, expect_id=have,
                                    reason=f"had {have[7:19]} untagged; tagged {image.ref}"))
        elif v.host in streamed:
            out.append(HostTransfer(v.host, Action.SEND, expect_id=image.expected_id(v.store)))
        else:  # what `senders` leaves out beyond the above: --compress zstd where zstd is not installed
            out.append(HostTransfer(v.host, Action.FAIL, reason="--compress zstd but zstd is not installed there"))
    chosen, why = choose_strategy(strategy, sending, broken_links)
    by_host = {h.host: h for h in out}
    plan = PushPlan(image, chosen, out, route)
    if chosen == Strategy.CHAIN and sending:
        mode = _compression(compress, sending)
        common = (frozenset.intersection(*[v.chain_ids for v in sending])
                  if thin and all(v.chain_ids is not None for v in sending) else None)
        skip, size = thin_layers(image, common, layers)
        for i, v in enumerate(sending):
            by_host[v.host].__dict__.update(
                strategy=Strategy.CHAIN, compression=mode, link=i, address=v.address,
                next_host=sending[i + 1].host if i + 1 < len(sending) else None,
                layers=len(image.diff_ids), layers_skipped=len(skip), skip_files=skip, bytes_to_send=size,
                reason=f"chain ({why})" if i == 0 else f"chain, relayed from {sending[i - 1].host}")
        plan.fallback = {t.host: t for t in star_fallback(plan, sending, [v.host for v in sending], compress, thin,
                                                          layers).hosts}
    else:
        for v in sending:
            skip, size = thin_layers(image, v.chain_ids if thin else None, layers)
            by_host[v.host].__dict__.update(
                strategy=Strategy.STAR, compression=_compression(compress, [v]), layers=len(image.diff_ids),
                layers_skipped=len(skip), skip_files=skip, bytes_to_send=size, reason=f"star ({why})")
    return plan


def star_fallback(plan: PushPlan, views: list[HostView], hosts: list[str], compress: str, thin: bool,
                  layers: list[tuple[str, int]] | None) -> PushPlan:
    """A star plan for the hosts a broken chain did not reach (each thinned by its own layers); `plan_push` makes
    it for every chain host with the chain (`PushPlan.fallback`), so apply only looks it up."""
    wanted = [v for v in views if v.host in hosts]
    return plan_push(plan.image, wanted, strategy="star", compress=compress, thin=thin, layers=layers,
                     route=plan.route)


def route_as_read(route: RouteChoice | None, image: LocalImage) -> RouteChoice | None:
    """The route as the layers were read: a cache route whose read fell back to the save (the cache could not serve
    after all: image.source says why) is told as the save route, with that reason."""
    if route is not None and route.route == Route.CACHE and image.source and image.source.via == "save":
        return replace(route, route=Route.SAVE, fill_later=False,
                       reason=f"the layer cache could not serve: {image.source.why}")
    return route


# ---------------------------------------------------------------- fallbacks: what follows a host's failure
#
# push.apply_plan carries out the plan and, after a failure, asks these rules; each reads typed facts (a host's Outcome,
# its planned transfer), never a message.


def load_outcome(status: int, *, cut: bool = False, disk_full: bool = False) -> Outcome:
    """How a stream that ended with `status` failed, by the exit statuses load.sh and relay.sh promise (3: docker
    load refused it, 4: not the planned Image ID, 5: the tag, 9: a relay's stream stopped short), or by what the
    launcher saw: `cut` (the stream stopped before its end), `disk_full` (the host's disk filled up)."""
    if cut or status == 9:
        return Outcome.FAILED_CUT
    if disk_full:
        return Outcome.FAILED_DISK_FULL
    return {3: Outcome.FAILED_LOAD, 4: Outcome.FAILED_VERIFY, 5: Outcome.FAILED_TAG}.get(status, Outcome.FAILED)


def stage_goes(outcome: Outcome, whole: bool) -> bool:
    """Whether a failed stream's stage on the host is removed: when all of the stream arrived (`whole`) and did not
    load, or not as the planned ID (resuming would load the same bytes again), or the disk filled up (the stage
    took space the load needed). A cut stream's stage stays: the next push resumes from it."""
    return outcome == Outcome.FAILED_DISK_FULL or (whole and outcome in (Outcome.FAILED_LOAD, Outcome.FAILED_VERIFY))


def chain_again(chained: list[HostResult]) -> list[str]:
    """The hosts of a chain that runs once more, as a chain of them: those it cut off (a link, a relay, the
    launcher), each resuming from what it staged. A host that failed otherwise gets its star push."""
    return [r.host for r in chained if r.outcome == Outcome.FAILED_CUT]


def star_after_chain(chained: list[HostResult]) -> list[str]:
    """The chain hosts still failed once the chain (and its second run) ended: each gets its star push
    (`PushPlan.fallback`). A broken link must not leave the hosts behind it without the image."""
    return [r.host for r in chained if r.failed]


def send_whole(t: HostTransfer, result: HostResult, image: LocalImage) -> HostTransfer | None:
    """A thin star stream the host's engine refused (containerd's store wants every layer whose snapshot it lacks) is
    sent once more, whole: the transfer for that, or None (a stream that left nothing out, or one that failed
    otherwise: a full disk, a cut, a different ID are never a reason to send everything)."""
    if not t.skip_files or result.outcome != Outcome.FAILED_LOAD:
        return None
    return replace(t, skip_files=[], layers_skipped=0, bytes_to_send=image.size)


_SAID = {Fallback.CHAIN_AGAIN: "chain again after a cut ({why}): {detail}",
         Fallback.STAR: "star after the chain failed ({why}); {detail}",
         Fallback.WHOLE: "the thin stream was refused ({why}); sent in full: {detail}"}


def after_fallback(failed: HostResult, step: Fallback, then: HostResult) -> HostResult:
    """`then`, the result of fallback `step` after `failed`: its detail says why first, its steps follow `failed`'s;
    a whole resend counts the bytes of the refused stream too."""
    detail = _SAID[step].format(why=failed.detail[:160], detail=then.detail)
    sent = then.bytes_sent + (failed.bytes_sent if step == Fallback.WHOLE else 0)
    return replace(then, detail=detail, bytes_sent=sent, fallbacks=(*failed.fallbacks, step, *then.fallbacks))
