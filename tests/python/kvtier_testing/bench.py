"""python3 -m kvtier_testing.bench [--json]: the Python binding against the C++ client it wraps.

Two loops, each run in the same process over the same daemon session, the C++ one called
through the binding in one call (so the difference between the two is what Python and the
binding add), in interleaved rounds, 2 MiB blocks:

  page path   lease a batch of pages, copy 2 MiB into each through a numpy view of the
              shared memory, commit; acquire them, copy each out, release
  kv path     store_kv / load_kv of a paged KV cache (per-layer CPU tensors, 32 layers of
              64 KiB slabs: one gather / scatter per batch)

Prints blocks/s of each and Python / C++ as ``*_ratio`` (1.0: no overhead).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import kvtier
from kvtier_testing import _bench
from kvtier_testing.daemon import Daemon

BLOCK = 2 << 20


def page_loop_py(c: "kvtier.Client", batch: int, rounds: int, seed: int, src: np.ndarray, dst: np.ndarray) -> float:
    t0 = time.perf_counter()
    for r in range(rounds):
        hashes = [(seed * 1_000_003 + r * batch + i).to_bytes(8, "little") + b"\0" * 7 + b"\xc2" for i in range(batch)]
        pages = c.allocate(batch)
        for i, p in enumerate(pages):
            np.copyto(np.frombuffer(c.page(p), dtype=np.uint8)[:BLOCK], src[i])
        res = c.commit(pages, hashes, [b""] + hashes[:-1])
        if not all(x.ok for x in res):
            raise kvtier.InternalError(f"commit: {res[0].status}")
        got = c.acquire(hashes)
        for i, g in enumerate(got):
            np.copyto(dst[i], np.frombuffer(c.page(g.page, g.tier), dtype=np.uint8)[:BLOCK])
        c.release(hashes=hashes)
    return time.perf_counter() - t0


def kv_loop_py(c: "kvtier.Client", layers: list, batch: int, rounds: int, seed: int) -> float:
    blocks = list(range(batch))
    t0 = time.perf_counter()
    for r in range(rounds):
        hashes = [(seed * 1_000_003 + r * batch + i).to_bytes(8, "little") + b"\0" * 7 + b"\xc3" for i in range(batch)]
        c.store_kv(layers, blocks, hashes)
        if c.load_kv(layers, hashes, blocks) != batch:
            raise kvtier.InternalError("load_kv loaded less than it stored")
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kvtier_testing.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8, help="blocks per store/load")
    p.add_argument("--rounds", type=int, default=40, help="batches per measurement")
    p.add_argument("--repeats", type=int, default=5, help="interleaved measurements of each loop")
    p.add_argument("--socket", default="", help="a running kvtierd (default: one of its own)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    import torch

    pool_pages = max(64, 4 * a.batch)
    daemon = None if a.socket else Daemon(page_bytes=BLOCK, pages=pool_pages)
    socket = a.socket or daemon.socket
    try:
        # Page path: an opaque 2 MiB layout.
        page_layout = kvtier.Layout.opaque("bench-pages", BLOCK)
        kv_layout = kvtier.Layout("bench-kv", layers=32, kv_heads=8, head_dim=128, dtype="bf16", tokens_per_block=16)
        rng = np.random.default_rng(7)
        src = rng.integers(0, 256, size=(a.batch, BLOCK), dtype=np.uint8)
        dst = np.zeros_like(src)
        layers = [torch.randint(-100, 100, (2, a.batch, 16, 8, 128), dtype=torch.int16).view(torch.bfloat16)
                  for _ in range(32)]
        results = {"page": {"py": [], "cpp": []}, "kv": {"py": [], "cpp": []}}
        with kvtier.Client(page_layout, socket, name="bench-pages", device="host-emulated") as pc, \
                kvtier.Client(kv_layout, socket, name="bench-kv", device="host-emulated") as kc:
            ptrs = [t.data_ptr() for t in layers]
            # Warm: every page of the pool mapped and faulted in, by both paths, before any
            # measurement (the first touch of a page costs more than the copy).
            warm = 2 * pool_pages // a.batch + 2
            page_loop_py(pc, a.batch, warm, 999, src, dst)
            kv_loop_py(kc, layers, a.batch, warm, 998)
            blocks = 2 * a.batch * a.rounds  # stored and loaded per measurement

            def run(path, lang, seed):
                if path == "page" and lang == "py":
                    t = page_loop_py(pc, a.batch, a.rounds, seed, src, dst)
                    if not np.array_equal(src, dst):
                        raise kvtier.InternalError("the page path read back other bytes than it wrote")
                elif path == "page":
                    t = _bench.page_loop(pc._c, a.batch, a.rounds, seed, src.ctypes.data, dst.ctypes.data, BLOCK)
                elif lang == "py":
                    t = kv_loop_py(kc, layers, a.batch, a.rounds, seed)
                else:
                    t = _bench.store_load_loop(kc._c, ptrs, a.batch, a.batch, a.rounds, seed)
                if t <= 0:
                    raise kvtier.InternalError(f"the {lang} {path} loop failed")
                results[path][lang].append(blocks / t)

            for rep in range(a.repeats):
                order = ("py", "cpp") if rep % 2 == 0 else ("cpp", "py")  # ABBA: drift hits both alike
                for path in ("page", "kv"):
                    for lang in order:
                        run(path, lang, 1000 + 10 * rep + (lang == "cpp"))
    finally:
        if daemon:
            daemon.close()
    out = {"block_bytes": BLOCK, "batch": a.batch, "rounds": a.rounds, "repeats": a.repeats}
    for path in ("page", "kv"):
        py_, cpp = statistics.median(results[path]["py"]), statistics.median(results[path]["cpp"])
        out[f"{path}_python_blocks_per_s"] = py_
        out[f"{path}_cpp_blocks_per_s"] = cpp
        out[f"{path}_python_gib_per_s"] = py_ * BLOCK / (1 << 30)
        out[f"{path}_ratio"] = py_ / cpp
    if a.json:
        print(json.dumps(out))
    else:
        for path in ("page", "kv"):
            print(f"{path:4} path: python {out[f'{path}_python_blocks_per_s']:8.0f} blocks/s "
                  f"({out[f'{path}_python_gib_per_s']:.2f} GiB/s), C++ {out[f'{path}_cpp_blocks_per_s']:8.0f} blocks/s: "
                  f"ratio {out[f'{path}_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
