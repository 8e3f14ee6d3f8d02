"""The CUDA rules verify, build and doctor share: cubins and PTX against a GPU, an image's CUDA against a driver."""

import pytest

from dockerlaunch.gpu import cuda


@pytest.mark.parametrize("driver, image, verdict", [
    ("570.86.15", "13.0", "FAIL"),  # R570 runs CUDA <= 12.8
    ("575.57.08", "13.0", "FAIL"),
    ("580.65.06", "13.0", None),
    ("590.44.01", "13.0", None),
    ("580.65.06", "12.8", None),  # newer branches run older CUDA
    ("570.26", "12.8", None),
    ("535.247.01", "12.8", "WARN"),  # minor-version compatibility: short of PTX JIT of newer code
    ("525.60.13", "12.6", "WARN"),
    ("520.61.05", "12.8", "FAIL"),  # below every 12.x
    ("470.256.02", "12.8", "FAIL"),
])
def test_a_drivers_verdict_on_an_images_cuda(driver, image, verdict):
    got = cuda.driver_problem(driver, image)
    assert (got[0] if got else None) == verdict


def test_the_failure_says_what_the_driver_runs_and_what_the_image_needs():
    verdict, why = cuda.driver_problem("570.86.15", "13.0")
    assert why == "runs CUDA <= 12.8; the image needs 13.0 (R580+)"
    # forward compatibility shipped in the image turns it into a warning, never a pass
    assert cuda.driver_problem("570.86.15", "13.0", has_compat=True)[0] == "WARN"


def test_an_unreadable_driver_is_no_verdict_here():
    assert cuda.driver_problem("", "13.0") is None
    assert cuda.driver_problem("580.65.06", "11.8") is None  # an older major: backward compatibility


@pytest.mark.parametrize("driver, image, verdict", [
    ("570.86", "12.9", "WARN"),  # 12.9 GA's own driver is 575.51.03: minor-version compatibility
    ("580.95.05", "13.2", "WARN"),  # 13.2 GA's is 595.45.04
    ("580.95", "14.0", "WARN"),  # a major no table read knows: said, not passed
    ("595.45.04", "13.2", None),
    ("590.48.01", "13.1", None),
    ("610.57.04", "13.3", None),  # past Table 3 as read: R610 runs 13.3 (its cuda-compat manifest)
    ("620.70.06", "13.5", None),
    ("610.57.04", "13.5", "WARN"),
    ("616.10", "13.4", "WARN"),  # a branch in no table read
    ("450.80.02", "11.8", "WARN"),  # 11.x minor-version compatibility from 450.80.02 (Table 2's footnote)
    ("440.33", "11.0", "FAIL"),
    ("418.39", "10.1", None), ("410.48", "10.1", "FAIL"),  # 10.x: the toolkit's own driver, no minor compatibility
])
def test_issue_58s_rows_and_nvidias_tables(driver, image, verdict):
    got = cuda.driver_problem(driver, image)
    assert (got[0] if got else None) == verdict, got


@pytest.mark.parametrize("driver, reported, image, verdict", [
    ("580.95.05", "13.0", "13.2", "WARN"),  # older than the image's toolkit: minor-version compatibility
    ("595.71.05", "13.2", "13.2", None),
    ("620.70.06", "13.5", "13.0", None),  # newer runs older
    ("616.10", "13.4", "13.4", None),  # the host's word, where no table has the branch
    ("616.10", "13.4", "13.5", "WARN"),
    ("590.48.01", "13.1", "14.0", "FAIL"),  # a CUDA 13 driver runs no CUDA 14 image
    ("570.86.15", "12.8", "13.0", "FAIL"),
    ("620.70.06", "13.5", "12.4", None),
])
def test_the_cuda_the_host_reports_decides_before_any_table(driver, reported, image, verdict):
    got = cuda.driver_problem(driver, image, host_cuda=reported)
    assert (got[0] if got else None) == verdict, got


def test_the_warnings_say_why():
    _, why = cuda.driver_problem("580.95.05", "13.2", host_cuda="13.0")
    assert why.startswith("runs CUDA 13.0 (nvidia-smi), older than the image's 13.2") and "PTX JIT" in why
    _, why = cuda.driver_problem("580.95", "14.0")
    assert "CUDA 14.x is in none of NVIDIA's tables" in why and "<= 13.0" in why
    assert cuda.driver_problem("590.48.01", "14.0", host_cuda="13.1")[1] == \
        "runs CUDA <= 13.1; the image needs 14.0 (a driver of CUDA 14.x)"
    # the image's own labels still come first: a driver-min it states fails even where nvidia-smi reports enough
    assert cuda.driver_problem("580.95.05", "13.0", need="590.44.01", host_cuda="13.0")[0] == "FAIL"
    # and forward compatibility turns the host's FAIL into a WARN, never a pass
    assert cuda.driver_problem("570.86.15", "13.0", has_compat=True, host_cuda="12.8")[0] == "WARN"


@pytest.mark.parametrize("label, cubins, ptx", [
    ("9.0", ["sm_90"], []),
    ("8.0;9.0", ["sm_80", "sm_90"], []),
    ("9.0+PTX", ["sm_90"], ["compute_90"]),
    ("9.0a", ["sm_90a"], []),
    ("bogus", [], []),
])
def test_an_images_arch_label_as_cubins_and_ptx(label, cubins, ptx):
    assert cuda.archs_as_cubins(label.split(";")) == (cubins, ptx)


@pytest.mark.parametrize("cubins, gpu, ok", [
    (["sm_90"], "9.0", True),
    (["sm_90"], "8.0", False),  # an A100 under a 9.0-only image
    (["sm_80"], "8.6", True),  # same major, higher minor
    (["sm_80"], "9.0", False),  # never across majors
    (["sm_90a"], "9.0", True),
    (["sm_100a"], "10.3", False),  # arch-specific: only its own
])
def test_cubins_run_on_the_same_major_and_an_equal_or_higher_minor(cubins, gpu, ok):
    assert cuda.cubin_covers(cubins, gpu) is ok


@pytest.mark.parametrize("ptx, gpu, ok", [
    (["compute_80"], "9.0", True),  # JIT to newer architectures
    (["compute_90"], "8.0", False),  # never to older
    (["compute_90a"], "10.0", False),
    (["sm_75"], "12.0", True),
])
def test_ptx_runs_on_newer_architectures(ptx, gpu, ok):
    assert cuda.ptx_covers(ptx, gpu) is ok
