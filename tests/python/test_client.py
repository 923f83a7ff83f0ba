"""The binding itself: zero-copy pages, errors, the GIL, pipelining, the context manager."""

import dataclasses
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import torch

import kvtier
from conftest import LAYOUT, peer_path


def hashes(n, seed=1, size=32):
    return [bytes([seed, i]) * (size // 2) for i in range(n)]


def test_a_page_written_through_numpy_is_read_with_equal_bytes_by_the_cpp_client(daemon, tmp_path):
    h = hashes(1)[0]
    block = LAYOUT.natural_block_bytes
    data = np.random.default_rng(3).integers(0, 256, block, dtype=np.uint8)
    with kvtier.Client(LAYOUT, daemon.socket, hash_bytes=32) as c:
        [p] = c.allocate(1)
        view = np.frombuffer(c.page(p), dtype=np.uint8)  # the shared memory itself
        assert view.flags.writeable and view.nbytes == c.page_bytes()
        view[:block] = data
        assert c.commit([p], [h])[0].ok
        out = tmp_path / "read.bin"
        args = [peer_path(), "read", daemon.socket, LAYOUT.model, str(LAYOUT.layers), str(LAYOUT.kv_heads),
                str(LAYOUT.head_dim), LAYOUT.dtype, str(LAYOUT.tokens_per_block), h.hex(), str(out)]
        assert subprocess.run(args).returncode == 0
        assert out.read_bytes() == data.tobytes()
    # And the other way: a block the C++ client stores is read through a torch view.
    h2 = hashes(1, seed=9)[0]
    src = tmp_path / "write.bin"
    src.write_bytes(bytes(range(256)) * (block // 256))
    args[1], args[9], args[10] = "write", h2.hex(), str(src)
    assert subprocess.run(args).returncode == 0
    with kvtier.Client(LAYOUT, daemon.socket, hash_bytes=32) as c:
        [r] = c.acquire([h2])
        assert r.ok and r.tier == "host"
        t = torch.frombuffer(c.page(r.page), dtype=torch.uint8)[:block]
        assert bytes(t.numpy()) == src.read_bytes()
        assert c.release(hashes=[h2]) == ["OK"]


def test_a_page_is_writable_only_while_leased_and_a_write_after_raises(daemon):
    h = hashes(1, seed=4)[0]
    with kvtier.Client(LAYOUT, daemon.socket, hash_bytes=32) as c:
        [p] = c.allocate(1)
        assert c.page(p).writable and np.frombuffer(c.page(p), dtype=np.uint8).flags.writeable
        np.frombuffer(c.page(p), dtype=np.uint8)[:3] = [1, 2, 3]
        assert c.commit([p], [h])[0].ok
        for page in (c.page(p), c.page(c.acquire([h])[0].page)):  # committed, then acquired
            assert not page.writable
            view = np.frombuffer(page, dtype=np.uint8)
            assert not view.flags.writeable and list(view[:3]) == [1, 2, 3]
            with pytest.raises(ValueError, match="read-only"):
                view[0] = 9
            with pytest.raises(TypeError):
                memoryview(page)[0] = 9
        assert list(np.frombuffer(c.page(p), dtype=np.uint8)[:3]) == [1, 2, 3]


def test_token_ids_of_a_commit_are_whole_blocks_or_refused(daemon):
    with kvtier.Client(LAYOUT, daemon.socket, hash_bytes=32) as c:
        [p] = c.allocate(1)
        with pytest.raises(kvtier.InvalidArgumentError, match="token_ids"):
            c.commit([p], hashes(1, seed=6), token_ids=[1] * (LAYOUT.tokens_per_block + 1))
        assert c.commit([p], hashes(1, seed=6), token_ids=list(range(LAYOUT.tokens_per_block)))[0].ok


def test_extra_keys_of_a_commit_are_an_entry_per_block_or_refused(daemon):
    with kvtier.Client(LAYOUT, daemon.socket, hash_bytes=32) as c:
        [p] = c.allocate(1)
        # msgpack [nil, nil] for one block, ["salt"] (an entry that is not an array), a cut map
        for bad in (b"\x92\xc0\xc0", b"\x91\xa4salt", b"\xde"):
            with pytest.raises(kvtier.InvalidArgumentError, match="extra_keys"):
                c.commit([p], hashes(1, seed=7), extra_keys=bad)
        # one block's entry of 64 arrays of 4 keys of 3,600 bytes (921 KB: each key and array
        # within msgpack's limits), kept with its BlockStored while it waits to be sent
        key = b"\xda\x0e\x10" + b"k" * 3600
        wide = b"\x91\xdc\x00\x40" + (b"\x94" + key * 4) * 64
        with pytest.raises(kvtier.InvalidArgumentError, match=r"entry 0 packs to \d+ bytes \(at most 8192 per block\)"):
            c.commit([p], hashes(1, seed=7), extra_keys=wide)
        # [["salt"]]: the page was still leased
        assert c.commit([p], hashes(1, seed=7), extra_keys=b"\x91\x91\xa4salt", lora_name="a", lora_id=2)[0].ok


def test_writes_through_one_view_are_seen_through_another(daemon):
    with kvtier.Client(LAYOUT, daemon.socket) as c:
        [p] = c.allocate(1)
        t = torch.frombuffer(c.page(p), dtype=torch.uint8)
        n = np.frombuffer(c.page(p), dtype=np.uint8)
        t[:4] = torch.tensor([9, 8, 7, 6], dtype=torch.uint8)
        assert list(n[:4]) == [9, 8, 7, 6]
        assert c.page(p).address == c.page_address(p)


def test_each_status_code_raises_its_own_error_with_the_daemons_message(daemon, tmp_path):
    with pytest.raises(kvtier.UnavailableError) as e:
        kvtier.Client(LAYOUT, str(tmp_path / "nobody.sock"))
    assert "no kvtierd answers" in str(e.value) and e.value.code == "UNAVAILABLE"
    assert issubclass(kvtier.UnavailableError, kvtier.Error)
    with kvtier.Client(LAYOUT, daemon.socket) as c:
        with pytest.raises(kvtier.InvalidArgumentError, match="cannot allocate"):
            c.allocate(10 ** 6)
        with pytest.raises(kvtier.InvalidArgumentError, match="hash of 32 bytes"):
            c.lookup(hashes(1, size=32))  # this session uses 16-byte hashes
        # Per-entry outcomes are returned, not raised.
        [p] = c.allocate(1)
        assert c.commit([p + 1], hashes(1, size=16))[0].status == "FAILED_PRECONDITION"
        assert c.acquire(hashes(1, seed=5, size=16))[0].status == "NOT_FOUND"
        assert c.acquire(hashes(3, seed=5, size=16), prefix=True) == []  # a chain's cached prefix only
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.Layout("m", layers=1, kv_heads=1, head_dim=1, dtype="fp99", tokens_per_block=1).natural_block_bytes


def test_closing_ends_the_session_and_later_calls_fail(daemon):
    control = kvtier.ControlClient(daemon.socket)
    with kvtier.Client(LAYOUT, daemon.socket) as c:
        c.allocate(3)
        assert control.stats()["tiers"]["host"]["leased_pages"] == 3
    assert c.closed
    # The daemon sees the close on its own loop: bounded wait for the leases to go.
    deadline = time.monotonic() + 10
    while control.stats()["tiers"]["host"]["leased_pages"] != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert control.stats()["tiers"]["host"]["leased_pages"] == 0
    with pytest.raises(kvtier.FailedPreconditionError):
        c.allocate(1)


def test_the_gil_is_released_while_a_call_waits_for_the_daemon(daemon):
    with kvtier.Client(LAYOUT, daemon.socket, timeout_ms=1500) as c:
        daemon.signal(signal.SIGSTOP)  # the daemon stops answering
        try:
            done = {}

            def blocked():
                t0 = time.monotonic()
                try:
                    c.lookup(hashes(2, size=16))
                except kvtier.DeadlineExceededError:  # its own code, an UnavailableError too
                    done["error"] = time.monotonic() - t0

            th = threading.Thread(target=blocked)
            th.start()
            spins, t0 = 0, time.monotonic()
            while th.is_alive() and time.monotonic() - t0 < 10:
                spins += 1  # Python code runs meanwhile: the waiting call holds no GIL
            th.join(10)
        finally:
            daemon.signal(signal.SIGCONT)
        assert 1.0 < done["error"] < 5.0, done  # bounded by the client's timeout
        assert spins > 10_000


def test_pipelined_calls_and_tickets_not_outstanding(daemon):
    with kvtier.Client(LAYOUT, daemon.socket) as c:
        pages = c.allocate(4)
        chain = hashes(4, size=16)
        c.commit(pages, chain, [b""] + chain[:-1])
        tickets = [c.start_lookup(chain[:k]) for k in range(1, 5)]
        assert [c.wait_lookup(t).matched for t in reversed(tickets)] == [4, 3, 2, 1]
        with pytest.raises(kvtier.InvalidArgumentError, match="not outstanding"):
            c.wait_lookup(tickets[0])
        t = c.start_acquire(chain)
        assert all(r.ok for r in c.wait_acquire(t))
        assert c.release(hashes=chain) == ["OK"] * 4


def test_store_kv_and_load_kv_move_paged_torch_tensors_exactly(daemon):
    blocks = 6
    layers = [torch.randn(2, blocks, 16, 2, 64).to(torch.bfloat16) for _ in range(LAYOUT.layers)]
    chain = hashes(3, seed=4, size=16)
    with kvtier.Client(LAYOUT, daemon.socket, device="host-emulated") as c:
        assert all(r.ok for r in c.store_kv(layers, [5, 1, 3], chain, [b""] + chain[:-1]))
        out = [torch.zeros_like(t) for t in layers]
        assert c.load_kv(out, chain, [0, 2, 4]) == 3
        for a, b in zip(layers, out):
            assert torch.equal(a[:, [5, 1, 3]], b[:, [0, 2, 4]])
        with pytest.raises(kvtier.InvalidArgumentError, match="shape"):
            c.store_kv([t[:, :, :8] for t in layers], [0], chain[:1])
        with pytest.raises(kvtier.InvalidArgumentError, match="2 layers"):
            c.store_kv(layers[:1], [0], chain[:1])
        with pytest.raises(kvtier.InvalidArgumentError, match="4-byte"):
            c.store_kv([t.float() for t in layers], [0], chain[:1])


def test_a_load_in_layers_moves_each_layer_when_asked_and_holds_its_blocks_until_finished(daemon):
    blocks = 6
    layers = [torch.randn(2, blocks, 16, 2, 64).to(torch.bfloat16) for _ in range(LAYOUT.layers)]
    chain = hashes(3, seed=9, size=16)
    with kvtier.Client(LAYOUT, daemon.socket, device="host-emulated") as c:
        assert all(r.ok for r in c.store_kv(layers, [5, 1], chain[:2], [b""] + chain[:1]))
        out = [torch.zeros_like(t) for t in layers]
        load = c.start_load(c.kv_view(out), chain, [0, 2, 4])
        assert load.loaded == 2  # the cached prefix
        def referenced():
            return sum(t["referenced_pages"] for t in kvtier.ControlClient(daemon.socket).stats()["tiers"].values())

        assert referenced() == 2
        load.scatter(1, 2)
        assert torch.equal(layers[1][:, [5, 1]], out[1][:, [0, 2]])
        assert not out[0].any()
        load.scatter(0, 1)
        assert torch.equal(layers[0][:, [5, 1]], out[0][:, [0, 2]])
        assert not out[0][:, 4].any() and not out[1][:, 4].any()
        with pytest.raises(kvtier.InvalidArgumentError, match="out of range"):
            load.scatter(1, 3)
        load.finish()
        c.ping()
        assert referenced() == 0
        with pytest.raises(kvtier.InvalidArgumentError, match="finished"):
            load.scatter(0, 1)


@pytest.mark.parametrize("kwargs", [{"timeout_ms": -1}, {"timeout_ms": 0}, {"hash_bytes": 20}])
def test_bad_client_arguments_raise_kvtier_errors(daemon, kwargs):
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.Client(LAYOUT, daemon.socket, **kwargs)


@pytest.mark.parametrize("field", ["layers", "kv_heads", "head_dim", "tokens_per_block"])
def test_negative_layout_fields_raise_kvtier_errors(daemon, field):
    bad = dataclasses.replace(LAYOUT, **{field: -1})
    with pytest.raises(kvtier.InvalidArgumentError, match=field):
        kvtier.Client(bad, daemon.socket)


def test_a_tensor_of_another_dtype_with_the_same_element_size_is_refused(daemon):
    torch = pytest.importorskip("torch")
    with kvtier.Client(LAYOUT, daemon.socket, device="host-emulated") as c:  # LAYOUT is bf16
        layers = [torch.zeros(2, 4, 16, 2, 64, dtype=torch.float16) for _ in range(LAYOUT.layers)]
        with pytest.raises(kvtier.InvalidArgumentError, match="bfloat16"):
            c.store_kv(layers, [0], [b"\x01" * 16])


def test_a_load_into_a_read_only_array_is_refused(daemon):
    import numpy as np

    with kvtier.Client(LAYOUT, daemon.socket, device="host-emulated") as c:
        layers = [np.zeros((2, 4, 16, 2, 64), dtype=np.uint16) for _ in range(LAYOUT.layers)]
        for a in layers:
            a.flags.writeable = False
        with pytest.raises(kvtier.InvalidArgumentError, match="read-only"):
            c.load_kv(layers, [b"\x01" * 16], [0])


def test_a_load_into_a_torch_tensor_over_read_only_memory_is_refused_not_a_fault(daemon, tmp_path):
    # torch keeps no writeable flag: a tensor over a file mapped read-only, or over a page
    # this session acquired (read-only in its mapping), faulted the process on a load.
    torch = pytest.importorskip("torch")
    import mmap

    import numpy as np

    shape = (2, 4, 16, 2, 64)
    nbytes = int(np.prod(shape)) * 2
    with kvtier.Client(LAYOUT, daemon.socket, device="host-emulated") as c:
        source = [torch.randn(*shape).to(torch.bfloat16) for _ in range(LAYOUT.layers)]
        chain = hashes(1, seed=7, size=16)
        assert all(r.ok for r in c.store_kv(source, [0], chain))
        path = tmp_path / "kv.bin"
        path.write_bytes(b"\0" * nbytes)
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), nbytes, prot=mmap.PROT_READ)
            ro = torch.frombuffer(m, dtype=torch.bfloat16).view(*shape)  # torch warns: not writable
            with pytest.raises(kvtier.InvalidArgumentError, match="read-only"):
                c.load_kv([ro] * LAYOUT.layers, chain, [0])
            del ro
            m.close()
        # A view of an acquired page: the kernel holds it read-only for this session.
        (hit,) = c.acquire(chain)
        page = torch.frombuffer(c.page(hit.page), dtype=torch.uint8)
        block_of_a_layer = nbytes // 4  # [2, 1, 16, 2, 64] of a [2, 4, 16, 2, 64] layer
        in_page = page[:block_of_a_layer].view(torch.bfloat16).view(2, 1, 16, 2, 64)
        with pytest.raises(kvtier.InvalidArgumentError, match="read-only"):
            c.load_kv([in_page] * LAYOUT.layers, chain, [0])
        c.release(hashes=chain)
        # A writable tensor still loads, exactly.
        out = [torch.zeros(*shape, dtype=torch.bfloat16) for _ in range(LAYOUT.layers)]
        assert c.load_kv(out, chain, [0]) == 1
        assert all(torch.equal(o[:, 0], s[:, 0]) for o, s in zip(out, source))


def test_the_maps_are_read_once_per_torch_tensor_and_every_time_for_kvtiers_own_pages(daemon, monkeypatch):
    # /proc/self/maps is thousands of lines in a process with torch loaded: read per
    # store_kv/load_kv it halved the binding's speed. Anonymous memory is asked once per
    # tensor; a page of kvtier's own changes protection with its lease, so it is asked again.
    torch = pytest.importorskip("torch")
    from kvtier import kv

    scans = []
    real = kv._writable_spans
    monkeypatch.setattr(kv, "_writable_spans", lambda: scans.append(1) or real())
    shape = (2, 4, 16, 2, 64)
    with kvtier.Client(LAYOUT, daemon.socket, device="host-emulated") as c:
        layers = [torch.randn(*shape).to(torch.bfloat16) for _ in range(LAYOUT.layers)]
        chain = hashes(2, seed=9, size=16)
        assert all(r.ok for r in c.store_kv(layers, [0, 1], chain))
        for _ in range(5):
            assert c.load_kv(layers, chain, [2, 3]) == 2
        assert len(scans) == 1, "the maps were read again for tensors already seen"
        fresh = [torch.zeros(*shape, dtype=torch.bfloat16) for _ in range(LAYOUT.layers)]
        assert c.load_kv(fresh, chain, [0, 1]) == 2
        assert len(scans) == 2, "new tensors are asked about"
        # A view of a page this session acquired: read-only, and asked each time.
        (hit, _) = c.acquire(chain)
        page = torch.frombuffer(c.page(hit.page), dtype=torch.uint8)
        in_page = page[: 2 * 16 * 2 * 64 * 2].view(torch.bfloat16).view(2, 1, 16, 2, 64)
        for n in range(2):
            with pytest.raises(kvtier.InvalidArgumentError, match="read-only"):
                c.load_kv([in_page] * LAYOUT.layers, chain, [0])
            assert len(scans) == 3 + n
        c.release(hashes=chain)


def test_a_kv_cache_passed_again_is_checked_once_unless_it_changed(daemon):
    # store_kv/load_kv given the same layers again reuse their view (checking 32 layers cost
    # a fifth of the binding's speed); a layer that changed under the same object is checked
    # again, never copied into by its old description.
    torch = pytest.importorskip("torch")
    from kvtier import kv

    shape = (2, 4, 16, 2, 64)
    with kvtier.Client(LAYOUT, daemon.socket, device="host-emulated") as c:
        layers = [torch.randn(*shape).to(torch.bfloat16) for _ in range(LAYOUT.layers)]
        first = c.kv_view(layers)
        assert c.kv_view(layers) is first
        assert c.kv_view([t.clone() for t in layers]) is not first  # other tensors
        layers[1].resize_(2, 2, 16, 2, 64)  # the same object, half its blocks
        with pytest.raises(kvtier.InvalidArgumentError, match="same blocks"):
            c.kv_view(layers)
        layers[1].resize_(*shape)
        chain = hashes(2, seed=11, size=16)
        assert all(r.ok for r in c.store_kv(layers, [0, 1], chain))
        out = [torch.zeros(*shape, dtype=torch.bfloat16) for _ in range(LAYOUT.layers)]
        assert c.load_kv(out, chain, [2, 3]) == 2
        assert all(torch.equal(o[:, 2:4], s[:, 0:2]) for o, s in zip(out, layers))
        assert len(kv._VIEWS_SEEN) <= kv._VIEWS_SEEN_MAX


def test_a_kv_cache_of_zero_blocks_is_refused_for_what_it_is(daemon):
    import numpy as np

    with kvtier.Client(LAYOUT, daemon.socket, device="host-emulated") as c:
        for make in (np.zeros, None):
            if make is None:
                torch = pytest.importorskip("torch")
                empty = [torch.zeros(2, 0, 16, 2, 64, dtype=torch.bfloat16) for _ in range(LAYOUT.layers)]
            else:
                empty = [make((2, 0, 16, 2, 64), dtype=np.uint16) for _ in range(LAYOUT.layers)]
            with pytest.raises(kvtier.InvalidArgumentError, match="0 blocks"):
                c.kv_view(empty)


def test_results_are_typed_and_still_compare_as_the_names(daemon):
    chain = hashes(3, seed=11)
    with kvtier.Client(LAYOUT, daemon.socket, hash_bytes=32) as c:
        pages = c.allocate(3)
        assert all(isinstance(p, int) for p in pages)
        stored = c.commit(pages, chain, [b""] + chain[:-1])
        assert [(r.status, r.tier) for r in stored] == [(kvtier.Code.OK, kvtier.Tier.HOST)] * 3
        assert all(type(r.status) is kvtier.Code and type(r.tier) is kvtier.Tier for r in stored)
        assert stored[0].status == "OK" and f"{stored[0].tier}" == "host" and str(stored[0].status) == "OK"
        found = c.lookup(chain + hashes(1, seed=12))
        assert found.matched == 3 and found.tiers == [kvtier.Tier.HOST] * 3
        missing = c.acquire(hashes(1, seed=13))[0]
        assert missing.status is kvtier.Code.NOT_FOUND and not missing.ok
        assert c.release(hashes=[chain[0]]) == [kvtier.Code.FAILED_PRECONDITION]  # not referenced


# Parameter names of a pybind11 callable, from the signature line of its docstring.
def _native_params(obj):
    import re
    line = (obj.__doc__ or "").strip().splitlines()[0] if obj.__doc__ else ""
    inside = line[line.find("(") + 1:line.rfind(") ->")]
    return [n for n in re.findall(r"(?:^|, )(\w+):", inside) if n != "self"]


def test_the_extensions_stub_names_every_function_and_parameter_it_has():
    import ast
    import pathlib
    from kvtier import _kvtier
    tree = ast.parse(pathlib.Path(_kvtier.__file__).with_name("_kvtier.pyi").read_text())
    stub = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    public = {n for n in dir(_kvtier) if not n.startswith("_")}
    assert public == {n for n in stub if not n.startswith("_")}
    for name in sorted(public):
        node, native = stub[name], getattr(_kvtier, name)
        if isinstance(native, type) and issubclass(native, BaseException):
            continue
        members = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
        have = {m for m in vars(native) if not m.startswith("_")}
        assert {m for m in members if not m.startswith("_")} == have, name
        for m in have | ({"__init__"} & set(members)):  # a constructor, where the stub has one
            fn = getattr(native, m)
            if isinstance(fn, property) or "Overloaded" in (fn.__doc__ or ""):
                continue
            args = members[m].args
            assert [a.arg for a in args.args + args.kwonlyargs if a.arg != "self"] == _native_params(fn), f"{name}.{m}"


def test_a_sessions_hint_names_the_blocks_it_found_and_bad_hints_raise(daemon):
    chain = hashes(4, seed=21, size=16)
    with kvtier.Client(LAYOUT, daemon.socket) as c:
        c.commit(c.allocate(3), chain[:3], [b""] + chain[:2])
        assert c.hint("agent-7", chain, ttl_s=30, hit_tokens=32) == 3  # the cached prefix of the chain
        [s] = kvtier.ControlClient(daemon.socket).stats(agent_sessions=True)["agent_sessions"]
        assert (s["session"], s["state"], s["hit_tokens"], s["protected_blocks"]) == ("agent-7", "live", 32, 3)
        assert 25 < s["ttl_left_s"] <= 30
        control = kvtier.ControlClient(daemon.socket)
        assert control.hint(c.namespace_id, "agent-7", chain, ttl_s=5, prefetch=True) == 3  # no tier below: nothing read
        assert c.hint("agent-7", chain, end=True) == 3
        with pytest.raises(kvtier.InvalidArgumentError, match="session id"):
            c.hint("", chain)
        with pytest.raises(kvtier.InvalidArgumentError, match="ttl"):
            c.hint("agent-8", chain, ttl_s=-1)
        assert c.lookup(chain).matched == 3  # a hint changes no one's blocks
