"""Locked files from a package index, for any target Python: find each locked distribution's file by its hash.

`pip download` answers for the Python it runs under (and, for another one, cannot fetch sdists whose setup.py
imports torch to make metadata), so a machine with Python 3.11 could not fill a wheelhouse for a Python 3.13 stack.
Here the lock already names every file's sha256: the index's simple page (PEP 503, which PyPI, mirrors and the
PyTorch index all serve) lists files with their hashes, the target's wheel tags pick the one the image installs,
and the bytes are checked as they arrive.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import http.client
import ipaddress
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from functools import cache
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

from dockerlaunch import hints
from dockerlaunch.cache import HashMismatch, write_checked
from dockerlaunch.errors import DockerlaunchError

if TYPE_CHECKING:  # the lock names what to fetch; the index knows only an entry's name, version and hashes
    from dockerlaunch.images.lock import Entry


class FetchError(DockerlaunchError):
    pass


class NoSpace(FetchError):
    """The disk a file was being written to filled (not the index's fault: the caller says where to free room)."""


NET_ERRORS = (OSError, http.client.HTTPException, ValueError)  # what urllib raises besides URLError
# (scheme, host, port) -> Authorization header, from an index URL's user:password@ (never printed): a file the
# index links to on the same origin gets it; a redirect to any other origin (object storage) never does
_AUTH: dict[tuple[str, str, int], str] = {}


def redact(url: str) -> str:
    """The URL without its user:password@, for every message and log line (also one urlsplit cannot read)."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.username is None and parts.password is None:
            return url
        host = parts.hostname or ""
        return urllib.parse.urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")))
    except ValueError:  # a port that is not a number, a broken [IPv6] address
        return redact_loose(url)


def origin(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def is_loopback(host: str) -> bool:
    """This machine, by the parsed host: a loopback IP address (127.0.0.0/8, ::1) or exactly `localhost`. A name
    is never judged by how it begins (`localhost.evil.example` and `127.evil.example` are anyone's)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_credentials(url: str, what: str = "index") -> None:
    """Credentials only over https, or plain http to this machine: a one-line refusal naming `what` (the flag)
    and the URL, before any byte is sent."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here, not later in a client
    except ValueError as e:
        raise FetchError(f"{what} {redact_loose(url)} is not a valid URL ({e}): write it as "
                         "https://user:token@host[:port]/path") from None
    if parts.username is None and parts.password is None:
        return
    # the host this check reads must be the one every client connects to: uv (WHATWG URLs) and pip (urllib3) end
    # the host at a backslash, urlsplit does not; urlsplit reads [::1].evil.example as ::1, http.client does not
    hostinfo = parts.netloc.rpartition("@")[2]
    if "\\" in parts.netloc or not re.fullmatch(r"(\[[0-9A-Za-z:.%]+\]|[^\[\]:]+)(:[0-9]*)?", hostinfo):
        raise FetchError(f"{what}: the host part of this URL with credentials is read as different hosts by "
                         "different clients (a backslash, or text after an [IPv6] address): write it as "
                         "https://user:token@host[:port]/path")
    if parts.scheme.lower() != "https" and not is_loopback(parts.hostname or ""):
        raise FetchError(f"{what} {redact(url)}: credentials over plain http can be read on the network: use https "
                         "(plain http only to a loopback address)")


def redact_loose(url: str) -> str:
    """`url` with everything up to the last @ of its host part left out, for a URL urlsplit cannot take whole."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<the URL>"
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    host = rest[:end].rpartition("@")[2].replace("\\", "/").split("/")[0]
    return f"{scheme}://{host}{rest[end:]}" if "@" in rest[:end] else url


def request(url: str, **headers: str) -> urllib.request.Request:
    """A request for `url` with its credentials, if any, as a Basic Authorization header (urllib does not read
    user:password@ from a URL), also for later URLs of the same origin (files an index page links to). The header
    is never copied to a redirect (`open_url`'s handler gives it back only on the same origin), and credentials
    over plain http are refused unless the index is on this machine."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is not None:
        check_credentials(url)
        cred = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        _AUTH[origin(url)] = "Basic " + base64.b64encode(cred.encode()).decode()
    req = urllib.request.Request(redact(url), headers=headers)
    auth = _AUTH.get(origin(url))
    if auth:
        req.add_unredirected_header("Authorization", auth)
    return req


class _SameOriginAuth(urllib.request.HTTPRedirectHandler):
    """urllib copies a request's headers to the redirect's: credentials go only where they were given."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            for key in [k for k in new.headers if k.lower() == "authorization"]:
                del new.headers[key]
            auth = _AUTH.get(origin(new.full_url))
            if auth:
                new.add_unredirected_header("Authorization", auth)
        return new


class _DirectToLoopback(urllib.request.ProxyHandler):
    """The environment's proxies, except for this machine: plain http with credentials is allowed only to a
    loopback address, and through http_proxy it would cross the network to the proxy (no_proxy is often unset)."""

    def proxy_open(self, req, proxy, type):
        if is_loopback(urllib.parse.urlsplit(req.full_url).hostname or ""):
            return None
        return super().proxy_open(req, proxy, type)


_OPENER = urllib.request.build_opener(_DirectToLoopback(), _SameOriginAuth)


def open_url(req: urllib.request.Request, timeout: float):
    """urlopen with credentials kept to their origin across redirects, and this machine never asked through a
    proxy."""
    return _OPENER.open(req, timeout=timeout)


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str  # http(s) URL or a local path
    sha256: str | None  # None for a find-links file not hashed yet


def target_tags(python: str, glibc_max: int = 28) -> list[Tag]:
    """The wheel tags an x86-64 Linux CPython `python` installs, best first (manylinux up to glibc 2.`glibc_max`,
    the lock's platform)."""
    major, minor = (int(x) for x in python.split("."))
    plats = [f"manylinux_2_{n}_x86_64" for n in range(glibc_max, 4, -1)]
    plats += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    return [*cpython_tags((major, minor), platforms=plats), *compatible_tags((major, minor), platforms=plats)]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


@cache
def index_files(index_url: str, project: str) -> tuple[IndexFile, ...]:
    """The project's files on a PEP 503 index, with the sha256 each link carries."""
    check_credentials(index_url)
    page = f"{index_url.rstrip('/')}/{project}/"
    try:
        with open_url(request(page, Accept="text/html"), timeout=60) as r:
            text = r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return ()
        raise FetchError(f"index {redact(index_url)}: {project}: HTTP {e.code}") from None
    except NET_ERRORS as e:
        raise FetchError(f"index {redact(index_url)} is not reachable ({getattr(e, 'reason', e)}): fetch on a "
                         "machine that reaches it, or give --index-url / --find-links") from None
    page = redact(page)
    parser = _Links()
    parser.feed(text)
    out = []
    for href, name in parser.links:
        url, _, frag = urllib.parse.urljoin(page, href).partition("#")
        sha = frag[len("sha256="):] if frag.startswith("sha256=") else None
        out.append(IndexFile(name or urllib.parse.unquote(url.rsplit("/", 1)[-1]), url, sha))
    return tuple(out)


def folder_files(folder: str, project: str) -> list[IndexFile]:
    """The project's files in a find-links folder (hashed when chosen)."""
    out = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        if dist_name(name) == project:
            out.append(IndexFile(name, os.path.join(folder, name), None))
    return out


def normalize(name: str) -> str:
    """PEP 503: `Transformer_Engine` and `transformer-engine` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_name(filename: str) -> str | None:
    try:
        if filename.endswith(".whl"):
            return normalize(parse_wheel_filename(filename)[0])
        return normalize(parse_sdist_filename(filename)[0])
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def choose(entry: Entry, files: list[IndexFile], tags: list[Tag]) -> IndexFile | None:
    """The locked file the target installs: the best-ranked compatible wheel among the entry's hashes, else its
    sdist. Files without a hash on the page (find-links) are hashed here."""
    want = {h.removeprefix("sha256:") for h in entry.hashes}
    rank = {t: i for i, t in enumerate(tags)}
    best: tuple[int, IndexFile] | None = None
    sdist = None
    for f in files:
        if f.filename.endswith(".whl"):
            try:
                _, version, _, ftags = parse_wheel_filename(f.filename)
            except InvalidWheelFilename:
                continue
            score = min((rank[t] for t in ftags if t in rank), default=None)
            if score is None or str(version) != entry.version and version.public != entry.version:
                continue
        else:
            try:
                _, version = parse_sdist_filename(f.filename)
            except InvalidSdistFilename:
                continue
            if str(version) != entry.version:
                continue
            score = None
        sha = f.sha256 or (file_sha256(f.url) if not f.url.startswith(("http:", "https:")) else None)
        if sha not in want:
            continue
        f = IndexFile(f.filename, f.url, sha)
        if score is None:
            sdist = sdist or f
        elif best is None or score < best[0]:
            best = (score, f)
    return best[1] if best else sdist


def download(f: IndexFile, dest: Path) -> Path:
    """The file into `dest` (a folder), its bytes checked against its sha256 as they arrive; a copy already there
    with the right hash is kept."""
    target = dest / f.filename
    if target.is_file() and file_sha256(target) == f.sha256:
        return target
    try:
        if f.url.startswith(("http:", "https:")):
            src = open_url(request(f.url), timeout=300)
        else:
            src = open(f.url, "rb")
        with src:
            write_checked(src, target, f.sha256)
    except HashMismatch as e:
        raise FetchError(f"{f.filename}: the bytes that arrived do not match the lock (expected sha256 {f.sha256}, "
                         f"got {e.got}): the index or a proxy served another file") from None
    except NET_ERRORS as e:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise NoSpace(f"no space left in {dest} while writing {f.filename}: free some") from None
        raise FetchError(f"downloading {f.filename} failed ({getattr(e, 'reason', e)})") from None
    return target


def locate(entry: Entry, indexes: list[str], folders: list[str], tags: list[Tag]) -> IndexFile:
    """Where the entry's file is: the find-links folders first (a local copy), then each index in order."""
    for folder in folders:
        f = choose(entry, folder_files(folder, entry.name), tags)
        if f:
            return f
    for index in indexes:
        f = choose(entry, list(index_files(index, entry.name)), tags)
        if f:
            return f
    where = ", ".join([*map(redact, indexes), *(f"find-links {d}" for d in folders)])
    raise FetchError(f"{entry.name}=={entry.version}: no file with one of the lock's hashes for this Python and "
                     f"platform in {where}; lock again against the index you fetch from "
                     f"({hints.dockerlaunch('stacks', 'lock', '--stack', 'NAME', hint='fetch.lock-again')})")
