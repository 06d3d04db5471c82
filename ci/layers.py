#!/usr/bin/env python3
"""ci/layers.py: fails on an #include or a call that points up a layer.

    python3 ci/layers.py [--root DIR] [--build DIR] [-v]
    python3 ci/layers.py --self-test

It reads every .c, .h, .cu, .cuh and .cpp file under the module folders
(a file belongs to the module of its top folder: tensor/cpu/ is tensor/)
and the CMake files under them, and checks three things against the
layering below, which is ARCHITECTURE.md's ("Modules and the direction of
dependencies") with the edges docs/decisions.md ("Layers, checked") adds:

  - every include directory a CMake file gives a target that lies in
    another module's folder, other than its public include/: a grant of
    that module's private headers. A module's object library may be
    granted (ct_module's PRIVATE_FROM, or target_include_directories on
    ct_<module>_obj) only the modules below it; examples/ and bench/
    nothing; tests/ anything;
  - every #include "..." (resolved as the compiler would: the including
    file's folder, then the include directories of the target it is built
    into: for a module, its object library's own and granted folders) and
    every #include <ct/...>: a module may include its own headers and those
    of the modules below it, public (include/ct/) or private; examples/
    and bench/ include public headers only, tests/ any header; the
    umbrella ct/ct.h is for examples/, tests/ and bench/ only, since it
    pulls in every module;
  - every use of a ct_* or ct__* function or macro (called, or its address
    taken) defined in another module: it must be defined below the user.
    Definitions are read from the sources (non-static functions, and
    static inline functions and macros in headers, which count as the
    header's module's); with --build DIR also from nm on DIR's object
    files, which adds the functions that macros generate and the
    references the compiler saw. examples/ and bench/ may use only what a
    public header declares; tests/ may use anything.

Within tensor/ it tells two layers apart (docs/decisions.md, "The base
layer"): the base layer, tensor/base/, which the top-level CMakeLists.txt
puts on every module's path (ct_module_common) and which holds what needs
no struct layout; and the rest of tensor/'s private headers (tensor_impl.h
with the layouts of ct_tensor and ct_storage, device_impl.h, ...), which
only the modules in LAYOUT may be granted or include. It fails on a grant
of tensor/ or an include of its private headers outside the base layer
from any other module, on a base file that includes them, and on
ct_module_common carrying any private folder but the base layer's.

It prints one line per violation and a summary, and exits 1 on any
violation, 0 when there is none, 2 on a usage error. It reads the tree
only; it never builds.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# The layering: each library module and the modules it may use directly.
# A module may use everything below what it may use (the closure).
DIRECT = {
    "tensor": set(),
    "autograd": {"tensor"},
    "nn": {"autograd"},
    "optim": {"autograd"},
    # data/ -> nn/: ct/llmc.h reads and writes llm.c's GPT-2 checkpoints
    # into a ct_gpt (docs/decisions.md, "Layers, checked").
    "data": {"autograd", "nn"},
    "collectives": {"tensor"},
    # dist/ -> optim/: ct_ddp's ZeRO stages make the optimizer over a rank's
    # shard, as ZeroRedundancyOptimizer wraps torch.optim (decisions.md).
    "dist": {"collectives", "autograd", "nn", "data", "optim"},
    # dist_autograd/ -> optim/: ct_dist_optim_serve drives a ct_optim, as
    # PyTorch's DistributedOptimizer drives torch.optim (decisions.md).
    "dist_autograd": {"dist", "autograd", "optim"},
    "checkpoint": {"tensor", "dist"},
    "launcher": {"dist"},
}
# Programs and suites over the library. tests/ may also use examples/'
# code (test_ctplot links metrics_plot) and private headers and internal
# functions of any module (ct_add_internal_test); examples/ and bench/ use
# the public API only.
USERS = {
    "examples": set(),
    "bench": set(),
    "tests": {"examples"},
}
PUBLIC_ONLY = {"examples", "bench"}
MODULES = list(DIRECT) + list(USERS)

# The base layer: part of tensor/, on every module's path, with what every
# module needs and that needs no struct layout (docs/decisions.md, "The
# base layer").
BASE = "tensor/base"
# The modules that may have the rest of tensor/'s private headers, and why:
# the layouts in tensor_impl.h, and device_impl.h's dispatch table, which
# includes it. Every other module gets what it needs from the base layer and
# the public accessors.
LAYOUT = {
    "autograd": "it fills in the tensors' autograd slot (meta), reads reference counts to steal "
                "a gradient and makes saved outputs as aliases",
    "nn": "its fused kernels (attention, layer norm, cross-entropy) call the device table and "
          "run rows over raw pointers",
    "optim": "its flat update calls the device table's optimizer kernels",
    "collectives": "its reductions are stamped per dtype with tensor_impl.h's element types and "
                   "conversions, and nccl reaches the device's stream through the device table",
    "dist_autograd": "its rpc_impl.h includes autograd_impl.h, whose inline functions read the "
                     "layouts",
}

SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".cpp")
HEADER_EXT = (".h", ".cuh")

# Uses that point up a layer today, each with its reason. An entry is
# (file, what, reason): the file that includes or uses, and what it uses as
# its violation line names it: a public header ("ct/nn.h"), a private one
# by its path ("dist/dist_impl.h"), a folder granted ("dist/"), or a
# function ("ct_gpt_new"). Keep it
# short: an entry is a debt. Empty: the two uses the diagram did not draw
# became arrows in DIRECT instead (docs/decisions.md, "Layers, checked").
ALLOW = [
]


def closure(direct):
    out = {}
    for m in direct:
        seen, todo = set(), list(direct[m])
        while todo:
            d = todo.pop()
            if d not in seen:
                seen.add(d)
                todo.extend(direct.get(d, ()))
        out[m] = seen
    return out


BELOW = closure(DIRECT)


def may_use(a, b):
    """Whether module a may use module b (any header or function of it)."""
    if a == b:
        return True
    if a in USERS:
        return b in DIRECT or b in USERS[a]
    return b in BELOW.get(a, ())


# ---------------------------------------------------------------- reading


def strip(text):
    """Returns (no_comments, code): text with comments blanked, and with
    string and character literals blanked as well (their quotes kept). Both
    keep every offset and newline of text."""
    nc, code = list(text), list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            while True:  # a // comment continued with a backslash
                if j > 0 and text[j - 1] == "\\" and j < n:
                    k = text.find("\n", j + 1)
                    j = n if k < 0 else k
                else:
                    break
            for k in range(i, j):
                if text[k] != "\n":
                    nc[k] = code[k] = " "
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if text[k] != "\n":
                    nc[k] = code[k] = " "
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                if text[k] != "\n":
                    code[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(nc), "".join(code)


def line_of(starts, pos):
    """1-based line of offset pos, given the offsets where lines start."""
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1


PP_LINE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
INCLUDE = re.compile(r'#\s*include\s*([<"])([^>"]+)[>"]')
DEFINE = re.compile(r"#\s*define\s+([A-Za-z_]\w*)(\(([^)]*)\))?")
TOKEN = re.compile(r'[A-Za-z_]\w*|->|"\s*"|[{}();,.=]')
IDENT = re.compile(r"[A-Za-z_]\w*")
CT_NAME = re.compile(r"ct_\w+")


class Source:
    """One file: its includes, definitions, declarations and uses."""

    def __init__(self, rel, module, text):
        self.rel, self.module = rel, module
        self.is_header = rel.endswith(HEADER_EXT)
        self.public = "/include/ct/" in "/" + rel
        self.includes = []  # (line, '<' or '"', name)
        self.defs = {}  # function name -> (line, static in a .c file?)
        self.macros = {}  # function-like or object macro name -> line
        self.decls = set()  # names declared (prototypes, non-static)
        self.uses = []  # (line, name)
        self.macro_text = {}  # macro name -> (parameters, body)
        self.expansions = []  # (line, MAP, DECLARE): an X-macro list applied at file scope
        self.parse(text)

    def parse(self, text):
        nc, code = strip(text)
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        code = list(code)
        for m in PP_LINE.finditer(nc):
            line = line_of(starts, m.start())
            d = m.group(0)
            inc = INCLUDE.match(d.strip())
            if inc:
                self.includes.append((line, inc.group(1), inc.group(2).strip()))
            mac = DEFINE.match(d.strip())
            if mac:
                name = mac.group(1)
                self.macros.setdefault(name, line)
                params = IDENT.findall(mac.group(3) or "")
                body = d.strip()[mac.end():].replace("\\\n", " ")
                self.macro_text[name] = (params, body)
                for u in CT_NAME.finditer(body):
                    if u.group(0) not in params and u.group(0) != name:
                        self.uses.append((line, u.group(0)))
            for k in range(m.start(), m.end()):
                if code[k] != "\n":
                    code[k] = " "
        self.scan("".join(code), starts)

    def scan(self, code, starts):
        toks = [(m.group(0), m.start()) for m in TOKEN.finditer(code)]
        n = len(toks)
        stack = []  # per open brace: 'body' (counted), 'skip' (struct), 'open'
        depth = 0  # braces other than extern "C" and namespace
        stmt = []  # the tokens of the current declaration at file scope
        i = 0
        while i < n:
            t, pos = toks[i]
            if t == "{":
                prev = [x for x, _ in toks[max(0, i - 3):i]]
                extern_c = prev[-2:-1] == ["extern"] and prev[-1].startswith('"')
                if depth == 0 and (extern_c or "namespace" in prev[-2:]):
                    stack.append("open")
                else:
                    kind = "body"
                    if any(x in ("struct", "union", "enum", "class") for x in prev[-2:]) and \
                            (depth == 0 or stack[-1] == "skip"):
                        kind = "skip"
                    stack.append(kind)
                    depth += 1
                stmt = []
            elif t == "}":
                if stack:
                    if stack.pop() != "open":
                        depth -= 1
                stmt = []
            elif depth == 0:
                if t == ";":
                    stmt = []
                elif IDENT.fullmatch(t) and i + 1 < n and toks[i + 1][0] == "(":
                    j, level = i + 1, 0
                    while j < n:
                        if toks[j][0] == "(":
                            level += 1
                        elif toks[j][0] == ")":
                            level -= 1
                            if level == 0:
                                break
                        elif toks[j][0] in "{};":
                            break
                        j += 1
                    k = j + 1  # past attributes: __attribute__((...)), CT_PRINTF(2, 3)
                    while k < n and IDENT.fullmatch(toks[k][0]):
                        k += 1
                        if k < n and toks[k][0] == "(":
                            level = 0
                            while k < n:
                                level += {"(": 1, ")": -1}.get(toks[k][0], 0)
                                k += 1
                                if level == 0:
                                    break
                    nxt = toks[k][0] if k < n else ""
                    static = "static" in stmt
                    if j == i + 3 and IDENT.fullmatch(toks[i + 2][0]):
                        self.expansions.append((line_of(starts, pos), t, toks[i + 2][0]))
                    if t.startswith("ct_") and toks[j][0] == ")":
                        if nxt == "{":
                            self.defs[t] = (line_of(starts, pos), static and not self.is_header)
                        elif nxt in (";", ",") and not static:
                            self.decls.add(t)
                    stmt.append(t)
                    i = k - 1 if nxt == "{" else j
                else:
                    nxt = toks[i + 1][0] if i + 1 < n else ""
                    if t.startswith("ct_") and nxt in ("=", ";", ",", "[") and stmt and \
                            "typedef" not in stmt and stmt[-1] not in ("struct", "union", "enum"):
                        if "extern" in stmt:  # a global variable, declared or defined
                            self.decls.add(t)
                        else:
                            self.defs.setdefault(t, (line_of(starts, pos), "static" in stmt))
                    stmt.append(t)
            elif stack and stack[-1] == "body" and t.startswith("ct_") and IDENT.fullmatch(t):
                before = toks[i - 1][0] if i else ""
                if before not in (".", "->"):
                    self.uses.append((line_of(starts, pos), t))
            i += 1


# ------------------------------------------------------------ the tree


def module_of(rel):
    top = rel.split("/", 1)[0]
    return top if top in MODULES else None


def in_base(rel):
    return rel == BASE or rel.startswith(BASE + "/")


def layout_private(rel):
    """Whether rel (a file or folder of the tree) is tensor/'s and private,
    outside the base layer: what only LAYOUT's modules may have."""
    return (module_of(rel) == "tensor" and not in_base(rel) and rel != "tensor/include"
            and not rel.startswith("tensor/include/"))


def walk(root):
    out = []
    for top in MODULES:
        base = os.path.join(root, top)
        for d, dirs, files in os.walk(base):
            dirs[:] = sorted(x for x in dirs if not x.startswith(".") and not x.startswith("build"))
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    out.append(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/"))
    return out


CMAKE_CALL = re.compile(
    r"\b(target_include_directories|ct_add_internal_test|target_sources|ct_module)\s*\(([^)]*)\)",
    re.S)
KEYWORDS = ("PRIVATE", "PUBLIC", "INTERFACE", "SYSTEM", "BEFORE", "AFTER")
MODULE_KEYWORDS = ("SOURCES", "PRIVATE_DIRS", "PRIVATE_FROM")
OBJECT_LIB = re.compile(r"ct_(\w+)_obj$")


class Cmake:
    """What the CMake files under the module folders say about include
    directories. A module's object library (ct_module(), then
    target_include_directories on ct_<module>_obj) has its own folder, its
    PRIVATE_DIRS and the folder of each module PRIVATE_FROM grants; the
    other targets of a CMake file (tests, programs) have the directories
    they add, pooled per file."""

    def __init__(self, root):
        self.folders = {}  # CMakeLists folder -> the module whose library it makes, or None
        self.lib_dirs = {}  # module -> its object library's include directories
        self.other_dirs = {}  # CMakeLists folder -> its other targets' directories
        self.grants = []  # (CMakeLists.txt, line, who, directory, how it was added)
        self.common = []  # (line, directory): ct_module_common's, on every module's path
        for top in MODULES:
            for d, dirs, files in os.walk(os.path.join(root, top)):
                dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")]
                if "CMakeLists.txt" in files:
                    self.read(root, os.path.relpath(d, root).replace(os.sep, "/"))
        self.read_common(root)

    def read_common(self, root):
        """The include directories the top-level CMakeLists.txt gives
        ct_module_common, which every module's object library links: the
        base layer (and nothing private else, which check() sees to)."""
        top = os.path.join(root, "CMakeLists.txt")
        if not os.path.exists(top):
            return
        with open(top, encoding="utf-8", errors="replace") as f:
            text = re.sub(r"#[^\n]*", "", f.read())
        for m in CMAKE_CALL.finditer(text):
            args = m.group(2).split()
            if m.group(1) == "target_include_directories" and args[:1] == ["ct_module_common"]:
                line = text.count("\n", 0, m.start()) + 1
                self.common += [(line, x) for x in self.paths(".", args[1:])]
        for dirs in self.lib_dirs.values():
            dirs.extend(x for _, x in self.common)

    def read(self, root, rel):
        with open(os.path.join(root, rel, "CMakeLists.txt"), encoding="utf-8",
                  errors="replace") as f:
            text = re.sub(r"#[^\n]*", "", f.read())
        self.folders.setdefault(rel, None)
        for m in CMAKE_CALL.finditer(text):
            call, args = m.group(1), m.group(2).split()
            if not args:
                continue
            line = text.count("\n", 0, m.start()) + 1
            cm = rel + "/CMakeLists.txt"
            lib = OBJECT_LIB.match(args[0])
            if call == "ct_module":
                module, part = args[0], None
                self.folders[rel] = module
                self.lib_dirs.setdefault(module, []).append(rel)
                for a in args[1:]:
                    if a in MODULE_KEYWORDS:
                        part = a
                        continue
                    if part == "PRIVATE_DIRS":
                        found, how = self.paths(rel, [a]), "PRIVATE_DIRS"
                    elif part == "PRIVATE_FROM":
                        found, how = [a], "PRIVATE_FROM " + a
                    else:
                        continue
                    self.lib_dirs[module].extend(found)
                    self.grants += [(cm, line, module, x, how) for x in found]
                continue
            if call == "target_sources":
                continue
            if call == "ct_add_internal_test":
                found = self.paths(rel, ["${PROJECT_SOURCE_DIR}/" + a for a in args[2:]])
            else:
                found = self.paths(rel, args[1:])
            who = lib.group(1) if lib else module_of(rel)
            self.grants += [(cm, line, who, x, call) for x in found]
            if lib:
                self.lib_dirs.setdefault(lib.group(1), []).extend(found)
            else:
                self.other_dirs.setdefault(rel, []).extend(found)

    @staticmethod
    def paths(rel, args):
        """The folders of the tree that args name, relative to the tree (a
        relative path is CMake's, from rel); variables other than the
        source and binary folders name something outside it."""
        out = []
        for a in args:
            if not a.startswith("$") and not os.path.isabs(a) and a not in KEYWORDS:
                a = rel + "/" + a
            a = a.replace("${CMAKE_CURRENT_SOURCE_DIR}", rel)
            a = a.replace("${PROJECT_SOURCE_DIR}/", "")
            a = a.replace("${PROJECT_SOURCE_DIR}", ".")
            if a.startswith("${CMAKE_CURRENT_BINARY_DIR}"):
                out.append(rel)  # generated headers: their .in sits here
            elif "$" not in a and a not in KEYWORDS:
                out.append(os.path.normpath(a).replace(os.sep, "/"))
        return out


class Tree:
    def __init__(self, root, build=None, allow=None):
        self.root = root
        self.allow = ALLOW if allow is None else allow
        self.files = {}
        for rel in walk(root):
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                self.files[rel] = Source(rel, module_of(rel), f.read())
        self.expand_x_macros()
        self.cmake = Cmake(root)
        self.public = {}  # 'ct/x.h' -> rel
        self.by_name = {}  # basename -> [rel]
        for rel in self.files:
            if self.files[rel].public:
                self.public["ct/" + rel.rsplit("/include/ct/", 1)[1]] = rel
            self.by_name.setdefault(rel.rsplit("/", 1)[-1], []).append(rel)
        # name -> {module: where}: the functions and macros other files
        # see; a static function or a macro of a .c file is its own.
        self.defined, self.declared, self.public_names = {}, {}, set()
        for rel, s in self.files.items():
            seen = [(n, l) for n, (l, static) in s.defs.items() if not static]
            if s.is_header:
                seen += list(s.macros.items())
            for name, line in seen:
                self.defined.setdefault(name, {}).setdefault(s.module, "%s:%d" % (rel, line))
            for name in s.decls:
                self.declared.setdefault(name, {}).setdefault(s.module, rel)
            if s.public:
                self.public_names.update(s.decls, s.defs, s.macros)
        self.object_uses = {}
        if build:
            self.read_objects(build)

    def expand_x_macros(self):
        """Declares (or defines) the functions an X-macro list makes at
        file scope, such as CT_UNARY_OP_MAP(CT__UNARY_DECLARE) in
        ct/tensor.h: ct_neg, ct_neg_, ct_abs, ..."""
        text = {}
        for s in self.files.values():
            for name, pb in s.macro_text.items():
                text.setdefault(name, pb)
        for s in self.files.values():
            for line, lst, decl in s.expansions:
                if lst not in text or decl not in text:
                    continue
                if len(text[lst][0]) != 1 or not text[decl][0]:
                    continue
                x, items = text[lst][0][0], text[lst][1]
                params, body = text[decl]
                for m in re.finditer(r"\b%s\s*\(\s*(\w+)" % re.escape(x), items):
                    word = m.group(1)
                    out = re.sub(r"\b%s\b" % re.escape(params[0]), word, body)
                    out = re.sub(r"\s*##\s*", "", out)
                    for name in re.findall(r"\b(ct_\w+)\s*\(", out):
                        if word not in name or re.search(r"\b%s\b" % name, body):
                            continue
                        if "{" in body:
                            s.defs.setdefault(name, (line, "static" in body and not s.is_header))
                        elif "static" not in body:
                            s.decls.add(name)

    def read_objects(self, build):
        """Adds what nm sees in build's objects of the modules' object
        libraries: the global symbols each defines (also those a macro
        generates) and the ct_ symbols each references."""
        objs = {}
        for folder, module in self.cmake.folders.items():
            if module is None:
                continue
            objdir = os.path.join(build, folder, "CMakeFiles", "ct_%s_obj.dir" % module)
            for d, _, files in os.walk(objdir):
                for f in files:
                    if f.endswith(".o"):
                        p = os.path.join(d, f)
                        src = folder + "/" + os.path.relpath(p, objdir)[:-2].replace(os.sep, "/")
                        if src in self.files:  # not the object of a deleted source
                            objs[p] = src
        if not objs:
            raise UsageError("--build %s: no object files of ct_<module>_obj under it (build ct "
                             "first)" % build)
        try:
            out = subprocess.run(["nm", "-A", "-P"] + sorted(objs), capture_output=True,
                                 text=True, check=False).stdout
        except OSError as e:
            raise UsageError("--build needs nm (binutils): %s" % e)
        for line in out.splitlines():
            head, _, rest = line.partition(": ")
            fields = rest.split()
            src = objs.get(head)
            if src is None or len(fields) < 2 or not fields[0].startswith("ct_"):
                continue
            name, kind = fields[0], fields[1]
            if kind == "U":
                self.object_uses.setdefault(src, set()).add(name)
            elif kind in "TWDBRVGSCi":  # the global kinds
                self.defined.setdefault(name, {}).setdefault(self.files[src].module, src + " (nm)")

    def search_path(self, rel):
        """The file's folder, then the include directories of the target
        its nearest CMake file builds it into."""
        folder = rel.rsplit("/", 1)[0] if "/" in rel else "."
        d, cm = folder, None
        while d and d != ".":
            if d in self.cmake.folders:
                cm = d
                break
            d = d.rsplit("/", 1)[0] if "/" in d else ""
        dirs = [folder]
        if cm is not None:
            module = self.cmake.folders[cm]
            dirs += self.cmake.lib_dirs[module] if module else self.cmake.other_dirs.get(cm, [])
        return dirs

    def resolve(self, rel, kind, name):
        """The header's path in the tree, 'umbrella', or None (a system
        header, or one this tree does not have)."""
        if name == "ct/ct.h":
            return "umbrella"
        if name in self.public:
            return self.public[name]
        dirs = self.search_path(rel) if kind == '"' else self.search_path(rel)[1:]
        for d in dirs:
            p = os.path.normpath(os.path.join(d, name)).replace(os.sep, "/")
            if p in self.files:
                return p
            if os.path.exists(os.path.join(self.root, p + ".in")):
                return p + ".in"
        if kind == '"':
            cands = self.by_name.get(name.rsplit("/", 1)[-1], [])
            if len(cands) == 1 and cands[0].endswith(name):
                return cands[0]
        return None

    def allowed(self, rel, what):
        return any(rel == f and what == w for f, w, _ in self.allow)

    def check(self):
        """Returns (violations, the ones ALLOW lets pass, [includes, uses])."""
        bad, allowed, counts = [], [], [0, 0]
        why = "(ARCHITECTURE.md)"

        def report(rel, line, what, msg):
            out = allowed if self.allowed(rel, what) else bad
            out.append("%s:%d: %s" % (rel, line, msg))

        base_why = '(docs/decisions.md, "The base layer")'

        def needs_layout(a):
            return a not in LAYOUT and a != "tensor" and a not in USERS

        for line, folder in self.cmake.common:
            b = module_of(folder)
            if b is not None and folder != b + "/include" and not in_base(folder):
                report("CMakeLists.txt", line, folder + "/", "every module is granted %s's "
                       "private headers (%s/, by ct_module_common), but only the base layer (%s/) "
                       "is every module's %s" % (b, folder, BASE, base_why))
        for cm, line, a, folder, how in self.cmake.grants:
            b = module_of(folder)
            if a is None or b is None or b == a or folder == b + "/include":
                continue  # its own, outside the modules, or public
            if not may_use(a, b):
                report(cm, line, folder + "/", "%s is granted %s's private headers (%s/, by %s), "
                       "but %s is not above %s %s" % (a, b, folder, how, a, b, why))
            elif a in PUBLIC_ONLY:
                report(cm, line, folder + "/", "%s is granted %s's private headers (%s/, by %s), "
                       "but %s/ uses the public API only %s" % (a, b, folder, how, a, why))
            elif layout_private(folder) and needs_layout(a):
                report(cm, line, folder + "/", "%s is granted tensor's layouts (%s/, by %s: "
                       "tensor_impl.h), but %s is not in LAYOUT; what needs no layout is in the "
                       "base layer, %s/ %s" % (a, folder, how, a, BASE, base_why))
        for rel in sorted(self.files):
            s = self.files[rel]
            a = s.module
            for line, kind, name in s.includes:
                hdr = self.resolve(rel, kind, name)
                if hdr is None:
                    continue
                counts[0] += 1
                if hdr == "umbrella":
                    if a not in USERS:
                        report(rel, line, name, "%s includes the umbrella ct/ct.h, which pulls in "
                               "every module; %s includes the headers of the modules below it %s"
                               % (a, a, why))
                    continue
                b = module_of(hdr)
                if b == a:
                    if in_base(rel) and layout_private(hdr):
                        report(rel, line, hdr, "the base layer includes %s, but the base layer "
                               "holds what needs no struct layout %s" % (hdr, base_why))
                    continue
                public = "/include/ct/" in "/" + hdr
                what = name if public else hdr
                if not may_use(a, b):
                    report(rel, line, what, "%s includes %s's %s, but %s is not above %s %s"
                           % (a, b, what, a, b, why))
                elif a in PUBLIC_ONLY and not public:
                    report(rel, line, what, "%s includes %s's private %s, but %s/ uses the public "
                           "API only %s" % (a, b, hdr, a, why))
                elif layout_private(hdr) and needs_layout(a):
                    report(rel, line, what, "%s includes %s, which has tensor's struct layouts, "
                           "but %s is not in LAYOUT; what needs no layout is in the base layer, "
                           "%s/ %s" % (a, hdr, a, BASE, base_why))
            seen = set()
            uses = list(s.uses)
            named = {u for _, u in s.uses}
            for name in sorted(self.object_uses.get(rel, ())):
                if name not in named:
                    uses.append((self.first_line(rel, name), name, " (nm: its object uses it)"))
            for line, name, *how in uses:
                if name in s.defs or name in s.macros:
                    continue  # its own (or a static of the same name)
                where = self.defined.get(name) or self.declared.get(name)
                if not where or a in where or (line, name) in seen:
                    continue
                seen.add((line, name))
                counts[1] += 1
                ok = [b for b in where if may_use(a, b)]
                lib = [b for b in ok if b in DIRECT]
                if not ok:
                    b = sorted(where)[0]
                    report(rel, line, name, "%s calls %s's %s, but %s is not above %s %s%s"
                           % (a, b, name, a, b, why, "".join(how)))
                elif a in PUBLIC_ONLY and lib and self.is_private(name):
                    report(rel, line, name, "%s calls %s's internal %s, but %s/ uses the public "
                           "API only %s%s" % (a, lib[0], name, a, why, "".join(how)))
        return bad, allowed, counts

    def is_private(self, name):
        if name in self.public_names:
            return False
        return name.startswith("ct__") or name in self.declared

    def first_line(self, rel, name):
        with open(os.path.join(self.root, rel), encoding="utf-8", errors="replace") as f:
            for i, line in enumerate(f, 1):
                if re.search(r"\b%s\b" % re.escape(name), line):
                    return i
        return 1


class UsageError(Exception):
    pass


def run(root, build=None, verbose=False, allow=None, out=sys.stdout):
    tree = Tree(root, build, allow)
    bad, allowed, counts = tree.check()
    for b in bad:
        print(b, file=out)
    if verbose:
        for b in allowed:
            print("allowed: " + b, file=out)
    print("ci/layers.py: %d files, %d includes and %d cross-module uses checked%s: %d violation%s%s"
          % (len(tree.files), counts[0], counts[1], " (with nm on %s)" % build if build else "",
             len(bad), "" if len(bad) == 1 else "s",
             ", %d allowed by ALLOW" % len(allowed) if allowed else ""), file=out)
    return bad, allowed


# ------------------------------------------------------------- self-test

SELF_TEST_TREE = {
    "CMakeLists.txt": "target_include_directories(ct_module_common INTERFACE\n"
                      "                           ${CMAKE_CURRENT_SOURCE_DIR}/tensor/base)\n",
    "tensor/CMakeLists.txt": "ct_module(tensor SOURCES good.c bad.c)\n",
    "tensor/base/base_impl.h": "#include <ct/tensor.h>\n"
                               "static inline int ct__b_now(void) { return 3; }\n",
    "tensor/include/ct/tensor.h": "int ct_t_ok(void);\n#define ct_t_macro(x) ((x) + 1)\n",
    "tensor/tensor_impl.h": "int ct__t_inner(void);\n"
                            "static inline int ct__t_fast(void) { return 1; }\n",
    "tensor/good.c": '#include <ct/tensor.h>\n#include "tensor_impl.h"\n'
                     '/* In a comment, not code:\n#include "dist_impl.h"\n   ct__d_up(); */\n'
                     "int ct_t_ok(void) {\n"
                     '    const char *s = "ct__d_up()"; // ct__d_up()\n'
                     "    return ct__t_inner() + ct__t_fast() + (s[0] == 0);\n}\n",
    "tensor/bad.c": '#include "tensor_impl.h"\n#include "dist_impl.h"\n'
                    "int ct__t_inner(void) {\n    return ct__d_up();\n}\n",
    "autograd/CMakeLists.txt": "ct_module(autograd SOURCES a.c PRIVATE_FROM tensor)\n",
    "autograd/a.c": '#include "tensor_impl.h"\n'
                    "int ct__a_x(void) { return ct__t_fast() + ct__b_now(); }\n",
    "dist/CMakeLists.txt": "ct_module(dist SOURCES d.c)\n",
    "dist/include/ct/dist.h": "#include <ct/tensor.h>\nint ct_d_api(void);\n",
    "dist/dist_impl.h": "int ct__d_up(void);\n",
    "dist/d.c": '#include <ct/dist.h>\n#include "base_impl.h"\n#include "dist_impl.h"\n'
                "static int ct_d_local(void) { return 2; }\n"
                "int ct__d_up(void) {\n"
                "    return ct_t_ok() + ct__b_now() + ct_t_macro(1) + ct_d_local();\n}\n"
                "int ct_d_api(void) { return ct__d_up(); }\n",
    "examples/CMakeLists.txt": "add_executable(e e.c)\n"
                               "target_include_directories(e PRIVATE ${PROJECT_SOURCE_DIR}/tensor)\n",
    "examples/e.c": '#include <ct/ct.h>\n#include "tensor_impl.h"\n'
                    "int main(void) {\n    return ct_t_ok() + ct_d_api() + ct__t_inner();\n}\n",
    "tests/t.c": '#include <ct/ct.h>\n#include "../tensor/tensor_impl.h"\n'
                 "int main(void) { return ct__t_inner() + ct__d_up(); }\n",
}
SELF_TEST_EXPECT = {
    "tensor/bad.c:2: tensor includes dist's dist/dist_impl.h, but tensor is not above dist "
    "(ARCHITECTURE.md)",
    "tensor/bad.c:4: tensor calls dist's ct__d_up, but tensor is not above dist (ARCHITECTURE.md)",
    "examples/e.c:2: examples includes tensor's private tensor/tensor_impl.h, but examples/ uses "
    "the public API only (ARCHITECTURE.md)",
    "examples/CMakeLists.txt:2: examples is granted tensor's private headers (tensor/, by "
    "target_include_directories), but examples/ uses the public API only (ARCHITECTURE.md)",
    "examples/e.c:4: examples calls tensor's internal ct__t_inner, but examples/ uses the public "
    "API only (ARCHITECTURE.md)",
}
# Variants of the tree that break the base layer's rules (files replaced),
# each with the violations it adds to SELF_TEST_EXPECT.
BASE_WHY = '(docs/decisions.md, "The base layer")'
SELF_TEST_VARIANTS = [
    ("a module not in LAYOUT granted tensor/ and including tensor_impl.h",
     {"dist/CMakeLists.txt": "ct_module(dist SOURCES d.c PRIVATE_FROM tensor)\n",
      "dist/d.c": SELF_TEST_TREE["dist/d.c"].replace("base_impl.h", "tensor_impl.h")},
     {"dist/CMakeLists.txt:1: dist is granted tensor's layouts (tensor/, by PRIVATE_FROM tensor: "
      "tensor_impl.h), but dist is not in LAYOUT; what needs no layout is in the base layer, "
      "tensor/base/ " + BASE_WHY,
      "dist/d.c:2: dist includes tensor/tensor_impl.h, which has tensor's struct layouts, but dist "
      "is not in LAYOUT; what needs no layout is in the base layer, tensor/base/ " + BASE_WHY}),
    ("the base layer including tensor_impl.h",
     {"tensor/base/base_impl.h": '#include "tensor_impl.h"\n'},
     {"tensor/base/base_impl.h:1: the base layer includes tensor/tensor_impl.h, but the base layer "
      "holds what needs no struct layout " + BASE_WHY}),
    ("tensor/ on every module's path",
     {"CMakeLists.txt": "target_include_directories(ct_module_common INTERFACE\n"
                        "    ${CMAKE_CURRENT_SOURCE_DIR}/tensor/base\n"
                        "    ${CMAKE_CURRENT_SOURCE_DIR}/tensor)\n"},
     {"CMakeLists.txt:1: every module is granted tensor's private headers (tensor/, by "
      "ct_module_common), but only the base layer (tensor/base/) is every module's " + BASE_WHY}),
]


def write(root, files):
    for rel, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
            f.write(text)


def self_test():
    tmp = tempfile.mkdtemp(prefix="ct-layers.")
    try:
        write(tmp, SELF_TEST_TREE)
        failures = []
        with open(os.devnull, "w") as null:
            bad, _ = run(tmp, allow=[], out=null)
            if set(bad) != SELF_TEST_EXPECT:
                failures.append("verdicts differ:\n  missing: %s\n  unexpected: %s"
                                % (sorted(SELF_TEST_EXPECT - set(bad)),
                                   sorted(set(bad) - SELF_TEST_EXPECT)))
            for name, files, added in SELF_TEST_VARIANTS:
                write(tmp, files)
                bad, _ = run(tmp, allow=[], out=null)
                write(tmp, {rel: SELF_TEST_TREE[rel] for rel in files})
                if set(bad) != SELF_TEST_EXPECT | added:
                    failures.append("%s: missing %s, unexpected %s"
                                    % (name, sorted((SELF_TEST_EXPECT | added) - set(bad)),
                                       sorted(set(bad) - SELF_TEST_EXPECT - added)))
            allow = [("tensor/bad.c", "dist/dist_impl.h", "test"),
                     ("tensor/bad.c", "ct__d_up", "test")]
            bad, allowed = run(tmp, allow=allow, out=null)
            if len(bad) != len(SELF_TEST_EXPECT) - 2 or len(allowed) != 2:
                failures.append("the allowlist did not take exactly tensor/bad.c's two: %s" % bad)
            # A grant of a private folder up a layer: the build would let
            # tensor/bad.c include dist_impl.h.
            with open(os.path.join(tmp, "tensor", "CMakeLists.txt"), "w", encoding="utf-8") as f:
                f.write("ct_module(tensor SOURCES good.c bad.c PRIVATE_FROM dist)\n")
            bad, _ = run(tmp, allow=[], out=null)
            grant = ("tensor/CMakeLists.txt:1: tensor is granted dist's private headers (dist/, by "
                     "PRIVATE_FROM dist), but tensor is not above dist (ARCHITECTURE.md)")
            if set(bad) != SELF_TEST_EXPECT | {grant}:
                failures.append("a grant up a layer: missing %s, unexpected %s"
                                % (sorted((SELF_TEST_EXPECT | {grant}) - set(bad)),
                                   sorted(set(bad) - SELF_TEST_EXPECT - {grant})))
            # A module including the umbrella header.
            with open(os.path.join(tmp, "tensor", "bad.c"), "w", encoding="utf-8") as f:
                f.write("#include <ct/ct.h>\n")
            bad, _ = run(tmp, allow=[], out=null)
            if not any(b.startswith("tensor/bad.c:1: tensor includes the umbrella") for b in bad):
                failures.append("an umbrella include from tensor/ passed: %s" % bad)
    finally:
        shutil.rmtree(tmp)
    for f in failures:
        print("ci/layers.py --self-test: " + f, file=sys.stderr)
    print("ci/layers.py --self-test: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


def main(argv):
    ap = argparse.ArgumentParser(prog="ci/layers.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the source tree (default: this script's checkout)")
    ap.add_argument("--build", metavar="DIR",
                    help="a build directory: also read its objects with nm")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="also list the uses ALLOW lets pass")
    ap.add_argument("--self-test", action="store_true", help="check the checker on a made-up tree")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if not os.path.isdir(os.path.join(args.root, "tensor")):
        print("ci/layers.py: %s is not ct's source tree (no tensor/)" % args.root, file=sys.stderr)
        return 2
    try:
        bad, _ = run(args.root, args.build, args.verbose)
    except UsageError as e:
        print("ci/layers.py: %s" % e, file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
