"""Stack locks: every Python distribution a stack's image installs, at one version, with its sha256 hashes.

A stack pins a dozen packages; they pull a hundred more, and pip resolves those afresh at every build, so two
builds a month apart differ. `dockerlaunch stacks lock` resolves a stack's pins together (uv, for the stack's
own Python and manylinux x86-64, against the package index) and writes Dockerfiles/locks/<stack>.lock. Each image
layer then installs its part with `pip install --no-deps --require-hashes`, and `fetch` downloads exactly the
locked files. `stacks check` needs no network: a lock carries the digest of the pins it was resolved from
(stale when they change) and of its own body (changed by hand when that differs).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from dockerlaunch import hints
from dockerlaunch.errors import ConfigError
from dockerlaunch.images import index as idx
from dockerlaunch.images.index import normalize
from dockerlaunch.images.layers import LAYERS, layer_roots
from dockerlaunch.images.stacks import PIN, Stack

FORMAT = 1
# manylinux_2_28 (glibc 2.28) runs on every base of the matrix: Ubuntu 22.04 (2.35), 24.04 (2.39), Debian 12 (2.36)
PLATFORM = "x86_64-manylinux_2_28"
DEFAULT_INDEX = "https://pypi.org/simple"
UV_FIX = "pip install 'uv>=0.13,<0.14' (in dockerlaunch's environment)"
# The CUDA runtime wheel torch pulls tells which CUDA the index's torch was built for.
CUDA_RUNTIME = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime")
HASH = re.compile(r"^sha256:[0-9a-f]{64}\Z")


class LockError(ConfigError):
    """A stack's lock is missing, stale or changed, or its pins do not resolve: the user fixes it (exit 2)."""


def pin_name(pin: str) -> str:
    m = PIN.match(pin)
    return normalize(m.group(1) if m else pin)


@dataclass(frozen=True)
class Entry:
    name: str  # normalized
    version: str
    hashes: tuple[str, ...]  # "sha256:<hex>", one per file the index has for this version
    layer: str

    def requirement(self) -> str:
        return " \\\n".join([f"{self.name}=={self.version}", *(f"    --hash={h}" for h in self.hashes)])


@dataclass(frozen=True)
class Lock:
    path: Path
    header: dict[str, str]
    body: str
    entries: tuple[Entry, ...]

    @property
    def stack(self) -> str:
        return self.header.get("stack", "")

    def get(self, name: str) -> Entry | None:
        return next((e for e in self.entries if e.name == normalize(name)), None)

    def layer(self, layer: str) -> list[Entry]:
        return [e for e in self.entries if e.layer == layer]

    def layer_text(self, layer: str, drop: frozenset[str] = frozenset()) -> str:
        """A layer's part as a requirements file for `pip install --no-deps --require-hashes -r`."""
        return "".join(e.requirement() + "\n" for e in self.layer(layer) if e.name not in drop)


# ---------------------------------------------------------------- what a lock is resolved from


def flat_pins(stack: Stack) -> list[str]:
    """Every pin a lock resolves, once each, in layer order."""
    out: list[str] = []
    for pins in layer_roots(stack).values():
        out += [p for p in pins if p not in out]
    return out


def inputs_digest(stack: Stack) -> str:
    """What the resolution depends on: the pins per layer, Python, platform and CUDA (not sources or the base)."""
    data = {"format": FORMAT, "python": stack.python, "platform": PLATFORM, "cuda": stack.cuda,
            "roots": layer_roots(stack)}
    if stack.overrides:  # only where there are any: the other stacks' locks keep their digests
        data["overrides"] = sorted(stack.overrides)
    if stack.drop:
        data["drop"] = sorted(stack.drop)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def lock_path(stack: Stack, dockerfiles: Path) -> Path:
    return dockerfiles / "locks" / f"{stack.name}.lock"


# ---------------------------------------------------------------- uv's answer -> entries


def parse_compiled(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """uv pip compile's requirements output (with hashes, without annotations) -> name: (version, hashes)."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(\s*\\)?$", raw)
        if m:
            current = normalize(m.group(1))
            out[current] = (m.group(2), ())
        elif current is not None and line.startswith("--hash="):
            version, hashes = out[current]
            out[current] = (version, (*hashes, line[len("--hash="):].rstrip(" \\")))
    return out


def assign_layers(resolved: dict, subsets: dict[str, set[str]]) -> dict[str, str]:
    """Each distribution goes to the lowest layer whose pins (with those of the layers below) need it.
    `subsets[layer]`: what resolving the pins of that layer and all below it installs, at the final versions.
    (uv's `# via` annotations cannot say this: with extras, aiohttp is `via fsspec`, a torch dependency, but only
    datasets asks for fsspec[http].)"""
    out = {}
    for name in resolved:
        out[name] = next((layer for layer in LAYERS if name in subsets.get(layer, ())), LAYERS[-1])
    return out


def cuda_problem(stack: Stack, versions: dict[str, str]) -> str | None:
    """The index's torch must be the stack's CUDA build (apex needs nvcc == torch.version.cuda) or its CPU
    build: a CUDA 13 torch locked into a CUDA 12.8 image imports, then fails on the first kernel."""
    runtime = next(((n, versions[n]) for n in CUDA_RUNTIME if n in versions), None)
    torch = versions.get("torch", stack.torch)
    if stack.cuda is None:
        if runtime or any(n.startswith("nvidia-") for n in versions):
            return (f"stack {stack.name} is a CPU stack, but torch {torch} from the package index is a CUDA build "
                    f"({runtime[0] + ' ' + runtime[1] if runtime else 'it pulls nvidia-* wheels'}): pin torch "
                    f"{torch.split('+')[0]}+cpu and lock with its index (--torch-index, or --find-links)")
        return None
    if runtime is None:
        if "+" in torch:
            return None  # a local variant (+cu128) bundles its runtime: its index is the stack's own
        return (f"stack {stack.name}: torch {torch} from the package index pulls no CUDA runtime wheel, so which CUDA "
                f"it was built for is unknown: pin torch {torch}+cu{stack.cuda.replace('.', '')} and lock with "
                "its index (--torch-index)")
    got = ".".join(runtime[1].split(".")[:2])
    if got != stack.cuda:
        return (f"stack {stack.name}: torch {torch} from the package index is built for CUDA {got} ({runtime[0]} "
                f"{runtime[1]}), the stack's base has CUDA {stack.cuda}: pin torch "
                f"{torch.split('+')[0]}+cu{stack.cuda.replace('.', '')} and lock with --torch-index "
                f"{stack.torch_index_url or 'https://download.pytorch.org/whl/cu' + stack.cuda.replace('.', '')}")
    return None


# ---------------------------------------------------------------- the lock file


def render(stack: Stack, resolved: dict[str, tuple[str, tuple[str, ...]]], layers: dict[str, str],
           meta: dict[str, str]) -> str:
    body_lines = []
    for layer in LAYERS:
        names = sorted(n for n in resolved if layers[n] == layer)
        if not names:
            continue
        body_lines.append(f"# layer {layer}")
        for n in names:
            version, hashes = resolved[n]
            if not hashes:
                raise LockError(f"{n}=={version}: the package index gave no sha256 for it (a local folder without "
                                "hashes?): lock against an index")
            body_lines.append(Entry(n, version, tuple(sorted(hashes)), layer).requirement())
    body = "\n".join(body_lines) + "\n"
    header = {
        "stack": stack.name, "python": stack.python, "platform": PLATFORM, "cuda": stack.cuda or "none",
        "pins": " ".join(flat_pins(stack)),
        **({"overrides": " ".join(stack.overrides)} if stack.overrides else {}),
        **({"drop": " ".join(stack.drop)} if stack.drop else {}),
        "inputs-sha256": inputs_digest(stack),
        "body-sha256": hashlib.sha256(body.encode()).hexdigest(), **meta,
    }
    head = [f"# dockerlaunch lock of stack {stack.name}: every Python distribution its image installs, with its "
            "sha256 hashes.",
            f"# Written by `{hints.dockerlaunch('stacks', 'lock', '--stack', stack.name, hint='lock.header')}`; do not "
            "edit (stacks check compares the digests below)."]
    head += [f"# {k}: {v}" for k, v in header.items()]
    return "\n".join(head) + "\n\n" + body


def parse(text: str, path: Path) -> Lock:
    head, sep, body = text.partition("\n\n")
    if not sep:
        raise LockError(f"{path}: not a dockerlaunch lock (no header): write it again with "
                        + hints.dockerlaunch("stacks", "lock", "--stack", "NAME", hint="lock.rewrite"))
    header = {}
    for line in head.splitlines():
        m = re.match(r"^# ([a-z0-9-]+): (.*)$", line)
        if m:
            header[m.group(1)] = m.group(2)
    entries: list[Entry] = []
    layer = None
    name = version = None
    hashes: list[str] = []

    def done() -> None:
        if name is not None:
            entries.append(Entry(name, version or "", tuple(hashes), layer or ""))

    for raw in body.splitlines():
        line = raw.strip()
        m = re.match(r"^# layer (\S+)$", line)
        if m:
            done()
            name, hashes, layer = None, [], m.group(1)
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(\s*\\)?$", line)
        if m:
            done()
            name, version, hashes = normalize(m.group(1)), m.group(2), []
            continue
        if line.startswith("--hash="):
            hashes.append(line[len("--hash="):].rstrip(" \\"))
        elif line and not line.startswith("#"):
            raise LockError(f"{path}: cannot read line {line[:80]!r}: write it again with "
                            + hints.dockerlaunch("stacks", "lock", "--stack", "NAME", hint="lock.rewrite"))
    done()
    return Lock(path, header, body, tuple(entries))


def read(stack: Stack, dockerfiles: Path) -> Lock:
    path = lock_path(stack, dockerfiles)
    try:
        return parse(path.read_text(), path)
    except FileNotFoundError:
        raise LockError(f"stack {stack.name} has no lock ({path}): run "
                        + hints.dockerlaunch("stacks", "lock", "--stack", stack.name, hint="lock.again")) from None
    except OSError as e:
        raise LockError(f"{path}: {e.strerror}") from None


def problems(stack: Stack, lock: Lock) -> list[str]:
    """Why this lock is not the stack's, one line each (no network)."""
    fix = "run " + hints.dockerlaunch("stacks", "lock", "--stack", stack.name, hint="lock.again")
    where = f"{lock.path}"
    out = []
    if hashlib.sha256(lock.body.encode()).hexdigest() != lock.header.get("body-sha256"):
        out.append(f"{where} was edited by hand (its body no longer matches its body-sha256): {fix}")
    if lock.header.get("python") != stack.python:
        out.append(f"{where} is for Python {lock.header.get('python')}, stack {stack.name} is Python "
                   f"{stack.python}: {fix}")
    if lock.header.get("inputs-sha256") != inputs_digest(stack):
        was = {pin_name(p): p
               for p in [*lock.header.get("pins", "").split(), *lock.header.get("overrides", "").split()]}
        now = {pin_name(p): p for p in [*flat_pins(stack), *stack.overrides]}
        changed = [f"{was.get(n, '(none)')} -> {now.get(n, '(none)')}" for n in sorted(set(was) | set(now))
                   if was.get(n) != now.get(n)]
        what = ", ".join(changed) if changed else "its Python, CUDA or the lock format changed"
        out.append(f"{where} is stale: stack {stack.name}'s pins changed since it was resolved ({what}): {fix}")
    for e in lock.entries:
        if not e.hashes or not all(HASH.match(h) for h in e.hashes):
            out.append(f"{where}: {e.name}=={e.version} has no valid sha256 hash: {fix}")
            break
        if e.layer not in LAYERS:
            out.append(f"{where}: {e.name} is in an unknown layer {e.layer!r}: {fix}")
            break
    if not out:
        for pin in [*flat_pins(stack), *stack.overrides]:
            m = PIN.match(pin)
            if m:
                e = lock.get(m.group(1))
                if e is None or e.version != m.group(3):
                    out.append(f"{where}: the pin {pin} is not what the lock holds "
                               f"({e.name + '==' + e.version if e else 'absent'}): {fix}")
    return out


def check(stack: Stack, dockerfiles: Path) -> list[str]:
    try:
        return problems(stack, read(stack, dockerfiles))
    except LockError as e:
        return [str(e)]


def checked(stack: Stack, dockerfiles: Path) -> Lock:
    """The stack's lock, or a one-line LockError that says how to fix it."""
    lock = read(stack, dockerfiles)
    found = problems(stack, lock)
    if found:
        raise LockError(found[0])
    return lock


# ---------------------------------------------------------------- resolving (network)


def uv_binary() -> str:
    try:
        from uv import find_uv_bin  # the uv wheel: a static binary and this helper

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        pass
    found = shutil.which("uv")
    if not found:
        raise LockError(f"stacks lock resolves with uv, which is not installed: {UV_FIX}")
    return found


def torch_index_for(stack: Stack, torch_index: str | None) -> str | None:
    """A local variant (2.13.0+cpu, 2.9.0+cu126) lives only on the PyTorch index; a plain version on the main index."""
    if torch_index is not None:
        return torch_index or None  # "" -> none
    return stack.torch_index_url if "+" in stack.torch else None


def resolve(stack: Stack, index_url: str | None = None, find_links: tuple[str, ...] = (),
            torch_index: str | None = None, ca_cert: str | None = None, timeout: float = 900,
            prefer: dict[str, str] | None = None) -> str:
    """The lock file's text for `stack`, resolved now (network). `prefer` (name -> version, the committed lock's)
    keeps those versions where the pins still allow them, so adding one pin does not move every other package
    (uv's preference for an existing output file)."""
    index = index_url or DEFAULT_INDEX
    extra = torch_index_for(stack, torch_index)
    # uv sends a URL's user:password@ as Basic auth: over plain http only to this machine, refused before uv runs
    idx.check_credentials(index, "--index-url")
    if extra:
        idx.check_credentials(extra, "--torch-index" if torch_index else f"stack {stack.name}'s torch_index_url")
    for d in find_links:
        if "://" in d:
            idx.check_credentials(d, "--find-links")
    uv = uv_binary()
    # the sources go to uv through its environment, never its argv (an index URL may hold a token: `ps` shows
    # argv to every user, /proc/<pid>/environ only to the owner)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    env["UV_INDEX_URL"] = index
    if extra:
        env["UV_EXTRA_INDEX_URL"] = extra
    if find_links:
        env["UV_FIND_LINKS"] = ",".join(find_links)
    # an index on this machine is asked directly, never through http_proxy: plain-http credentials are allowed
    # to it only because they do not cross the network
    local = [h for u in (index, extra, *find_links) if u and "://" in u
             and idx.is_loopback(h := urllib.parse.urlsplit(u).hostname or "")]
    if local:
        direct = ",".join([*filter(None, [env.get("NO_PROXY") or env.get("no_proxy")]), *sorted(set(local))])
        env["NO_PROXY"] = env["no_proxy"] = direct
    secret_urls = [u for u in (index, extra, *find_links) if u and idx.redact(u) != u]
    sources: list[str] = []
    if ca_cert:  # a TLS-intercepting proxy's CA, as pip's --cert; else the system's store (pip's default too)
        env["SSL_CERT_FILE"] = ca_cert
    common = ["--python-version", stack.python, "--python-platform", PLATFORM, "--no-header", "--no-config",
              "--no-python-downloads", "--no-progress", "--color", "never", "--system-certs", *sources]

    def compile_(tmp: str, files: list[str], more: list[str]) -> str:
        try:
            r = subprocess.run([uv, "pip", "compile", *files, *common, *more], cwd=tmp, capture_output=True,
                               text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise LockError(f"stack {stack.name}: uv did not resolve in {timeout:.0f} s (is {idx.redact(index)} "
                            "reachable?)") from None
        if r.returncode != 0:
            raise LockError(f"stack {stack.name}: {scrub(explain(r.stderr), secret_urls)}")
        return r.stdout

    roots = layer_roots(stack)
    with tempfile.TemporaryDirectory(prefix="dockerlaunch-lock-") as tmp:
        if stack.overrides or stack.drop:  # uv's overrides replace a dependency's exact pin (torch's cuBLAS for
            # TE's); one whose marker is never true removes the dependency
            lines = [*stack.overrides, *(f"{n} ; sys_platform == 'never'" for n in stack.drop)]
            Path(tmp, "overrides.txt").write_text("\n".join(lines) + "\n")
            common += ["--override", "overrides.txt"]
        for layer, pins in roots.items():
            Path(tmp, f"{layer}.in").write_text("\n".join(pins) + "\n")
        files = [f"{layer}.in" for layer in roots]
        keep: list[str] = []
        if prefer:
            Path(tmp, "prefer.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(prefer.items())))
            keep = ["--output-file", "prefer.txt"]
        resolved = parse_compiled(compile_(tmp, files, ["--generate-hashes", "--no-annotate", *keep]))
        problem = cuda_problem(stack, {n: v for n, (v, _) in resolved.items()})
        if problem:
            raise LockError(problem)
        # Which layer installs what: the layers' pins resolved cumulatively, held to the final versions.
        Path(tmp, "final.txt").write_text("".join(f"{n}=={v}\n" for n, (v, _) in resolved.items()))
        subsets: dict[str, set[str]] = {}
        for i, layer in enumerate(roots):
            if i == len(roots) - 1:
                subsets[layer] = set(resolved)
                break
            # the whole set's versions as preferences, not constraints: this pass only says which names each
            # layer needs (uv can fail to find a version as a constraint that it chose in the whole pass)
            shutil.copy(Path(tmp, "final.txt"), Path(tmp, f"subset-{i}.txt"))
            subsets[layer] = set(parse_compiled(compile_(tmp, files[: i + 1], [
                "--output-file", f"subset-{i}.txt", "--no-annotate"])))
        version = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.strip()
    shown = [idx.redact(u) for u in (index, *([extra] if extra else []))] + [
        f"find-links {idx.redact(d)}" for d in find_links]
    meta = {"resolver": version, "sources": "; ".join(shown),
            "resolved": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
    return render(stack, resolved, assign_layers(resolved, subsets), meta)


def scrub(text: str, urls: list[str]) -> str:
    """`text` with every credential of `urls` taken out (uv may quote a URL it could not reach)."""
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        text = text.replace(url, idx.redact(url))
        for secret in {userinfo, parts.password or "", urllib.parse.unquote(parts.password or "")} - {""}:
            text = text.replace(secret, "***")
    return text


def explain(stderr: str) -> str:
    """uv's reason as one line: the two requirements that conflict, or what could not be reached."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.lstrip().startswith("warning:")]
    text = " ".join(ln.removeprefix("error: ").removeprefix("cause: ").removeprefix("╰─▶ ").removeprefix("× ")
                    for ln in lines)
    text = re.sub(r"\s+", " ", text)
    if "No solution found" in text or "unsatisfiable" in text:
        why = re.sub(r"^.*?No solution found when resolving dependencies:?\s*", "", text)
        return f"its pins cannot be installed together: {why}"
    return f"uv could not resolve it: {text[:600]}"
