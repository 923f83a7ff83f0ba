"""kvtier: the Python client of kvtierd, the KV-cache tiering daemon.

An engine attaches with its model layout and leases pages of the daemon's pools; pages
are shared memory (``Client.page`` is a writable buffer that ``numpy.frombuffer`` and
``torch.frombuffer`` view without a copy). Blocks are named by chained prefix hashes
(16 or 32 bytes), so equal hashes mean equal prefixes across processes and engines.

    layout = kvtier.Layout("my-model", layers=32, kv_heads=8, head_dim=128,
                           dtype="bf16", tokens_per_block=16)
    with kvtier.Client(layout, hash_bytes=32) as c:
        pages = c.allocate(2)
        memoryview(c.page(pages[0]))[:4] = b"kv.."
        c.commit(pages, [h0, h1], parents=[b"", h0])
        c.lookup([h0, h1]).matched        # 2

Failed calls raise a subclass of ``kvtier.Error`` named for the status code
(``UnavailableError`` when no daemon answers, ``ResourceExhaustedError`` for a full tier,
...), with the daemon's message; per-entry outcomes of commit/acquire/release are
returned. Every call that waits for the daemon releases the GIL.

Engine integrations: ``kvtier.vllm`` (a vLLM v1 KV connector) and ``kvtier.sglang`` (an
SGLang HiCache storage backend). The repository's tests/python/kvtier_testing holds the
reference engine, the binding's benchmark and the real-vLLM end-to-end run.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Iterable, NamedTuple, Optional, Sequence

from kvtier import _kvtier
from kvtier._kvtier import (  # noqa: F401  (the public error types)
    AbortedError,
    AlreadyExistsError,
    DataLossError,
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    Page,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    UnimplementedError,
)
from kvtier.kv import KvView, kv_args

__all__ = [
    "Layout", "Client", "ControlClient", "BlockResult", "LookupResult", "Tier", "Code", "KvView", "Page", "Error",
    "InvalidArgumentError", "NotFoundError", "AlreadyExistsError", "ResourceExhaustedError",
    "FailedPreconditionError", "AbortedError", "UnavailableError", "DataLossError",
    "PermissionDeniedError", "UnimplementedError", "InternalError", "DeadlineExceededError", "DTYPE_BYTES",
]

# Element sizes of the dtypes a layout may name (protocol/base/layout.h).
DTYPE_BYTES = {"fp16": 2, "float16": 2, "half": 2, "bf16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "int8": 1, "fp32": 4, "float32": 4}


@dataclass(frozen=True)
class Layout:
    """A model's KV layout: the namespace its blocks live in (with the tenant).

    Two engines share blocks only when every field is equal. ``block_bytes`` defaults to
    the natural size: 2 x layers x tokens_per_block x kv_heads x head_dim x dtype bytes.
    """

    model: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    tokens_per_block: int
    block_bytes: Optional[int] = None

    @property
    def natural_block_bytes(self) -> int:
        if self.dtype not in DTYPE_BYTES:
            raise InvalidArgumentError(f"dtype '{self.dtype}' is not one of {sorted(DTYPE_BYTES)}")
        return 2 * self.layers * self.tokens_per_block * self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    @staticmethod
    def opaque(model: str, block_bytes: int, tokens_per_block: int = 1) -> "Layout":
        """A layout for blocks that are opaque bytes to their engine (SGLang's pages, a
        benchmark's): `block_bytes` per block of `tokens_per_block` tokens (the block size
        its KV events announce)."""
        if not isinstance(block_bytes, int) or block_bytes <= 0:
            raise InvalidArgumentError(f"an opaque block of {block_bytes!r} bytes: want a positive size")
        return Layout(model, layers=1, kv_heads=1, head_dim=1, dtype="int8", tokens_per_block=tokens_per_block,
                      block_bytes=block_bytes)

    def as_dict(self) -> dict:
        for name in ("layers", "kv_heads", "head_dim", "tokens_per_block"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0 or v >= 1 << 32:
                raise InvalidArgumentError(f"Layout.{name} must be a positive integer below 2^32, not {v!r}")
        if self.block_bytes is not None and (not isinstance(self.block_bytes, int) or self.block_bytes <= 0):
            raise InvalidArgumentError(f"Layout.block_bytes must be a positive integer, not {self.block_bytes!r}")
        d = asdict(self)
        if d["block_bytes"] is None:
            d["block_bytes"] = self.natural_block_bytes
        return d


class _Named(str, enum.Enum):
    """A name the daemon sends, as an enum that is also the string itself (``Tier.HOST ==
    "host"``, and it formats as its value on every Python version)."""

    __str__ = str.__str__
    __format__ = str.__format__


class Tier(_Named):
    """A tier of kvtierd (protocol/base/tier.h's names). A name this package does not list
    (a lower tier of a newer kvtierd, e.g. ``"memory"``) comes back as a member of its own,
    equal to that name, rather than an error."""

    GPU = "gpu"
    HOST = "host"
    NVME = "nvme"
    REMOTE = "remote"

    @classmethod
    def _missing_(cls, value):
        if not isinstance(value, str) or not value.isidentifier():
            return None
        member = str.__new__(cls, value)
        member._name_ = value.upper()
        member._value_ = value
        return member


class Code(_Named):
    """A status code (protocol/base/status.h's names); each but OK is also an error class."""

    OK = "OK"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    UNAVAILABLE = "UNAVAILABLE"
    DATA_LOSS = "DATA_LOSS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


class BlockResult(NamedTuple):
    """One entry of commit, acquire, store_kv: its status, tier and page."""

    status: Code
    tier: Tier
    page: int
    duplicate: bool

    @property
    def ok(self) -> bool:
        return self.status is Code.OK


class LookupResult(NamedTuple):
    matched: int       # blocks 0..matched-1 of the chain are cached
    tiers: list[Tier]  # the tier of each matched block


def _results(raw) -> list[BlockResult]:
    return [BlockResult(Code(status), Tier(tier), page, duplicate) for status, tier, page, duplicate in raw]


def _lookup(raw) -> LookupResult:
    matched, tiers = raw
    return LookupResult(matched, [Tier(t) for t in tiers])


class Client:
    """One engine session with kvtierd (a context manager; closing ends the session).

    ``socket``: None or "" uses $KVTIER_SOCKET, else kvtierd's default ./var/kvtierd.sock.
    ``device``: "auto" (CUDA when visible, else host-emulated), "cuda" or "host-emulated";
    KV tensors given to store_kv/load_kv must live where it says (CPU tensors need
    "host-emulated"). ``routable_id`` ("IP:port", where routers send the engine's
    requests) and ``data_parallel_rank`` (-1: none) name the engine in kvtierd's KV event
    topics; ``event_hashes`` is how the engine's own events name a block, so kvtierd's
    announcements of this session's blocks match them: "vllm" (last 8 bytes, unsigned),
    "sglang" (first 8 bytes, signed) or "none" (not announced). ``event_group``,
    ``event_spec_kind``, ``event_sliding_window`` and ``event_block_tokens`` say which of
    the engine's KV cache groups the namespace holds (vLLM's group index, its
    KVCacheSpecKind value, its window and its block size in tokens; 0: the layout's):
    kvtierd's KV events carry them as vLLM's own do. Thread-safe: calls from
    several threads are serialized.
    """

    def __init__(self, layout: Layout, socket: Optional[str] = None, *, name: str = "python", hash_bytes: int = 16,
                 timeout_ms: int = 60000, device: str = "auto", cuda_device: int = 0, routable_id: str = "",
                 data_parallel_rank: int = -1, event_hashes: str = "vllm", event_group: int = -1,
                 event_spec_kind: str = "", event_sliding_window: int = 0, event_block_tokens: int = 0):
        self.layout = layout
        self._device = None
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or not 0 < timeout_ms < 1 << 31:
            raise InvalidArgumentError(f"timeout_ms must be a positive number of milliseconds, not {timeout_ms!r}")
        if hash_bytes not in (16, 32):
            raise InvalidArgumentError(f"hash_bytes must be 16 or 32, not {hash_bytes!r}")
        self._c = _kvtier.Client(layout.as_dict(), socket or "", name, hash_bytes, timeout_ms, device, cuda_device,
                                 routable_id, data_parallel_rank, event_hashes, event_group, event_spec_kind,
                                 event_sliding_window, event_block_tokens)

    # ---- session ----
    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Ends the session (the daemon frees its leases and references). Pages already
        handed out stay mapped (not meaningful) until they are garbage-collected."""
        self._c.close()

    @property
    def closed(self) -> bool:
        return self._c.closed

    @property
    def session_id(self) -> int:
        return self._c.session_id

    @property
    def daemon_epoch(self) -> int:
        return self._c.daemon_epoch

    @property
    def namespace_id(self) -> str:
        return self._c.namespace_id

    @property
    def hash_bytes(self) -> int:
        return self._c.hash_bytes

    @property
    def device_backend(self) -> str:
        """"cuda" or "host-emulated" (the device is opened on first use)."""
        if self._device is None:
            self._device = self._c.open_device()
        return self._device

    def page_bytes(self, tier: str = "host") -> int:
        return self._c.page_bytes(tier)

    # ---- pages and blocks ----
    def allocate(self, count: int, tier: str = "host") -> list[int]:
        """Leases `count` writable pages (all or nothing)."""
        return self._c.allocate(count, tier)

    def page(self, page: int, tier: str = "host") -> Page:
        """The page's bytes as a buffer over shared memory (no copy): writable while this
        session holds the page leased, read-only once committed or released and for
        acquired blocks (a view made then refuses writes; one made before goes on
        allowing them and faults: make views after each allocate)."""
        return self._c.page(page, tier)

    def page_address(self, page: int, tier: str = "host") -> int:
        """The page's address in this process (device memory for a CUDA GPU tier); 0 when
        its segment is not mapped here."""
        return self._c.page_address(page, tier)

    def commit(self, pages: Sequence[int], hashes: Sequence[bytes], parents: Optional[Sequence[bytes]] = None,
               tier: str = "host", retain: bool = False, token_ids: Sequence[int] = (), extra_keys: bytes = b"",
               lora_name: str = "", lora_id: int = 0) -> list[BlockResult]:
        """Leased pages become blocks ``hashes[i]`` (parent ``parents[i]``; b"" for none).
        What the blocks were hashed from, announced with their KV events (routers index
        blocks by them), never part of a block's identity: ``token_ids``, none or the
        layout's tokens_per_block tokens of each block in order; ``extra_keys``, none or one
        msgpack array with an entry per block, nil or an array (vLLM's
        ``BlockStored.extra_keys``); the LoRA adapter's ``lora_name`` and ``lora_id``."""
        return _results(self._c.commit(list(pages), list(hashes), None if parents is None else list(parents), tier,
                                       retain, list(token_ids), extra_keys, lora_name, lora_id))

    def release(self, pages: Iterable[int] = (), hashes: Iterable[bytes] = (), tier: str = "host") -> list[Code]:
        """Releases leased pages or references; one status per page, then per hash."""
        return [Code(c) for c in self._c.release(list(pages), list(hashes), tier)]

    def lookup(self, chain: Sequence[bytes]) -> LookupResult:
        """The longest cached prefix of a hash chain, with each matched block's tier."""
        return _lookup(self._c.lookup(list(chain)))

    def acquire(self, hashes: Sequence[bytes], *, prefix: bool = False) -> list[BlockResult]:
        """References cached blocks until release (NVMe blocks are read back first). With
        ``prefix``, the hashes are a chain and only its longest cached prefix is acquired:
        one result per block of that prefix (a daemon before protocol minor 5 answers for
        every hash)."""
        return _results(self._c.acquire(list(hashes), prefix))

    def start_lookup(self, chain: Sequence[bytes]) -> int:
        return self._c.start_lookup(list(chain))

    def wait_lookup(self, ticket: int) -> LookupResult:
        return _lookup(self._c.wait_lookup(ticket))

    def start_acquire(self, hashes: Sequence[bytes], *, prefix: bool = False) -> int:
        return self._c.start_acquire(list(hashes), prefix)

    def wait_acquire(self, ticket: int) -> list[BlockResult]:
        return _results(self._c.wait_acquire(ticket))

    def ping(self, payload_bytes: int = 0) -> None:
        self._c.ping(payload_bytes)

    def hint(self, session: str, chain: Sequence[bytes], *, ttl_s: Optional[float] = None, end: bool = False,
             hit_tokens: int = 0) -> int:
        """An agentic session's hint: ``session`` used the cached prefix of ``chain`` (this
        client's namespace); it expects to be back within ``ttl_s`` seconds (None: its last
        TTL stands) and ``end`` says it has ended; ``hit_tokens``: what its request loaded
        from kvtierd. kvtierd then evicts the session's blocks after its tenant's others
        while it lives, and an ended session's first. Returns the blocks the hint named."""
        return self._c.hint(session, list(chain), -1 if ttl_s is None else int(ttl_s * 1000), end, hit_tokens)

    def alive(self) -> None:
        """Raises when the session has ended (no round trip): bytes read through acquired
        pages are the blocks' only if this does not raise after the read (kvtierd drops an
        expired session's references, and the pages may be rewritten)."""
        self._c.alive()

    # ---- whole paged KV caches ----
    def kv_view(self, kv_caches: Sequence, kv_layout: str = "kv_first") -> KvView:
        """Checks a paged KV cache once and describes it for store_kv/load_kv, which then
        take the view in place of the tensors (an engine whose cache never moves checks
        it at start, not on every copy). The tensors must outlive the view.

        ``kv_caches``: one tensor per layer (torch or numpy) of the layout's dtype, on the
        client's device, in one of the layouts of ``kvtier.kv``: "kv_first"
        [2, num_blocks, block_tokens, kv_heads, head_dim] and "block_first"
        [num_blocks, 2, ...] (contiguous), or "paged" (a dense run per block at a fixed
        stride, as vLLM >= 0.32 hands them).
        """
        return kv_args(self.layout, self.device_backend, kv_caches, kv_layout)

    def store_kv(self, kv_caches, block_ids: Sequence[int], hashes: Sequence[bytes],
                 parents: Optional[Sequence[bytes]] = None, *, kv_layout: str = "kv_first",
                 token_ids: Sequence[int] = (), extra_keys: bytes = b"", lora_name: str = "",
                 lora_id: int = 0) -> list[BlockResult]:
        """Stores engine blocks ``block_ids[i]`` of a paged KV cache (tensors as kv_view
        takes them, or a KvView) as ``hashes[i]`` (``token_ids``, ``extra_keys``,
        ``lora_name`` and ``lora_id`` as commit's). All layers of all blocks move in one
        gather; returns one BlockResult per block (as commit)."""
        v = kv_caches if isinstance(kv_caches, KvView) else self.kv_view(kv_caches, kv_layout)
        return _results(self._c.store_blocks(v.pointers, v.num_blocks, v.kind, list(block_ids), list(hashes),
                                             None if parents is None else list(parents), v.stream, v.block_stride,
                                             list(token_ids), extra_keys, lora_name, lora_id))

    def load_kv(self, kv_caches, chain: Sequence[bytes], block_ids: Sequence[int], *,
                kv_layout: str = "kv_first") -> int:
        """Loads the cached prefix of ``chain`` into engine blocks ``block_ids[0..n)`` of a
        paged KV cache (tensors or a KvView); returns n, the number of leading blocks
        loaded (0 on a miss)."""
        v = kv_caches if isinstance(kv_caches, KvView) else self.kv_view(kv_caches, kv_layout)
        if not v.writable:
            raise InvalidArgumentError("a KV layer is read-only: a load writes into it")
        return self._c.load_blocks(v.pointers, v.num_blocks, v.kind, list(chain), list(block_ids), v.stream,
                                   v.block_stride)

    def start_load(self, view: KvView, chain: Sequence[bytes], block_ids: Sequence[int]) -> _kvtier.KvLoad:
        """load_kv in layers, for an engine that waits for each layer before computing it:
        holds the cached prefix of ``chain`` (one round trip) and returns a KvLoad whose
        ``loaded`` leading blocks ``scatter(first, last, stream=, wait=)`` moves layer
        range by layer range into ``block_ids`` (enqueued on the CUDA stream ``stream``,
        0: the default stream; waiting for the copy when ``wait``); ``finish()`` gives the
        blocks back once every scatter has completed. Calls on the KvLoad take this
        client's lock."""
        if not view.writable:
            raise InvalidArgumentError("a KV layer is read-only: a load writes into it")
        return self._c.start_load(view.pointers, view.num_blocks, view.kind, list(chain), list(block_ids),
                                  view.block_stride)


class ControlClient:
    """An operator's session: ``stats()`` as a dict (tiers, hits, sessions)."""

    def __init__(self, socket: Optional[str] = None, *, name: str = "python-control", timeout_ms: int = 60000):
        self._c = _kvtier.ControlClient(socket or "", name, timeout_ms)

    def stats(self, sessions: bool = False, agent_sessions: bool = False) -> dict:
        """The daemon's figures; ``agent_sessions``: with the agentic sessions its hints
        made (``agent_sessions``: a list of dicts, as ``kvctl agents --json`` shows them)."""
        return self._c.stats(sessions, agent_sessions)

    def ping(self) -> None:
        self._c.ping()

    def hint(self, namespace_id: str, session: str, chain: Sequence[bytes], *, ttl_s: Optional[float] = None,
             end: bool = False, prefetch: bool = False) -> int:
        """A router's or an operator's hint for a session of namespace ``namespace_id`` (its
        tenant's; any for an admin): as Client.hint. ``prefetch``: the chain's blocks found on
        NVMe or a lower tier are read into free host pages too, before the session's next
        turn (never evicting)."""
        return self._c.hint(namespace_id, session, list(chain), -1 if ttl_s is None else int(ttl_s * 1000), end,
                            prefetch)
