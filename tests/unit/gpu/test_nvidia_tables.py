"""gpu/cuda.py's and gpu/host.py's tables against the text of NVIDIA's tables they were read from
(tests/data/nvidia-tables/): a test per published row, and none of the code's rows without one."""

import pytest
import yaml

from dockerlaunch.gpu import cuda, host
from tests import gpu_standin
from tests.nvidia_tables import HEAD, TABLES, driver, head, rows, sections

T3 = "cuda-toolkit-driver-versions.txt"
TABLE3 = rows(T3, "Table 3", header=True)
MANIFESTS = "driver-cuda-compat-manifests.txt"
BRANCHES = "datacenter-driver-branches.txt"
GPUS = "cuda-gpus.txt"


@pytest.mark.parametrize("name", sorted(p.name for p in TABLES.glob("*.txt")))
def test_every_excerpt_names_its_address_date_cuts_and_coverage(name):
    lines = head(name)
    assert [line.split(" ")[0] for line in lines] == list(HEAD), lines
    assert "https://" in lines[0] or "file" in lines[0]
    assert "2026-11-27" in lines[1]


# ---------------------------------------------------------------- Table 3: the driver of each toolkit release


@pytest.mark.parametrize("label, linux, windows", TABLE3, ids=[r[0] for r in TABLE3])
def test_a_toolkit_releases_driver_is_table_3s_row(label, linux, windows):
    assert (label.removeprefix("CUDA "), driver(linux), driver(windows)) in cuda.TOOLKIT_DRIVERS


def test_the_code_has_no_table_3_row_nvidia_did_not_publish():
    published = {(r[0].removeprefix("CUDA "), driver(r[1]), driver(r[2])) for r in TABLE3}
    assert set(cuda.TOOLKIT_DRIVERS) == published and len(cuda.TOOLKIT_DRIVERS) == len(TABLE3)


GA = [r for r in TABLE3 if r[0].endswith(" GA")]


@pytest.mark.parametrize("label, linux, _windows", GA, ids=[r[0] for r in GA])
def test_a_minor_releases_own_driver_is_its_ga_row(label, linux, _windows):
    """What an image of that major.minor runs fully on; below it, minor-version compatibility."""
    assert cuda.TOOLKIT_DRIVER[cuda.release_cuda(label.removeprefix("CUDA "))] == driver(linux)


# ---------------------------------------------------------------- Table 2: minor-version compatibility


def _branch(cell: str) -> int | None:
    return None if cell.strip() == "N/A" else int(cell.replace(">=", "").replace("<", "").replace("[1]", "").strip())


MINOR = [(r[0].removeprefix("CUDA ").removesuffix(".x"), r[1], r[2])
         for r in [*rows(T3, "Table 2", header=True),
                   *rows("cuda-compatibility-minor-version.txt", "Table 1", header=True)]]


@pytest.mark.parametrize("major, low, high", MINOR)
def test_a_majors_minor_version_range_is_nvidias(major, low, high):
    assert cuda.MINOR_COMPAT[major] == (_branch(low), _branch(high))


@pytest.mark.parametrize("major, release", [("13", "13.0 GA"), ("12", "12.0 GA")])
def test_a_majors_minimum_is_its_first_ga_driver(major, release):
    assert cuda.DRIVER_MIN[major] == dict((r[0], driver(r[1])) for r in TABLE3)[f"CUDA {release}"]
    assert cuda.version_tuple(cuda.DRIVER_MIN[major])[0] == cuda.MINOR_COMPAT[major][0]


def test_the_11x_minimum_is_table_2s_footnote():
    text = (TABLES / T3).read_text(encoding="utf-8")
    assert f"Tesla Recommended Drivers {cuda.DRIVER_MIN['11']} (Linux)" in text
    assert cuda.version_tuple(cuda.DRIVER_MIN["11"])[0] == cuda.MINOR_COMPAT["11"][0]


# ---------------------------------------------------------------- the newest CUDA of each driver branch


@pytest.mark.parametrize("label, linux, _windows", TABLE3, ids=[r[0] for r in TABLE3])
def test_a_toolkits_driver_branch_runs_at_least_that_toolkit(label, linux, _windows):
    runs, known = cuda.branch_cuda(driver(linux))
    assert known and cuda.version_tuple(runs) >= cuda.version_tuple(cuda.release_cuda(label.removeprefix("CUDA ")))


MANIFEST_ROWS = [r for rows_ in sections(MANIFESTS).values() for r in rows_]


@pytest.mark.parametrize("version, _date, compat_cuda", MANIFEST_ROWS, ids=[r[0] for r in MANIFEST_ROWS])
def test_a_branch_runs_the_cuda_of_its_own_cuda_compat(version, _date, compat_cuda):
    assert cuda.branch_cuda(version) == (compat_cuda, True)


BRANCH_ROWS = [r for rows_ in sections(BRANCHES).values() for r in rows_]


@pytest.mark.parametrize("branch, _designation, _eol, maximum", BRANCH_ROWS, ids=[r[0] for r in BRANCH_ROWS])
def test_a_data_center_branch_runs_the_major_nvidia_lists(branch, _designation, _eol, maximum):
    runs, known = cuda.branch_cuda(branch.removeprefix("R"))
    assert known and runs.split(".")[0] == maximum.split()[1].split(".")[0]


def _real_versions() -> list[tuple[str, str, str]]:
    out = []
    for folder in gpu_standin.REAL_FOLDERS:
        exp = yaml.safe_load((gpu_standin.REAL / folder / "expected.yaml").read_text(encoding="utf-8"))
        if exp.get("driver") and exp.get("cuda") and cuda.version_tuple(exp["cuda"]):
            out.append((folder, str(exp["driver"]), str(exp["cuda"])))
    return out


REAL = [r for r in _real_versions() if cuda.branch_cuda(r[1])[1]]


@pytest.mark.parametrize("folder, version, reported", REAL, ids=[r[0] for r in REAL])
def test_the_branch_table_says_what_a_real_nvidia_smi_reported(folder, version, reported):
    """tests/data/nvidia-smi/real/: every recorded driver of a branch in the table reports the table's CUDA."""
    assert cuda.branch_cuda(version)[0] == reported


def test_what_the_tables_do_not_cover_is_said_not_guessed():
    """R615/R616 (CUDA 13.4) is in no table read: its lower bound is R610's, and it says it is not exact."""
    assert cuda.branch_cuda("616.10") == ("13.3", False)
    assert "13.3" not in cuda.TOOLKIT_DRIVER and "13.2" in cuda.TOOLKIT_DRIVER


# ---------------------------------------------------------------- compute capability by model


CURRENT = [(r[0], r[2]) for section in ("cuda-gpus", "cuda-gpus, rest") for r in rows(GPUS, section)]
LEGACY = [(r[0], r[2]) for r in rows(GPUS, "cuda-legacy-gpus")]


@pytest.mark.parametrize("cap, name", CURRENT, ids=[f"{c} {n}" for c, n in CURRENT])
def test_a_model_in_nvidias_table_gets_its_compute_capability(cap, name):
    assert name in host.CUDA_GPUS[cap] and host.cap_of_model(name) == cap


@pytest.mark.parametrize("cap, name", LEGACY, ids=[f"{c} {n}" for c, n in LEGACY])
def test_a_model_in_nvidias_legacy_table_gets_its_compute_capability(cap, name):
    assert name in host.CUDA_LEGACY_GPUS[cap] and host.cap_of_model(name) == cap


def test_the_code_has_no_model_nvidias_tables_do_not_list():
    for table, published in ((host.CUDA_GPUS, CURRENT), (host.CUDA_LEGACY_GPUS, LEGACY)):
        assert {(cap, n) for cap, names in table.items() for n in names} == set(published)


SMI_ROWS = [(r[0], r[1]) for r in rows("nvidia-smi-names.txt", "nvidia-smi")]


@pytest.mark.parametrize("cap, name", SMI_ROWS, ids=[n for _, n in SMI_ROWS])
def test_a_name_nvidia_smi_prints_gets_the_compute_capability_it_reported(cap, name):
    assert host.cap_of_model(name) == cap


def test_every_smi_name_row_has_its_quote():
    """Each SMI_NAMES entry is a name a quoted nvidia-smi printed (or its first words), at the capability it said."""
    for cap, names in host.SMI_NAMES.items():
        for n in names:
            words = host.model_tokens(n)
            assert any(c == cap and host.model_tokens(q)[:len(words)] == words for c, q in SMI_ROWS), n


def _real_caps() -> list[tuple[str, str, str]]:
    """(folder, name, compute_cap) of every real output whose query-gpu.csv nvidia-smi printed (not derived)."""
    out = []
    for folder in gpu_standin.REAL_FOLDERS:
        d = gpu_standin.REAL / folder
        csv = d / "query-gpu.csv"
        if csv.is_file() and "query-gpu.csv is DERIVED" not in (d / "SOURCE.md").read_text(encoding="utf-8"):
            for line in csv.read_text(encoding="utf-8").splitlines():
                cells = [c.strip() for c in line.split(",")]
                if len(cells) > 3 and host.parse_cap(cells[3]):
                    out.append((folder, cells[2], cells[3]))
    return sorted(set(out))


@pytest.mark.parametrize("folder, name, cap", _real_caps(), ids=[f"{f} {n}" for f, n, _ in _real_caps()])
def test_the_table_agrees_with_every_compute_cap_a_real_nvidia_smi_printed(folder, name, cap):
    assert host.cap_of_model(name) == cap


@pytest.mark.parametrize("name, cap", [
    ("NVIDIA RTX 5000 Ada Generation", "8.9"), ("Quadro RTX 5000", "7.5"), ("Quadro RTX 4000", "7.5"),
    ("NVIDIA GB10", "12.1"), ("NVIDIA Thor", "11.0"), ("NVIDIA RTX 4000 Ada Generation", "8.9"),
    ("NVIDIA RTX PRO 5000 Blackwell", "12.0"), ("NVIDIA GeForce RTX 5090", "12.0"),
])
def test_issue_58s_names(name, cap):
    """The rows the issue measured wrong (12.0 for an Ada or Turing 5000, 8.9 for Quadro RTX 4000, none for GB10
    and Thor)."""
    assert host.cap_of_model(name) == cap


@pytest.mark.parametrize("name", ["NVIDIA GeForce GTX 1660 Ti", "NVIDIA B100", "NVIDIA RTX A4500", "Graphics Device"])
def test_a_model_no_table_lists_is_unknown_not_guessed(name):
    assert host.cap_of_model(name) is None
