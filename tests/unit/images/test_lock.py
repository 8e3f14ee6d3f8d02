"""Stack locks without a network: uv's answer parsed and split into layers, the lock file written and read back,
and every way a lock can stop being the stack's (missing, stale, edited by hand, another Python) caught in one
line by `stacks check` and `build`. (`stacks lock` against the registry runs in tests/integration/test_build.py.)"""

import shutil
from pathlib import Path

import pytest

from dockerlaunch.errors import ConfigError
from dockerlaunch.images import lock as locks
from dockerlaunch.images.build import hash_mismatch
from dockerlaunch.images.build_argv import BuildOptions
from dockerlaunch.images.build_context import check_wheelhouse
from dockerlaunch.images.layers import LAYERS, layer_roots
from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix
from tests import cli

H = {c: f"sha256:{c * 64}" for c in "abcdef"}

# What uv pip compile prints with --generate-hashes --no-annotate (shape copied from a real run).
UV_OUT = f"""torch==2.13.0+cpu \\
    --hash={H['a']}
filelock==3.20.0 \\
    --hash={H['b']} \\
    --hash={H['c']}
ms-swift==4.0.4 \\
    --hash={H['d']}
aiohttp==3.14.5 \\
    --hash={H['e']}
"""


@pytest.fixture(scope="module")
def matrix():
    return load_matrix()


def test_uv_output_parsed_with_versions_and_hashes():
    got = locks.parse_compiled(UV_OUT)
    assert got["torch"] == ("2.13.0+cpu", (H["a"],))
    assert got["filelock"] == ("3.20.0", (H["b"], H["c"]))
    assert list(got) == ["torch", "filelock", "ms-swift", "aiohttp"]


def test_each_distribution_goes_to_the_lowest_layer_whose_pins_need_it():
    resolved = locks.parse_compiled(UV_OUT)
    subsets = {"1-torch": {"torch", "filelock"}, "7-top": set(resolved)}
    layers = locks.assign_layers(resolved, subsets)
    # aiohttp says `via fsspec` (a torch dependency), but only datasets' fsspec[http] pulls it: not the torch layer
    assert layers == {"torch": "1-torch", "filelock": "1-torch", "ms-swift": "7-top", "aiohttp": "7-top"}


def render_cpu(stack, resolved=None):
    resolved = resolved or locks.parse_compiled(UV_OUT)
    pins = {locks.pin_name(p) for p in locks.flat_pins(stack)}
    for name in pins:  # every pin of the stack, so that the lock holds them
        pin = next(p for p in locks.flat_pins(stack) if locks.pin_name(p) == name)
        resolved.setdefault(name, (locks.PIN.match(pin).group(3), (H["f"],)))
    resolved["torch"] = (stack.torch, (H["a"],))
    resolved["ms-swift"] = (stack.ms_swift, (H["d"],))
    layers = {n: ("1-torch" if n in ("torch", "filelock") else "7-top") for n in resolved}
    return locks.render(stack, resolved, layers, {"resolver": "uv test", "sources": "test", "resolved": "today"})


def test_a_lock_reads_back_and_matches_its_stack(matrix, tmp_path):
    stack = matrix.get("cpu")
    path = tmp_path / "cpu.lock"
    path.write_text(render_cpu(stack))
    lock = locks.parse(path.read_text(), path)
    assert locks.problems(stack, lock) == []
    assert lock.get("Torch").version == stack.torch and lock.get("filelock").hashes == (H["b"], H["c"])
    part = lock.layer_text("1-torch")
    assert part.startswith("filelock==3.20.0 \\\n    --hash=") and f"torch=={stack.torch} \\\n" in part
    assert "ms-swift" not in part


def test_a_changed_pin_makes_the_lock_stale_and_says_which(matrix, tmp_path):
    stack = matrix.get("cpu")
    path = tmp_path / "cpu.lock"
    path.write_text(render_cpu(stack))
    bumped = stack.model_copy(update={"ms_swift": "4.0.5"})
    [line] = locks.problems(bumped, locks.parse(path.read_text(), path))
    assert "is stale" in line and "ms-swift==4.0.4 -> ms-swift==4.0.5" in line
    assert line.endswith("run dockerlaunch stacks lock --stack cpu") and "\n" not in line


def test_a_hand_edited_hash_is_caught_without_a_network(matrix, tmp_path):
    stack = matrix.get("cpu")
    path = tmp_path / "cpu.lock"
    path.write_text(render_cpu(stack).replace(H["c"], f"sha256:{'0' * 64}"))
    [line] = locks.problems(stack, locks.parse(path.read_text(), path))
    assert "edited by hand" in line and str(path) in line and "stacks lock --stack cpu" in line


def test_a_lock_for_another_python_is_refused(matrix, tmp_path):
    stack = matrix.get("cpu")
    other = stack.model_copy(update={"python": "3.12"})
    path = tmp_path / "cpu.lock"
    path.write_text(render_cpu(other))
    found = locks.problems(stack, locks.parse(path.read_text(), path))
    assert any("is for Python 3.12, stack cpu is Python 3.11" in p for p in found), found


def test_a_missing_lock_says_how_to_make_it(matrix, tmp_path):
    [line] = locks.check(matrix.get("cpu"), tmp_path)
    assert line == (f"stack cpu has no lock ({tmp_path}/locks/cpu.lock): run dockerlaunch stacks lock --stack cpu")
    with pytest.raises(locks.LockError, match="has no lock"):
        locks.checked(matrix.get("cpu"), tmp_path)


def test_garbage_in_a_lock_is_one_line(matrix, tmp_path):
    path = tmp_path / "cpu.lock"
    path.write_text(render_cpu(matrix.get("cpu")) + "rm -rf /\n")
    with pytest.raises(locks.LockError, match=r"cannot read line 'rm -rf /'"):
        locks.parse(path.read_text(), path)


def test_every_stack_of_the_matrix_has_a_fresh_lock(matrix):
    for stack in matrix.stacks.values():
        assert locks.check(stack, default_dockerfiles_dir()) == [], stack.name
        lock = locks.read(stack, default_dockerfiles_dir())
        assert {e.layer for e in lock.entries} <= set(LAYERS)
        assert lock.get("torch").layer == "1-torch" and lock.get("ms-swift").layer == "7-top"
        assert lock.get("megatron-core").layer == "6-megatron"
        assert all(e.hashes for e in lock.entries)


def test_the_registry_torch_must_be_the_stacks_cuda(matrix):
    s = matrix.get("swift4.0-mcore0.15")  # CUDA 12.8
    assert locks.cuda_problem(s, {"torch": "2.10.0", "nvidia-cuda-runtime-cu12": "12.8.90"}) is None
    line = locks.cuda_problem(s, {"torch": "2.10.0", "nvidia-cuda-runtime": "13.0.96"})
    assert "built for CUDA 13.0" in line and "base has CUDA 12.8" in line and "pin torch 2.10.0+cu128" in line
    cpu = matrix.get("cpu")
    line = locks.cuda_problem(cpu.model_copy(update={"torch": "2.13.0"}), {"torch": "2.13.0", "nvidia-nccl-cu13": "2"})
    assert "CPU stack" in line and "pin torch 2.13.0+cpu" in line
    assert locks.cuda_problem(cpu, {"torch": "2.13.0+cpu", "filelock": "3"}) is None


def test_a_conflict_names_both_requirements_in_one_line():
    stderr = ("warning: The requested Python version 3.12 is not available; 3.11.7 will be used to build deps\n"
              "error: No solution found when resolving dependencies\n"
              "  cause: Because ms-swift>=4.6.0 depends on transformers>=4.33,<5.20.0 and you require "
              "ms-swift==4.6.0, we can conclude that you require transformers>=4.33,<5.20.0.\n"
              "         And because you require transformers==5.21.0, we can conclude that your requirements are "
              "unsatisfiable.\n")
    line = locks.explain(stderr)
    assert "\n" not in line and line.startswith("its pins cannot be installed together: Because ms-swift")
    assert "transformers>=4.33,<5.20.0" in line and "transformers==5.21.0" in line and "warning" not in line


def test_a_layer_pins_every_build_tool_and_numpy_in_the_build_layer(matrix):
    roots = layer_roots(matrix.get("swift4.5-mcore0.18-cu13"))
    assert roots["3-te"] == ["transformer_engine[pytorch,core_cu13]==2.16.1", "nvidia-cudnn-frontend==1.26.0"]
    assert "4-apex" not in roots  # a git archive, pinned by its commit
    # flash-attn's setup_requires, which its compile (no network) would otherwise try to download
    assert "psutil==7.2.2" in roots["2-build"]
    assert not any(p.startswith("psutil") for p in layer_roots(matrix.get("cpu"))["2-build"])


def test_pips_hash_mismatch_becomes_the_package_name():
    log = """#14 12.3 ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have ...
#14 12.3     peft==0.18.1 from file:///wheelhouse/7-top/peft-0.18.1-py3-none-any.whl (from -r /lock/7-top.txt (line 3)):
#14 12.3         Expected sha256 1111111111111111111111111111111111111111111111111111111111111111
#14 12.3              Got        2222222222222222222222222222222222222222222222222222222222222222
"""
    assert hash_mismatch(log) == "peft==0.18.1 (expected sha256 111111111111..., got 222222222222...)"
    assert hash_mismatch("ERROR: No matching distribution") is None


def test_an_offline_build_names_the_locked_file_its_wheelhouse_lacks(matrix, tmp_path):
    import dataclasses
    import hashlib

    from dockerlaunch.errors import BuildError

    stack = matrix.get("cpu")
    real = locks.read(stack, default_dockerfiles_dir())
    # the committed lock, each entry's hash made that of a small stand-in file, so the wheelhouse below is "right"
    lock = dataclasses.replace(real, entries=tuple(
        dataclasses.replace(e, hashes=(f"sha256:{hashlib.sha256(e.name.encode()).hexdigest()}",))
        for e in real.entries))
    wh = tmp_path / "wh"
    opts = BuildOptions(offline=True, wheelhouse=str(wh))
    with pytest.raises(ConfigError, match=r"layer 1-torch was never fetched; run: dockerlaunch fetch --stack cpu"):
        check_wheelhouse(stack, opts, lock)
    for layer in LAYERS:  # a wheelhouse fetched for this lock, but for one file that is gone
        (wh / layer).mkdir(parents=True)
        lines = []
        for e in lock.layer(layer):
            name = f"{e.name.replace('-', '_')}-{e.version}-py3-none-any.whl"
            (wh / layer / name).write_bytes(e.name.encode())
            lines.append(f"{e.name}=={e.version} --hash=sha256:{'a' * 64}  # {name}")
        (wh / f"{layer}.lock").write_text("\n".join(lines) + "\n")
    check_wheelhouse(stack, opts, lock)
    peft = lock.get("peft")
    wheel = wh / peft.layer / f"peft-{peft.version}-py3-none-any.whl"
    # a swapped file whose line in the wheelhouse's own list was edited to match: the committed lock decides
    wheel.write_bytes(b"other bytes")
    part = wh / "7-top.lock"
    swapped = hashlib.sha256(b"other bytes").hexdigest()
    part.write_text(part.read_text().replace(f"peft=={peft.version} --hash=sha256:{'a' * 64}",
                                             f"peft=={peft.version} --hash=sha256:{swapped}"))
    with pytest.raises(BuildError) as e:
        check_wheelhouse(stack, opts, lock)
    assert str(e.value).startswith(f"build of stack cpu: 7-top/peft-{peft.version}-py3-none-any.whl (peft=="
                                   f"{peft.version}) does not match the lock's hash (got sha256 {swapped[:12]}...")
    assert "dockerlaunch fetch --stack cpu" in str(e.value) and "nothing was tagged" in str(e.value)
    wheel.unlink()
    with pytest.raises(ConfigError, match=rf"7-top/peft-{peft.version}-py3-none-any.whl \(peft=={peft.version}\) "
                                          r"is missing; run: dockerlaunch fetch"):
        check_wheelhouse(stack, opts, lock)
    part.write_text("\n".join(ln for ln in part.read_text().splitlines() if not ln.startswith("peft==")) + "\n")
    with pytest.raises(ConfigError, match=rf"peft=={peft.version} \(layer 7-top\) is not in it"):
        check_wheelhouse(stack, opts, lock)


@pytest.fixture
def dockerfiles_copy(tmp_path):
    d = tmp_path / "Dockerfiles"
    shutil.copytree(default_dockerfiles_dir(), d)
    return d


def dl(*args, dockerfiles: Path):
    return cli.dl(*args, timeout=120, env={"DOCKERLAUNCH_DOCKERFILES": str(dockerfiles)})


def test_stacks_check_and_build_refuse_a_tampered_lock_in_one_line(dockerfiles_copy):
    path = dockerfiles_copy / "locks" / "cpu.lock"
    text = path.read_text()
    first = next(ln for ln in text.splitlines() if ln.strip().startswith("--hash=sha256:"))
    path.write_text(text.replace(first, "    --hash=sha256:" + "0" * 64 + (" \\" if first.endswith("\\") else ""), 1))
    r = dl("stacks", "check", dockerfiles=dockerfiles_copy)
    assert r.returncode == 1
    bad = [ln for ln in r.stdout.splitlines() if ln.startswith("ERROR")]
    assert len(bad) == 1 and "cpu.lock was edited by hand" in bad[0], r.stdout
    for args in (("build", "--stack", "cpu", "--dry-run"), ("build", "--stack", "cpu"),
                 ("fetch", "--stack", "cpu", "-o", str(dockerfiles_copy / "wh"))):
        r = dl(*args, dockerfiles=dockerfiles_copy)
        assert r.returncode == 2 and "edited by hand" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r
        assert "Traceback" not in r.stderr
    assert not (dockerfiles_copy / "wh").exists()


def test_build_refuses_a_stale_lock_naming_the_pin(dockerfiles_copy):
    stacks = dockerfiles_copy / "stacks.yaml"
    stacks.write_text(stacks.read_text().replace("ms_swift: 4.0.4\n    transformers: 4.57.6\n    peft: 0.18.1\n"
                                                 "    trl: 0.28.0\n    numpy: 1.26.4\n    extra: [pyarrow",
                                                 "ms_swift: 4.0.5\n    transformers: 4.57.6\n    peft: 0.18.1\n"
                                                 "    trl: 0.28.0\n    numpy: 1.26.4\n    extra: [pyarrow"))
    r = dl("build", "--stack", "cpu", "--dry-run", dockerfiles=dockerfiles_copy)
    assert r.returncode == 2 and "is stale" in r.stderr and "ms-swift==4.0.4 -> ms-swift==4.0.5" in r.stderr, r
    r = dl("stacks", "check", dockerfiles=dockerfiles_copy)
    assert r.returncode == 1 and "cpu.lock is stale" in r.stdout
