"""Build a stack's image: the base, the builder stage and the compiled wheels, a BuildKit `docker build` of the
stack's layers, then verify inside the image and stamp its report into it.

`fetch` fills a wheelhouse (one folder per image layer) on a connected machine so that
`build --wheelhouse DIR --offline` needs no network for Python packages. Build context = those
folders (hard links, or empty folders online; images/build_context.py); CA and index URL go in as BuildKit secrets.
What `docker build` is told is images/build_argv.py's; which GPU architectures it compiles for, images/archs.py's.
"""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from dockerlaunch import hints
from dockerlaunch.errors import BuildError, ConfigError
from dockerlaunch.gpu import labels as labels_
from dockerlaunch.images import compiles, sources, wheels
from dockerlaunch.images import lock as locks
from dockerlaunch.images.archs import check_archs, local_gpu_archs
from dockerlaunch.images.build_argv import BuildOptions, cuda_archs, prebuilt_flash, render_build
from dockerlaunch.images.build_context import check_wheelhouse, fetch_again, prepare_context
from dockerlaunch.images.buildkit import BuildCLI, _one_line, find_cli
from dockerlaunch.images.constraints import check_stack, flash_attn_wheel_url
from dockerlaunch.images.stacks import Stack

_LOG = logging.getLogger(__name__)  # the CLI shows it (cli/main.py); library use stays quiet


def hash_mismatch(log: str) -> str | None:
    """pip's `THESE PACKAGES DO NOT MATCH THE HASHES` in a build log -> `name==version (expected .., got ..)`."""
    if "DO NOT MATCH THE HASHES" not in log:
        return None
    tail = log.split("DO NOT MATCH THE HASHES", 1)[1]
    pkg = re.search(r"(\S+==\S+) from \S+", tail)
    want = re.search(r"Expected sha256 ([0-9a-f]{64})", tail)
    got = re.search(r"Got\s+([0-9a-f]{64})", tail)
    what = pkg.group(1) if pkg else "a locked distribution"
    if want and got:
        return f"{what} (expected sha256 {want.group(1)[:12]}..., got {got.group(1)[:12]}...)"
    return what


SYSTEM_CA = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")


def system_ca() -> str | None:
    """This machine's CA bundle: pip in the image trusts what this machine trusts (a TLS-intercepting proxy's CA
    that the site installed), as a build secret, never in a layer."""
    return next((p for p in SYSTEM_CA if Path(p).is_file()), None)


def ensure_registry_base(docker: str, ref: str) -> None:
    """A registry base that is neither on this engine nor pullable fails here in one line (BuildKit would say it
    in 18 lines of `failed to solve`)."""
    if subprocess.run([docker, "image", "inspect", ref], capture_output=True).returncode == 0:
        return
    try:
        r = subprocess.run([docker, "pull", ref], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        r = subprocess.CompletedProcess([], 1, "", "no answer in 600 s")
    if r.returncode != 0:
        why = _one_line(r.stderr or r.stdout, 200)
        raise BuildError(f"base image {ref} is not on this engine and cannot be pulled ({why}): `docker load` it "
                         "here, or build a stack whose base is made without a registry (base: {debian: trixie}, "
                         "e.g. swift4.6-mcore0.19-cu13-py313)")


def flash_attn_prebuilt(stack: Stack, opts: BuildOptions, log, dest_dir: Path | None = None) -> list[Path]:
    """flash-attn's prebuilt GitHub wheel, where the stack uses one, checked against its pinned sha256 (a stack
    without one is refused: GitHub's release files are not in any lock)."""
    name = prebuilt_flash(stack)
    if not name:
        return []
    src = sources.Source(f"stack {stack.name}: flash-attn {stack.flash_attn}'s prebuilt wheel", "5-flash", name,
                        stack.flash_attn_wheel_sha256 or "", "file", flash_attn_wheel_url(stack))
    wh = Path(opts.wheelhouse) if opts.wheelhouse else None
    return [sources.get_source(src, wh, None, opts.offline, log, dest_dir=dest_dir)]


def megatron_archive(stack: Stack, opts: BuildOptions, log) -> list[Path]:
    """Megatron-LM's pinned source, checked against its tree hash, for the layer that bakes it."""
    pin = stack.megatron_lm
    if not pin:
        return []
    src = sources.Source(f"Megatron-LM {pin.ref[:12]} source", "6-megatron", pin.archive_name, pin.sha256 or "",
                        "archive", pin.archive_url)
    wh = Path(opts.wheelhouse) if opts.wheelhouse else None
    return [sources.get_source(src, wh, opts.pip_index_url, opts.offline, log)]


def _stream(argv: list[str], env: dict[str, str], out) -> tuple[int, str]:
    log: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            log.append(line)
            out.write(line)
            out.flush()
    except BaseException:
        proc.terminate()
        raise
    return proc.wait(), "".join(log)


@dataclass
class BuildSession:
    """What every phase of a build shares: the checked lock, the architectures, the docker CLI that builds, where
    log lines go, and the secret file of --pip-index-url (written once, 0600, removed with the session)."""

    stack: Stack
    opts: BuildOptions
    lock: locks.Lock
    cli: BuildCLI
    out: object
    work: Path
    archives: list[Path] = field(default_factory=list)
    prebuilt: list[Path] = field(default_factory=list)  # flash-attn's checked prebuilt wheel
    where: compiles.Here | None = None  # where packages compile: here (None) or a cluster host (--on HOST)

    def say(self, msg: str) -> None:
        self.out.write(f"[dockerlaunch] {msg}\n")
        self.out.flush()

    def argv(self, ctx: Path, target: str, tag: str | None = None) -> list[str]:
        argv = [*self.cli.prefix, *render_build(self.stack, self.opts, self.lock, str(ctx), target=target,
                                                    tag=tag)[2:]]
        secret = self.work / "pip_index_url"
        if self.opts.pip_index_url and not secret.exists():
            fd = os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.opts.pip_index_url)
        return [a if not a.startswith("id=pip_index_url,") else f"id=pip_index_url,src={secret}" for a in argv]

    def run(self, argv: list[str]) -> tuple[int, str]:
        return _stream(argv, {**os.environ, **self.cli.env}, self.out)


def start(stack: Stack, opts: BuildOptions, out, work: Path, cli: BuildCLI | None = None,
          where: compiles.Here | None = None) -> BuildSession:
    """Everything checked before anything runs (rules, lock, wheelhouse, architectures), then the base (made, or
    a registry image that must be here or pullable) and the pinned source archives. `where` compiles elsewhere
    (`--on HOST`): its GPUs set the default architectures."""
    from dockerlaunch.images import base as bases

    lock = locks.checked(stack, opts.dockerfiles)
    violations = [v for v in check_stack(stack, lock=lock) if v.rule.severity == "error"]
    if violations and not opts.force:
        raise BuildError(f"stack {stack.name} violates {len(violations)} rule(s): {violations[0].line()} "
                         f"({hints.dockerlaunch('stacks', 'check', '--stack', stack.name, hint='build.check')}; "
                         "--force to build anyway)")
    for v in violations:
        _LOG.warning("warning: building despite: %s", v.line())
    check_wheelhouse(stack, opts, lock)
    if opts.ca_cert and not Path(opts.ca_cert).is_file():
        raise ConfigError(f"--ca-cert {opts.ca_cert}: no such file")
    if not opts.ca_cert and not opts.offline:
        opts = replace(opts, ca_cert=system_ca())
    gpus = (where.gpu_archs() if where else local_gpu_archs()) if stack.cuda and not opts.cuda_archs else []
    archs = cuda_archs(stack, opts, gpus)
    check_archs(stack, archs)
    s = BuildSession(stack, replace(opts, cuda_archs=archs), lock, cli or find_cli(), out, work, where=where)
    if stack.cuda and opts.archs_from:
        s.say(f"compiling for compute capability {';'.join(archs)} ({opts.archs_from})")
    elif stack.cuda and not opts.cuda_archs:
        what = where.what if where else "this machine"
        why = f"{what}'s GPUs" if gpus else f"H100/H200; no GPU on {what} to ask"
        s.say(f"compiling for compute capability {';'.join(archs)} ({why}); --cuda-archs '8.0;9.0;10.0' adds A100 "
              "and B200 (each architecture more multiplies the compile time)")
    s.say(f"building with {s.cli.what}")
    if stack.base and not opts.base_image:
        base_tag, found = bases.ensure_base(stack.base.debian, s.cli.docker, log=s.say)
        gcc = next((v for k, v in sorted(found.items()) if k.startswith("gcc")), "?")
        s.say(f"base {base_tag}: Debian {stack.base.debian}, gcc {gcc}, glibc {found.get('libc6', '?')}, Python "
              f"{found.get('python', '?')}")
    else:
        ensure_registry_base(s.cli.docker, opts.base_image or stack.base_image)
    return s


def builder_tag(stack: Stack) -> str:
    return f"dockerlaunch/builder:{stack.name}"


def build_wheels(s: BuildSession) -> list[tuple[Path, str]]:
    """The builder stage, then each compiled package from the wheel cache or compiled now: (wheel, sha256) each."""
    pkgs = wheels.compiled_packages(s.stack, s.lock, s.opts.cuda_archs, flash_prebuilt=bool(prebuilt_flash(s.stack)))
    if not pkgs:
        return []
    tag = builder_tag(s.stack)
    s.say(f"builder stage {tag} (system, CUDA toolkit, torch, build tools, TE's core); "
          f"{', '.join(p.label for p in pkgs)} compile in it")
    code, text = s.run(s.argv(prepare_context(s.stack, s.opts, s.lock, s.work / "builder"), "builder", tag))
    if code != 0:
        _fail(s.stack, s.opts, text)
        raise BuildError(f"build of stack {s.stack.name}: the builder stage failed (exit {code}); its log is above")
    facts = wheels.probe_builder(tag, s.cli.docker)
    wh = Path(s.opts.wheelhouse) if s.opts.wheelhouse else None
    return [compiles.ensure_wheel(pkg, facts, s.lock, tag, wheelhouse=wh, index_url=s.opts.pip_index_url,
                                offline=s.opts.offline, max_jobs=s.opts.max_jobs, docker=s.cli.docker,
                                log=s.say, trust_carried=s.opts.trust_carried_wheels, where=s.where)
            for pkg in pkgs]


def build(stack: Stack, opts: BuildOptions, out=None, verify_after: bool = True,
          cli: BuildCLI | None = None, stage: str = "train", where: compiles.Here | None = None) -> tuple[int, str]:
    """Run the build; returns (exit code, full log). `out` (the CLI passes stdout) gets the log as it comes.
    `cli`: default `find_cli()`. Order: base (made or checked), the builder stage, each compiled package
    from the wheel cache or compiled now, then the image, which installs those wheels; then verify. `stage` cuda
    or builder stops there (tagged --tag, else dockerlaunch/<stage>:<stack>; nothing compiled or verified)."""
    out = out or io.StringIO()
    with tempfile.TemporaryDirectory(prefix="dockerlaunch-build-") as tmp:
        s = start(stack, opts, out, Path(tmp), cli, where)
        if stage != "train":
            tag = opts.tag or (builder_tag(stack) if stage == "builder" else f"dockerlaunch/cuda:{stack.name}")
            code, text = s.run(s.argv(prepare_context(stack, s.opts, s.lock, s.work / stage), stage, tag))
            return code, _fail(stack, opts, text) if code else text
        s.archives = megatron_archive(stack, s.opts, s.say)  # checked before the compiles: a wrong pin fails now
        s.prebuilt = flash_attn_prebuilt(stack, s.opts, s.say)
        compiled = build_wheels(s)
        ctx = prepare_context(stack, s.opts, s.lock, s.work / "train", compiled, s.archives, s.prebuilt)
        code, text = s.run(s.argv(ctx, "train"))
    if code != 0:
        return code, _fail(stack, opts, text)
    if verify_after:
        from dockerlaunch.images.verify import verify

        tag = opts.tag or stack.tag
        report = verify(tag, docker=s.cli.docker, cuda_archs=s.opts.cuda_archs or None)
        out.write(report.render() + "\n")
        if not report.ok:
            return 1, text
        with tempfile.TemporaryDirectory(prefix="dockerlaunch-report-") as tmp:
            stamp_report(s, tag, report, Path(tmp))
    return 0, text


REPORT_DIR = "/opt/dockerlaunch"


def stamp_report(s: BuildSession, tag: str, report, ctx: Path) -> None:
    """The verify report into the image it describes (/opt/dockerlaunch/verify.txt and .json, a small top layer),
    so whoever runs the image later can read what was proven when it was built."""
    (ctx / "verify.txt").write_text(report.render() + "\n")
    (ctx / "verify.json").write_text(report.to_json() + "\n")
    (ctx / "Dockerfile").write_text(f"FROM {tag}\nCOPY verify.txt verify.json {REPORT_DIR}/\n"
                                    f"LABEL {labels_.VERIFY}={REPORT_DIR}/verify.json\n")
    before = subprocess.run([s.cli.docker, "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True,
                            text=True).stdout.strip()
    r = subprocess.run([*s.cli.prefix, "--network", "none", "-t", tag, str(ctx)], capture_output=True, text=True,
                       env={**os.environ, **s.cli.env})
    if r.returncode != 0:
        raise BuildError(f"{tag} built and verified, but its report could not be added to it: "
                         f"{_one_line(r.stderr or r.stdout, 300)}")
    if before:  # the unstamped image, now untagged: its layers live on in the stamped one; no dangling copy
        subprocess.run([s.cli.docker, "rmi", before], capture_output=True)
    s.say(f"verify report in the image: {REPORT_DIR}/verify.txt and verify.json")


def _fail(stack: Stack, opts: BuildOptions, text: str) -> str:
    """A failed `docker build`: pip's hash mismatch becomes one line naming the file; else the log as it is."""
    bad = hash_mismatch(text)
    if bad:
        fix = (f"a wheelhouse file was changed: fetch again ({fetch_again(stack, opts.wheelhouse)})" if opts.offline
               else "the index served another file than the lock was resolved from: check --pip-index-url, or "
               f"lock again ({hints.dockerlaunch('stacks', 'lock', '--stack', stack.name, hint='lock.again')})")
        raise BuildError(f"build of stack {stack.name}: {bad} does not match the lock's hash; {fix}; "
                         "nothing was tagged")
    return text


def cached_steps(build_log: str) -> tuple[list[str], list[str]]:
    """(cached, executed) RUN steps, as `N/M RUN ...`, from a BuildKit plain-progress log."""
    names: dict[str, str] = {}
    cached: set[str] = set()
    for line in build_log.splitlines():
        m = re.match(r"^#(\d+) \[(?:\S+\s+)?(\d+/\d+)\] (RUN .*)$", line)
        if m:
            names[m.group(1)] = f"{m.group(2)} {m.group(3)[:70]}"
            continue
        m = re.match(r"^#(\d+) CACHED", line)
        if m:
            cached.add(m.group(1))
    order = sorted(names, key=lambda i: int(names[i].split("/")[0]))
    return [names[i] for i in order if i in cached], [names[i] for i in order if i not in cached]
