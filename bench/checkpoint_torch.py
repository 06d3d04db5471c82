#!/usr/bin/python3
"""PyTorch peer of the checkpoint benchmark: torch.save and torch.load.

    checkpoint_torch.py [--dir DIR] [--bytes N] [--tensors N]

Saves a dict of --tensors float32 tensors of shape (rows, 1024), --bytes in
all (default 1G in 16 tensors, bench_checkpoint's state), with
torch.save(state, DIR/torch.pt), then fsyncs the file, since ct's save
fsyncs its files too: the save is timed from the call to the fsync's
return. It then drops the file's page cache (os.posix_fadvise DONTNEED,
which evicts clean pages without root) and times torch.load(path) reading
the disk ("cold"), then torch.load again with the pages that load left
cached ("warm"). torch.load makes new tensors, as a restart does; ct's load
writes into tensors that exist. The file is removed at the end, then a
sync (untimed) lets the file system finish the removal before the next
timed write, this script's under another torch or another implementation's.

stdout: one JSON line per figure, {"bench": "checkpoint", "impl": "torch",
"torch" (the version), "op": "save" or "load", "cache" (load: "cold" or
"warm"), "cached_share" (load: the share of the file's pages cached when it
started, from mincore; null where that cannot be asked), "ranks": 1,
"bytes", "tensors", "seconds", "gbps" (10^9 bytes/s)}. stderr: notes.
Without torch it says so and exits 1.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import sys
import time

PROG = "checkpoint_torch.py"
COLS = 1024


def note(text):
    print("%s: %s" % (PROG, text), file=sys.stderr, flush=True)


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def cached_share(path):
    """The share of path's pages in the page cache (mincore), or None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        size = os.path.getsize(path)
        page = os.sysconf("SC_PAGE_SIZE")
        pages = (size + page - 1) // page
        if not pages:
            return 0.0
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            vec = ctypes.create_string_buffer(pages)
            rc = libc.mincore(addr, size, vec)
            libc.munmap(addr, size)
        finally:
            os.close(fd)
        if rc != 0:
            return None
        return sum(b & 1 for b in vec.raw) / pages
    except (OSError, AttributeError):
        return None


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def emit(torch, op, nbytes, tensors, seconds, cache=None, cached=None):
    record = {"bench": "checkpoint", "impl": "torch", "torch": torch.__version__, "op": op}
    if cache:
        record.update(cache=cache, cached_share=None if cached is None else round(cached, 4))
    record.update(ranks=1, bytes=nbytes, tensors=tensors, seconds=round(seconds, 4),
                  gbps=round(nbytes / seconds * 1e-9, 4))
    print(json.dumps(record), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="ckpt-bench", help="where the file goes")
    parser.add_argument("--bytes", default="1G", help="the state's size, K/M/G suffixes")
    parser.add_argument("--tensors", type=int, default=16)
    args = parser.parse_args()
    nbytes = parse_bytes(args.bytes)
    if args.tensors < 1 or nbytes <= 0 or nbytes % (args.tensors * COLS * 4):
        parser.error("--bytes must be a positive multiple of --tensors rows of %d float32" % COLS)
    try:
        import torch
    except ImportError:
        note("no torch for %s; nothing measured" % sys.executable)
        return 1

    rows = nbytes // (args.tensors * COLS * 4)
    # Distinct values, made at memory speed: the content does not matter to
    # the file's size or to the I/O.
    state = {"model.layer%03d.weight" % i:
             torch.arange(rows * COLS, dtype=torch.float32).add_(i).view(rows, COLS)
             for i in range(args.tensors)}
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "torch.pt")
    try:
        t0 = time.perf_counter()
        torch.save(state, path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        emit(torch, "save", nbytes, args.tensors, time.perf_counter() - t0)

        for cache in ("cold", "warm"):
            if cache == "cold":
                drop_cache(path)
            cached = cached_share(path)
            t0 = time.perf_counter()
            loaded = torch.load(path)
            seconds = time.perf_counter() - t0
            ok = all(torch.equal(loaded[k], v) for k, v in state.items())
            del loaded
            if not ok:
                note("torch.load gave back other values than were saved")
                return 1
            emit(torch, "load", nbytes, args.tensors, seconds, cache, cached)
    finally:
        if os.path.exists(path):
            os.remove(path)
            os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
