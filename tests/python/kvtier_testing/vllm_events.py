"""A subscriber to kvtierd's KV events that decodes every message with the installed
vLLM's own msgspec decoder for KVEventBatch, as vLLM's consumers (and the routers that
follow its wire form) do."""

from __future__ import annotations

import threading

import msgspec
import zmq
from vllm.distributed.kv_events import KVEventBatch


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
