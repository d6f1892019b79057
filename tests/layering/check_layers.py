#!/usr/bin/env python3
"""Fails if a source file includes a header from a higher layer (DESIGN.md: dependencies
point one way: api > engine > algo > topo > transports > bootstrap > base > kernels).

kernels/ is the bottom: it depends on nothing in src/ (the CUDA module builds it on its
own), so a quoted include in a kernels/ file (kernels/cuda included) must name another file
of kernels/, as "kernels/x.h" or relative to the includer; base/..., src/... or any other
header is a violation."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
# Layer of each folder; a file may include headers of its own layer or lower ones.
LAYERS = {"kernels": 0, "src/base": 1, "src/bootstrap": 2, "transports": 3, "src/topo": 4,
          "src/algo": 5, "src/engine": 6, "src/dispatch": 7, "src/api": 8}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path: str):
    for prefix, level in sorted(LAYERS.items(), key=lambda kv: -len(kv[0])):
        if path == prefix or path.startswith(prefix + "/"):
            return prefix, level
    return None, None


def header_layer(inc: str):
    for candidate in (inc, "src/" + inc):
        prefix, level = layer_of(candidate)
        if prefix:
            return prefix, level
    return None, None


def kernels_may_include(f: pathlib.Path, inc: str):
    """Whether a kernels/ file may include "inc": only another file of kernels/."""
    kernels = (root / "kernels").resolve()
    for target in (root / inc, f.parent / inc):
        target = target.resolve()
        if target.exists() and (target == kernels or kernels in target.parents):
            return True
    return False


bad = []
for prefix in LAYERS:
    for f in sorted((root / prefix).rglob("*")):
        if f.suffix not in (".h", ".cc", ".cu", ".cuh") or f.name.endswith("_test.cc"):
            continue
        rel = f.relative_to(root).as_posix()
        _, mine = layer_of(rel)
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            if prefix == "kernels":
                if not kernels_may_include(f, inc):
                    bad.append(f"{rel}: includes \"{inc}\", which is not a kernels/ header "
                               "(kernels/ depends on nothing in src/)")
                continue
            hprefix, theirs = header_layer(inc)
            if theirs is not None and theirs > mine:
                bad.append(f"{rel}: includes \"{inc}\" from the higher layer {hprefix}")
for b in bad:
    print(b)
print(f"layering: {len(bad)} violation(s)")
sys.exit(1 if bad else 0)
