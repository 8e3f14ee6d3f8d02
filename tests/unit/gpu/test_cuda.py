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
    assert cuda.driver_problem("580.65.06", "11.8") is None  # a major without a recorded minimum


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
