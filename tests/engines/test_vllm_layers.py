"""kvtier.vllm.layers on CUDA, with torch's stream and event calls recorded (this machine
has no GPU: the order of the calls is what is checked; tests/gpu/run.sh has the device)."""

import pytest
import torch

import kvtier
from kvtier.vllm.layers import LayerLoads


class _Calls:
    def __init__(self):
        self.log = []


class _Stream:
    cuda_stream = 7

    def __init__(self, calls, name):
        self._calls, self._name = calls, name

    def wait_stream(self, other):
        self._calls.log.append(f"{self._name} waits {other._name}")

    def wait_event(self, event):
        self._calls.log.append(f"{self._name} waits event {event.index}")

    def synchronize(self):
        self._calls.log.append(f"sync {self._name}")


class _Load:
    """A KvLoad whose scatter of `fail_at` raises (the device refused the copy), and whose
    finish raises when `expired` (kvtierd ended the session while the layers were read)."""

    def __init__(self, calls, name, fail_at=None, expired=False):
        self._calls, self._name, self._fail_at, self._expired = calls, name, fail_at, expired
        self.loaded = 4

    def scatter(self, first, last, stream=0, wait=True):
        assert not wait and stream == _Stream.cuda_stream
        if first == self._fail_at:
            raise kvtier.InternalError(f"injected: layer {first}")
        self._calls.log.append(f"scatter {self._name} {first}")

    def finish(self):
        self._calls.log.append(f"finish {self._name}")
        if self._expired:
            raise kvtier.AbortedError("injected: the session ended while a load read its blocks")


@pytest.fixture
def calls(monkeypatch):
    c = _Calls()
    engine = _Stream(c, "engine")

    class Event:
        def __init__(self):
            self.index = None

        def record(self, stream):
            self.index = sum(1 for l in c.log if l.startswith("event"))
            c.log.append(f"event {self.index}")

    monkeypatch.setattr(torch.cuda, "current_stream", lambda: engine)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    return c


LAYERS = {"model.layers.0.attn": 0, "model.layers.1.attn": 1, "model.layers.2.attn": 2}


def test_each_layer_waits_for_its_own_event_after_the_side_stream_waited_for_the_engine(calls):
    side = _Stream(calls, "side")
    ll = LayerLoads(LAYERS, side)
    ll.start([_Load(calls, "a"), _Load(calls, "b")])
    for name in LAYERS:
        ll.wait(name)
    assert ll.finish() is None
    log = calls.log
    assert log[0] == "side waits engine"  # a freed block may still be read by earlier kernels
    assert log[1:10] == ["scatter a 0", "scatter b 0", "event 0", "scatter a 1", "scatter b 1", "event 1",
                         "scatter a 2", "scatter b 2", "event 2"]
    assert log[10:13] == ["engine waits event 0", "engine waits event 1", "engine waits event 2"]
    assert log[13:] == ["sync side", "finish a", "finish b"]


def test_a_layer_that_fails_midway_fails_the_step_and_every_copy_enqueued_ends_before_the_blocks_go_back(calls):
    # b's layer 1 fails after a's layer 1 was enqueued, with no event recorded after it:
    # the blocks are given back only once the side stream has run everything enqueued.
    side = _Stream(calls, "side")
    ll = LayerLoads(LAYERS, side)
    ll.start([_Load(calls, "a"), _Load(calls, "b", fail_at=1)])
    for name in LAYERS:
        ll.wait(name)
    error = ll.finish()
    assert error is not None and "layer 1" in error
    log = calls.log
    assert "scatter a 1" in log and "event 1" not in log
    assert log.index("scatter a 1") < log.index("sync side") < log.index("finish a") < log.index("finish b")
    # Layers past the failure wait for the last event enqueued (their results are recomputed).
    assert log.count("engine waits event 0") == 3


def test_a_session_that_ended_while_the_layers_were_read_fails_the_step(calls):
    # Every layer moved and was waited for, but kvtierd expired the session meanwhile (the
    # engine was stopped past protocol.heartbeat_ttl): the bytes may be other blocks'.
    side = _Stream(calls, "side")
    ll = LayerLoads(LAYERS, side)
    ll.start([_Load(calls, "a"), _Load(calls, "b", expired=True)])
    for name in LAYERS:
        ll.wait(name)
    error = ll.finish()
    assert error is not None and "session ended" in error
    assert calls.log[-2:] == ["finish a", "finish b"]  # every load is given back all the same
