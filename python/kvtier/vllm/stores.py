"""The worker's store queue: the blocks a step made are copied out of the engine's KV
cache and committed on a thread of their own, so the step returns at once.

Contract with the rest of the worker:

- ``submit`` queues one chunk of a ``StoreSpec``; chunks are copied and committed in
  submission order (a block's parent is committed before it), each over the thread's own
  client of its group (a load on the forward path never waits for a store's lock).
- Nothing the step does after ``submit`` may write a block with a copy in flight. vLLM
  writes a block only after it hands it out again (a preempted or finished request's
  blocks, a window's freed blocks) or, for a Mamba state, in place: ``wait_blocks`` holds
  the step until no copy reads the blocks it is about to write, ``wait_states`` until no
  state copy is in flight.
- ``in_flight(req_id)`` says whether a request still has copies queued: vLLM keeps a
  finished request's blocks until the worker reports it (``get_finished``).
- On CUDA each chunk waits for an event recorded on the engine's stream when it was
  queued, and copies on a stream of its own.
- What the thread stored or was refused is counted in ``take_counts``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Optional

import kvtier
from kvtier.vllm.metadata import StoreSpec

log = logging.getLogger("kvtier.vllm")


@dataclasses.dataclass
class _Chunk:
    store: StoreSpec
    part: slice
    tokens: list      # the chunk's token ids (empty for runs of other geometry)
    state: bool       # a Mamba state group
    ready: object     # CUDA event the copy waits for, or None


def _msgpack(obj) -> bytes:
    import msgspec  # vLLM's own encoder; only needed where vLLM gave a request extra keys

    return msgspec.msgpack.encode(obj)


class StoreQueue:
    def __init__(self, clients: list, views: list, stream=None):
        self._clients = clients
        self._views = views
        self._stream = stream  # torch.cuda.Stream the copies run on (CUDA), else None
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._by_req: collections.Counter = collections.Counter()
        self._by_block: collections.Counter = collections.Counter()
        self._states = 0
        self._counts: collections.Counter = collections.Counter()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvtier-store", daemon=True)
        self._thread.start()

    # ---- the step's side ----
    def submit(self, store: StoreSpec, part: slice, tokens: list, state: bool) -> None:
        ready = None
        if self._stream is not None:
            import torch  # CUDA caches are torch tensors

            ready = torch.cuda.Event()
            ready.record()  # on the engine's current stream: the step's kernels that made the blocks
        chunk = _Chunk(store, part, tokens, state, ready)
        with self._cv:
            self._queue.append(chunk)
            self._by_req[store.req_id] += 1
            self._by_block.update(store.block_ids[part])
            self._states += state
            self._cv.notify_all()

    def wait_blocks(self, block_ids) -> bool:
        """Until no queued copy reads any of `block_ids`; whether it had to wait."""
        with self._cv:
            busy = lambda: any(self._by_block[b] for b in block_ids)  # noqa: E731
            if not self._by_block or not busy():
                return False
            self._cv.wait_for(lambda: not busy())
            return True

    def wait_states(self) -> bool:
        with self._cv:
            if not self._states:
                return False
            self._cv.wait_for(lambda: not self._states)
            return True

    def drain(self) -> None:
        with self._cv:
            self._cv.wait_for(lambda: not self._queue)

    def in_flight(self, req_id: str) -> bool:
        with self._cv:
            return self._by_req[req_id] > 0

    def take_counts(self) -> collections.Counter:
        with self._cv:
            counts, self._counts = self._counts, collections.Counter()
            return counts

    def close(self) -> None:
        """Lets the queued copies finish (each is bounded by the client's timeout), then
        stops the thread and closes its clients."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()
        for c in self._clients:
            c.close()

    # ---- the thread ----
    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                chunk = self._queue[0]  # stays counted until it is done
            counts = self._copy(chunk)
            with self._cv:
                self._queue.popleft()
                store = chunk.store
                self._by_req[store.req_id] -= 1
                if not self._by_req[store.req_id]:
                    del self._by_req[store.req_id]
                for b in store.block_ids[chunk.part]:
                    self._by_block[b] -= 1
                    if not self._by_block[b]:
                        del self._by_block[b]
                self._states -= chunk.state
                self._counts.update(counts)
                self._cv.notify_all()

    def _copy(self, chunk: _Chunk) -> collections.Counter:
        store, part = chunk.store, chunk.part
        hashes = store.hashes[part]
        counts: collections.Counter = collections.Counter()
        view = self._views[store.group]
        try:
            if chunk.ready is not None:
                self._stream.wait_event(chunk.ready)
            extra = _msgpack(store.extra_keys[part]) if store.extra_keys else b""
            results = self._clients[store.group].call(
                lambda c: c.store_kv(view, store.block_ids[part], hashes, store.parents[part],
                                     token_ids=chunk.tokens, extra_keys=extra, lora_name=store.lora[0],
                                     lora_id=store.lora[1]))
        except kvtier.Error as e:
            counts["store_refused_blocks"] += len(hashes)
            log.warning("kvtierd refused a store of %d blocks of group %d for %s: %s", len(hashes), store.group,
                        store.req_id, e)
            return counts
        except Exception:  # noqa: BLE001 - a store must never take the thread (and every later store) down
            counts["store_refused_blocks"] += len(hashes)
            log.exception("a store of %d blocks of group %d for %s failed", len(hashes), store.group, store.req_id)
            return counts
        ok = sum(1 for r in results if r.ok)
        counts["stored_blocks"] += ok
        if chunk.state:
            counts["states_stored"] += ok
        if ok < len(results):
            counts["store_refused_blocks"] += len(results) - ok
            log.warning("kvtierd stored %d of %d blocks of group %d for %s (%s)", ok, len(results), store.group,
                        store.req_id, next(r.status for r in results if not r.ok))
        return counts


def side_stream(view) -> Optional[object]:
    """A CUDA stream of its own for the store thread's copies (None on the CPU)."""
    if not view.stream:
        return None
    import torch

    return torch.cuda.Stream()
