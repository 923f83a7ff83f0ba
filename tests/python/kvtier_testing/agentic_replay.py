"""serve_bench's agentic replay: a Mooncake-format trace with session fields (``session_id``,
``cache_ttl_s``, ``session_end``; ``kvtier-sim --synthetic agentic --write-trace F`` writes
one) replayed against one real ``vllm serve`` at a time by vLLM's own benchmark client
(``vllm.benchmarks.serve`` with its ``timed_trace`` dataset: each request sent at its
trace time, its prompt made from its ``hash_ids``).

    build-engines/venv/bin/python -m kvtier_testing.serve_bench --agentic-trace FILE --json

| config         | the server                                                              |
|----------------|-------------------------------------------------------------------------|
| vllm           | vLLM alone                                                              |
| kvtier-nohints | vLLM with kvtier.vllm over a kvtierd whose host tier is the only tier   |
| kvtier         | the same, and each request carries its session's hints in               |
|                | ``kv_transfer_params`` ({"kvtier": {session, ttl_s, end}})               |
| lmcache        | vLLM with LMCache's MP server, its L1 as large as kvtier's host tier    |

What scales the trace to the machine (all knobs of serve_bench):

| knob              | meaning                                                               |
|-------------------|-----------------------------------------------------------------------|
| --sessions N      | the first N sessions of the trace (with their subagents)              |
| --turns N         | at most N turns of each (a cut session that ended ends at its last kept turn) |
| --time-scale F    | trace seconds x F (pauses and TTL hints alike)                        |
| --hash-tokens N   | tokens per trace hash id (the trace's 512 made smaller)               |
| --host-fraction F | kvtier's host tier (and LMCache's L1) as a share of the replay's unique blocks |
| --engine-blocks N | vLLM's own KV cache (default: the longest request and 16 blocks more) |

The client is vLLM's, run with two additions made from outside: each request's
``request_overrides`` carry its hints (vLLM merges them into the request body), and the
``prompt_tokens_details.cached_tokens`` of each response (the server runs with
``--enable-prompt-tokens-details``: vLLM's own and the connector's hits) is recorded per
request. A turn after a session's first is a resumed turn (it follows a tool pause).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

from kvtier_testing.vllm_e2e import (KvtierService, LMCacheService, Server, _tail, settled_counter, start_all,
                                     transfer_metrics)

CONFIGS = ("vllm", "kvtier-nohints", "kvtier", "lmcache")

# vllm.benchmarks.serve's main, with the hints put into each sample's request_overrides and
# each response's cached tokens recorded by request id. argv: HINTS CACHED_OUT CLIENT_ARGS...
_CLIENT = r"""
import contextvars, json, sys
from vllm.benchmarks import serve
from vllm.benchmarks.lib import endpoint_request_func as erf
from vllm.utils.argparse_utils import FlexibleArgumentParser

hints_path, cached_path = sys.argv[1], sys.argv[2]
with open(hints_path) as f:
    hints = json.load(f)
get_samples = serve.get_samples

index = {}  # request id -> the request's line in the trace

def samples_with_hints(args, tokenizer):
    samples = get_samples(args, tokenizer)
    for i, s in enumerate(samples):
        index[s.request_id] = i
        if hints[i] is not None:
            s.request_overrides = dict(s.request_overrides or {}, kv_transfer_params=hints[i])
    return samples

serve.get_samples = samples_with_hints
current = contextvars.ContextVar("request_id", default=None)
cached = {}

class Json:
    def __getattr__(self, name):
        return getattr(json, name)

    @staticmethod
    def loads(s, *a, **k):
        d = json.loads(s, *a, **k)
        if isinstance(d, dict) and current.get() is not None:
            details = (d.get("usage") or {}).get("prompt_tokens_details") or {}
            if "cached_tokens" in details:
                cached[current.get()] = details["cached_tokens"]
        return d

erf.json = Json()
completions = erf.ASYNC_REQUEST_FUNCS["vllm"]

async def completions_recorded(request_func_input, session, pbar=None):
    token = current.set(request_func_input.request_id)
    try:
        return await completions(request_func_input, session, pbar)
    finally:
        current.reset(token)

erf.ASYNC_REQUEST_FUNCS["vllm"] = completions_recorded
p = FlexibleArgumentParser()
serve.add_cli_args(p)
try:
    serve.main(p.parse_args(sys.argv[3:]))
finally:
    with open(cached_path, "w") as f:
        json.dump({index[k]: v for k, v in cached.items() if k in index}, f)
"""


@dataclass
class Turn:
    session: str
    turn: int  # 0: the session's first request
    hint: Optional[dict]  # the request's kv_transfer_params, for the hinted configuration


class ReplayKvtier(KvtierService):
    """kvtierd with its host tier only: what the replay compares is the host tier's
    retention at equal capacity."""

    nvme_factor = 0


class ReplayLMCache(LMCacheService):
    whole_gb = False


SERVICE = {"kvtier": ReplayKvtier, "kvtier-nohints": ReplayKvtier, "lmcache": ReplayLMCache}


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("agentic replay (--agentic-trace)")
    g.add_argument("--agentic-trace", default="", help="a Mooncake-format trace with session fields")
    g.add_argument("--sessions", type=int, default=10, help="the trace's first N sessions (and their subagents)")
    g.add_argument("--turns", type=int, default=10, help="at most N turns of each session")
    g.add_argument("--time-scale", type=float, default=0.25, help="trace seconds x this")
    g.add_argument("--hash-tokens", type=int, default=16, help="tokens per trace hash id")
    g.add_argument("--host-fraction", type=float, default=0.2,
                   help="kvtier's host tier and LMCache's L1 as a share of the replay's unique blocks")
    g.add_argument("--engine-blocks", type=int, default=0, help="vLLM's own KV cache in blocks (0: derived)")


def scale_trace(a: argparse.Namespace, dst: str) -> tuple:
    """Writes the replay's trace (vLLM's timed_trace reads it) and returns (turns, facts)."""
    with open(a.agentic_trace) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows.sort(key=lambda r: r["timestamp"])
    roots: list = []
    for r in rows:
        if "session_id" not in r:
            raise ValueError(f"{a.agentic_trace}: a request without session_id (the replay needs sessions)")
        root = str(r["session_id"]).split(".")[0]
        if root not in roots:
            roots.append(root)
    keep = set(roots[:a.sessions])
    by_session: dict = {}
    for r in rows:
        sid = str(r["session_id"])
        if sid.split(".")[0] in keep:
            by_session.setdefault(sid, []).append(r)
    picked = []
    for sid, reqs in by_session.items():
        kept = reqs[:a.turns]
        ended = bool(reqs[-1].get("session_end"))
        for i, r in enumerate(kept):
            picked.append((r, sid, i, ended and i == len(kept) - 1))
    picked.sort(key=lambda x: x[0]["timestamp"])
    t0 = picked[0][0]["timestamp"]
    turns, blocks, longest = [], set(), 0
    per_block = a.block_size // a.hash_tokens if a.block_size % a.hash_tokens == 0 else 0
    if not per_block:
        raise ValueError(f"--block-size {a.block_size} must be a multiple of --hash-tokens {a.hash_tokens}")
    with open(dst, "w") as f:
        for i, (r, sid, turn, end) in enumerate(picked):
            ids = r["hash_ids"]
            tokens = len(ids) * a.hash_tokens
            longest = max(longest, tokens)
            for b in range(len(ids) // per_block):  # vLLM's full blocks, each named by its whole prefix
                blocks.add(tuple(ids[:(b + 1) * per_block]))
            f.write(json.dumps({"timestamp": (r["timestamp"] - t0) * a.time_scale, "input_length": tokens,
                                "output_length": min(a.output_tokens, int(r.get("output_length", a.output_tokens))),
                                "hash_ids": ids}) + "\n")
            hint = {"session": sid, "ttl_s": max(0.1, round(float(r.get("cache_ttl_s", 0)) * a.time_scale, 2))}
            if end:
                hint["end"] = True
            turns.append(Turn(sid, turn, {"kvtier": hint}))
    facts = {"requests": len(turns), "sessions": len(by_session), "resumed_turns": sum(t.turn > 0 for t in turns),
             "unique_blocks": len(blocks), "longest_request_tokens": longest,
             "trace_seconds": (picked[-1][0]["timestamp"] - t0) / 1000.0 * a.time_scale}
    return turns, facts


def percentile(xs: list, q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def replay(a: argparse.Namespace, config: str, model_dir: str, work: str, rnd: int, rng: random.Random, trace: str,
           turns: list, facts: dict) -> dict:
    """One server of `config`, the whole trace through vLLM's client."""
    bs = a.block_size
    longest_blocks = -(-(facts["longest_request_tokens"] + a.output_tokens) // bs) + 1
    engine_blocks = a.engine_blocks or longest_blocks + 16
    host_blocks = max(16, round(a.host_fraction * facts["unique_blocks"]))
    page_bytes = 2 * 4 * 4 * 64 * 4 * bs  # serve_bench's model: 4 layers, 4 KV heads, head 64, fp32
    args = ["--max-model-len", str(longest_blocks * bs), "--block-size", str(bs), "--dtype", "float32",
            "--enforce-eager", "--max-num-seqs", "8", "--max-num-batched-tokens", "2048", "--seed", "0",
            "--num-gpu-blocks-override", str(engine_blocks), "--disable-uvicorn-access-log",
            "--enable-prompt-tokens-details"]
    env = dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND="nobind", TOKENIZERS_PARALLELISM="false")
    service = SERVICE[config](page_bytes, host_blocks, work, rng) if config != "vllm" else None
    tag = f"agentic-{config}-r{rnd}"
    hints_path, cached_path = os.path.join(work, f"{tag}.hints.json"), os.path.join(work, f"{tag}.cached.json")
    with open(hints_path, "w") as f:
        json.dump([t.hint if config == "kvtier" else None for t in turns], f)
    server = None
    try:
        server = Server(tag, model_dir, args + (service.connector_args() if service else []),
                        dict(env, **(service.env if service else {})), work, rng)
        start_all([server], a.start_timeout)
        load_before = os.getloadavg()[0]
        hits0 = settled_counter(server, "vllm:external_prefix_cache_hits_total")
        log0 = os.path.getsize(server.log_path)
        cmd = [sys.executable, "-c", _CLIENT, hints_path, cached_path, "--backend", "vllm", "--base-url",
               f"http://127.0.0.1:{server.port}", "--model", "tiny", "--tokenizer", model_dir, "--temperature", "0",
               "--dataset-name", "timed_trace", "--dataset-path", trace, "--num-prompts", str(len(turns)),
               "--timed-trace-chunk-hash-size", str(a.hash_tokens), "--timed-trace-sec-multiplier", "0.001",
               "--ready-check-timeout-sec", "0", "--percentile-metrics", "ttft,e2el", "--metric-percentiles",
               "50,90", "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", work,
               "--result-filename", f"{tag}.json"]
        t0 = time.monotonic()
        with open(os.path.join(work, f"{tag}.client.log"), "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=3600).returncode
        seconds = time.monotonic() - t0
        if rc != 0 or not os.path.exists(os.path.join(work, f"{tag}.json")):
            raise RuntimeError(f"vllm.benchmarks.serve failed ({rc}): {_tail(os.path.join(work, f'{tag}.client.log'))}")
        with open(os.path.join(work, f"{tag}.json")) as f:
            r = json.load(f)
        with open(cached_path) as f:
            cached = {int(k): v for k, v in json.load(f).items()}
        time.sleep(11)  # vLLM logs connector stats every 10 s
        with open(server.log_path, "rb") as f:
            f.seek(log0)
            xfer = transfer_metrics(f.read().decode(errors="replace"))
        out = {"load_avg_before": load_before, "load_avg_after": os.getloadavg()[0], "seconds": seconds,
               "completed": r["completed"], "failed": r["failed"], "engine_blocks": engine_blocks,
               "host_blocks": host_blocks if service else 0,
               "external_hit_tokens": settled_counter(server, "vllm:external_prefix_cache_hits_total") - hits0}
        ok = [not e for e in r["errors"]]
        for name, want in (("first", False), ("resumed", True)):
            idx = [i for i, t in enumerate(turns) if (t.turn > 0) == want and ok[i]]
            ttfts = [r["ttfts"][i] * 1000 for i in idx]
            out[f"{name}_ttft_p50_ms"] = percentile(ttfts, 0.5)
            out[f"{name}_ttft_p90_ms"] = percentile(ttfts, 0.9)
            out[f"{name}_hit_tokens"] = sum(cached.get(i, 0) for i in idx)
            out[f"{name}_prompt_tokens"] = sum(r["input_lens"][i] for i in idx)
        for k in ("session_hints", "session_hints_dropped", "loaded_blocks", "load_failed_blocks", "stored_blocks"):
            if k in xfer:
                out[k] = xfer[k]
        out["texts"] = r.get("generated_texts", [])
        return out
    finally:
        if server is not None:
            server.stop()
        if service is not None:
            service.close()


def summarize(rounds: dict) -> dict:
    med: dict = {}
    for config, rows in rounds.items():
        keys = set().union(*rows) - {"texts"}
        med[config] = {k: statistics.median(r[k] for r in rows if k in r) for k in sorted(keys)}
        med[config]["failed"] = max(r["failed"] for r in rows)
    ratios: dict = {}

    def ratio(name, config, base, key):
        try:
            ratios[name] = med[config][key] / med[base][key]
        except (KeyError, ZeroDivisionError):
            pass

    for base, tag in (("kvtier-nohints", "nohints"), ("lmcache", "lmcache"), ("vllm", "vllm")):
        ratio(f"resumed_ttft_p50_ratio_vs_{tag}", "kvtier", base, "resumed_ttft_p50_ms")
        ratio(f"resumed_ttft_p90_ratio_vs_{tag}", "kvtier", base, "resumed_ttft_p90_ms")
        ratio(f"first_ttft_p50_ratio_vs_{tag}", "kvtier", base, "first_ttft_p50_ms")
        ratio(f"resumed_hit_tokens_ratio_vs_{tag}", "kvtier", base, "resumed_hit_tokens")
        # What the cache service served (vLLM's external hits, every turn): the part of the
        # hit tokens above that vLLM's own prefix cache did not.
        ratio(f"external_hit_tokens_ratio_vs_{tag}", "kvtier", base, "external_hit_tokens")
    for config in med:
        ratios[f"failed_requests_{config.replace('-', '_')}"] = med[config]["failed"]
    return {"medians": med, "ratios": ratios}


def compare_outputs(rounds: dict) -> dict:
    """Greedy outputs of each configuration against vLLM alone's in the same round."""
    out = {}
    for config, rows in rounds.items():
        if config == "vllm" or "vllm" not in rounds:
            continue
        equal = compared = 0
        for mine, base in zip(rows, rounds["vllm"]):
            for x, y in zip(mine["texts"], base["texts"]):
                if x and y:
                    compared += 1
                    equal += x == y
        out[config.replace("-", "_")] = {"equal": equal, "compared": compared}
    return out


def run(a: argparse.Namespace, work: str, model_dir: str, rng: random.Random, configs: list) -> dict:
    trace = os.path.join(work, "agentic-replay.jsonl")
    turns, facts = scale_trace(a, trace)
    rounds: dict = {c: [] for c in configs}
    t0 = time.monotonic()
    for rnd in range(a.rounds):
        for config in (configs if rnd % 2 == 0 else list(reversed(configs))):
            rounds[config].append(replay(a, config, model_dir, work, rnd, rng, trace, turns, facts))
    out = {"trace": os.path.abspath(a.agentic_trace), "replay": facts, "configs": configs, "rounds": a.rounds,
           "knobs": {k: getattr(a, k) for k in ("sessions", "turns", "time_scale", "hash_tokens", "host_fraction",
                                                "engine_blocks", "block_size", "output_tokens")},
           "outputs_vs_vllm": compare_outputs(rounds), "seconds": time.monotonic() - t0}
    out.update(summarize(rounds))
    for rows in rounds.values():
        for r in rows:
            r.pop("texts", None)
    out["sessions_by_round"] = rounds
    return out


def print_table(out: dict) -> None:
    print(f"replay: {out['replay']}")
    for config, m in out["medians"].items():
        print(f"{config:15} resumed ttft p50 {m['resumed_ttft_p50_ms']:8.1f} ms  p90 {m['resumed_ttft_p90_ms']:8.1f}  "
              f"first p50 {m['first_ttft_p50_ms']:8.1f}  resumed hit tokens {m['resumed_hit_tokens']:8.0f} "
              f"of {m['resumed_prompt_tokens']:8.0f}  failed {m['failed']:.0f}  load {m['load_avg_before']:.2f}")
    for k, v in out["ratios"].items():
        print(f"{k:40} {v:.3f}")
    print(f"outputs vs vLLM alone: {out['outputs_vs_vllm']}")
