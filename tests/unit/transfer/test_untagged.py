"""An image tar re-streamed for `docker load` (bundles, `load --hosts`, pushes) can name no tag: links among its
metadata names or above them are refused, and a bundle's image tar is loaded with metadata rebuilt from the facts
the bundle checks (issue 50, finding 2)."""

import hashlib
import io
import json
import tarfile

import pytest

from dockerlaunch.errors import TransferError
from dockerlaunch.transfer.image_facts import LocalImage
from dockerlaunch.transfer.restream import image_chunks, untagged_chunks


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


CFG, EVIL_CFG = b'{"rootfs": {"type": "layers", "n": 1}}', b'{"rootfs": {"type": "layers", "n": 2}}'
LAYER = b"x" * 3000
MANIFEST = {"schemaVersion": 2, "config": {"digest": sha(CFG)}}
MANIFEST_RAW = json.dumps(MANIFEST).encode()


def entry(cfg: bytes, tags: list[str]) -> dict:
    return {"Config": f"blobs/sha256/{sha(cfg)[7:]}", "RepoTags": tags, "Layers": ["layer/layer.tar"],
            "LayerSources": {}, "Extra": "dropped"}


def tar_of(*members) -> bytes:
    """members: (name, bytes) regular files, (name, "->", target) symlinks, (name, "=>", target) hardlinks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for m in members:
            info = tarfile.TarInfo(m[0])
            if len(m) == 3:
                info.type, info.linkname = (tarfile.SYMTYPE if m[1] == "->" else tarfile.LNKTYPE), m[2]
                t.addfile(info)
            else:
                info.size = len(m[1])
                t.addfile(info, io.BytesIO(m[1]))
    return buf.getvalue()


def good_members():
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(MANIFEST_RAW),
         "size": len(MANIFEST_RAW), "annotations": {"io.containerd.image.name": "victim:latest"}},
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(b"other"), "size": 5,
         "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}
    return [("layer/layer.tar", LAYER), (f"blobs/sha256/{sha(CFG)[7:]}", CFG),
            (f"blobs/sha256/{sha(EVIL_CFG)[7:]}", EVIL_CFG), (f"blobs/sha256/{sha(MANIFEST_RAW)[7:]}", MANIFEST_RAW),
            ("repositories", b'{"victim": {"latest": "x"}}'), ("oci-layout", b'{"imageLayoutVersion":"9"}'),
            ("index.json", json.dumps(index).encode()),
            ("manifest.json", json.dumps([entry(CFG, ["app:1"]), entry(EVIL_CFG, ["victim:latest"])]).encode())]


def run(tar: bytes, **kw) -> bytes:
    return b"".join(untagged_chunks(iter([tar[i:i + 700] for i in range(0, len(tar), 700)]), **kw))


EVIL_MANIFEST = json.dumps([entry(EVIL_CFG, ["victim:latest"])]).encode()
LINKS = {
    "symlinked manifest": [("evil.json", EVIL_MANIFEST), ("manifest.json", "->", "evil.json")],
    "hardlinked manifest": [("evil.json", EVIL_MANIFEST), ("manifest.json", "=>", "evil.json")],
    "symlinked index": [("evil.json", b"{}"), ("index.json", "->", "evil.json")],
    "hardlinked repositories": [("evil.json", b"{}"), ("repositories", "=>", "evil.json")],
    "linked parent folder": [("d", "->", "."), ("d/manifest.json", EVIL_MANIFEST)],
    "link made after a member under it": [("d/manifest.json", EVIL_MANIFEST), ("d", "->", ".")],
    "hardlinked parent folder": [("e/x", b"1"), ("d", "=>", "e"), ("d/y/manifest.json", EVIL_MANIFEST)],
}


@pytest.mark.parametrize("case", list(LINKS))
def test_links_among_the_metadata_names_or_above_any_member_are_refused(case):
    """Docker's classic loader follows a symlinked or hardlinked manifest.json (or a `d -> .` folder above
    `d/manifest.json`): re-streaming matched the name only, and the tar's own RepoTags moved the user's tags."""
    tar = tar_of(("layer/layer.tar", LAYER), *LINKS[case])
    for stream in (lambda: run(tar), lambda: b"".join(image_chunks(iter([tar]), LocalImage("a:1", sha(CFG), 1)))):
        with pytest.raises(TransferError) as e:
            stream()
        msg = str(e.value)
        assert "link" in msg and "\n" not in msg, msg
        assert any(repr(m[0]) in msg for m in LINKS[case]), msg  # it names the member


def test_a_bundles_image_tar_is_loaded_with_metadata_rebuilt_for_its_image_only():
    """The tar's own manifest.json, index.json, repositories and oci-layout go; in their place (at the end), one
    manifest.json entry for the image the bundle names (no tag, no other key) and an index of its manifest only
    (no annotation): a second image in the tar is never loaded, whatever it claims. The small members' digests
    are reported (the images the tar holds: the tag check after a load watches them)."""
    contained: set[str] = set()
    out = run(tar_of(*good_members()), expect=(sha(CFG), sha(MANIFEST_RAW)), contained=contained)
    with tarfile.open(fileobj=io.BytesIO(out)) as t:
        names = t.getnames()
        assert names[-3:] == ["manifest.json", "oci-layout", "index.json"] and "repositories" not in names
        assert len(names) == len(set(names))
        assert json.loads(t.extractfile("manifest.json").read()) == [
            {"Config": f"blobs/sha256/{sha(CFG)[7:]}", "RepoTags": None, "Layers": ["layer/layer.tar"]}]
        index = json.loads(t.extractfile("index.json").read())
        assert index["manifests"] == [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                       "digest": sha(MANIFEST_RAW), "size": len(MANIFEST_RAW)}]
        assert json.loads(t.extractfile("oci-layout").read()) == {"imageLayoutVersion": "1.0.0"}
        assert t.extractfile("layer/layer.tar").read() == LAYER
    assert {sha(CFG), sha(EVIL_CFG), sha(MANIFEST_RAW)} <= contained
    # the same bytes every time (a staged prefix on a host is proven ours by their sha256)
    assert run(tar_of(*good_members()), expect=(sha(CFG), sha(MANIFEST_RAW))) == out


def test_a_bundles_image_tar_that_does_not_hold_its_image_is_refused():
    tar = tar_of(*[m for m in good_members() if m[0] != "manifest.json"],
                 ("manifest.json", json.dumps([entry(EVIL_CFG, ["victim:latest"])]).encode()))
    with pytest.raises(TransferError) as e:
        run(tar, expect=(sha(CFG), sha(MANIFEST_RAW)))
    assert f"names no image {sha(CFG)[7:19]}" in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(TransferError, match="no manifest.json"):
        run(tar_of(("layer/layer.tar", LAYER)), expect=(sha(CFG), ""))


def test_a_bundle_whose_image_tar_is_refused_fails_in_one_line_and_the_tags_are_checked(tmp_path):
    """The refusal reaches load_bundle however the loader met it (here a loader that wraps every error of its
    stream in its own, as an SSH channel's writer does): one line naming the image, and the engine's tags are
    listed again after the failed load (a load that failed may still have moved one)."""
    import zstandard

    from dockerlaunch.errors import HostError
    from dockerlaunch.transfer.bundle import BUNDLE_FORMAT, ENGINE_TAGS, load_bundle

    inner = tar_of(("layer/layer.tar", LAYER), *LINKS["linked parent folder"])
    name = f"images/{sha(CFG)[7:]}.tar"
    manifest = json.dumps({"format": BUNDLE_FORMAT, "images": [{
        "ref": "app:1", "id": sha(CFG), "manifest_id": sha(MANIFEST_RAW), "size": 1, "file": name,
        "sha256": hashlib.sha256(inner).hexdigest(), "bytes": len(inner)}]}).encode()
    path = tmp_path / "b.dlb"
    path.write_bytes(zstandard.ZstdCompressor().compress(tar_of((name, inner), ("manifest.json", manifest))))

    def loader(stream, piece):
        try:
            while stream.read(1 << 20):
                pass
        except TransferError as e:
            raise HostError("node1", f"sending input failed: {e}") from None
        return 0, ""

    ran = []
    with pytest.raises(TransferError) as e:
        load_bundle(path, loader, lambda argv: ran.append(argv) or (0, ""), where="host node1")
    msg = str(e.value)
    assert msg.startswith("host node1: app:1 (" + name + ") in bundle ") and "was refused: image tar member " \
        "'d/manifest.json' is under 'd', a link" in msg and "\n" not in msg, msg
    assert ran.count(ENGINE_TAGS) == 2 and not any(a[:2] == ["docker", "tag"] for a in ran), ran
