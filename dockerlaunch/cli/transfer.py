"""Commands that move images without a registry: push (plan or apply), save, load."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from dockerlaunch import hints
from dockerlaunch.cli.console import RichReporter, host_text, print_table, styled
from dockerlaunch.cli.main import cli, output_option, split_hosts
from dockerlaunch.errors import DockerlaunchError

CACHE = hints.dockerlaunch("cache", hint="push.cache")  # shows (and prunes) the layer cache a push fills


def _took(seconds: float, stream_seconds: float) -> str:
    """Total time, and how much of it the stream took (the rest is docker load applying layers)."""
    if not seconds:
        return ""
    return f"{seconds:.1f}s (stream {stream_seconds:.1f}s)" if stream_seconds else f"{seconds:.1f}s"


def _summary(results, output: str = "text", extra: dict | None = None) -> int:
    from dockerlaunch.transfer.push_plan import PushState

    failed = any(r.status == PushState.FAILED for r in results)
    if output == "json":
        click.echo(json.dumps({"ok": not failed, "hosts": [r.to_dict() for r in results], **(extra or {})}, indent=2))
        return 1 if failed else 0
    rows = []
    for r in results:
        style = {PushState.FAILED: "bold red", PushState.SKIPPED: "dim"}.get(r.status, "green")
        rows.append([r.host, styled(str(r.status), style), f"{r.bytes_sent / 1e6:.0f} MB" if r.bytes_sent else "",
                     _took(r.seconds, r.stream_seconds), r.detail])
    print_table(["host", "result", "sent", "time", "detail"], rows)
    return 1 if failed else 0


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def _print_push_plan(plan, output: str) -> None:
    if output == "json":
        click.echo(plan.to_json())
        return
    from dockerlaunch.transfer.push_plan import Action, size_text

    image = plan.image
    click.echo(f"Push plan for {image.ref} ({image.id[7:19]}, {_mb(image.size)}): strategy {plan.strategy}")
    rows = []
    for t in plan.hosts:
        send = t.action == Action.SEND
        layers = f"{t.layers - t.layers_skipped} of {t.layers}" if send else ""
        src = ("launcher" if t.strategy is not None and (str(t.strategy) == "star" or t.link == 0)
               else "previous host") if send else ""
        rows.append([t.host, str(t.action), str(t.strategy or ""), t.compression or "", layers,
                     size_text(t.bytes_to_send) if send else "", src, t.reason])
    print_table(["host", "action", "strategy", "compress", "layers sent", "bytes", "from", "why"], rows)
    click.echo(f"The launcher sends about {_mb(plan.launcher_bytes)} (before compression). "
               "Dry run: hosts were inspected; nothing was sent or tagged.")
    for line in _route_lines(plan.route, image.source):
        click.echo(host_text(line))  # a save's reason may quote an engine or registry


def _route_lines(route, source) -> list[str]:
    """Where the layers are read and why (push_plan.choose_route), what that read cost in this run, and whether
    the push fills the layer cache after it."""
    out = []
    if route is not None:
        where = ("through the launcher's layer cache" if str(route.route) == "cache" else "by docker save")
        out.append(f"Layers: read {where}: {route.reason}.")
    if source is not None and source.via == "save" and source.seconds >= 0.05:
        out.append(f"This run: docker save read the whole image for its layer map in {source.seconds:.1f} s "
                   "(kept per Image ID: the push after it reads it only for its stream).")
    elif source is not None and source.via == "cache" and source.added:
        out.append(f"This run: filled the layer cache with {_mb(source.added)} of the image's layers in "
                   f"{source.seconds:.1f} s (the engine read and gzipped them into the launcher's registry, "
                   f"on 127.0.0.1 only while a push runs, stored in {source.where}); the push after it reads them "
                   f"from there. `{CACHE}` shows or prunes it.")
    elif source is not None and source.via == "cache":
        out.append(f"This run: the layer cache had every layer already ({source.seconds:.1f} s; {source.where}).")
    if route is not None and route.fill_later:
        out.append("After the push, the layer cache is filled with the image in the background (the engine reads and "
                   "gzips what the cache lacks), so that the next push of this image's lineage reads only its new "
                   f"layers; `{CACHE}` shows it.")
    return out


@cli.command()
@click.argument("ref", metavar="[IMAGE]", required=False)
@click.option("--config", "config_path", metavar="PATH", help="Cluster config (default ./dockerlaunch.yaml).")
@click.option("--hosts", callback=split_hosts, metavar="H1,H2", help="These hosts instead of the config's.")
@click.option("--image", "image_opt", metavar="IMAGE", help="The image (as IMAGE; default: the config's image:).")
@click.option("--compress", type=click.Choice(["auto", "zstd", "none"]), default="auto", show_default=True,
              help="auto: zstd where the host has it.")
@click.option("--thin/--full", default=True, show_default=True,
              help="Send only the layers a host lacks (docker load skips layers it has).")
@click.option("--strategy", type=click.Choice(["auto", "star", "chain"]), default="auto", show_default=True,
              help="star: the launcher streams to each host; chain: each host relays to the next over TCP "
                   "(every link carries one copy); auto: chain for 3+ hosts.")
@click.option("--dry-run", is_flag=True,
              help="Inspect the hosts and print the per-host plan, and where the layers are read and why; send and "
                   "tag nothing. A thin plan reads what the push would to plan it: the layers a warm layer cache "
                   "lacks (into it), or a cold cache's layer map by one docker save (kept for the push).")
@click.option("--clean", is_flag=True,
              help="Send nothing: remove what cut pushes staged on the hosts (in $HOME/.cache/dockerlaunch/push; "
                   "a push run again would have resumed from it). Staged files also go after 7 days.")
@output_option()
def push(ref: str | None, config_path: str | None, hosts: list[str] | None, image_opt: str | None, compress: str,
         thin: bool, strategy: str, dry_run: bool, clean: bool, output: str) -> None:
    """Copy a local image to every host over SSH (no registry); skips hosts that already have it. A push cut
    off (link, Ctrl-C, SIGKILL) resumes from what each host staged when run again.

    The image: IMAGE, else --image, else the config's `image:`. A thin push reads the image's new layers through
    the launcher's layer cache where it holds the rest, else by docker save, and then fills the cache in the
    background (see `dockerlaunch cache`)."""
    from dockerlaunch.engine import engine
    from dockerlaunch.hosts.fleet import Fleet
    from dockerlaunch.job.flags import Overrides
    from dockerlaunch.job.load import load_config
    from dockerlaunch.transfer import push as pushlib
    from dockerlaunch.transfer.push_plan import HostResult, PushState

    if ref and image_opt and ref != image_opt:
        raise click.UsageError(f"two images: {ref} and --image {image_opt}; give one")
    if clean:
        if ref or image_opt:
            raise click.UsageError("push --clean removes staged pushes and sends nothing: drop "
                                   + ("IMAGE" if ref else "--image"))
        sys.exit(_clean(load_config(config_path, Overrides(hosts=hosts)), output))
    cfg = load_config(config_path, Overrides(hosts=hosts, image=ref or image_opt))
    ref = cfg.image
    if not ref:
        raise click.UsageError("which image? give IMAGE or --image IMAGE, or set image: in the config "
                               "(or --clean)")
    client = engine()
    note = None if output == "json" else (lambda line: click.echo(line, err=True))
    reporter = RichReporter(quiet_progress=output == "json")
    image = pushlib.source_image(client, ref, note)  # a clear error before any connection
    with Fleet.connect(cfg, require_all=False) as fleet:
        live = fleet.live
        job = pushlib.Push(client, [h.remote for h in live], image, addresses=[h.target.hostname for h in live],
                           strategy=strategy, compress=compress, thin=thin, note=note, reporter=reporter)
        plan = job.plan()
        if dry_run:
            from dockerlaunch.transfer.push_plan import Action, HostTransfer

            plan.hosts = [HostTransfer(h.address, Action.FAIL, reason=str(h.error)) for h in fleet.hosts
                          if not h.connected] + plan.hosts
            _print_push_plan(plan, output)
            sys.exit(1 if any(t.action == Action.FAIL for t in plan.hosts) else 0)
        results = [HostResult(h.address, PushState.FAILED, str(h.error)) for h in fleet.hosts
                   if not h.connected] + job.apply()
    pid = job.fill_pid
    route = plan.route
    code = _summary(results, output, {"layer_route": route.to_dict() if route else None, "layer_source":
                                      image_source(plan.image), "cache_fill": {"pid": pid} if pid else None})
    if output != "json":
        for line in _push_lines(plan, pid):
            click.echo(host_text(line))
    sys.exit(code)


def image_source(image) -> dict | None:
    return image.source.to_dict() if image.source else None


def _push_lines(plan, pid: int | None) -> list[str]:
    """After the summary: where the layers were read and why, and the fill the push started (push_plan.choose_route
    decided both before any layer was read)."""
    route = plan.route
    if route is None or (str(route.route) == "save" and not route.lacks and not pid):
        return []  # a whole image by docker save, nothing to say beyond the table
    where = "through the launcher's layer cache" if str(route.route) == "cache" else "by docker save"
    out = [f"Layers: read {where}: {route.reason}."]
    if pid:
        out.append(f"Layer cache: filling it in the background with {plan.image.ref} (pid {pid}; the engine reads and "
                   "gzips what the cache lacks, logged in its fill.log): the next push of this image's lineage reads "
                   f"only its new layers. `{CACHE}` shows it.")
    return out


def _clean(cfg, output: str) -> int:
    from dockerlaunch.hosts.fleet import Fleet
    from dockerlaunch.transfer.staging import Cleaned, clean_staged

    with Fleet.connect(cfg, require_all=False) as fleet:
        done = clean_staged([h.remote for h in fleet.live])
        done = [Cleaned(h.address, error=str(h.error)) for h in fleet.hosts if not h.connected] + done
    failed = any(c.error for c in done)
    if output == "json":
        click.echo(json.dumps({"ok": not failed, "hosts": [c.__dict__ for c in done]}, indent=2))
        return 1 if failed else 0
    rows = [[c.host, styled("failed", "bold red") if c.error else styled("cleaned", "green"), str(c.files),
             f"{c.bytes / 1e6:.0f} MB", c.error or (f"{c.in_use} in use by a push now: kept" if c.in_use else "")]
            for c in done]
    print_table(["host", "result", "staged files removed", "freed", "detail"], rows)
    return 1 if failed else 0


def _size(text: str) -> int:
    import re

    m = re.fullmatch(r"(\d+)([KMGT]?)i?B?", text.strip(), re.I)
    if not m or int(m.group(1)) == 0:
        raise click.BadParameter(f"{text!r}: give a size like 4000M or 2G", param_hint="--split")
    return int(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")


@cli.command()
@click.argument("images", nargs=-1, required=True)
@click.option("-o", "--output", "out", required=True, metavar="FILE", help="Bundle file (zstd tar).")
@click.option("--base", metavar="IMAGE|BUNDLE",
              help="Write only the layers this image (or the images of this bundle) lacks: a delta for hosts that "
                   "have it, e.g. after an ms-swift bump. `load` checks the target has the base's layers first.")
@click.option("--split", metavar="SIZE", help="Parts of at most SIZE (e.g. 4000M, 2G: FAT32 holds < 4 GiB) named "
                                              "FILE.001..; FILE becomes their index. `load FILE` checks every part.")
def save(images: tuple[str, ...], out: str, base: str | None, split: str | None) -> None:
    """Write local images to one bundle file (zstd tar + manifest with Image IDs and sha256)."""
    from dockerlaunch.engine import engine
    from dockerlaunch.transfer import bundle as bundlelib
    from dockerlaunch.transfer.bundle_parts import split_bundle

    size = _size(split) if split else None
    bundle = bundlelib.save_bundle(engine(), list(images), Path(out), base=base)
    for e in bundle.images:
        delta = f"  delta on {e.base}" if e.needs else ""
        click.echo(host_text(f"{e.ref}  {e.id[7:19]}  {e.bytes / 1e6:.0f} MB  sha256 {e.sha256[:12]}{delta}"))
    if size:
        parts = split_bundle(Path(out), size)
        click.echo(f"split into {len(parts)} part(s) of at most {split}: {parts[0].name} .. {parts[-1].name}; "
                   f"{out} is their index (carry them all; `load {out}`)")
    click.echo(f"wrote {out} ({Path(out).stat().st_size / 1e6:.0f} MB)")


@cli.command("load")
@click.argument("bundle")
@click.option("--config", "config_path", metavar="PATH",
              help="Load onto this config's hosts, with its SSH settings.")
@click.option("--hosts", callback=split_hosts, metavar="H1,H2",
              help="Load onto these hosts instead (SSH settings from --config or ./dockerlaunch.yaml).")
def load_cmd(bundle: str, config_path: str | None, hosts: list[str] | None) -> None:
    """Load a bundle (from `save`) into this machine's engine, or with --config/--hosts onto those hosts over SSH;
    sha256 and Image IDs are checked before anything is tagged.

    Without --config and --hosts it goes into the local engine only, whatever ./dockerlaunch.yaml lists."""
    from dockerlaunch.hosts.fleet import Fleet
    from dockerlaunch.job.flags import Overrides
    from dockerlaunch.job.load import load_config
    from dockerlaunch.transfer import bundle as bundlelib
    from dockerlaunch.transfer.bundle_parts import bundle_path
    from dockerlaunch.transfer.push_plan import HostResult, PushState

    path = bundle_path(bundle)
    if not path.is_file():
        raise DockerlaunchError(f"bundle {bundle} does not exist")
    if not hosts and not config_path:
        for e in bundlelib.load_bundle(path, bundlelib.local_loader(), bundlelib.local_runner):
            click.echo(host_text(f"loaded {e.ref} ({e.id[7:19]})"))
        return
    cfg = load_config(config_path, Overrides(hosts=hosts))
    results = []
    with Fleet.connect(cfg, require_all=False) as fleet:
        for h in fleet.hosts:  # one at a time: each reads the whole bundle from local disk
            if not h.connected:
                results.append(HostResult(h.address, PushState.FAILED, str(h.error)))
                continue
            notes: list[str] = []
            try:
                entries = bundlelib.load_bundle(path, bundlelib.remote_loader(h.remote, notes),
                                                bundlelib.remote_runner(h.remote), where=f"host {h.address}")
                results.append(HostResult(h.address, PushState.LOADED, "; ".join(
                    [", ".join(e.ref for e in entries), *notes])))
            except DockerlaunchError as e:
                results.append(HostResult(h.address, PushState.FAILED, str(e)))
    sys.exit(_summary(results))



# ---------------------------------------------------------------- the layer cache


def _duration(text: str) -> float:
    import re

    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", text.strip().lower())
    if not m:
        raise click.BadParameter(f"{text!r}: give a duration like 7d, 12h or 30m", param_hint="--older-than")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[m.group(2)]


def _ago(epoch: float) -> str:
    import time

    if not epoch:
        return ""
    s = max(0.0, time.time() - epoch)
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def _local_names() -> dict[str, list[str]]:
    """Image ID (first 12 hex) -> its tags in the local engine; empty when no engine answers (names are a help)."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        return {img["Id"][7:19]: list(img.get("RepoTags") or []) for img in client.api.images()}
    except Exception:  # noqa: BLE001 - the cache is read from disk; names are optional
        return {}


def _size_text(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


@cli.group(invoke_without_command=True)
@output_option()
@click.pass_context
def cache(ctx: click.Context, output: str) -> None:
    """Show the layer cache a thin push reads new layers through (`cache prune` empties it).

    It lives in ~/.cache/dockerlaunch/registry (DOCKERLAUNCH_CACHE_DIR moves it): the storage of a docker-registry
    that a push runs on 127.0.0.1, on a free port with a new password, only while it runs. After each push the least
    recently used layers go until it fits 30 GB (DOCKERLAUNCH_LAYER_CACHE_GB)."""
    if ctx.invoked_subcommand is not None:
        return
    from dockerlaunch.transfer.layer_cache import CAP_ENV, cache_facts

    facts = cache_facts()
    if output == "json":
        names = _local_names()
        d = facts.to_dict()
        for img in d["images"]:
            img["names"] = names.get(img["id"], [])
        click.echo(json.dumps(d, indent=2))
        return
    click.echo(f"Layer cache: {facts.where}")
    if not facts.blobs:
        click.echo("  empty: the first thin push of an image fills it (the engine reads and gzips the image once).")
    else:
        used = f"; last used {_ago(facts.newest)}, least recently used {_ago(facts.oldest)}"
        click.echo(f"  {_size_text(facts.bytes)} in {facts.blobs} blob(s), cap {_size_text(facts.cap)} "
                   f"({CAP_ENV}){used}")
    click.echo("  Served by docker-registry on 127.0.0.1 (a free port, a new password) only while a push or a fill "
               "runs; after each the least recently used blobs go until it fits its cap.")
    if facts.filling:
        from dockerlaunch.transfer.layer_cache import filling_text

        click.echo(host_text(f"  Filling now, in the background: {filling_text(facts.filling)}."))
    if facts.images:
        names = _local_names()
        rows = [[i.id, host_text(", ".join(names.get(i.id, [])) or "(not in the local engine)"),
                 f"{i.cached} of {i.layers}", _size_text(i.bytes), _ago(i.last_used)] for i in facts.images]
        print_table(["image", "name", "layers cached", "size", "last used"], rows)
    if facts.blobs:
        click.echo(f"Prune: {hints.dockerlaunch('cache', 'prune', hint='cache.prune')} (--older-than 7d keeps the last "
                   "week's; a later push reads what went again, once).")


@cache.command("fill")
@click.argument("image")
@click.option("--background", is_flag=True, hidden=True,
              help="As a push starts it: quiet, and gone at once when the cache is in use.")
def cache_fill(image: str, background: bool) -> None:
    """Fill the layer cache with IMAGE now (the engine reads and gzips the layers the cache lacks).

    A push fills the cache itself where that costs less than `docker save` reading the image, and otherwise after
    it, in the background; this does it now, so that the next push of IMAGE's lineage reads only its new layers."""
    import logging
    import time

    from dockerlaunch.engine import engine
    from dockerlaunch.transfer import layer_cache
    from dockerlaunch.transfer.image_facts import local_image
    from dockerlaunch.transfer.push_plan import size_text

    client = engine()
    img = local_image(client, image, facts=False)
    state = layer_cache.cache_state(img, client.info())
    if state.unavailable:
        raise DockerlaunchError(f"the layer cache cannot serve here: {state.unavailable}")
    t0 = time.monotonic()
    if background:
        from dataclasses import replace

        tags = client.images.get(img.id).tags  # started by ID: its name, for `dockerlaunch cache`
        img = replace(img, ref=tags[0]) if tags else img
        log = logging.getLogger("dockerlaunch")
        try:
            got = layer_cache.fill(client, img, background=True)
        except DockerlaunchError as e:
            log.error("filling the layer cache with %s failed: %s", img.ref, e)
            sys.exit(1)
        if got is None:
            log.warning("the layer cache was in use: %s was not filled", img.ref)
        return
    if state.filling:
        click.echo(host_text(f"waiting for the fill running now ({state.filling}) ..."), err=True)
    holds = sum(state.held[d] for d in dict.fromkeys(img.diff_ids) if d in state.held)
    lacks = max(0, img.size - holds) if not all(d in state.held for d in img.diff_ids) else 0
    with RichReporter().progress() as bars:
        bar = bars.add("layer cache fill (engine gzip)", lacks or None)
        got = layer_cache.fill(client, img, bar.advance)
        bar.done("filled")
    added = got.source.added if got and got.source else 0
    click.echo(host_text(f"Layer cache: {'filled with ' + size_text(added) if added else 'it had every layer'} of "
                         f"{img.ref} in {time.monotonic() - t0:.1f} s ({layer_cache.root()}); a push of its lineage "
                         "reads only the layers it lacks."))


@cache.command("prune")
@click.option("--older-than", "older_than", metavar="AGE",
              help="Only the layers no push used for AGE (e.g. 7d, 12h, 30m); default: everything.")
def cache_prune(older_than: str | None) -> None:
    """Remove cached layers (all, or old ones).

    All of them, or with --older-than those no push used for that long; a later push of an image whose layers
    went reads them again, once. Refused while a push fills the cache; one streaming from it keeps the layers it
    opened."""
    from dockerlaunch.transfer.layer_cache import prune, root

    got = prune(_duration(older_than) if older_than else None)
    which = f"unused for {older_than}" if older_than else "all"
    click.echo(f"removed {got.blobs} blob(s) ({which}), freed {_size_text(got.bytes)} in {root()}; "
               f"kept {got.kept_blobs} ({_size_text(got.kept_bytes)})")
