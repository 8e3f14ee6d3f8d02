"""Forward compatibility (cuda-compat): every verdict doctor gives an image that ships it (gpu.cuda.compat_problem
through gpu.needs), what verify reads of it (the file's name, its ELF note, the image's environment), and the plan
that puts its folder first in device mode only where it is what runs the image."""

import ast
import json
import struct
from pathlib import Path

import pytest

from dockerlaunch.gpu import cuda
from dockerlaunch.gpu.host import Gpu, GpuHost
from dockerlaunch.gpu.needs import CudaCompat, ImageNeeds, compat_of_env, compat_to_load
from dockerlaunch.images import verify_judges
from dockerlaunch.verdict import Verdict

# nvidia/cuda:13.0.1's environment (NVIDIA_REQUIRE_CUDA as its Dockerfiles write it)
REQUIRE = ("cuda>=13.0 brand=tesla,driver>=535,driver<536 brand=tesla,driver>=550,driver<551 "
           "brand=tesla,driver>=570,driver<571")
ENV = ("PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/bin", "CUDA_VERSION=13.0.1",
       f"NVIDIA_REQUIRE_CUDA={REQUIRE}", "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64")
H100 = "NVIDIA H100 80GB HBM3"
GEFORCE = "NVIDIA GeForce RTX 4090"
# what the 590.44.01 compat library's note holds (nvidia-container-toolkit's testdata, cuda-elf-header_test.go)
NOTE_590 = {"Format": 1, "CUDA Version": "13.1", "Driver": [535, 550, 570, 575, 580, 590],
            "Device": [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]}


def host(driver: str, *names: str) -> GpuHost:
    return GpuHost(driver=driver, cuda=None, gpus=tuple(Gpu(i, f"00000000:{i + 1:02X}:00.0", n, "9.0")
                                                       for i, n in enumerate(names or (H100,))))


def driver_row(needs: ImageNeeds, h: GpuHost):
    return next(f for f in needs.runs_on(h) if f.check == "driver")


def compat_stub(note: dict | None) -> bytes:
    """A small ELF64 file shaped like a compat libcuda: a `.note.cuda.fwd_compatibility` SHT_NOTE section (owner
    "NVIDIA Corporation", a JSON descriptor) when `note` is given, and the section-name table."""
    shstr = b"\0.note.cuda.fwd_compatibility\0.shstrtab\0"
    body = b""
    if note is not None:
        name, desc = b"NVIDIA Corporation\0", json.dumps(note).encode()
        pad = lambda b: b + b"\0" * (-len(b) % 4)  # noqa: E731
        body = struct.pack("<III", len(name), len(desc), 1) + pad(name) + pad(desc)
    note_off = 64
    str_off = note_off + len(body)
    sh_off = str_off + len(shstr) + (-(str_off + len(shstr)) % 8)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    if note is not None:
        sections.append(struct.pack("<IIQQQQIIQQ", 1, 7, 2, 0, note_off, len(body), 0, 0, 4, 0))
    sections.append(struct.pack("<IIQQQQIIQQ", shstr.index(b".shstrtab"), 3, 0, 0, str_off, len(shstr), 0, 0, 1, 0))
    head = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9 + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, len(sections), len(sections) - 1)
    data = head + body + shstr
    return data + b"\0" * (sh_off - len(data)) + b"".join(sections)


# ---------------------------------------------------------------- the verdicts


def test_a_data_center_gpu_on_a_listed_older_branch_runs_it_through_forward_compatibility():
    row = driver_row(ImageNeeds.of_image(None, ENV), host("570.86.15"))
    assert row.verdict == Verdict.WARN, row
    assert "CUDA 13.0 via forward compatibility (compat 580.65.06 over R570)" in row.detail


def test_a_geforce_gpu_fails_naming_804():
    row = driver_row(ImageNeeds.of_image(None, ENV), host("570.86.15", GEFORCE))
    assert row.verdict == Verdict.FAIL and "CUDA error 804" in row.detail and GEFORCE in row.detail, row


def test_one_geforce_among_data_center_gpus_fails_the_host():
    row = driver_row(ImageNeeds.of_image(None, ENV), host("570.86.15", H100, GEFORCE))
    assert row.verdict == Verdict.FAIL and "804" in row.detail, row


def test_a_branch_the_compat_library_does_not_list_fails_naming_804():
    row = driver_row(ImageNeeds.of_image(None, ENV), host("560.35.03"))
    assert row.verdict == Verdict.FAIL, row
    assert "serves branches R535, R550, R570, R580, not R560: CUDA error 804" in row.detail


def test_a_driver_too_old_and_no_compat_stays_the_plain_driver_failure():
    env = tuple(e for e in ENV if not e.startswith("NVIDIA_REQUIRE_CUDA"))
    row = driver_row(ImageNeeds.of_image(None, env), host("570.86.15"))
    assert row.verdict == Verdict.FAIL and "upgrade the driver" in row.detail and "804" not in row.detail, row


def test_a_driver_that_runs_the_image_ignores_a_compat_library_off_the_loader_path():
    """The toolkit adds compat only for an older host branch and device mode only where the driver is too old:
    an older compat library is never loaded, so it is no 803."""
    row = driver_row(ImageNeeds.of_image(None, ENV), host("590.44.01"))
    assert row.verdict == Verdict.PASS, row


def test_a_compat_library_older_than_the_driver_fails_naming_803_where_the_image_loads_it_itself():
    env = (*ENV[:3], "LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/nvidia/lib64")
    row = driver_row(ImageNeeds.of_image(None, env), host("590.44.01"))
    assert row.verdict == Verdict.FAIL and "error 803" in row.detail and "LD_LIBRARY_PATH" in row.detail, row
    # the same image on a driver it needs compat for still gets forward compatibility
    assert driver_row(ImageNeeds.of_image(None, env), host("570.86.15")).verdict == Verdict.WARN
    # device mode puts the host's driver libraries first on the loader's path: the image's folder is never loaded
    rows = ImageNeeds.of_image(None, env).runs_on(host("590.44.01"), gpu_mode="devices")
    assert next(r for r in rows if r.check == "driver").verdict == Verdict.PASS, rows


def test_an_image_that_loads_compat_itself_fails_on_a_geforce_even_with_a_new_enough_driver():
    needs = ImageNeeds(cuda="13.0", compat=CudaCompat("580.95.05", (535, 550, 570), on_path="LD_LIBRARY_PATH"))
    row = driver_row(needs, host("580.65.06", GEFORCE))
    assert row.verdict == Verdict.FAIL and "804" in row.detail, row
    assert driver_row(needs, host("580.65.06")).verdict == Verdict.PASS  # a data-center GPU: nothing to say


@pytest.mark.parametrize("compat, driver, estimated, verdict", [
    ("580.65.06", "580.95.05", False, "FAIL"),  # read from the file: any newer driver is 803
    ("580.65.06", "580.95.05", True, None),  # estimated from its CUDA: the same branch is not a certain 803
    ("575", "580.95.05", True, "FAIL"),  # estimated, but the host's branch is newer
])
def test_803_compares_whole_versions_only_where_the_version_was_read(compat, driver, estimated, verdict):
    got = cuda.compat_problem(compat, (535,), driver, [H100], estimated=estimated, on_path="LD_LIBRARY_PATH")
    if verdict is None:
        assert got is None or "803" not in got[1], got
    else:
        assert got[0] == verdict and "803" in got[1], got


def test_verifys_record_wins_over_the_environment():
    record = ImageNeeds(compat=CudaCompat("580.95.05", (570,), cuda="13.0"))
    needs = ImageNeeds.of_image(None, ENV, record)
    assert needs.compat == record.compat
    row = driver_row(needs, host("550.163.01"))
    assert row.verdict == Verdict.FAIL and "serves branches R570, R580, not R550" in row.detail, row
    assert ImageNeeds.of_image(None, ENV, ImageNeeds()).compat == compat_of_env(ENV)  # a record without compat


# ---------------------------------------------------------------- the environment, the record


def test_the_environment_gives_the_branches_and_an_estimated_version():
    c = compat_of_env(ENV)
    assert c == CudaCompat("580.65.06", (535, 550, 570), cuda="13.0", estimated=True)
    # 12.9 GA's own driver (NVIDIA's Table 3), where the table once stopped at 12.8 and the branch stood in
    assert compat_of_env(("CUDA_VERSION=12.9.1", f"NVIDIA_REQUIRE_CUDA={REQUIRE}")).version == "575.51.03"
    assert compat_of_env(("CUDA_VERSION=13.0.1", "NVIDIA_REQUIRE_CUDA=cuda>=13.0")) is None  # no brand=tesla
    assert compat_of_env(("CUDA_VERSION=13.0.1",)) is None
    assert compat_of_env((*ENV[:3], "LD_LIBRARY_PATH=/usr/local/cuda-13.0/compat/")).on_path == "LD_LIBRARY_PATH"


def test_the_record_keeps_every_compat_field():
    c = CudaCompat("580.65.06", (535, 550, 570), "/usr/local/cuda-13.0/compat", "13.0", False, "LD_LIBRARY_PATH")
    back = ImageNeeds.from_record(json.loads(json.dumps(ImageNeeds(image="x", compat=c).to_record())))
    assert back.compat == c
    older = {"format": 2, "image": "x", "code": [], "compat": {"version": "580.65.06", "branches": [570]}}
    assert ImageNeeds.from_record(older).compat == CudaCompat("580.65.06", (570,))


# ---------------------------------------------------------------- verify's reading


def _script_functions(*names: str) -> dict:
    """Functions of images/scripts/verify_image.py (which runs its checks when imported), with its imports."""
    path = Path(verify_judges.__file__).parent / "scripts" / "verify_image.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
            or (isinstance(n, ast.FunctionDef) and n.name in names)
            or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") in ("COMPAT_NOTE", "SHT_NOTE")
                                                  for t in n.targets))]
    ns: dict = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)  # noqa: S102
    return ns


def test_the_elf_note_is_read_from_the_section_headers(tmp_path):
    ns = _script_functions("elf_note")
    lib = tmp_path / "libcuda.so.590.44.01"
    lib.write_bytes(compat_stub(NOTE_590))
    name, desc = ns["elf_note"](str(lib), ns["COMPAT_NOTE"])
    assert name == "NVIDIA Corporation" and json.loads(desc) == NOTE_590
    lib.write_bytes(compat_stub(None))
    assert ns["elf_note"](str(lib), ns["COMPAT_NOTE"]) is None
    lib.write_bytes(b"not an ELF file")
    with pytest.raises(ValueError):
        ns["elf_note"](str(lib), ns["COMPAT_NOTE"])


def scan(note=None, ld_path="/usr/local/nvidia/lib64", conf=(), dirs=None, **item):
    d = {"dir": "/usr/local/cuda/compat", "real": "/usr/local/cuda-13.1/compat",
         "files": ["libcuda.so.590.44.01"], **({"note": note} if note else {}), **item}
    return {"dirs": dirs or [d], "env": {"NVIDIA_REQUIRE_CUDA": REQUIRE, "CUDA_VERSION": "13.1.0",
                                         "LD_LIBRARY_PATH": ld_path}, "ld_conf": list(conf)}


def test_verify_reads_version_branches_and_cuda_from_the_note_and_says_so():
    report = verify_judges.VerifyReport("img")
    c = verify_judges.judge_compat(report, scan(NOTE_590))
    assert c == CudaCompat("590.44.01", (535, 550, 570, 575, 580), "/usr/local/cuda/compat", "13.1")
    [row] = report.checks
    assert (row.check, row.verdict) == ("cuda-compat", verify_judges.NOTE)
    assert row.detail.startswith("cuda-compat 590.44.01 in /usr/local/cuda/compat (CUDA 13.1): forward "
                                 "compatibility for R535, R550, R570, R575, R580, from its ELF note")


def test_without_a_note_the_branches_come_from_nvidia_require_cuda():
    report = verify_judges.VerifyReport("img")
    c = verify_judges.judge_compat(report, scan(None, note_error="not an ELF file"))
    assert c.branches == (535, 550, 570) and c.cuda is None
    assert "from the image's NVIDIA_REQUIRE_CUDA; its ELF note could not be read (not an ELF file)" \
        in report.checks[0].detail


@pytest.mark.parametrize("kw, where", [
    (dict(ld_path="/usr/local/cuda-13.1/compat:/usr/local/nvidia/lib64"), "LD_LIBRARY_PATH"),
    (dict(conf=["/etc/ld.so.conf.d/00-compat.conf"]), "/etc/ld.so.conf.d/00-compat.conf"),
])
def test_an_image_that_puts_compat_on_its_loader_path_is_a_warning_naming_803(kw, where):
    report = verify_judges.VerifyReport("img")
    c = verify_judges.judge_compat(report, scan(NOTE_590, **kw))
    assert c.on_path == where
    assert report.checks[0].verdict == verify_judges.WARN and "error 803" in report.checks[0].detail


def test_the_folder_cuda_resolves_to_is_the_one_recorded():
    other = {"dir": "/usr/local/cuda-12.9/compat", "real": "/usr/local/cuda-12.9/compat",
             "files": ["libcuda.so.575.57.08"]}
    mine = {"dir": "/usr/local/cuda/compat", "real": "/usr/local/cuda-13.1/compat", "files": ["libcuda.so.590.44.01"]}
    assert verify_judges.compat_of_scan(scan(dirs=[other, mine])).version == "590.44.01"
    assert verify_judges.compat_of_scan(scan(dirs=[other])).path == "/usr/local/cuda-12.9/compat"
    assert verify_judges.compat_of_scan({"dirs": [], "env": {}, "ld_conf": []}) is None


def test_an_image_without_compat_has_no_row_and_a_scan_that_broke_is_a_warning():
    report = verify_judges.VerifyReport("img")
    assert verify_judges.judge_compat(report, {"dirs": [], "env": {}, "ld_conf": []}) is None and report.checks == []
    assert verify_judges.judge_compat(report, {"error": "PermissionError: /usr/local"}) is None
    assert report.checks[0].verdict == verify_judges.WARN


# ---------------------------------------------------------------- the plan (device mode)


def planned(driver: str | None, env=ENV, user_env=None):
    from dockerlaunch.gpu.access import HostGpuAccess, device_access

    gpu = HostGpuAccess(device_nodes=("/dev/nvidiactl", "/dev/nvidia0"),
                        libs=(("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),),
                        image_env=env)
    return device_access("all", gpu, user_env or {}, "hosts[0] h", "no toolkit runtime", driver)


def test_device_mode_puts_the_compat_folder_first_where_forward_compatibility_runs_the_image():
    access = planned("570.86.15")
    assert dict(access.env)["LD_LIBRARY_PATH"] == ("/usr/local/cuda/compat:/usr/local/nvidia/lib:"
                                                   "/usr/local/nvidia/lib64")
    assert ("forward compatibility: driver 570.86.15 is older than the image's CUDA 13.0 needs, so the image's "
            "cuda-compat (/usr/local/cuda/compat) goes first on LD_LIBRARY_PATH") in access.why
    assert compat_to_load(ENV, "570.86.15")[0].version == "580.65.06"
    assert compat_to_load(ENV, "580.40.07") is not None  # an early R580 below 13.0's own driver: the same as doctor


@pytest.mark.parametrize("driver", ["580.95.05", "590.44.01", None])
def test_device_mode_keeps_the_hosts_libraries_first_where_the_driver_runs_the_image(driver):
    access = planned(driver)
    assert "LD_LIBRARY_PATH" not in dict(access.env)  # the image's own path already starts with them
    assert "forward compatibility" not in access.why


def test_device_mode_leaves_the_users_loader_path_alone():
    assert "LD_LIBRARY_PATH" not in dict(planned("570.86.15", user_env={"LD_LIBRARY_PATH": "/mine"}).env)


def test_the_dry_run_says_where_the_compat_folder_would_go():
    from dockerlaunch.job.plan import gpu_access

    deferred = gpu_access("all", "devices", None, {}, "hosts[0] h")
    assert "cuda-compat folder first on LD_LIBRARY_PATH where the host's driver is older" in str(deferred)


def test_up_and_doctor_take_the_driver_from_the_hosts_gpu_facts():
    """The driver's version is the GpuHost's (nvidia-smi -q's, read once): `up`'s plan (HostFacts.gpu_host) and
    doctor's GPU container (the probe's gpu_host) put the compat folder first from it, as the driver row judges."""
    from dockerlaunch.backends.docker.doctor.observations import host_gpu_access
    from dockerlaunch.backends.docker.probe import Probe
    from dockerlaunch.job.config import ClusterConfig
    from dockerlaunch.job.facts import HostFacts, HostGpuAccess
    from dockerlaunch.job.plan import make_plan

    config = ClusterConfig.model_validate({"hosts": ["10.0.0.1"], "image": "img:tag", "ssh": {"config_file": None},
                                           "container": {"gpu_mode": "devices"}})
    gpu = HostGpuAccess(device_nodes=("/dev/nvidiactl", "/dev/nvidia0"),
                        libs=(("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),), image_env=ENV)
    for driver, compat in (("570.86.15", True), ("580.95.05", False)):
        hp = make_plan(config, facts={0: HostFacts(gpu_count=1, access=gpu, gpu_host=host(driver))}).hosts[0]
        planned_first = hp.container.env.get("LD_LIBRARY_PATH", "").split(":")[0]
        assert (planned_first == "/usr/local/cuda/compat") is compat, (driver, hp.container.env)
        probe = Probe("eth0", None, None, False, [], [], 1, access=gpu, gpu_host=host(driver))
        checked_first = dict(host_gpu_access(config, hp, probe).env).get("LD_LIBRARY_PATH", "").split(":")[0]
        assert (checked_first == "/usr/local/cuda/compat") is compat, driver
