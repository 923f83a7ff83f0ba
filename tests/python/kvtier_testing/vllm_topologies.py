"""vLLM deployments of more than one engine around one kvtierd, served for real by `vllm
serve` processes of the installed vLLM (kvtier_testing.vllm_e2e's Server) over the tiny
dense model:

| mode | servers | what it shows |
|---|---|---|
| `--dp N` | one server with `--data-parallel-size N` (N engine cores) with kvtier; C, vLLM alone | prompts sent to DP rank 0 (vLLM's `X-data-parallel-rank` header) store their prefixes; the same prefixes sent to rank 1 are hits from kvtier (rank 1's own prefix cache never saw them); kvtierd's KV events name the rank that stored each block; rank 1's TTFT on its first use of a prefix against C's |
| `--pd` | a prefill and a decode server, each with vLLM's `MultiConnector` of `NixlConnector` (`kv_buffer_device: cpu`, UCX over TCP on loopback) and kvtier; C | the proxy protocol of vLLM's toy P/D proxy: prefill with `max_tokens: 1` and `do_remote_decode`, then decode with the `kv_transfer_params` the prefill answered; the prefill side stores into kvtier; after the prefill server is killed and started again (and one probe request of a prompt of its own), its prompts' prefixes are hits from kvtier (probe requests go first until one passes: a proxy's readiness check) |

Outputs (greedy, `ignore_eos`) are compared token for token with C's. Both print the keys
`outputs_equal`, `prefix_tokens_hit`, `errors` (and `--pd`:
`prefix_tokens_hit_after_prefill_restart`).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time

from kvtier_testing import tiny_model
from kvtier_testing.daemon import Daemon
from kvtier_testing.ports import PortLease
from kvtier_testing.vllm_e2e import Result, Server, settled_counter, start_all, vllm_version

HITS = "vllm:external_prefix_cache_hits_total"


def _env() -> dict:
    return dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                VLLM_CPU_OMP_THREADS_BIND="nobind", TOKENIZERS_PARALLELISM="false", OMP_WAIT_POLICY="PASSIVE",
                VLLM_LOG_STATS_INTERVAL="1")


def _common(a, max_len: int) -> list:
    return ["--max-model-len", str(max_len), "--block-size", str(a.block_size), "--dtype", "float32",
            "--enforce-eager", "--max-num-seqs", "4", "--max-num-batched-tokens", str(max(max_len, 2048)),
            "--seed", "0", "--disable-uvicorn-access-log"]


def _kvtier(daemon: Daemon, **extra) -> dict:
    return {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"socket": daemon.socket, **extra}}


def _prompts(a, rng: random.Random, vocab: int) -> list:
    """(prefix + suffix a, prefix + suffix b) per request: distinct shared prefixes."""
    out = []
    for _ in range(a.requests):
        prefix = [rng.randrange(3, vocab) for _ in range(a.shared_prefix_tokens)]
        tail = a.prompt_tokens - a.shared_prefix_tokens
        out.append((prefix + [rng.randrange(3, vocab) for _ in range(tail)],
                    prefix + [rng.randrange(3, vocab) for _ in range(tail)]))
    return out


class _Checks:
    """Outputs compared with the reference's, and every error, as vllm_e2e counts them."""

    def __init__(self):
        self.errors, self.detail = [], []
        self.compared = self.mismatched = 0

    def check(self, res: Result, want: Result, what: str) -> None:
        for r in (res, want):
            if r.error:
                self.errors.append(f"{what}: {r.error}")
        if res.error or want.error:
            return
        self.compared += 1
        if res.tokens != want.tokens:
            self.mismatched += 1
            self.detail.append(f"{what}: {res.tokens} != {want.tokens}")

    def fields(self) -> dict:
        return {"outputs_equal": self.compared > 0 and self.mismatched == 0, "outputs_compared": self.compared,
                "outputs_mismatched": self.mismatched, "errors": len(self.errors),
                "error_messages": (self.errors + self.detail)[:10]}


VOCAB = 512


def _model_and_daemon(a, work: str, **daemon_args) -> tuple:
    """(model dir, kvtierd) of a run: the tiny dense model of the geometry flags, and a
    kvtierd with a page per block and room for every block of the run."""
    model_dir = tiny_model.make(os.path.join(work, "model"), layers=a.layers, hidden=a.hidden, heads=a.heads,
                                kv_heads=a.kv_heads, vocab_size=VOCAB, seed=a.seed)
    block_bytes = 2 * a.layers * a.kv_heads * (a.hidden // a.heads) * 4 * a.block_size
    daemon = Daemon(page_bytes=1 << (block_bytes - 1).bit_length(),
                    pages=max(256, 4 * a.requests * (a.prompt_tokens // a.block_size + 2)), **daemon_args)
    return model_dir, daemon


def run_dp(a, work: str) -> dict:
    from kvtier_testing.vllm_events import Subscriber

    rng = random.Random(a.seed)
    endpoint = f"ipc://{work}/events.sock"
    model_dir, daemon = _model_and_daemon(a, work, extra_yaml=f"events: {{publish: '{endpoint}', flush_interval: 5ms}}\n")
    sub = Subscriber(endpoint)
    servers: list = []
    try:
        max_len = -(-(a.prompt_tokens + a.max_tokens) // a.block_size) * a.block_size
        common = _common(a, max_len)
        dp = Server("DP", model_dir, common + ["--data-parallel-size", str(a.dp), "--kv-transfer-config",
                                               json.dumps(_kvtier(daemon))], _env(), work, rng)
        ref = Server("C", model_dir, list(common), _env(), work, rng)
        servers = [dp, ref]
        t0 = time.monotonic()
        start_all(servers, a.start_timeout)
        start_s = time.monotonic() - t0
        checks = _Checks()
        prompts = _prompts(a, rng, VOCAB)
        rank = lambda r: {"X-data-parallel-rank": str(r)}  # noqa: E731 - vLLM's dispatch header
        # Rank 0 computes and stores each prefix; the last rank then serves the same
        # prefixes with other suffixes, C alternating with it (one server at a time).
        first = [dp.complete(pa, a.max_tokens, a.request_timeout, headers=rank(0)) for pa, _ in prompts]
        time.sleep(1.0)  # the stores of the last request are copied after its response
        hits0 = settled_counter(dp, HITS)
        ttft_dp, ttft_ref = [], []
        for i, (_, pb) in enumerate(prompts):
            order = ("DP", "C") if i % 2 else ("C", "DP")
            got = {}
            for name in order:
                got[name] = (dp.complete(pb, a.max_tokens, a.request_timeout, headers=rank(a.dp - 1))
                             if name == "DP" else ref.complete(pb, a.max_tokens, a.request_timeout))
            checks.check(got["DP"], got["C"], f"rank {a.dp - 1} vs C, prompt {i}")
            if not got["DP"].error and not got["C"].error:
                ttft_dp.append(got["DP"].ttft_s)
                ttft_ref.append(got["C"].ttft_s)
        hits = settled_counter(dp, HITS) - hits0
        for i, (pa, _) in enumerate(prompts):
            checks.check(first[i], ref.complete(pa, a.max_tokens, a.request_timeout), f"rank 0 vs C, prompt {i}")
        hits_by_engine = {}
        _, text = dp.get("/metrics")
        for line in text.splitlines():
            if line.startswith(HITS + "{") and 'engine="' in line:
                engine = line.split('engine="', 1)[1].split('"', 1)[0]
                hits_by_engine[engine] = float(line.rsplit(" ", 1)[1])
        for s in servers:
            if s.proc.poll() is not None:
                checks.errors.append(f"vLLM {s.name} exited with {s.proc.returncode}: {s.log_tail(500)}")
        time.sleep(0.5)
        from vllm.distributed.kv_events import BlockStored

        stored_by_rank: dict = {}
        for _, batch in list(sub.messages):
            n = sum(len(e.block_hashes) for e in batch.events if isinstance(e, BlockStored))
            if n:
                key = str(batch.data_parallel_rank)
                stored_by_rank[key] = stored_by_rank.get(key, 0) + n
        med_dp = statistics.median(ttft_dp) if ttft_dp else float("nan")
        med_ref = statistics.median(ttft_ref) if ttft_ref else float("nan")
        return {"vllm_version": vllm_version(), "mode": "dp", "data_parallel_size": a.dp,
                "servers_start_s": round(start_s, 1), "prompt_tokens": a.prompt_tokens,
                "shared_prefix_tokens": a.shared_prefix_tokens, "requests": a.requests,
                "prefix_tokens_hit": int(hits), "prefix_tokens_hit_by_engine": hits_by_engine,
                "blocks_stored_by_rank": stored_by_rank, "event_batches": len(sub.messages),
                "ttft_ms_second_rank_first_use": round(med_dp * 1e3, 1), "ttft_ms_alone": round(med_ref * 1e3, 1),
                "ttft_ratio_second_rank_first_use_vs_alone": round(med_dp / med_ref, 3) if ttft_ref else None,
                **checks.fields(), "command_dp": " ".join(dp.command)}
    finally:
        for s in servers:
            s.stop()
        sub.close()
        daemon.stop()
        daemon.close()


# vLLM's toy P/D proxy asks the prefill server for one token with these, then sends the
# request to the decode server with the kv_transfer_params the prefill answered.
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


def pd_complete(prefill: Server, decode: Server, prompt: list, max_tokens: int, timeout: float) -> Result:
    """One request through the P/D proxy protocol: the prefill server computes the prompt
    (one token, do_remote_decode), the decode server takes its KV over NIXL and generates."""
    status, body = prefill.post_json("/v1/completions", {
        "model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "ignore_eos": True,
        "stream": False, "kv_transfer_params": PREFILL_PARAMS}, timeout)
    if status != 200 or not isinstance(body, dict):
        return Result(error=f"{prefill.name}: HTTP {status}: {str(body)[:300]}")
    params = body.get("kv_transfer_params")
    if not params:
        return Result(error=f"{prefill.name}: no kv_transfer_params in its answer")
    return decode.complete(prompt, max_tokens, timeout, extra={"kv_transfer_params": params})


def _multi_connector(daemon: Daemon) -> dict:
    """vLLM's MultiConnector: NIXL (KV of DRAM over UCX) first, kvtier second."""
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": [nixl, _kvtier(daemon)]}}


def run_pd(a, work: str) -> dict:
    import kvtier

    rng = random.Random(a.seed)
    model_dir, daemon = _model_and_daemon(a, work)
    servers: list = []
    leases: list = []
    try:
        max_len = -(-(a.prompt_tokens + a.max_tokens) // a.block_size) * a.block_size
        common = _common(a, max_len)
        connector = ["--kv-transfer-config", json.dumps(_multi_connector(daemon))]

        def nixl_env() -> dict:
            lease = PortLease(rng)  # NIXL's side channel (its handshake) on loopback
            leases.append(lease)
            # UCX over TCP on the loopback device only
            return dict(_env(), VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT=str(lease.port),
                        UCX_TLS="tcp,self,sm", UCX_NET_DEVICES="lo")

        prefill = Server("P", model_dir, common + connector, nixl_env(), work, rng)
        decode = Server("D", model_dir, common + connector, nixl_env(), work, rng)
        ref = Server("C", model_dir, list(common), _env(), work, rng)
        servers = [prefill, decode, ref]
        t0 = time.monotonic()
        start_all(servers, a.start_timeout)
        start_s = time.monotonic() - t0
        checks = _Checks()
        prompts = _prompts(a, rng, VOCAB)
        for i, (pa, _) in enumerate(prompts):
            checks.check(pd_complete(prefill, decode, pa, a.max_tokens, a.request_timeout),
                         ref.complete(pa, a.max_tokens, a.request_timeout), f"P/D vs C, prompt {i}")
        time.sleep(1.0)  # the prefill's stores are copied after its answer
        stats = kvtier.ControlClient(daemon.socket).stats()
        held = sum(t["cached_pages"] + t["referenced_pages"] for t in stats["tiers"].values())
        prefill_local = settled_counter(prefill, "vllm:prefix_cache_hits_total")
        # The prefill server dies and comes back, as a new pod would (another NIXL side
        # channel): its own prefix cache is gone, kvtier's is not. Requests of a prompt of
        # their own go first, as a proxy's readiness probe, until one passes (at most 6):
        # the decode server's NIXL handshake with a restarted prefill server timed out (5 s)
        # once or twice in a row here on a loaded machine, and kvtier's scheduler inside a
        # MultiConnector learns the layouts from the first step.
        prefill.stop()
        prefill.env = nixl_env()
        start_all([prefill], a.start_timeout)
        probes_failed = 0
        for _ in range(6):
            warmup = pd_complete(prefill, decode, [rng.randrange(3, VOCAB) for _ in range(2 * a.block_size)], 2,
                                 a.request_timeout)
            if not warmup.error:
                break
            probes_failed += 1
        hits0 = settled_counter(prefill, HITS)
        for i, (_, pb) in enumerate(prompts):
            checks.check(pd_complete(prefill, decode, pb, a.max_tokens, a.request_timeout),
                         ref.complete(pb, a.max_tokens, a.request_timeout), f"after restart: P/D vs C, prompt {i}")
        hits_after = settled_counter(prefill, HITS) - hits0
        for s in servers:
            if s.proc.poll() is not None:
                checks.errors.append(f"vLLM {s.name} exited with {s.proc.returncode}: {s.log_tail(500)}")
        return {"vllm_version": vllm_version(), "mode": "pd", "servers_start_s": round(start_s, 1),
                "prompt_tokens": a.prompt_tokens, "shared_prefix_tokens": a.shared_prefix_tokens,
                "requests": a.requests,
                # kvtier's hits on the prefill server: after its restart (before it, its own
                # prefix cache holds what it computed)
                "prefix_tokens_hit": int(hits_after), "prefix_tokens_hit_after_prefill_restart": int(hits_after),
                "kvtier_blocks_after_prefills": int(held), "prefill_own_prefix_cache_hits": int(prefill_local),
                "probes_failed_after_prefill_restart": probes_failed,
                "probe_after_prefill_restart_error": warmup.error,
                **checks.fields(), "command_prefill": " ".join(prefill.command)}
    finally:
        for s in servers:
            s.stop()
        for lease in leases:
            lease.close()
        daemon.stop()
        daemon.close()
