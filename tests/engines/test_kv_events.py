"""kvtierd's KV events read by the installed vLLM's own event classes: the daemon holds
the blocks vLLM's scheduler stored through the kvtier connector, and a ZMQ subscriber
decodes every message with vLLM's msgspec decoder for KVEventBatch, as vLLM's consumers
(and the routers that follow its wire form) do."""

import threading
import time

import msgspec
import zmq
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from kvtier_testing.daemon import Daemon
from kvtier_testing.vllm_engine import BLOCK, Engine, vllm_config


def u64(block_hash) -> int:
    """vLLM's and kvtierd's announced form of a bytes hash: its last 8 bytes, big-endian."""
    return int.from_bytes(bytes(block_hash)[-8:], "big")


class Subscriber:
    """Every message on `endpoint`, decoded by vLLM's KVEventBatch decoder, on a thread."""

    def __init__(self, endpoint: str):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.messages, self.failures, self.topics = [], [], set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.sub.poll(50):
                continue
            topic, seq, payload = self.sub.recv_multipart()
            self.topics.add(topic.decode())
            try:
                self.messages.append((int.from_bytes(seq, "big"), self.decoder.decode(payload)))
            except msgspec.DecodeError as e:
                self.failures.append(str(e))

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sub.close(linger=0)
        self.ctx.term()


def test_vllms_own_event_classes_decode_every_message_of_kvtierd_under_load(model_dir, tmp_path):
    endpoint = f"ipc://{tmp_path}/events.sock"
    # 96 pages of one block each: the prompts below need more, so blocks are evicted too.
    with Daemon(page_bytes=64 << 10, pages=96,
                extra_yaml=f"events: {{publish: '{endpoint}', flush_interval: 5ms}}\n") as d:
        sub = Subscriber(endpoint)
        time.sleep(0.5)  # the subscription lands before the first namespace attaches
        engine = Engine(vllm_config(model_dir, d.socket), 256)
        try:
            chains = []
            for i in range(8):
                req = engine.add(f"r{i}", [(7 * i + j) % 500 + 3 for j in range(20 * BLOCK + 5)], 1)
                chains.append([u64(h) for h in req.block_hashes])
            engine.run()
            assert engine.connector_stats["stored_blocks"] == 8 * 20
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and sum(
                    len(e.block_hashes) for _, b in sub.messages for e in b.events if isinstance(e, BlockStored)) < 160:
                time.sleep(0.05)
        finally:
            engine.close()
            sub.close()
    assert sub.failures == []
    assert [s for s, _ in sub.messages] == list(range(len(sub.messages)))  # none missed, in order
    assert len(sub.topics) == 1 and next(iter(sub.topics)).startswith("kv@")
    events = [e for _, batch in sub.messages for e in batch.events]
    assert not any(isinstance(e, AllBlocksCleared) for e in events)
    stored = [e for e in events if isinstance(e, BlockStored)]
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert {e.block_size for e in stored} == {BLOCK} and {e.medium for e in stored} == {"CPU_TIER1"}
    # Every block vLLM hashed is announced, chained to its parent as vLLM chains them.
    parent_of = {c[i]: (c[i - 1] if i else None) for c in chains for i in range(len(c))}
    announced = [h for e in stored for h in e.block_hashes]
    assert sorted(announced) == sorted(parent_of)
    for e in stored:
        assert e.parent_block_hash == parent_of[e.block_hashes[0]]
        for prev, h in zip(e.block_hashes, e.block_hashes[1:]):
            assert parent_of[h] == prev
    assert removed and set(removed) <= set(parent_of)  # evictions, of blocks announced before
