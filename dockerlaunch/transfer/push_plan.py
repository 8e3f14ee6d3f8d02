"""Push, planned: what each host gets (nothing, a tag, a star stream or a chain link), how, and how much.

Pure: `HostView`s (what each host told us, see `push.observe`) + the local image + the user's choices
in, a `PushPlan` out. `push --dry-run` prints it; `push.apply` carries it out. Deciding here, apart
from the I/O, is what lets every choice (auto strategy, compression, thin layers) be unit-tested.
"""

from __future__ import annotations

import json
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


def plan_push(
    image: LocalImage, views: list[HostView], *, strategy: str = "auto", compress: str = "auto",
    thin: bool = True, layers: list[tuple[str, int]] | None = None, broken_links: list[str] | None = None,
) -> PushPlan:
    """Per host: skip / tag / star / chain link, compression and the layers left out.

    `layers` is the save's layer map ((file, bytes) in RootFS order); without it nothing is left out.
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
    return PushPlan(image, chosen, out)


def star_fallback(plan: PushPlan, views: list[HostView], hosts: list[str], compress: str, thin: bool,
                  layers: list[tuple[str, int]] | None) -> PushPlan:
    """A star plan for the hosts a broken chain did not reach (each thinned by its own layers)."""
    wanted = [v for v in views if v.host in hosts]
    return plan_push(plan.image, wanted, strategy="star", compress=compress, thin=thin, layers=layers)
