"""kvtierd's KV events read by the installed vLLM's own event classes: the daemon holds
the blocks vLLM's scheduler stored through the kvtier connector, and a ZMQ subscriber
decodes every message with vLLM's msgspec decoder for KVEventBatch, as vLLM's consumers
(and the routers that follow its wire form) do."""

import contextlib
import http.client
import json
import random
import subprocess
import sys
import time

from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from vllm.lora.request import LoRARequest

from kvtier_testing.daemon import Daemon
from kvtier_testing.ports import PortLease
from kvtier_testing.vllm_engine import BLOCK, Engine, vllm_config
from kvtier_testing.vllm_events import Subscriber, u64


def test_vllms_own_event_classes_decode_every_message_of_kvtierd_under_load(model_dir, tmp_path):
    endpoint = f"ipc://{tmp_path}/events.sock"
    # 96 pages of one block each: the prompts below need more, so blocks are evicted too.
    with Daemon(page_bytes=64 << 10, pages=96,
                extra_yaml=f"events: {{publish: '{endpoint}', flush_interval: 5ms, token_ids: true}}\n") as d:
        sub = Subscriber(endpoint)
        time.sleep(0.5)  # the subscription lands before the first namespace attaches
        engine = Engine(vllm_config(model_dir, d.socket, extra={"routable_id": "10.1.2.3:8000"}), 256)
        try:
            chains, tokens_of = [], {}
            for i in range(8):
                p = [(7 * i + j) % 500 + 3 for j in range(20 * BLOCK + 5)]
                req = engine.add(f"r{i}", p, 1)
                chains.append([u64(h) for h in req.block_hashes])
                tokens_of.update({h: p[k * BLOCK:(k + 1) * BLOCK] for k, h in enumerate(chains[-1])})
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
    # None missed, in order: consecutive from this run's first (its start time in µs).
    seqs = [s for s, _ in sub.messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert seqs[0] > 1_600_000_000 * 10**6
    # llm-d's topic, kv@<pod>@<model>: the identity the server declared and the served model.
    assert sub.topics == {f"kv@10.1.2.3:8000@{model_dir}"}
    events = [e for _, batch in sub.messages for e in batch.events]
    assert not any(isinstance(e, AllBlocksCleared) for e in events)
    stored = [e for e in events if isinstance(e, BlockStored)]
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert {e.block_size for e in stored} == {BLOCK} and {e.medium for e in stored} == {"CPU_TIER1"}
    # Every block vLLM hashed is announced, chained to its parent as vLLM chains them.
    parent_of = {c[i]: (c[i - 1] if i else None) for c in chains for i in range(len(c))}
    announced = [h for e in stored for h in e.block_hashes]
    assert sorted(announced) == sorted(parent_of)
    for e in stored:  # with each block's tokens, as vLLM's own events carry them
        assert e.token_ids == [t for h in e.block_hashes for t in tokens_of[h]]
        assert e.parent_block_hash == parent_of[e.block_hashes[0]]
        for prev, h in zip(e.block_hashes, e.block_hashes[1:]):
            assert parent_of[h] == prev
    assert removed and set(removed) <= set(parent_of)  # evictions, of blocks announced before


class _OwnEvents:
    """Stands in for the scheduler's event publisher: keeps the batches vLLM's own block
    pool makes (what a vLLM without kvtier would publish)."""

    def __init__(self):
        self.batches = []

    def publish(self, batch) -> None:
        self.batches.append(batch)

    def shutdown(self) -> None:
        pass


def _by_hash(events) -> dict:
    """Each announced block: hash -> (tokens, extra keys, LoRA name, LoRA id)."""
    out = {}
    for e in events:
        if not isinstance(e, BlockStored):
            continue
        extra = e.extra_keys or [None] * len(e.block_hashes)
        for i, h in enumerate(e.block_hashes):
            key = u64(h) if isinstance(h, bytes) else h
            out[key] = (list(e.token_ids[i * e.block_size:(i + 1) * e.block_size]),
                        None if extra[i] is None else tuple(extra[i]), e.lora_name, e.lora_id)
    return out


def test_a_blocks_extra_keys_and_lora_adapter_are_announced_as_vllms_own_block_pool_announces_them(
        model_dir, tmp_path):
    """Requests with a cache salt and with a LoRA adapter through vLLM's scheduler: every
    block kvtierd announces carries the tokens, extra keys, LoRA name and id that vLLM's own
    BlockStored for the same hash carries (vLLM's events captured from its scheduler)."""
    endpoint = f"ipc://{tmp_path}/events.sock"
    with Daemon(page_bytes=64 << 10, pages=256,
                extra_yaml=f"events: {{publish: '{endpoint}', flush_interval: 5ms, token_ids: true}}\n") as d:
        sub = Subscriber(endpoint)
        time.sleep(0.5)  # the subscription lands before the first namespace attaches
        config = vllm_config(model_dir, d.socket)
        config.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
        engine = Engine(config, 256)
        own = _OwnEvents()
        engine.scheduler.kv_event_publisher = own
        try:
            prompts = {r: [(11 * i + j) % 500 + 3 for j in range(6 * BLOCK + 5)] for i, r in enumerate("sla")}
            engine.add("s", prompts["s"], 1, cache_salt="tenant-salt")
            engine.add("l", prompts["l"], 1, lora_request=LoRARequest("adapter-a", 7, "/adapters/a"))
            engine.add("a", prompts["a"], 1)
            engine.run()
            assert engine.connector_stats["stored_blocks"] == 3 * 6
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(
                    _by_hash(e for _, b in sub.messages for e in b.events)) < 18:
                time.sleep(0.05)
        finally:
            engine.close()
            sub.close()
    assert sub.failures == []
    ours = _by_hash(e for _, b in sub.messages for e in b.events)
    theirs = _by_hash(e for b in own.batches for e in b.events)
    assert len(ours) == 18 and set(ours) <= set(theirs)
    assert {h: theirs[h] for h in ours} == ours
    # What they carry: the salt on a salted prompt's first block only, the adapter's name
    # on each of its blocks, nothing on a plain prompt's.
    extra = sorted((v[1], v[2], v[3]) for v in ours.values() if v[1] or v[2])
    assert extra == sorted([(("tenant-salt",), None, None)] + [(("adapter-a",), "adapter-a", 7)] * 6)


def _http(port: int, method: str, path: str, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        c.request(method, path, body=None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def test_dynamos_indexer_finds_the_prefix_an_engine_stored_through_kvtier(model_dir, tmp_path):
    """Dynamo's standalone KV indexer (the installed ai-dynamo's `python -m dynamo.indexer`)
    subscribes to kvtierd as worker 1 and answers /query for a prompt's tokens with the
    number of its blocks kvtier holds."""
    endpoint = f"ipc://{tmp_path}/events.sock"
    lease = PortLease(random.Random())
    log = open(tmp_path / "indexer.log", "w")
    with Daemon(page_bytes=64 << 10, pages=256,
                extra_yaml=f"events: {{publish: '{endpoint}', flush_interval: 5ms, token_ids: true}}\n") as d:
        indexer = subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port", str(lease.port), "--threads", "1",
                                    "--block-size", str(BLOCK), "--workers", f"1={endpoint}"],
                                   stdout=log, stderr=subprocess.STDOUT)
        engine = None
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and indexer.poll() is None:
                with contextlib.suppress(OSError):
                    if _http(lease.port, "GET", "/workers")[0] == 200:
                        break
                time.sleep(0.2)
            assert indexer.poll() is None, (tmp_path / "indexer.log").read_text()[-2000:]
            time.sleep(1.0)  # its SUB socket's subscription lands before the first event
            p = [(5 * j) % 500 + 3 for j in range(12 * BLOCK + 7)]
            engine = Engine(vllm_config(model_dir, d.socket), 64)
            engine.add("r", p, 1)
            engine.run()
            assert engine.connector_stats["stored_blocks"] == 12
            def matched(tokens):
                """Dynamo's answer for worker 1: tokens matched, and on its host tier (it
                reads kvtier's CPU_TIER1 as host-pinned; its `scores` count the GPU tier)."""
                status, text = _http(lease.port, "POST", "/query", {"token_ids": tokens, "model_name": "default"})
                assert status == 200, text
                got = json.loads(text).get("instances", {}).get("1", {})
                return got.get("longest_matched", 0), got.get("cpu", 0)

            deadline = time.monotonic() + 10
            while matched(p) != (12 * BLOCK, 12 * BLOCK) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert matched(p) == (12 * BLOCK, 12 * BLOCK), (tmp_path / "indexer.log").read_text()[-2000:]
            # A prompt that shares its first 5 blocks, then differs; and one that shares none.
            assert matched(p[:5 * BLOCK] + [7] * (4 * BLOCK)) == (5 * BLOCK, 5 * BLOCK)
            assert matched([9] * (4 * BLOCK)) == (0, 0)
        finally:
            if engine is not None:
                engine.close()
            indexer.kill()
            indexer.wait()
            log.close()
            lease.close()
