"""What each layer of train.Dockerfile installs: the one list that the build, `fetch` and the lock share.

Layers run from least to most often changed, so that an ms-swift bump rebuilds only the top one; a package
that several layers need is installed by the lowest of them (`lock.assign_layers`).
"""

from __future__ import annotations

from dockerlaunch.images.stacks import Stack

LAYERS = ["1-torch", "2-build", "3-te", "4-apex", "5-flash", "6-megatron", "7-top"]
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
    """TE's `core` extra is the CUDA 12 build; CUDA 13 images need `core_cu13`."""
    if stack.cuda and stack.cuda.split(".")[0] == "13":
        return "pytorch,core_cu13"
    return "pytorch"


def layer_roots(stack: Stack) -> dict[str, list[str]]:
    """The pins each layer asks for (apex is a git archive, not a Python distribution of the registry)."""
    roots = {
        "1-torch": [f"torch=={stack.torch}"],
        "2-build": BUILD_TOOLS + ([f"numpy=={stack.numpy}"] if stack.numpy else []),
        "3-te": [f"transformer_engine[{te_extras(stack)}]=={stack.transformer_engine}"]
        if stack.transformer_engine else [],
        "5-flash": [f"flash-attn=={stack.flash_attn}"] if stack.flash_attn else [],
        "6-megatron": [f"megatron-core=={stack.megatron_core}"],
        "7-top": [f"ms-swift=={stack.ms_swift}", *top_pins(stack)],
    }
    return {layer: roots[layer] for layer in LAYERS if roots.get(layer)}
