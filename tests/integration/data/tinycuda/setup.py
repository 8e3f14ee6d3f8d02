"""A tiny compiled package for the wheel-cache tests: six CUDA files compiled by ninja into one shared library,
laid out as torch's BuildExtension does (build/temp.*/build.ninja, absolute paths), so the cache's progress count,
resume and key work on it as on flash-attn, in seconds instead of hours. No torch needed."""

import os
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class NinjaCuda(build_ext):
    def build_extension(self, ext):
        tmp = Path(self.build_temp).resolve()
        tmp.mkdir(parents=True, exist_ok=True)
        archs = os.environ.get("TINY_CUDA_ARCHS", "90").split(";")
        gencode = " ".join(f"-gencode arch=compute_{a},code=sm_{a}" for a in archs)
        delay = os.environ.get("TINY_DELAY", "0")  # seconds each object waits before compiling (the resume test)
        lines = ["rule cu", f"  command = sleep {delay} && nvcc {gencode} -O2 -Xcompiler -fPIC -c $in -o $out",
                 "rule link", "  command = nvcc -shared $in -o $out"]
        objs = []
        for src in sorted(Path("csrc").resolve().glob("*.cu")):
            obj = tmp / (src.stem + ".o")
            objs.append(str(obj))
            lines.append(f"build {obj}: cu {src}")
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        lines.append(f"build {out}: link {' '.join(objs)}")
        (tmp / "build.ninja").write_text("\n".join(lines) + "\n")
        subprocess.run(["ninja", "-C", str(tmp), "-j", os.environ.get("MAX_JOBS", "1")], check=True)


setup(name="dltiny", version="0.1", packages=["dltiny"],
      ext_modules=[Extension("dltiny._kernels", sources=[])], cmdclass={"build_ext": NinjaCuda},
      options={"bdist_wheel": {"py_limited_api": False}}, zip_safe=False)
