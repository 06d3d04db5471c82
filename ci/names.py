#!/usr/bin/env python3
"""ci/names.py: fails on a symbol of libct that does not say whose it is.

    python3 ci/names.py --build DIR [-v]
    python3 ci/names.py --self-test

Every global symbol that an object file of libct defines (nm on the
library's objects under DIR) must be one of:

  - public: ct_<name>, declared in a public header (include/ct/*.h) or in
    the umbrella header's modules, and nothing else starting with ct_ but
    not ct__ (an undeclared ct_ symbol is an accident of the API);
  - internal: ct__<prefix>_<name>, where <prefix> is one of the prefixes of
    the module the object belongs to (PREFIXES below). Each prefix belongs
    to one module, so a name in a backtrace, a profile or a link error says
    which module defines it;
  - C++ (a mangled name, _Z...) from the CUDA kernels: their names live in
    the ct_cuda namespace or an anonymous one, and the extern "C" entry
    points are checked as C names.

Static inline functions and macros in headers define no symbols; they
follow the same prefixes by convention (docs/decisions.md, "Names").

It prints one line per violation and a summary; it exits 1 on any, 0 when
there is none, 2 on a usage error (no objects found).
"""

import argparse
import glob
import os
import re
import subprocess
import sys

# Each module's internal prefixes: the module's name, or the name of one of
# its parts (a device folder, a backend, a file format). No prefix is in
# two modules.
PREFIXES = {
    "tensor": {"tensor", "err", "cpu", "cuda", "device", "op", "iter", "file", "red", "array", "meta"},
    "autograd": {"autograd", "engine", "node"},
    "nn": {"nn"},
    "optim": {"optim"},
    "data": {"data"},
    "collectives": {"coll", "comm", "work", "shm", "mpi", "nccl", "gloo", "hier", "dry"},
    "dist": {"dist", "store", "auth", "ddp"},
    "dist_autograd": {"dautograd", "rpc", "rref"},
    "checkpoint": {"ckpt", "manifest", "reader", "safetensors"},
}

INTERNAL = re.compile(r"ct__([a-z0-9]+)_\w+$")
# nm's lines for defined global symbols: "ADDRESS TYPE NAME".
NM_LINE = re.compile(r"^[0-9a-fA-F]*\s+([A-Za-z])\s+(\S+)$")


def owner_of(prefix):
    for module, prefixes in PREFIXES.items():
        if prefix in prefixes:
            return module
    return None


def check_symbol(module, name, public):
    """The violation for symbol name defined by module, or None."""
    # C++ names, and what compilers and sanitizers add (__odr_asan_gen_*,
    # DW.ref.__gxx_personality_v0): not ct's to name.
    if name.startswith(("_Z", "__", "DW.ref.")):
        return None
    m = INTERNAL.match(name)
    if m:
        owner = owner_of(m.group(1))
        if owner == module:
            return None
        if owner:
            return f"{name}: prefix '{m.group(1)}' is {owner}'s, but {module} defines it"
        return f"{name}: '{m.group(1)}' is no prefix of {module} ({', '.join(sorted(PREFIXES[module]))})"
    if name.startswith("ct__"):
        return f"{name}: internal, but without a module prefix (ct__<prefix>_<name>)"
    if name.startswith("ct_"):
        return None if name in public else f"{name}: ct_ names the public API, but no public header declares it"
    return f"{name}: neither public (ct_) nor internal (ct__<prefix>_): a bare name in a library's namespace"


def public_names(root, build):
    """The ct_ names the public headers declare, macro expansions included
    (the op families are declared through X-macros): the preprocessed
    umbrella header's identifiers."""
    umbrella = os.path.join(build, "include", "ct", "ct.h")
    includes = [f"-I{d}" for d in glob.glob(os.path.join(root, "*", "include"))]
    includes.append(f"-I{os.path.join(build, 'include')}")
    out = subprocess.run(["cc", "-E", "-P", *includes, umbrella], capture_output=True, text=True,
                         check=True).stdout
    return set(re.findall(r"\b(ct_[A-Za-z0-9_]+)\b", out))


def objects(build):
    """(module, path) of libct's object files under build."""
    found = []
    for path in glob.glob(os.path.join(build, "**", "*.o"), recursive=True):
        rel = os.path.relpath(path, build).split(os.sep)
        # CMake puts a target's objects in [<folder>/]CMakeFiles/<target>.dir/
        # under the source's path from the folder: the library's targets
        # are ct_*, and the first module folder named on the way is the
        # object's module.
        if "CMakeFiles" not in rel:
            continue
        target = rel[rel.index("CMakeFiles") + 1]
        if not target.startswith("ct_") or not target.endswith(".dir"):
            continue
        module = next((part for part in rel if part in PREFIXES), None)
        if module:
            found.append((module, path))
    return found


def defined_globals(path):
    out = subprocess.run(["nm", "-g", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        m = NM_LINE.match(line.strip())
        if m and m.group(1) not in "wWvV":  # weak symbols are template instances
            yield m.group(2)


def self_test():
    public = {"ct_add"}
    cases = [("tensor", "ct__err_set", None), ("tensor", "ct_add", None),
             ("autograd", "ct__engine_run", None), ("tensor", "ct_undeclared", "public header"),
             ("checkpoint", "ct__agree", "without a module prefix"),
             ("checkpoint", "ct__json_parse", "no prefix of checkpoint"),
             ("dist_autograd", "ct__dist_enter", "dist's"), ("tensor", "ct__x", "without a module prefix"),
             ("checkpoint", "ck_type_names", "bare name"), ("tensor", "_ZN7ct_cuda3fooEv", None)]
    bad = 0
    for module, name, want in cases:
        got = check_symbol(module, name, public)
        if (want is None) != (got is None) or (want and want not in got):
            print(f"self-test: {module} {name}: expected {want!r}, got {got!r}")
            bad += 1
    owners = [p for ps in PREFIXES.values() for p in ps]
    if len(owners) != len(set(owners)):
        print("self-test: a prefix belongs to two modules")
        bad += 1
    print("self-test:", "failed" if bad else "ok")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", help="a build directory of ct")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("-v", action="store_true", help="list every object checked")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.build:
        ap.error("--build DIR is needed")
    objs = objects(a.build)
    if not objs:
        print(f"names: no object files of libct under {a.build}", file=sys.stderr)
        return 2
    public = public_names(a.root, a.build)
    violations = set()
    nsym = 0
    for module, path in objs:
        if a.v:
            print(f"{module}: {path}")
        for name in defined_globals(path):
            nsym += 1
            v = check_symbol(module, name, public)
            if v:
                violations.add(f"{os.path.relpath(path, a.build)}: {v}")
    for v in sorted(violations):
        print(v)
    print(f"names: {nsym} symbols in {len(objs)} objects, {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
