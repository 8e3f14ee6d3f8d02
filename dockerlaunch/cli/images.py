"""Commands about images: the stack matrix, build, fetch, verify."""

from __future__ import annotations

import contextlib
import json
import os
import sys

import click
import yaml

from dockerlaunch.cli.console import format_argv, host_text
from dockerlaunch.cli.main import CONTEXT, cli, output_option, split_hosts

INDEX_ENV = "DOCKERLAUNCH_INDEX_URL"  # an index URL with a token: from the environment, never the command line


def echo(text: object, err: bool = False) -> None:
    """A line that holds what an image, a build or an index said (a verify row, a lock's error, a wheel's name),
    shown as text: console.host_text, line breaks kept."""
    click.echo(host_text(text, newlines=True), err=err)


class HostTextOut:
    """stdout for library code that writes what images and builds print (build's log, verify's table): every
    write shown as text (console.host_text), line breaks kept."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(host_text(text, newlines=True))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _secret_url(ctx, param, value: str | None) -> str | None:
    """A URL with a password given as a flag still works, with one warning: `ps` shows argv to every user."""
    if value and param.name and ctx.get_parameter_source(param.name) == click.core.ParameterSource.COMMANDLINE:
        from dockerlaunch.images.index import redact

        if redact(value) != value:
            click.echo(f"warning: {param.opts[0]} holds credentials, which `ps` shows to every user of this "
                       f"machine: set {INDEX_ENV} instead", err=True)
    return value


@cli.group(context_settings=CONTEXT)
def stacks() -> None:
    """The pinned stack matrix (Dockerfiles/stacks.yaml)."""


@stacks.command("list")
def stacks_list() -> None:
    """One line per stack: name, image tag, key pins, where it builds."""
    from dockerlaunch.images.constraints import flash_attn_wheel
    from dockerlaunch.images.stacks import load_matrix

    matrix = load_matrix()
    for s in matrix.stacks.values():
        te = f" te {s.transformer_engine}" if s.transformer_engine else ""
        notes = ["recommended"] if s.name == matrix.recommended else []
        notes += ["no registry needed (made base, CUDA from PyPI)"] if s.base else []
        if flash_attn_wheel(s) and not s.flash_attn_wheel_sha256:
            notes.append("flash-attn compiles from its PyPI sdist: set flash_attn_wheel_sha256 to use its prebuilt "
                         "GitHub wheel instead")
        more = f"  [{'; '.join(notes)}]" if notes else ""
        mark = "*" if s.name == matrix.recommended else " "
        click.echo(f"{mark} {s.name:<30} torch {s.torch}{te} mcore {s.megatron_core} swift {s.ms_swift}  {s.tag}{more}")


@stacks.command("show")
@click.argument("name")
def stacks_show(name: str) -> None:
    """Every pin of one stack, and its image tag."""
    from dockerlaunch.images.stacks import load_matrix

    s = load_matrix().get(name)
    click.echo(yaml.safe_dump({"name": s.name, "tag": s.tag, **s.model_dump(mode="json", exclude_none=True,
                                                                          exclude={"name"})}, sort_keys=False).rstrip())


@stacks.command("check")
@click.option("--stack", "names", multiple=True, metavar="NAME", help="Only this stack (repeatable); default all.")
@click.option("--skip-rule", "skip", multiple=True, metavar="ID",
              help="Leave out this rule (repeatable): to see what the other checks find without it.")
@click.option("--binaries", is_flag=True,
              help="Also check the lock's binaries (network: each binary wheel is downloaded once, hash-checked, "
                   "read and deleted; its tables are kept in the cache): every undefined symbol resolved and every "
                   "cubin listed, as verify does in an image. A CUDA stack's wheels are 3-5 GB.")
@click.option("--cuda-archs", metavar="LIST",
              help="With --binaries: architectures every library with device code must have a cubin for "
                   "(default: 9.0, what build compiles for without a GPU or --cuda-archs).")
@click.option("--index-url", metavar="URL", envvar=INDEX_ENV, callback=_secret_url,
              help=f"With --binaries: where the wheels come from (default: the lock's sources; ${INDEX_ENV}).")
@click.option("--find-links", multiple=True, metavar="DIR",
              help="With --binaries: a folder of wheels to read before any download (repeatable).")
@click.option("--offline", is_flag=True, help="With --binaries: no download; only cached tables and --find-links.")
@output_option()
def stacks_check(names: tuple[str, ...], skip: tuple[str, ...], binaries: bool, cuda_archs: str | None,
                 index_url: str | None, find_links: tuple[str, ...], offline: bool, output: str) -> None:
    """Every compatibility rule on every stack, and every stack's lock against its pins (no network); exit 1 on
    any error. With --binaries, the lock's wheels too: FAIL or ERROR there also exits 1."""
    from dockerlaunch.images import lock as locks
    from dockerlaunch.images.archs import DEFAULT_ARCH, check_archs, parse_cuda_archs
    from dockerlaunch.images.constraints import RULES, check_stack
    from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix

    known = {r.id for r in RULES}
    for rule in skip:
        if rule not in known:
            raise click.BadParameter(f"no rule {rule!r} (the rules: {', '.join(sorted(known))})",
                                     param_hint="--skip-rule")
    if not binaries:
        for flag, given in (("--cuda-archs", cuda_archs), ("--find-links", find_links), ("--offline", offline),
                            ("--index-url", index_url and "cli")):
            if given:
                raise click.UsageError(f"{flag} goes with --binaries")
    for d in find_links:
        if not os.path.isdir(d):
            raise click.BadParameter(f"{d}: no such folder", param_hint="--find-links")
    matrix = load_matrix()
    chosen = [matrix.get(n) for n in names] if names else list(matrix.stacks.values())
    dockerfiles = default_dockerfiles_dir()
    errors, reports = 0, []
    for s in chosen:
        problems = locks.check(s, dockerfiles)
        # rules that read the lock (what its binaries need) run on a lock that is the stack's own
        lock = None if problems else locks.read(s, dockerfiles)
        for found in check_stack(s, lock=lock):
            if found.rule.id in skip:
                continue
            errors += found.rule.severity == "error"
            echo(f"{found.rule.severity.upper():5} {found.line()}")
        for problem in problems:
            errors += 1
            echo(f"ERROR {problem}")
        if binaries and lock is not None and s.cuda:
            reports.append(_check_binaries(s, lock, dockerfiles, cuda_archs, index_url, find_links, offline,
                                           output, DEFAULT_ARCH, check_archs, parse_cuda_archs))
        elif binaries and lock is not None:
            click.echo(f"NOTE  {s.name}: a CPU stack: no binaries of CUDA libraries to check")
    rules = len(RULES) - len(skip)
    click.echo(f"stacks check: {len(chosen)} stacks x {rules} rules and their locks, {errors} error(s)"
               + (f" (rules left out: {', '.join(skip)})" if skip else ""))
    if output == "json" and reports:
        click.echo(json.dumps([{**r.to_dict(), "costs": r.costs} for r in reports], indent=2))
    sys.exit(1 if errors or any(not r.ok for r in reports) else 0)


def _check_binaries(s, lock, dockerfiles, cuda_archs, index_url, find_links, offline, output, default_arch,
                    check_archs, parse_cuda_archs):
    from dockerlaunch.images import binaries

    archs = parse_cuda_archs(cuda_archs) if cuda_archs else [default_arch]
    check_archs(s, archs)

    def log(msg: str) -> None:
        echo(f"  {msg}", err=True)

    report = binaries.check(s, lock, dockerfiles, archs=archs,
                            archs_source="--cuda-archs" if cuda_archs else "build's default without a GPU",
                            find_links=find_links, index_url=index_url, offline=offline, log=log)
    if output == "text":
        echo(report.render())
        c = report.costs
        echo(f"binaries {s.name}: {c['downloaded_gb']} GB downloaded, {c['wheels_read']} wheels read now, "
             f"{c['minutes']} min; tables cache {c['tables_mb']} MB")
    return report


@stacks.command("base-tables")
@click.option("--stack", "name", required=True, metavar="NAME", help="A stack on a made base (base: {debian: ...}).")
def stacks_base_tables(name: str) -> None:
    """Record what the stack's made base supplies to its wheels' libraries (Dockerfiles/bases/<suite>-amd64.json.gz,
    read by stacks check --binaries). Needs Docker; makes the base with debootstrap if it is not here."""
    from dockerlaunch.images import binaries
    from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix

    path = binaries.record_base(load_matrix().get(name), default_dockerfiles_dir(),
                                log=lambda msg: echo(msg, err=True))
    click.echo(f"recorded {path}")


@stacks.command("lock")
@click.option("--stack", "names", multiple=True, metavar="NAME", help="Only this stack (repeatable); default all.")
@click.option("--index-url", metavar="URL", envvar=INDEX_ENV, callback=_secret_url,
              help=f"The package index to resolve against (default: PyPI; ${INDEX_ENV}: keeps a token out of `ps`).")
@click.option("--find-links", multiple=True, metavar="DIR|URL",
              help="Also look here for distributions (a folder of wheels; repeatable).")
@click.option("--torch-index", metavar="URL|none",
              help="Where a local torch variant (+cpu, +cu128) comes from (default: the stack's torch_index_url; "
                   "none: only --index-url and --find-links).")
@click.option("--ca-cert", metavar="PATH", help="CA bundle for a TLS-intercepting proxy (default: the system's).")
@click.option("--upgrade", is_flag=True,
              help="Resolve every package afresh (default: keep the current lock's versions where the pins allow).")
def stacks_lock(names: tuple[str, ...], index_url: str | None, find_links: tuple[str, ...],
                torch_index: str | None, ca_cert: str | None, upgrade: bool) -> None:
    """Resolve each stack's pins together and write Dockerfiles/locks/<stack>.lock (network).

    Everything the image installs, at one version each and with sha256 hashes, for the stack's Python and
    manylinux x86-64; builds install it with --require-hashes and `fetch` downloads exactly it. A changed pin
    moves only what it must: the current lock's other versions are kept unless --upgrade."""
    from dockerlaunch.cache import write_whole
    from dockerlaunch.images import lock as locks
    from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix

    if ca_cert and not os.path.isfile(ca_cert):
        raise click.BadParameter(f"{ca_cert}: no such file", param_hint="--ca-cert")
    matrix = load_matrix()
    chosen = [matrix.get(n) for n in names] if names else list(matrix.stacks.values())
    dockerfiles = default_dockerfiles_dir()
    failed = 0
    for s in chosen:
        path = locks.lock_path(s, dockerfiles)
        prefer = None
        if not upgrade and path.is_file():
            try:
                prefer = {e.name: e.version for e in locks.parse(path.read_text(), path).entries}
            except locks.LockError:
                prefer = None  # an unreadable lock is replaced, not kept
        try:
            text = locks.resolve(s, index_url=index_url, find_links=find_links,
                                 torch_index="" if torch_index == "none" else torch_index, ca_cert=ca_cert,
                                 prefer=prefer)
        except locks.LockError as e:
            if len(chosen) == 1:
                raise
            failed += 1
            echo(f"FAIL  {e}", err=True)
            continue
        write_whole(path, text)
        lock = locks.parse(text, path)
        echo(f"locked {s.name}: {len(lock.entries)} distributions -> {path}")
    sys.exit(1 if failed else 0)


ON_HOST_HELP = ("Compile on this cluster host (its cores; the architectures default to its GPUs), over the SSH "
                "settings of --config; the wheels come back into this machine's cache.")


@contextlib.contextmanager
def compile_place(host: str | None, config_path: str | None):
    """None (compile here), or an OnHost over one SSH connection made the way `up` makes it (known_hosts)."""
    if not host:
        yield None
        return
    from dockerlaunch.hosts.fleet import Fleet
    from dockerlaunch.job.flags import Overrides
    from dockerlaunch.job.load import load_config
    from dockerlaunch.transfer.host_compile import OnHost

    cfg = load_config(config_path, Overrides(hosts=[host]))
    with Fleet.connect(cfg) as fleet:
        yield OnHost(fleet.live[0].remote, log=lambda msg: click.echo(f"[dockerlaunch] {host_text(msg, True)}"))


def _cluster_archs(hosts: list[str] | None, config_path: str | None) -> tuple[list[str], str]:
    """The union of the compute capabilities of the cluster's GPUs, asked of every host at once, and how to say
    it: `the GPUs of h1 (9.0 x8), h2 (8.0 x8)`."""
    from dockerlaunch.backends.docker.probe import gpu_compute_caps
    from dockerlaunch.gpu.cuda import version_tuple
    from dockerlaunch.hosts.fleet import Fleet
    from dockerlaunch.job.flags import Overrides
    from dockerlaunch.job.load import load_config

    cfg = load_config(config_path, Overrides(hosts=hosts) if hosts else Overrides())
    with Fleet.connect(cfg) as fleet:
        caps = fleet.each(lambda h: gpu_compute_caps(h.remote, h.address)).raise_first()
    union = sorted({c for host in caps for c in host}, key=version_tuple)
    per_host = ", ".join(
        f"{h.address} ({', '.join(f'{c} x{host.count(c)}' for c in sorted(set(host), key=version_tuple))})"
        for h, host in zip(cfg.hosts, caps))
    return union, f"the GPUs of {per_host}"


def _build_options(kw: dict):
    from dockerlaunch.images.archs import parse_cuda_archs
    from dockerlaunch.images.build_argv import BuildOptions

    return BuildOptions(tag=kw["tag"], base_image=kw["base_image"], ca_cert=kw["ca_cert"],
                        pip_index_url=kw["pip_index_url"], wheelhouse=kw["wheelhouse"], offline=kw["offline"],
                        no_cache=kw["no_cache"], max_jobs=kw["max_jobs"],
                        cuda_archs=parse_cuda_archs(kw["cuda_archs"]), force=kw["force"],
                        trust_carried_wheels=kw["trust_carried_wheels"])


@cli.command()
@click.option("--stack", "stack_name", required=True, help="A stack from `dockerlaunch stacks list`.")
@click.option("--tag", help="Image tag (default: one that encodes the stack).")
@click.option("--base-image", metavar="REF", help="Override the stack's base image (e.g. a local mirror).")
@click.option("--ca-cert", metavar="PATH",
              help="CA bundle for pip behind an intercepting proxy, a build secret (default: this machine's bundle).")
@click.option("--pip-index-url", metavar="URL", envvar=INDEX_ENV, callback=_secret_url,
              help=f"Package index (a build secret: may hold credentials; ${INDEX_ENV} keeps them out of `ps`).")
@click.option("--wheelhouse", metavar="DIR", help="Wheels from `dockerlaunch fetch`.")
@click.option("--offline", is_flag=True, help="No network for Python packages: install from --wheelhouse only.")
@click.option("--no-cache", is_flag=True)
@click.option("--max-jobs", type=click.IntRange(1, 256), default=None,
              help="Parallel compile jobs (default: per package, this machine's cores, at most as many as the "
                   "available memory holds: a flash-attn job needs ~6.5 GB, TE's binding ~3.5).")
@click.option("--cuda-archs", metavar="LIST",
              help="GPU architectures to compile for, e.g. 9.0 or '8.0;9.0;10.0' (default: this machine's GPUs, "
                   "else 9.0: H100/H200). Each one more multiplies the compile time.")
@click.option("--force", is_flag=True, help="Build even if the stack violates a compatibility rule.")
@click.option("--trust-carried-wheels", is_flag=True,
              help="Take compiled wheels that `wheels build -o` put in --wheelhouse (their records travel with them).")
@click.option("--stage", type=click.Choice(["cuda", "builder", "train"]), default="train", show_default=True,
              help="Stop at a stage: cuda (system + CUDA toolkit), builder (+ torch, build tools, TE's core), or "
                   "the training image (compiled wheels installed, verified).")
@click.option("--on", "on_host", metavar="HOST", help=ON_HOST_HELP + " The image is put together here (no compile: "
              "minutes); `push` sends it to the hosts.")
@click.option("--hosts", callback=split_hosts, metavar="H1,H2",
              help="The cluster the image is for: compile for the union of its GPUs' compute capabilities (each "
                   "host asked over SSH; one that cannot be asked or has no GPU is an error, never a guess).")
@click.option("--config", "config_path", metavar="PATH",
              help="Cluster config: its hosts are the cluster the image is for (as --hosts), and its SSH settings "
                   "reach them and --on's host.")
@click.option("--dry-run", is_flag=True, help="Print the docker build command; build nothing.")
def build(stack_name: str, dry_run: bool, stage: str, on_host: str | None, hosts: list[str] | None,
          config_path: str | None, **kw) -> None:
    """Build a stack's image, then verify it (imports, versions vs pins)."""
    from dataclasses import replace

    from dockerlaunch.images import build as buildlib
    from dockerlaunch.images import build_argv
    from dockerlaunch.images import lock as locks
    from dockerlaunch.images.archs import check_archs
    from dockerlaunch.images.stacks import load_matrix

    stack = load_matrix().get(stack_name)
    opts = _build_options(kw)
    if stack.cuda and not opts.cuda_archs and (hosts or config_path):
        archs, said = _cluster_archs(hosts, config_path)
        check_archs(stack, archs)
        opts = replace(opts, cuda_archs=archs, archs_from=said)
    if dry_run:
        from dockerlaunch.images import wheels
        from dockerlaunch.images.archs import local_gpu_archs
        from dockerlaunch.images.constraints import flash_attn_wheel

        lock = locks.checked(stack, opts.dockerfiles)
        archs = build_argv.cuda_archs(stack, opts, local_gpu_archs() if stack.cuda else [])
        check_archs(stack, archs)
        opts = replace(opts, cuda_archs=archs)
        if opts.archs_from:
            click.echo(f"# compiling for compute capability {';'.join(archs)} ({opts.archs_from})")
        click.echo(format_argv(build_argv.render_build(stack, opts, lock, target=stage), 0))
        if stage != "train":
            return
        pkgs = wheels.compiled_packages(stack, lock, archs, flash_prebuilt=bool(build_argv.prebuilt_flash(stack)))
        if flash_attn_wheel(stack) and not build_argv.prebuilt_flash(stack):
            click.echo(f"# flash-attn {stack.flash_attn}: a prebuilt GitHub wheel exists for this torch, but "
                       "stacks.yaml pins no sha256 for it (flash_attn_wheel_sha256), so it compiles from the lock's "
                       "PyPI sdist")
        if pkgs:
            jobs = opts.max_jobs or "per package"
            click.echo(f"# compiled in the builder stage (MAX_JOBS={jobs}): " + "; ".join(
                f"{p.label} ({' '.join(f'{k}={v}' for k, v in p.env)})" for p in pkgs))
            click.echo("# the builder stage, before them:")
            click.echo(format_argv(build_argv.render_build(stack, opts, lock, target="builder",
                                                           tag=buildlib.builder_tag(stack)), 0))
        return
    with compile_place(on_host, config_path) as where:
        code, _ = buildlib.build(stack, opts, out=HostTextOut(sys.stdout), stage=stage, where=where)
    sys.exit(code)


@cli.command()
@click.option("--stack", "stack_name", required=True)
@click.option("-o", "--output", "out_dir", required=True, metavar="DIR",
              help="Wheelhouse folder (one subfolder per layer).")
@click.option("--index-url", metavar="URL", envvar=INDEX_ENV, callback=_secret_url,
              help=f"The index to download from (default: the one the lock names; ${INDEX_ENV}).")
@click.option("--find-links", multiple=True, metavar="DIR", help="A folder of distributions, asked first.")
def fetch(stack_name: str, out_dir: str, index_url: str | None, find_links: tuple[str, ...]) -> None:
    """Download exactly the stack's lock (hashes checked) and its source archives, for `build --wheelhouse DIR
    --offline`.

    Fetching again into the same DIR asks the index only for layers whose locked part changed (after a pin bump:
    seconds, not minutes); delete DIR/.dockerlaunch-fetch.json to fetch every layer again. Files are found by the
    lock's hashes for the stack's own Python and platform, so any Python can fetch for any stack."""
    from pathlib import Path

    from dockerlaunch.images import fetch as fetchlib
    from dockerlaunch.images.stacks import load_matrix

    counts = fetchlib.fetch(load_matrix().get(stack_name), Path(out_dir), index_url=index_url, find_links=find_links)
    for layer, n in counts.items():
        click.echo(f"{layer:<12} {n} file(s)")


@cli.command()
@click.argument("image")
@click.option("--gpus", is_flag=True, help="Run the checks with --gpus all (CUDA images on a GPU host): a missing "
                                           "driver is then a FAIL.")
@click.option("--cuda-archs", metavar="LIST",
              help="Architectures every library with device code must have a cubin for, e.g. 9.0 or '8.0;9.0' "
                   "(default: the image's ai.dockerlaunch.cuda-archs label; without either, not checked).")
@click.option("--checks", metavar="LIST", help="Only these checks, comma-separated: symbols, load, archs, pip, "
                                               "imports, dists (default: all).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text for people, json for scripts")
def verify(image: str, gpus: bool, cuda_archs: str | None, checks: str | None, output: str) -> None:
    """Prove an image without a GPU: every library's symbols resolve (and each loads), cubins for every
    architecture, pip check, imports of the stack's modules, versions against its pins. Exit 1 on any FAIL, and on
    any ERROR (a check that could not run: it proves nothing).

    The tools (pyelftools, cuobjdump from PyPI, hash-pinned) are mounted read-only beside the image, never
    installed into it; an image without dockerlaunch labels gets every check that needs no pins."""
    from dockerlaunch.images import verify as verifylib

    wanted = tuple(c.strip() for c in checks.split(",") if c.strip()) if checks else None
    report = verifylib.verify(image, gpus=gpus, cuda_archs=cuda_archs, checks=wanted)
    if output == "json":
        click.echo(report.to_json())  # JSON escapes every control character itself
    else:
        echo(report.render())
    sys.exit(0 if report.ok else 1)


@cli.group(context_settings=CONTEXT)
def wheels() -> None:
    """Compiled packages (TE's torch binding, apex, flash-attn) as cached wheels: compiled once per key."""


@wheels.command("build")
@click.option("--stack", "stack_name", required=True, help="A stack from `dockerlaunch stacks list`.")
@click.option("--cuda-archs", metavar="LIST", help="GPU architectures (default: this machine's GPUs, else 9.0).")
@click.option("--max-jobs", type=click.IntRange(1, 256), default=None,
              help="Parallel compile jobs (default: per package, from the cores and the available memory).")
@click.option("--wheelhouse", metavar="DIR", help="Sources from `dockerlaunch fetch` (needed with --offline).")
@click.option("--offline", is_flag=True, help="Download nothing: sources from --wheelhouse or the cache.")
@click.option("--pip-index-url", metavar="URL", envvar=INDEX_ENV, callback=_secret_url,
              help=f"Package index for the builder stage and sdists (${INDEX_ENV}).")
@click.option("--ca-cert", metavar="PATH", help="CA bundle for pip behind an intercepting proxy.")
@click.option("--trust-carried-wheels", is_flag=True,
              help="Take compiled wheels that `wheels build -o` put in --wheelhouse (their records travel with them).")
@click.option("-o", "--output", "out_dir", metavar="DIR",
              help="Also copy the wheels into DIR/compiled/ (e.g. the wheelhouse you carry to an offline site).")
@click.option("--on", "on_host", metavar="HOST", help=ON_HOST_HELP)
@click.option("--config", "config_path", metavar="PATH", help="Cluster config for --on's SSH settings.")
def wheels_build(stack_name: str, out_dir: str | None, on_host: str | None, config_path: str | None, **kw) -> None:
    """Compile the stack's compiled packages into the wheel cache (the builder stage first); an interrupted
    compile resumes from the objects it finished. `build` runs this itself."""
    import tempfile
    from pathlib import Path

    from dockerlaunch.images import build as buildlib
    from dockerlaunch.images import wheels as wheelcache
    from dockerlaunch.images.archs import parse_cuda_archs
    from dockerlaunch.images.build_argv import BuildOptions
    from dockerlaunch.images.stacks import load_matrix

    stack = load_matrix().get(stack_name)
    opts = BuildOptions(ca_cert=kw["ca_cert"], pip_index_url=kw["pip_index_url"], wheelhouse=kw["wheelhouse"],
                        offline=kw["offline"], max_jobs=kw["max_jobs"], cuda_archs=parse_cuda_archs(kw["cuda_archs"]),
                        trust_carried_wheels=kw["trust_carried_wheels"])
    with tempfile.TemporaryDirectory(prefix="dockerlaunch-wheels-") as tmp, \
            compile_place(on_host, config_path) as where:
        s = buildlib.start(stack, opts, HostTextOut(sys.stdout), Path(tmp), where=where)
        built = buildlib.build_wheels(s)
    if not built:
        click.echo(f"stack {stack.name} compiles nothing")
    for wheel, sha in built:
        if out_dir:  # with its key and record: an offline build elsewhere takes it only for the same key
            wheel = wheelcache.export(wheelcache.Entry(wheel.parents[2]), Path(out_dir) / "compiled")
        echo(f"{wheel}  sha256:{sha}")


@wheels.command("list")
def wheels_list() -> None:
    """The wheel cache: each key's package, architectures, state (built, or objects done of total) and figures."""
    from dockerlaunch.images import compiles
    from dockerlaunch.images import wheels as wheelcache

    root = wheelcache.cache_root() / "compiled"
    rows = []
    for folder in sorted(p for p in root.glob("*") if p.is_dir()):
        entry = wheelcache.Entry(folder)
        try:
            key = entry.key
        except (OSError, ValueError):
            continue
        info = entry.done
        archs = next((v for k, v in key.get("flags", {}).items() if k in ("TORCH_CUDA_ARCH_LIST",)), "?")
        if info:
            where = f" on {info['host']}" if info.get("host") else ""
            state = (f"built {info.get('built', '?')}{where}: {info['file']} ({info['size'] / 2**20:.0f} MB), "
                     f"{info.get('cpu_s', 0) / 60:.0f} CPU-min, peak {info.get('peak_rss', 0) / 2**30:.1f} GB")
        else:
            done, total = compiles.ninja_progress(folder / "build")
            state = f"not finished: {done}/{total} objects" if total else "not started"
        rows.append(f"{key['package']} {key['version']}  archs {archs}  torch {key.get('torch', '?').split()[0]}  "
                    f"python {key.get('python')}  [{folder.name[-16:]}]  {state}")
    click.echo("\n".join(rows) if rows else f"no compiled wheels in {root}")


@cli.group(context_settings=CONTEXT)
def sources() -> None:
    """Source archives pinned by content (apex, Megatron-LM)."""


@sources.command("hash")
@click.argument("archive", type=click.Path(exists=True, dir_okay=False))
def sources_hash(archive: str) -> None:
    """The sha256 of an archive's unpacked tree: what stacks.yaml's `sha256:` of a git pin means (the same for
    GitHub's archive and `git archive` of one commit)."""
    from pathlib import Path

    from dockerlaunch.images.sources import tree_sha256

    click.echo(tree_sha256(Path(archive)))
