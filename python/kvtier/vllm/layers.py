"""Layer-wise loads: the step's loads of a one-group attention model move layer by layer
while the model computes, and each attention layer waits only for its own layer (vLLM calls
``wait_for_layer_load`` as each attention layer starts).

``LayerLoads.start`` takes loads whose blocks kvtierd already holds for this worker
(``Client.start_load``: one round trip each) and moves layer 0 of every load, then layer 1,
...: on CUDA every layer is enqueued at once on a side stream that first waits for the
engine's stream (a freed block may still be read by earlier kernels), with an event after
each layer, and ``wait`` makes the engine's stream wait for the layer's event (the host
never blocks); on the CPU a thread moves the layers and ``wait`` blocks until the layer's
turn has come. ``finish`` (after the forward pass) waits for every layer and gives the
blocks back; it returns what failed: a layer that could not be moved, a layer the model
computed without waiting for it, or a session kvtierd ended before the layers were read (its
references dropped, the pages possibly rewritten). Either way every block of the step's layer-wise loads is a
failed load (the tokens computed over it are recomputed; the worker holds and drops their
stores as for any failed load).
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

log = logging.getLogger("kvtier.vllm")


class LayerLoads:
    def __init__(self, layer_of: dict, stream=None, wait_s: float = 30.0):
        self._layer_of = layer_of  # layer name -> index of its tensor in the group's view
        self._indices = frozenset(layer_of.values())
        self._layers = len(self._indices)
        self._stream = stream      # a torch.cuda.Stream on CUDA; None on the CPU
        self._wait_s = wait_s
        self._loads: list = []     # KvLoads of this step
        self._events: list = []    # CUDA: an event after each layer
        self._cv = threading.Condition()
        self._moved = 0            # CPU: layers moved so far
        self._error: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        self._waited: set = set()

    @property
    def active(self) -> bool:
        return bool(self._loads)

    def start(self, loads: list) -> None:
        """Moves the layers of `loads` (KvLoads with blocks to move) in layer order."""
        self._loads = loads
        if self._stream is not None:
            import torch

            self._stream.wait_stream(torch.cuda.current_stream())
            for layer in range(self._layers):
                try:
                    for load in loads:
                        load.scatter(layer, layer + 1, stream=self._stream.cuda_stream, wait=False)
                except Exception as e:  # noqa: BLE001 - any failure is the step's failed load
                    self._error = f"layer {layer}: {e}"
                    break
                event = torch.cuda.Event()
                event.record(self._stream)
                self._events.append(event)
            return
        self._thread = threading.Thread(target=self._move, name="kvtier-layer-loads", daemon=True)
        self._thread.start()

    def _move(self) -> None:
        for layer in range(self._layers):
            try:
                for load in self._loads:
                    load.scatter(layer, layer + 1)
            except Exception as e:  # noqa: BLE001 - any failure is the step's failed load
                with self._cv:
                    self._error = f"layer {layer}: {e}"
                    self._moved = self._layers
                    self._cv.notify_all()
                return
            with self._cv:
                self._moved = layer + 1
                self._cv.notify_all()

    def wait(self, layer_name: str) -> None:
        """Before the model computes `layer_name`: its layer has been moved (CPU) or the
        engine's stream waits for it (CUDA)."""
        layer = self._layer_of.get(layer_name)
        if layer is None or not self._loads:
            return
        self._waited.add(layer)
        if self._stream is not None:
            import torch

            if self._events:  # after a failure: the layers enqueued before it
                torch.cuda.current_stream().wait_event(self._events[min(layer, len(self._events) - 1)])
            return
        with self._cv:
            if not self._cv.wait_for(lambda: self._moved > layer, timeout=self._wait_s):
                self._error = self._error or f"layer {layer} not moved within {self._wait_s:.0f} s"

    def finish(self) -> Optional[str]:
        """After the forward pass: waits for every layer, gives the blocks back, and
        returns why the step's layer-wise loads failed (None: they landed)."""
        if not self._loads:
            return None
        if self._thread is not None:
            self._thread.join()
        else:  # every copy enqueued, those of a layer that failed midway too, before the blocks go back
            self._stream.synchronize()
        error = self._error
        if error is None and len(self._waited) < self._layers:
            missing = sorted(self._indices - self._waited)
            error = f"the model computed layers {missing[:4]} without waiting for their load"
        for load in self._loads:
            try:
                load.finish()
            except Exception as e:  # noqa: BLE001 - the session ended while the layers were read
                error = error or f"the session ended under the loads: {e}"
        self._loads, self._events, self._waited = [], [], set()
        self._thread, self._error, self._moved = None, None, 0
        return error
