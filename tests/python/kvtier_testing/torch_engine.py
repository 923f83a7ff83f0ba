"""A small decoder-only transformer in torch with a paged KV cache, driven through the
kvtier vLLM connector — to show that a prefix loaded from kvtier gives the same answer as
computing it, and what it saves.

    python3 -m kvtier_testing.torch_engine --layers 4 --heads 8 --kv-heads 2 \\
        --head-dim 64 --block-tokens 16 --dtype float32 --prompt-tokens 2048 \\
        --shared-prefix-tokens 1792 --decode-steps 32 --json

The model: token embeddings, per layer RMSNorm -> grouped-query attention with rotary
position embeddings -> residual -> RMSNorm -> gated (SiLU) MLP -> residual, a final
RMSNorm and tied output embeddings; random weights from --seed. The KV cache is vLLM's
paged layout, one tensor per layer of [2, num_blocks, block_tokens, kv_heads, head_dim],
with a block table per sequence.

One run: engine process A prefills prompt A and stores its full blocks (through the
connector); engine process B — a separate process — gets a prompt sharing the first M
tokens, loads the cached full blocks of that prefix and prefills only the rest, then
decodes K tokens greedily; B also computes its prompt with no cache. --json prints the
comparison. Unless --socket is given, a kvtierd of its own runs on a temporary socket.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

import kvtier
from kvtier_testing import vllm_harness as harness
from kvtier_testing.daemon import Daemon

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Geometry:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    block_tokens: int
    dtype: str
    vocab: int = 2048

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


class Model:
    def __init__(self, g: Geometry, seed: int):
        self.g = g
        dt = DTYPES[g.dtype]
        gen = torch.Generator().manual_seed(seed)

        def w(*shape, fan_in):
            return (torch.randn(*shape, generator=gen) / math.sqrt(fan_in)).to(dt)

        h, inter = g.hidden, 2 * g.hidden
        self.embed = w(g.vocab, h, fan_in=1) * 0.5
        self.layers = []
        for _ in range(g.layers):
            self.layers.append(dict(
                n1=(1 + 0.1 * torch.randn(h, generator=gen)).to(dt), n2=(1 + 0.1 * torch.randn(h, generator=gen)).to(dt),
                wq=w(h, g.heads * g.head_dim, fan_in=h), wk=w(h, g.kv_heads * g.head_dim, fan_in=h),
                wv=w(h, g.kv_heads * g.head_dim, fan_in=h), wo=w(g.heads * g.head_dim, h, fan_in=h),
                w1=w(h, inter, fan_in=h), w3=w(h, inter, fan_in=h), w2=w(inter, h, fan_in=inter)))
        self.norm = torch.ones(h, dtype=dt)
        inv = 1.0 / (10000 ** (torch.arange(0, g.head_dim, 2, dtype=torch.float32) / g.head_dim))
        self.inv_freq = inv

    @staticmethod
    def rms(x, weight):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight

    def rope(self, x, positions):
        # x: [T, heads, head_dim]; rotates pairs (2i, 2i+1) by position * inv_freq[i].
        ang = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def forward(self, cache: "PagedKv", table: list, tokens: list, start: int) -> torch.Tensor:
        """Logits of tokens[start:] (positions start..), writing their KV into `cache` and
        attending over positions [0, len(tokens)) read back from it."""
        g = self.g
        ids = torch.tensor(tokens[start:], dtype=torch.long)
        pos = torch.arange(start, len(tokens))
        x = self.embed[ids]
        for li, L in enumerate(self.layers):
            h = self.rms(x, L["n1"])
            q = (h @ L["wq"]).view(-1, g.heads, g.head_dim)
            k = (h @ L["wk"]).view(-1, g.kv_heads, g.head_dim)
            v = (h @ L["wv"]).view(-1, g.kv_heads, g.head_dim)
            q, k = self.rope(q, pos), self.rope(k, pos)
            cache.write(li, table, pos, k, v)
            K, V = cache.read(li, table, len(tokens))
            rep = g.heads // g.kv_heads
            K, V = K.repeat_interleave(rep, dim=1), V.repeat_interleave(rep, dim=1)
            scores = torch.einsum("thd,shd->hts", q.float(), K.float()) / math.sqrt(g.head_dim)
            mask = torch.arange(len(tokens))[None, :] > pos[:, None]
            scores = scores.masked_fill(mask[None], float("-inf"))
            att = torch.einsum("hts,shd->thd", scores.softmax(-1), V.float()).to(x.dtype)
            x = x + att.reshape(-1, g.heads * g.head_dim) @ L["wo"]
            h = self.rms(x, L["n2"])
            x = x + (torch.nn.functional.silu(h @ L["w1"]) * (h @ L["w3"])) @ L["w2"]
        return (self.rms(x, self.norm) @ self.embed.T).float()


class PagedKv:
    """vLLM's paged KV: per layer [2, num_blocks, block_tokens, kv_heads, head_dim]."""

    def __init__(self, g: Geometry, num_blocks: int):
        self.g = g
        self.layers = [torch.zeros(2, num_blocks, g.block_tokens, g.kv_heads, g.head_dim, dtype=DTYPES[g.dtype])
                       for _ in range(g.layers)]

    def _slots(self, table, positions):
        blocks = torch.tensor(table, dtype=torch.long)[positions // self.g.block_tokens]
        return blocks * self.g.block_tokens + positions % self.g.block_tokens

    def write(self, layer, table, positions, k, v):
        flat = self.layers[layer].view(2, -1, self.g.kv_heads, self.g.head_dim)
        slots = self._slots(table, positions)
        flat[0, slots] = k
        flat[1, slots] = v

    def read(self, layer, table, n):
        flat = self.layers[layer].view(2, -1, self.g.kv_heads, self.g.head_dim)
        slots = self._slots(table, torch.arange(n))
        return flat[0, slots], flat[1, slots]


def prompts(seed: int, prompt_tokens: int, shared: int, vocab: int):
    gen = torch.Generator().manual_seed(seed + 1)
    a = torch.randint(0, vocab, (prompt_tokens,), generator=gen).tolist()
    gen_b = torch.Generator().manual_seed(seed + 2)
    b = a[:shared] + torch.randint(0, vocab, (prompt_tokens - shared,), generator=gen_b).tolist()
    if shared < prompt_tokens and b[shared] == a[shared]:
        b[shared] = (a[shared] + 1) % vocab  # the prompts really part at `shared`
    return a, b


class Engine:
    """The model, a paged KV cache and a vLLM-style loop around the kvtier connector."""

    def __init__(self, g: Geometry, seed: int, socket: str, decode_steps: int, prompt_tokens: int,
                 timeout_ms: int = 5000, model_id: str = "kvtier-torch-engine"):
        self.g = g
        self.model = Model(g, seed)
        blocks = 2 * (-(-(prompt_tokens + decode_steps) // g.block_tokens)) + 4
        self.kv = PagedKv(g, blocks)
        config = harness.vllm_config(f"{model_id}/seed{seed}", g.layers, g.kv_heads, g.head_dim, g.dtype,
                                     g.block_tokens, extra={"socket": socket, "timeout_ms": timeout_ms})
        self.loop = harness.Engine(config, self.kv.layers)
        self.decode_steps = decode_steps
        self.requests = 0

    def serve(self, prompt: list, decode_steps: int):
        """Prefill (loading what kvtier has) and greedy decode: (loaded tokens, logits of
        the prompt's last token, generated tokens, decode logits, ttft seconds)."""
        self.requests += 1
        req = harness.Request(f"req-{self.requests}", list(prompt), self.g.block_tokens)
        t0 = time.perf_counter()
        holder = {}

        def prefill(start, table):
            holder["logits"] = self.model.forward(self.kv, table, req.all_token_ids, start)[-1]

        step, table = self.loop.prefill(req, prefill, reserve_decode_tokens=decode_steps)
        first = int(holder["logits"].argmax())
        ttft = time.perf_counter() - t0
        req.output_token_ids.append(first)
        tokens, logits = [first], [holder["logits"]]
        for _ in range(decode_steps - 1):
            out = {}

            def decode():
                out["l"] = self.model.forward(self.kv, table, req.all_token_ids, req.num_tokens - 1)[-1]

            self.loop.decode_step(req, table, decode)
            nxt = int(out["l"].argmax())
            req.output_token_ids.append(nxt)
            tokens.append(nxt)
            logits.append(out["l"])
        self.loop.finish(req, table)
        return step.loaded_tokens, tokens, logits, ttft

    def recompute(self, prompt: list, decode_steps: int):
        """The same request with no cache at all (a fresh block table, nothing loaded)."""
        table = list(range(-(-(len(prompt) + decode_steps) // self.g.block_tokens)))
        kv = PagedKv(self.g, len(table))
        t0 = time.perf_counter()
        seq = list(prompt)
        last = self.model.forward(kv, table, seq, 0)[-1]
        first = int(last.argmax())
        ttft = time.perf_counter() - t0
        seq.append(first)
        tokens, logits = [first], [last]
        for _ in range(decode_steps - 1):
            l = self.model.forward(kv, table, seq, len(seq) - 1)[-1]
            seq.append(int(l.argmax()))
            tokens.append(seq[-1])
            logits.append(l)
        return tokens, logits, ttft

    def close(self):
        self.loop.close()


def compare(got, want) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(got, want))


# ---- the daemon and the two engine processes ----------------------------------------

def geometry(a) -> Geometry:
    return Geometry(a.layers, a.heads, a.kv_heads, a.head_dim, a.block_tokens, a.dtype)


def run_role(a) -> dict:
    g = geometry(a)
    torch.manual_seed(a.seed)
    engine = Engine(g, a.seed, a.socket, a.decode_steps, a.prompt_tokens)
    prompt_a, prompt_b = prompts(a.seed, a.prompt_tokens, a.shared_prefix_tokens, g.vocab)
    # Warm-up (thread pools, allocator) on a prompt of its own, so neither timing pays it.
    warm = list(range(min(64, a.prompt_tokens)))
    engine.recompute(warm, 1)
    if a.role == "writer":
        loaded, tokens, _, _ = engine.serve(prompt_a, a.decode_steps)
        engine.close()
        return {"role": "writer", "loaded": loaded, "stored_blocks": engine.loop.worker.stats["stored_blocks"]}
    loaded, tokens, logits, ttft_kv = engine.serve(prompt_b, a.decode_steps)
    want_tokens, want_logits, ttft_re = engine.recompute(prompt_b, a.decode_steps)
    stats = dict(engine.loop.worker.stats)
    engine.close()
    return {"role": "reader", "prefix_tokens_loaded": loaded, "logits_max_abs_diff": compare(logits, want_logits),
            "next_tokens_equal": tokens == want_tokens, "ttft_s_recompute": ttft_re, "ttft_s_with_kvtier": ttft_kv,
            "ttft_ratio": ttft_kv / ttft_re, "connector": stats}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kvtier_testing.torch_engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--shared-prefix-tokens", type=int, default=1792)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--socket", default="", help="a running kvtierd's socket (default: start one of its own)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--role", choices=["writer", "reader"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not 0 <= a.shared_prefix_tokens <= a.prompt_tokens or a.decode_steps < 1:
        p.error("need 0 <= --shared-prefix-tokens <= --prompt-tokens and --decode-steps >= 1")
    if a.heads % a.kv_heads:
        p.error("--heads must be a multiple of --kv-heads")
    if a.role:
        print(json.dumps(run_role(a)))
        return 0
    daemon = None
    if not a.socket:
        g = geometry(a)
        block_bytes = 2 * g.layers * g.block_tokens * g.kv_heads * g.head_dim * torch.finfo(DTYPES[g.dtype]).bits // 8
        page = max(4096, -(-block_bytes // 4096) * 4096)
        daemon = Daemon(page_bytes=page, pages=4 * (-(-(a.prompt_tokens + a.decode_steps) // g.block_tokens)) + 16)
        a.socket = daemon.socket
    try:
        base = [sys.executable, "-m", "kvtier_testing.torch_engine"] + [x for x in (argv or sys.argv[1:]) if x != "--json"]
        base += ["--socket", a.socket]
        out = {}
        for role in ("writer", "reader"):
            r = subprocess.run(base + ["--role", role], capture_output=True, text=True)
            if r.returncode != 0:
                sys.stderr.write(r.stderr)
                raise SystemExit(f"engine process {role} failed ({r.returncode})")
            out[role] = json.loads(r.stdout.strip().splitlines()[-1])
        result = {k: v for k, v in out["reader"].items() if k != "role"}
        result.update({"stored_blocks_by_a": out["writer"]["stored_blocks"], "prompt_tokens": a.prompt_tokens,
                       "shared_prefix_tokens": a.shared_prefix_tokens,
                       "expected_loaded": a.shared_prefix_tokens // a.block_tokens * a.block_tokens})
    finally:
        if daemon:
            daemon.close()
    if a.json:
        print(json.dumps(result))
    else:
        print(f"loaded {result['prefix_tokens_loaded']} of {a.prompt_tokens} prompt tokens from kvtier; logits max |diff| "
              f"{result['logits_max_abs_diff']:.2e}; greedy tokens equal: {result['next_tokens_equal']}; TTFT "
              f"{result['ttft_s_with_kvtier'] * 1e3:.1f} ms vs {result['ttft_s_recompute'] * 1e3:.1f} ms recomputed "
              f"(x{result['ttft_ratio']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
