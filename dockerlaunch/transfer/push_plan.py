"""Push, planned: what each host gets (nothing, a tag, a star stream or a chain link), how, and how much.

Pure: `HostView`s (what each host told us, see `push.observe`) + the local image + the user's choices
in, a `PushPlan` out. `push --dry-run` prints it; `push.apply` carries it out. Deciding here, apart
from the I/O, is what lets every choice (auto strategy, compression, thin layers) be unit-tested.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum

from dockerlaunch.enums import StrEnum
from dockerlaunch.transfer.image_facts import GRAPHDRIVER, LocalImage
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


@dataclass
class HostResult:
    """How one host ended, for the summary table and `--output json`."""

    host: str
    status: PushState
    detail: str = ""
    bytes_sent: int = 0
    seconds: float = 0.0
    stream_seconds: float = 0.0  # until the last byte left the launcher; the rest is the host's docker load
    resumable: bool = False  # failed because its stream was cut: what it got is staged, a retry sends the rest

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("resumable")
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


def choose_strategy(requested: str, senders: list[HostView], broken_links: list[str] | None = None
                    ) -> tuple[Strategy, str]:
    """auto: chain for 3+ hosts that need the image, when every one of them can relay and (once probed,
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
    senders: list[HostView] = []
    for v in views:
        if v.error:
            out.append(HostTransfer(v.host, Action.FAIL, reason=v.error))
        elif _up_to_date(image, v):
            out.append(HostTransfer(v.host, Action.SKIP, reason=f"already has {v.tag_id[7:19]}"))
        elif v.has_id:
            have = image.expected_id(v.store)
            out.append(HostTransfer(v.host, Action.TAG, expect_id=have,
                                    reason=f"had {have[7:19]} untagged; tagged {image.ref}"))
        elif compress == "zstd" and not v.zstd:
            out.append(HostTransfer(v.host, Action.FAIL, reason="--compress zstd but zstd is not installed there"))
        else:
            senders.append(v)
            out.append(HostTransfer(v.host, Action.SEND, expect_id=image.expected_id(v.store)))
    chosen, why = choose_strategy(strategy, senders, broken_links)
    by_host = {h.host: h for h in out}
    if chosen == Strategy.CHAIN and senders:
        mode = _compression(compress, senders)
        common = (frozenset.intersection(*[v.chain_ids for v in senders])
                  if thin and all(v.chain_ids is not None for v in senders) else None)
        skip, size = thin_layers(image, common, layers)
        for i, v in enumerate(senders):
            by_host[v.host].__dict__.update(
                strategy=Strategy.CHAIN, compression=mode, link=i, address=v.address,
                next_host=senders[i + 1].host if i + 1 < len(senders) else None,
                layers=len(image.diff_ids), layers_skipped=len(skip), skip_files=skip, bytes_to_send=size,
                reason=f"chain ({why})" if i == 0 else f"chain, relayed from {senders[i - 1].host}")
    else:
        for v in senders:
            skip, size = thin_layers(image, v.chain_ids if thin else None, layers)
            by_host[v.host].__dict__.update(
                strategy=Strategy.STAR, compression=_compression(compress, [v]), layers=len(image.diff_ids),
                layers_skipped=len(skip), skip_files=skip, bytes_to_send=size, reason=f"star ({why})")
    return PushPlan(image, chosen, out, route)


def star_fallback(plan: PushPlan, views: list[HostView], hosts: list[str], compress: str, thin: bool,
                  layers: list[tuple[str, int]] | None) -> PushPlan:
    """A star plan for the hosts a broken chain did not reach (each thinned by its own layers)."""
    wanted = [v for v in views if v.host in hosts]
    return plan_push(plan.image, wanted, strategy="star", compress=compress, thin=thin, layers=layers,
                     route=plan.route)
