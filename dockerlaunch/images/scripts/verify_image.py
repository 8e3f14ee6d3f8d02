"""Run inside a built image by `dockerlaunch verify`: import every component the image's labels declare and
compare installed versions with the pinned labels. Prints one JSON object. Only the standard library."""

import importlib
import importlib.metadata as md
import json
import os
import re

labels = json.loads(os.environ["DL_LABELS"])
comps = [c for c in labels.get("ai.dockerlaunch.components", "").split(",") if c]
res = {"imports": {}, "versions": {}, "checks": {}}
for mod in comps:
    try:
        importlib.import_module(mod)
        res["imports"][mod] = "ok"
    except BaseException as e:
        msg = f"{type(e).__name__}: {e}"
        drift = "UNDEFINED SYMBOL (ABI drift: rebuild against this torch): " if "undefined symbol" in msg else ""
        res["imports"][mod] = drift + msg
dists = {"torch": "torch", "transformer_engine": "transformer_engine", "flash_attn": "flash-attn",
         "megatron_core": "megatron-core", "ms_swift": "ms-swift", "transformers": "transformers", "peft": "peft",
         "trl": "trl", "deepspeed": "deepspeed", "numpy": "numpy"}
for key, dist in dists.items():
    want = labels.get("ai.dockerlaunch.pin." + key)
    if want is None:
        continue
    try:
        got = md.version(dist)
    except md.PackageNotFoundError:
        got = None
    res["versions"][key] = [want, got]
clone = os.environ.get("MEGATRON_LM_PATH")
if labels.get("ai.dockerlaunch.pin.megatron_lm") and clone:
    text = open(os.path.join(clone, "megatron/core/package_info.py")).read()
    mm = tuple(int(re.search(p + r"\s*=\s*(\d+)", text).group(1)) for p in ("MAJOR", "MINOR"))
    pip_mm = tuple(int(x) for x in md.version("megatron-core").split(".")[:2])
    res["checks"]["mcore-clone"] = [list(pip_mm), list(mm)]
print(json.dumps(res))
