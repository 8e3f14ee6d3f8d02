"""Rules that read a stack's lock (what the image really installs): each one fails the lock that broke a stack and
passes the committed locks. Without a lock they are skipped (check_stack(stack) works as before)."""

import dataclasses
from pathlib import Path

import pytest

from dockerlaunch.images import lock as locks
from dockerlaunch.images.constraints import (
    NEEDS_LOCK,
    RULES,
    check_stack,
    torch_cuda,
    torch_cuda_from,
)
from dockerlaunch.images.lock import Entry, Lock
from dockerlaunch.images.stacks import Stack, default_dockerfiles_dir, load_matrix

CU13 = ["swift4.5-mcore0.18-cu13", "swift4.6-mcore0.19-cu13", "swift4.6-mcore0.19-cu13-py313"]
# A lock as `stacks lock` wrote it for the CUDA 13 stacks before their nvidia-cublas override (the parts that matter).
OLD_CU13_LOCK = """# dockerlaunch lock of stack swift4.6-mcore0.19-cu13: every Python distribution its image installs
# stack: swift4.6-mcore0.19-cu13
# cuda: 13.0

# layer 1-torch
cuda-toolkit==13.0.2 \\
    --hash=sha256:{a}
nvidia-cublas==13.1.0.3 \\
    --hash=sha256:{a}
nvidia-cuda-runtime==13.0.96 \\
    --hash=sha256:{a}
torch==2.11.0 \\
    --hash=sha256:{a}
# layer 3-te
transformer-engine==2.16.1 \\
    --hash=sha256:{a}
transformer-engine-cu13==2.16.1 \\
    --hash=sha256:{a}
transformer-engine-torch==2.16.1 \\
    --hash=sha256:{a}
""".format(a="a" * 64)


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


def real_lock(stack: Stack) -> Lock:
    return locks.read(stack, default_dockerfiles_dir())


def make_lock(versions: dict[str, str]) -> Lock:
    return Lock(Path("test.lock"), {}, "", tuple(Entry(locks.normalize(n), v, (), "1-torch")
                                               for n, v in versions.items()))


def with_versions(lock: Lock, **changes: str | None) -> Lock:
    """`lock` with some distributions at other versions (None: without it); names with _ for -."""
    changes = {locks.normalize(k): v for k, v in changes.items()}
    kept = [dataclasses.replace(e, version=changes[e.name]) if e.name in changes else e
            for e in lock.entries if changes.get(e.name, "") is not None]
    added = [Entry(n, v, (), "1-torch") for n, v in changes.items() if v and lock.get(n) is None]
    return dataclasses.replace(lock, entries=tuple(kept + added))


def found(stack: Stack, lock: Lock | None) -> dict[str, str]:
    return {v.rule.id: v.line() for v in check_stack(stack, lock=lock)}


def errors(stack: Stack, lock: Lock | None) -> set[str]:
    return {v.rule.id for v in check_stack(stack, lock=lock) if v.rule.severity == "error"}


# ---------------------------------------------------------------- the committed locks


def test_every_stack_with_its_lock_passes_every_error_rule(matrix):
    """The cu128 stack too, since it drops the cu13 core that TE-torch 2.16.1's sdist names (drop:, core_cu12)."""
    for name, s in matrix.stacks.items():
        assert errors(s, real_lock(s)) == set(), name


def test_lock_rules_are_skipped_without_a_lock(matrix):
    lock_rules = [r for r in RULES if r.lock == NEEDS_LOCK]
    assert {r.id for r in lock_rules} >= {"te-cublas", "te-cublas-grouped", "te-core-cuda", "toolkit-torch"}
    s = matrix.stacks["swift4.6-mcore0.19-cu128"]
    bad = with_versions(real_lock(s), transformer_engine_cu12=None, transformer_engine_cu13="2.16.1")
    assert check_stack(s, rules=lock_rules) == []
    assert [v.rule.id for v in check_stack(s, rules=lock_rules, lock=bad)] == ["te-core-cuda"]


# ---------------------------------------------------------------- te-cublas: TE >= 2.13 needs cuBLAS >= 13.2


@pytest.mark.parametrize("name", CU13)
def test_te_cublas_fails_the_locks_before_the_cublas_override(matrix, name):
    s = matrix.stacks[name]
    old = with_versions(real_lock(s), nvidia_cublas="13.1.0.3")  # torch 2.11.0's exact pin
    got = found(s, old)
    assert "te-cublas" in errors(s, old) and "te-cublas-grouped" in got
    line = got["te-cublas"]
    assert line.startswith(f"{name}: [te-cublas] ")
    assert "transformer-engine-cu13 2.16.1" in line and "nvidia-cublas 13.1.0.3" in line
    assert "cublasLtGroupedMatrixLayoutInit_internal" in line and "source: " in line and "#2504" in line
    assert "`overrides: [nvidia-cublas==13.3.0.5]`" in line and f"dockerlaunch stacks lock --stack {name}" in line
    assert {"te-cublas", "te-cublas-grouped"}.isdisjoint(found(s, real_lock(s)))  # 13.3.0.5 now


def test_te_cublas_on_a_lock_text_as_stacks_lock_wrote_it(matrix):
    s = matrix.stacks["swift4.6-mcore0.19-cu13"]
    old = locks.parse(OLD_CU13_LOCK, Path("swift4.6-mcore0.19-cu13.lock"))
    assert old.get("nvidia-cublas").version == "13.1.0.3"
    assert errors(s, old) == {"te-cublas"}


def test_te_cublas_thresholds(matrix):
    s = matrix.stacks["swift4.6-mcore0.19-cu13"]
    lock = real_lock(s)
    mid = found(s, with_versions(lock, nvidia_cublas="13.2.0.9"))  # loads, but grouped GEMM wants 13.3
    assert "te-cublas" not in mid and "cuBLAS >= 13.3" in mid["te-cublas-grouped"]
    assert mid["te-cublas-grouped"].startswith(f"{s.name}: [te-cublas-grouped] TE 2.16.1")
    old_te = with_versions(lock, nvidia_cublas="13.1.0.3", transformer_engine_cu13="2.12.0")
    assert {"te-cublas", "te-cublas-grouped"}.isdisjoint(found(s, old_te))  # TE 2.12 runs on cuBLAS 13.1
    te_2_13 = found(s, with_versions(lock, nvidia_cublas="13.1.0.3", transformer_engine_cu13="2.13.0"))
    assert "te-cublas" in te_2_13 and "te-cublas-grouped" not in te_2_13  # grouped GEMM's check is from 2.14
    # the CUDA 12 core is built against cuBLAS 12 (grouped GEMM compiled out): not this rule's
    cu12 = matrix.stacks["swift4.0-mcore0.15"]
    assert "te-cublas" not in found(cu12, with_versions(real_lock(cu12), transformer_engine_cu12="2.16.1"))


# ---------------------------------------------------------------- te-core-cuda: TE's core wheel for torch's CUDA


def test_te_core_cuda_catches_the_cu13_core_beside_a_cuda_12_torch(matrix):
    s = matrix.stacks["swift4.6-mcore0.19-cu128"]
    # what `stacks lock` resolved for it: transformer-engine-torch 2.16.1 pulls transformer_engine_cu13
    lock = make_lock({"torch": "2.8.0", "nvidia-cuda-runtime-cu12": "12.8.90", "nvidia-cublas-cu12": "12.8.4.1",
                      "transformer-engine": "2.16.1", "transformer-engine-cu13": "2.16.1",
                      "transformer-engine-torch": "2.16.1"})
    got = found(s, lock)
    assert errors(s, lock) == {"te-core-cuda"}  # not te-cublas: there is no CUDA 13 cuBLAS to compare
    line = got["te-core-cuda"]
    assert "transformer-engine-cu13 2.16.1, built for CUDA 13" in line and "a CUDA 12 build" in line
    assert "nvidia-cuda-runtime-cu12 12.8.90" in line and "libcudart.so.13" in line and "libcublas.so.13" in line
    fixed = with_versions(lock, transformer_engine_cu13=None, transformer_engine_cu12="2.16.1")
    assert "te-core-cuda" not in found(s, fixed)


def test_te_core_cuda_the_other_way(matrix):
    s = matrix.stacks["swift4.6-mcore0.19-cu13"]
    lock = with_versions(real_lock(s), transformer_engine_cu13=None, transformer_engine_cu12="2.16.1")
    assert "CUDA 12, but torch 2.11.0 is a CUDA 13 build" in found(s, lock)["te-core-cuda"]


# ---------------------------------------------------------------- toolkit-torch and torch's CUDA on a made base


def test_a_made_base_knows_torch_2_11_from_pypi_is_cuda_13_0(matrix):
    s = matrix.stacks["swift4.6-mcore0.19-cu13-py313"]
    assert s.base is not None and s.base_image is None and s.torch_index_url is None
    assert torch_cuda_from(s) is None  # the pins alone do not tell
    assert torch_cuda(s) == "13.0"  # the made base's cuda_toolkit (stacks lock refuses another torch)
    lock = real_lock(s)
    assert torch_cuda(s, lock) == "13.0"
    assert torch_cuda_from(s, lock) == ("13.0", "the lock's nvidia-cuda-runtime 13.0.96")
    assert errors(s, None) == set() and errors(s, lock) == set()
    assert "python-jammy" not in found(s, lock)  # no base_image: no Ubuntu's Python


def test_toolkit_torch_catches_a_torch_of_another_cuda(matrix):
    s = matrix.stacks["swift4.6-mcore0.19-cu13-py313"]
    # torch 2.15.0 from PyPI is CUDA 13.2 (cuda-toolkit 13.2.2): apex refuses nvcc 13.0
    lock = with_versions(real_lock(s), torch="2.15.0", cuda_toolkit="13.2.2", nvidia_cuda_runtime="13.2.51")
    got = found(s, lock)
    assert {"toolkit-torch", "apex-cuda"} <= errors(s, lock)
    line = got["toolkit-torch"]
    assert "cuda_toolkit 13.0.2 (nvcc 13.0) but torch 2.15.0 is built for CUDA 13.2" in line
    assert "apex refuses" in line and "cuda_toolkit: 13.2.2" in line
    assert "nvcc 13.0 (cuda_toolkit 13.0.2) but torch is built for CUDA 13.2" in got["apex-cuda"]
    # torch 2.8.0 from PyPI pulls the CUDA 12.8 runtime; the toolkit brings the CUDA 13 one
    lock = with_versions(real_lock(s), torch="2.8.0", nvidia_cuda_runtime_cu12="12.8.90")
    assert "another CUDA major" in found(s, lock)["toolkit-torch"]
    assert "toolkit-torch" not in found(matrix.stacks["swift4.6-mcore0.19-cu13"], lock)  # a registry base


def test_apex_cuda_reads_the_lock_before_the_index_url(matrix):
    s = matrix.stacks["swift4.6-mcore0.19-cu128"].model_copy(update={"torch_index_url": None})
    assert "cannot tell torch 2.8.0's CUDA" in found(s, None)["apex-cuda"]
    assert "apex-cuda" not in found(s, real_lock(s))  # its nvidia-cuda-runtime-cu12 12.8.90
    wrong = with_versions(real_lock(s), nvidia_cuda_runtime_cu12=None, nvidia_cuda_runtime="13.0.96")
    assert "torch is built for CUDA 13.0 (the lock's nvidia-cuda-runtime 13.0.96)" in found(s, wrong)["apex-cuda"]
