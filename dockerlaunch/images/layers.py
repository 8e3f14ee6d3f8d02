"""What each layer of train.Dockerfile installs: the one list that the build, `fetch` and the lock share.

Layers run from least to most often changed, so that an ms-swift bump rebuilds only the top one; a package
that several layers need is installed by the lowest of them (`lock.assign_layers`).
"""

from __future__ import annotations

from dockerlaunch.images.stacks import Stack

LAYERS = ["0-cuda", "1-torch", "2-build", "3-te", "4-apex", "5-flash", "6-megatron", "7-top"]
# The PyPI CUDA toolkit's parts a made base installs as /usr/local/cuda: what nvcc, torch.utils.cpp_extension
# and TE's build need (compiler, front end, headers, cudart, thrust/cub). The runtime libraries torch uses come
# with torch (layer 1-torch) from the same cuda-toolkit release.
CUDA_TOOLKIT_EXTRAS = "nvcc,crt,nvvm,cccl,cudart"
BUILD_TOOLS = ["pybind11==3.0.1", "ninja==1.13.0", "packaging==25.0", "setuptools==80.9.0", "wheel==0.45.1",
               "py-spy==0.4.1"]


def top_pins(stack: Stack) -> list[str]:
    pins = [f"transformers=={stack.transformers}", f"peft=={stack.peft}", f"trl=={stack.trl}"]
    if stack.deepspeed:
        pins.append(f"deepspeed=={stack.deepspeed}")
    if stack.numpy:
        pins.append(f"numpy=={stack.numpy}")
    return pins + list(stack.extra)


def te_extras(stack: Stack) -> str:
    """TE's `core` extra is the CUDA 12 build; CUDA 13 images need `core_cu13`. From TE 2.16 the torch binding's
    sdist names the cu13 core (its PKG-INFO was written on CUDA 13), so a CUDA 12 stack asks for `core_cu12`
    itself and drops the cu13 one (`drop:` in stacks.yaml; rule te-core-cuda)."""
    if stack.cuda and stack.cuda.split(".")[0] == "13":
        return "pytorch,core_cu13"
    if stack.cuda and stack.transformer_engine and \
            tuple(int(x) for x in stack.transformer_engine.split(".")[:2]) >= (2, 16):
        return "pytorch,core_cu12"
    return "pytorch"


def te_build_pins(stack: Stack) -> list[str]:
    """What TE's torch binding compiles against besides torch: cuDNN's frontend headers, which TE's sdists stopped
    bundling (its submodule became the pip package, TE PR 3169); 1.26.0 is megatron-core 0.19's own pin."""
    if stack.transformer_engine and tuple(int(x) for x in stack.transformer_engine.split(".")[:2]) >= (2, 16):
        return ["nvidia-cudnn-frontend==1.26.0"]
    return []


def apex_build_pins(stack: Stack) -> list[str]:
    """apex's megatron kernels include cuda_profiler_api.h, which the toolkit's `profiler` part holds (nvidia/cuda
    devel images have it; a made base asks for it, at the toolkit's own release)."""
    return [f"cuda-toolkit[profiler]=={stack.cuda_toolkit}"] if stack.cuda_toolkit and stack.apex else []


def flash_build_pins(stack: Stack) -> list[str]:
    """flash-attn's setup.py asks for psutil at setup time (setup_requires) and fetches it if missing; the compile
    container has no network, so the builder has it."""
    return ["psutil==7.2.2"] if stack.flash_attn else []


def toolkit_pin(stack: Stack) -> str | None:
    return f"cuda-toolkit[{CUDA_TOOLKIT_EXTRAS}]=={stack.cuda_toolkit}" if stack.cuda_toolkit else None


def layer_roots(stack: Stack) -> dict[str, list[str]]:
    """The pins each layer asks for (apex is a git archive, not a Python distribution of the package index)."""
    roots = {
        "0-cuda": [toolkit_pin(stack)] if stack.cuda_toolkit else [],
        "1-torch": [f"torch=={stack.torch}"],
        "2-build": BUILD_TOOLS + ([f"numpy=={stack.numpy}"] if stack.numpy else []) + apex_build_pins(stack)
                   + flash_build_pins(stack),
        "3-te": [f"transformer_engine[{te_extras(stack)}]=={stack.transformer_engine}", *te_build_pins(stack)]
        if stack.transformer_engine else [],
        "5-flash": [f"flash-attn=={stack.flash_attn}"] if stack.flash_attn else [],
        "6-megatron": [f"megatron-core=={stack.megatron_core}"],
        "7-top": [f"ms-swift=={stack.ms_swift}", *top_pins(stack)],
    }
    return {layer: roots[layer] for layer in LAYERS if roots.get(layer)}
