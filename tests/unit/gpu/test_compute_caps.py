"""The one reading of compute capability (gpu/smi.py: parse_compute_caps) and its one policy for "unknown", on
what `build --hosts`, a host compile and this machine's build ask (gpu/smi.py: CAPS_QUERY)."""

import pytest

from dockerlaunch.gpu import smi
from dockerlaunch.gpu.host import cap_of_model

HEADER = "index, pci.bus_id, name, compute_cap\n"


def test_each_gpu_once_per_line_in_order():
    eight = HEADER + "".join(f"{i}, 00000000:{i:02X}:00.0, NVIDIA H200, 9.0\n" for i in range(8))
    assert smi.parse_compute_caps(0, eight) == ["9.0"] * 8
    mixed = HEADER + "0, 0:1:0.0, NVIDIA A100-SXM4-80GB, 8.0\n1, 0:2:0.0, NVIDIA B200, 10.0\n"
    assert smi.parse_compute_caps(0, mixed) == ["8.0", "10.0"]


def test_a_driver_without_compute_cap_answers_by_the_models_name():
    """R470 rejects the field (candle#733): CAPS_QUERY asks again without it, and NVIDIA's table answers."""
    out = ('Field "compute_cap" is not a valid field to query.\n\n'
           "index, pci.bus_id, name\n0, 0:1:0.0, NVIDIA A100-SXM4-80GB\n")
    assert smi.parse_compute_caps(0, out) == ["8.0"]


@pytest.mark.parametrize("status, out, missing, no_gpu, words", [
    (127, "sh: 1: nvidia-smi: not found\n", True, False, "has no nvidia-smi"),
    (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", False, True,
     "listed no GPU"),
    (0, "index, pci.bus_id, name\n0, 0:1:0.0, Graphics Device\n", False, False, "GPU 0 (Graphics Device)"),
])
def test_unknown_is_never_a_guess(status, out, missing, no_gpu, words):
    """Callers decide: a build machine without GPUs (missing, no_gpu) builds for the default and says so; a GPU
    whose capability is unknown is an error naming it (build --hosts: every failure is)."""
    with pytest.raises(smi.CapsUnknown) as e:
        smi.parse_compute_caps(status, out)
    assert (e.value.missing, e.value.no_gpu) == (missing, no_gpu) and words in e.value.why


@pytest.mark.parametrize("name, cap", [
    ("NVIDIA H100 80GB HBM3", "9.0"), ("NVIDIA H200", "9.0"), ("NVIDIA GH200 480GB", "9.0"), ("NVIDIA H20", "9.0"),
    ("NVIDIA A100-SXM4-40GB", "8.0"), ("NVIDIA A800 80GB PCIe", "8.0"), ("NVIDIA A10G", "8.6"), ("NVIDIA L40S", "8.9"),
    ("NVIDIA B200", "10.0"), ("NVIDIA GeForce RTX 4090", "8.9"), ("NVIDIA GeForce RTX 5090", "12.0"),
    ("Tesla V100-SXM2-32GB", "7.0"), ("Tesla T4", "7.5"), ("Tesla P100-PCIE-16GB", "6.0"), ("Graphics Device", None),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0"), ("NVIDIA GeForce RTX 2080 SUPER", "7.5"),
])
def test_the_model_table(name, cap):
    assert cap_of_model(name) == cap
