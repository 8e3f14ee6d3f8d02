"""stacks check --binaries, its pure parts: where a wheel's member lands, which wheels can hold libraries, the
recorded tables answering exactly as the files do, symbolic links of a made base, a registry base's share."""

import json
import os

import pytest

from dockerlaunch.images import binaries
from tests.unit.images.test_verify import elfscan, libs  # noqa: F401 - fixtures

SCANNED = ("pkg/libdlcons.so", "pkg/libfakete.so", "pkg/libneedsgone.so", "pkg/libneedsv2.so", "pkg/libneedsglob.so",
           "pkg/libglob.so", "lib/libdlprov.so.1")


@pytest.mark.parametrize("member, where", [
    ("torch/lib/libtorch.so", "torch/lib/libtorch.so"),
    ("foo-1.0.data/platlib/foo/_x.so", "foo/_x.so"),
    ("foo-1.0.data/purelib/foo/_x.so", "foo/_x.so"),
    ("foo-1.0.data/scripts/tool", None),
    ("foo-1.0.data/data/share/x.so", None),
])
def test_a_members_place_under_site_packages(member, where):
    assert binaries.installed_path(member) == where


@pytest.mark.parametrize("name, binary", [
    ("torch-2.11.0-cp313-cp313-manylinux_2_28_x86_64.whl", True),
    ("nvidia_cublas-13.3.0.5-py3-none-manylinux_2_27_x86_64.whl", True),
    ("peft-0.19.1-py3-none-any.whl", False),
    ("not-a-wheel.tar.gz", False),
])
def test_which_wheels_can_hold_libraries(name, binary):
    assert binaries.is_binary_wheel(name) is binary


def _tables(elfscan, libs, root="/v"):  # noqa: F811 - the fixture
    """Every ELF file of the test tree as a table, through JSON, at a virtual path under `root`."""
    out = {}
    for d in ("pkg", "lib", "old"):
        for dirpath, _, files in os.walk(libs / d):
            for f in files:
                p = os.path.join(dirpath, f)
                try:
                    obj = elfscan.read_elf(p)
                except Exception:  # noqa: BLE001 - the tree holds a file that is not ELF on purpose
                    continue
                virtual = root + p[len(str(libs)):]
                out[virtual] = elfscan.obj_from_dict(virtual, json.loads(json.dumps(elfscan.obj_to_dict(obj))))
    return out


def test_recorded_tables_answer_exactly_as_the_files_do(elfscan, libs):  # noqa: F811 - the fixtures
    files = elfscan.Resolver(scanned=[str(libs / n) for n in SCANNED], system_dirs=[])
    tables = elfscan.TableResolver(_tables(elfscan, libs), scanned=[f"/v/{n}" for n in SCANNED], system_dirs=[])
    for n in SCANNED:
        want = json.loads(json.dumps(files.check(str(libs / n))).replace(str(libs), "/v"))
        got = tables.check(f"/v/{n}")
        assert got == want, n
    # what the comparison rests on: the lost versioned symbol is found in both
    assert [m["symbol"] for m in tables.check("/v/pkg/libdlcons.so")["missing_symbols"]] == ["dl_absent"]


def test_a_made_bases_links_are_followed_without_touching_this_machine(elfscan, libs):  # noqa: F811
    objects = _tables(elfscan, libs, root="/usr/x")
    links = {"/lib": "usr/lib", "/usr/lib/prov": "/usr/x/lib", "/loop": "/loop2", "/loop2": "/loop"}
    r = elfscan.TableResolver(objects, links, scanned=[], system_dirs=[])
    assert r._real("/lib/prov/libdlprov.so.1") == "/usr/x/lib/libdlprov.so.1"
    assert r._real("/usr/x/pkg/../lib/libdlprov.so.1") == "/usr/x/lib/libdlprov.so.1"
    assert r._real("/loop/a")  # a cycle ends (40 hops), it does not hang
    assert r._is_file("/lib/prov/libdlprov.so.1") and not r._is_file(str(libs / "lib/libdlprov.so.1"))
    assert r.load("/nowhere/libx.so") is None and "not in the recorded tables" in r.errors["/nowhere/libx.so"]


def test_on_a_registry_base_what_its_libraries_answer_is_left_out_and_named():
    sym = {"clean": 3, "findings": {
        "a.so": {"missing_libraries": [{"name": "libc.so.6", "needed_by": "a.so"}],
                 "missing_symbols": [{"symbol": "memcpy", "expected": "libc.so.6"},
                                     {"symbol": "mystery", "expected": None}], "missing_versions": []},
        "b.so": {"missing_libraries": [{"name": "libstdc++.so.6", "needed_by": "b.so"}],
                 "missing_symbols": [{"symbol": "cublasLtX", "expected": "libcublasLt.so.13"}],
                 "missing_versions": []},
        "c.so": {"missing_libraries": [{"name": "libcublasLt.so.13", "needed_by": "c.so"}],
                 "missing_symbols": [], "missing_versions": []},
        "d.so": {"missing_libraries": [{"name": "libcuda.so.1", "needed_by": "d.so"}],
                 "missing_symbols": [{"symbol": "cuInit", "expected": "libcuda.so.1"}], "missing_versions": []}}}
    base = binaries._registry_base(sym, {"libcublasLt.so.13", "a.so", "b.so", "c.so"})
    assert base == {"libc.so.6", "libstdc++.so.6"}
    assert "a.so" not in sym["findings"] and sym["clean"] == 4
    # a wheel's own library and its symbols stay findings
    assert sym["findings"]["b.so"]["missing_symbols"] == [{"symbol": "cublasLtX", "expected": "libcublasLt.so.13"}]
    assert sym["findings"]["c.so"]["missing_libraries"] == [{"name": "libcublasLt.so.13", "needed_by": "c.so"}]
    # the driver is not the base's: verify's NEEDS-DRIVER row says it
    assert sym["findings"]["d.so"]["missing_libraries"] == [{"name": "libcuda.so.1", "needed_by": "d.so"}]


def test_package_folders_follow_verifys_order(elfscan):  # noqa: F811
    site = "/opt/venv/lib/python3.13/site-packages"
    paths = [f"{site}/{p}" for p in ("nvidia/cu13/lib/libcublas.so.13", "torch/lib/libtorch.so",
                                     "nvidia/nccl/lib/libnccl.so.2", "transformer_engine/libte.so")]
    assert binaries.package_dirs(site, paths, elfscan) == [f"{site}/torch/lib", f"{site}/nvidia/cu13/lib",
                                                           f"{site}/nvidia/nccl/lib"]
