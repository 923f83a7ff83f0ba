// kvtier._kvtier: the Python binding of the engine client library (engine/client.h,
// engine/control_client.h). The public Python API is the kvtier package around it
// (python/kvtier/__init__.py); this module is its native half.
//
// Every call that talks to kvtierd releases the GIL while it waits; a Client is guarded by a
// mutex of its own, so threads sharing one are serialized rather than racing. A failed call
// raises the kvtier.Error subclass of its status code with the daemon's message; per-entry
// outcomes (Commit, Acquire, Release) are returned, not raised. Pages are kvtier.Page
// objects with the buffer protocol: numpy.frombuffer / torch.frombuffer see the shared
// memory itself, and a Page keeps its client's mappings alive.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/client.h"
#include "engine/control_client.h"
#include "python/client_handle.h"

namespace py = pybind11;
using namespace kvtier;

namespace {

// ---- errors ---------------------------------------------------------------------------

// kvtier.Error and one subclass per status code, by code number.
std::array<PyObject*, kMaxStatusCode + 1> g_errors{};

[[noreturn]] void Raise(const Status& st) {
  const int code = static_cast<int>(st.code());
  PyObject* type = code >= 0 && code <= kMaxStatusCode && g_errors[code] ? g_errors[code] : g_errors[0];
  py::object exc = py::reinterpret_steal<py::object>(PyObject_CallFunction(
      type, "s", st.message().empty() ? std::string(StatusCodeName(st.code())).c_str() : st.message().c_str()));
  if (!exc) throw py::error_already_set();
  exc.attr("code") = std::string(StatusCodeName(st.code()));
  PyErr_SetObject(type, exc.ptr());
  throw py::error_already_set();
}

template <class T>
T Unwrap(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

void Check(const Status& st) {
  if (!st.ok()) Raise(st);
}

// ---- values ---------------------------------------------------------------------------

TierKind ParseTier(const std::string& name) {
  if (auto t = ParseTierKind(name)) return *t;
  Raise(InvalidArgument("tier '" + name + "' is not gpu, host or nvme"));
}

BlockHash HashOf(const py::bytes& b) {
  const std::string_view v = b;
  if (!BlockHash::ValidSize(v.size())) {
    Raise(InvalidArgument("a block hash is 16 or 32 bytes, not " + std::to_string(v.size())));
  }
  return BlockHash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size()));
}

std::vector<BlockHash> HashesOf(const std::vector<py::bytes>& hs) {
  std::vector<BlockHash> out;
  out.reserve(hs.size());
  for (const py::bytes& h : hs) out.push_back(HashOf(h));
  return out;
}

py::tuple ResultTuple(const BlockResult& r) {
  return py::make_tuple(std::string(StatusCodeName(r.status.code())), std::string(TierKindName(r.tier)), r.page,
                        r.duplicate);
}

py::list Results(const std::vector<BlockResult>& rs) {
  py::list out;
  for (const BlockResult& r : rs) out.append(ResultTuple(r));
  return out;
}

ModelLayout LayoutOf(const py::dict& d) {
  ModelLayout l;
  l.model_id = d["model"].cast<std::string>();
  l.num_layers = d["layers"].cast<uint32_t>();
  l.kv_heads = d["kv_heads"].cast<uint32_t>();
  l.head_dim = d["head_dim"].cast<uint32_t>();
  const std::string dtype = d["dtype"].cast<std::string>();
  if (!ParseDType(dtype, &l.dtype)) Raise(InvalidArgument("dtype '" + dtype + "' is not known"));
  l.tokens_per_block = d["tokens_per_block"].cast<uint32_t>();
  l.block_bytes = d.contains("block_bytes") && !d["block_bytes"].is_none() ? d["block_bytes"].cast<uint64_t>()
                                                                           : l.NaturalBlockBytes();
  return l;
}

// ---- client ---------------------------------------------------------------------------

// What a Python Client and its Pages share (python/client_handle.h).
using Handle = ClientHandlePtr;

// Runs `fn(client)` with the GIL released and the client's lock held.
template <class Fn>
auto Call(const Handle& h, Fn&& fn) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(h->mu);
  return fn(*h->client);
}

// One page of a tier as a buffer over the pool's shared memory: writable while the
// session may write it (Client::PageWritable, asked each time a view is made), read-only
// otherwise, so a write into a committed or acquired page raises instead of faulting.
struct Page {
  Handle handle;
  TierKind tier;
  PageId page;
  uint8_t* data;
  size_t size;
};

// A load StartLoad began (Client::StartLoad), with the client that holds its blocks.
struct LayeredLoad {
  Handle handle;
  std::shared_ptr<KvLoad> load;
};

Handle Connect(const py::dict& layout, const std::string& socket, const std::string& name, size_t hash_bytes,
               int timeout_ms, const std::string& device, int cuda_device, const std::string& routable_id,
               int data_parallel_rank, const std::string& event_hashes, int event_group,
               const std::string& event_spec_kind, uint32_t event_sliding_window, uint32_t event_block_tokens) {
  ClientOptions o;
  o.event_group.index = event_group;
  o.event_group.sliding_window = event_sliding_window;
  o.event_group.block_tokens = event_block_tokens;
  if (!event_spec_kind.empty()) {
    const std::optional<std::string_view> kind = EventSpecKind(event_spec_kind);
    if (!kind) Raise(InvalidArgument("event_spec_kind '" + event_spec_kind + "' is not a vLLM KVCacheSpecKind value"));
    o.event_group.kind = *kind;
  }
  if (event_hashes == "vllm") {
    o.event_hashes = EventHashForm::kVllm;
  } else if (event_hashes == "sglang") {
    o.event_hashes = EventHashForm::kSglang;
  } else if (event_hashes == "none") {
    o.event_hashes = EventHashForm::kNone;
  } else {
    Raise(InvalidArgument("event_hashes must be \"vllm\", \"sglang\" or \"none\", not \"" + event_hashes + "\""));
  }
  o.socket_path = socket;
  o.engine_name = name;
  o.routable_id = routable_id;
  o.data_parallel_rank = data_parallel_rank;
  o.layout = LayoutOf(layout);
  o.hash_bytes = hash_bytes;
  o.timeout_ms = timeout_ms;
  o.device = device;
  o.cuda_device = cuda_device;
  Result<std::unique_ptr<Client>> c = [&] {
    py::gil_scoped_release nogil;
    return Client::Connect(o);
  }();
  auto h = std::make_shared<ClientHandle>();
  h->client = Unwrap(std::move(c));
  return h;
}

EngineKv KvOf(const std::vector<uintptr_t>& layers, uint32_t num_blocks, int kind, uintptr_t stream,
              uint64_t block_stride = 0) {
  EngineKv kv;
  kv.layout = kind == 0 ? KvLayoutKind::kKvFirst : KvLayoutKind::kBlockFirst;
  kv.block_stride_bytes = block_stride;
  kv.num_blocks = num_blocks;
  for (uintptr_t p : layers) kv.layers.push_back(reinterpret_cast<void*>(p));
  kv.stream = reinterpret_cast<void*>(stream);
  return kv;
}

// Parents: b"" is "no parent" (the first block of a sequence).
std::vector<BlockHash> ParentsOf(const std::optional<std::vector<py::bytes>>& hs) {
  std::vector<BlockHash> out;
  if (!hs) return out;
  out.reserve(hs->size());
  for (const py::bytes& h : *hs) out.push_back(std::string_view(h).empty() ? BlockHash() : HashOf(h));
  return out;
}

// A commit's keys over storage the caller keeps alive (`extra`: the msgpack bytes).
CommitKeys KeysOf(const std::vector<uint32_t>& token_ids, const std::string& extra, const std::string& lora_name,
                  uint32_t lora_id) {
  return {.token_ids = token_ids,
          .extra_keys = std::span(reinterpret_cast<const uint8_t*>(extra.data()), extra.size()),
          .lora_name = lora_name,
          .lora_id = lora_id};
}

// ---- control client -------------------------------------------------------------------

py::dict StatsDict(const DaemonStats& s) {
  py::dict d;
  d["version"] = s.version;
  d["uptime_s"] = s.uptime_s;
  d["metrics_url"] = s.metrics_url;
  d["epoch"] = s.epoch;
  d["sessions"] = s.session_count;
  d["lookups"] = s.lookups;
  d["block_hits"] = s.block_hits;
  d["block_misses"] = s.block_misses;
  d["checksum_failures"] = s.checksum_failures;
  d["io_errors"] = s.io_errors;
  d["demotions"] = s.demotions;
  d["promotions"] = s.promotions;
  d["evictions"] = s.evictions;
  d["draining"] = s.draining;
  py::dict tiers;
  for (const TierStatsInfo& t : s.tiers) {
    py::dict x;
    x["page_bytes"] = t.page_bytes;
    x["capacity_pages"] = t.capacity_pages;
    x["free_pages"] = t.free_pages;
    x["leased_pages"] = t.leased_pages;
    x["inflight_pages"] = t.inflight_pages;
    x["cached_pages"] = t.cached_pages;
    x["referenced_pages"] = t.referenced_pages;
    x["quarantined_pages"] = t.quarantined_pages;
    x["blocks"] = t.blocks;
    x["ready"] = t.ready;
    tiers[py::str(t.name)] = x;
  }
  d["tiers"] = tiers;
  py::list agents;
  for (const AgentSessionStatsInfo& a : s.agent_sessions) {
    py::dict x;
    x["tenant"] = a.tenant;
    x["session"] = a.session;
    x["state"] = a.state;
    x["ttl_left_s"] = static_cast<double>(a.ttl_left_ms) / 1000.0;
    x["requests"] = a.requests;
    x["hit_tokens"] = a.hit_tokens;
    x["blocks"] = a.blocks;
    x["gpu_blocks"] = a.gpu_blocks;
    x["host_blocks"] = a.host_blocks;
    x["protected_blocks"] = a.protected_blocks;
    agents.append(x);
  }
  d["agent_sessions"] = agents;
  return d;
}

}  // namespace

PYBIND11_MODULE(_kvtier, m) {
  m.doc() = "Native half of the kvtier package: the kvtierd client library.";

  // kvtier.Error and its subclasses, one per status code.
  py::object base = py::reinterpret_steal<py::object>(
      PyErr_NewExceptionWithDoc("kvtier.Error", "A kvtier call failed; .code names the status.", nullptr, nullptr));
  m.attr("Error") = base;
  g_errors[0] = base.ptr();
  static const std::pair<StatusCode, const char*> kNames[] = {
      {StatusCode::kInvalidArgument, "InvalidArgumentError"},
      {StatusCode::kNotFound, "NotFoundError"},
      {StatusCode::kAlreadyExists, "AlreadyExistsError"},
      {StatusCode::kResourceExhausted, "ResourceExhaustedError"},
      {StatusCode::kFailedPrecondition, "FailedPreconditionError"},
      {StatusCode::kAborted, "AbortedError"},
      {StatusCode::kUnavailable, "UnavailableError"},
      {StatusCode::kDataLoss, "DataLossError"},
      {StatusCode::kPermissionDenied, "PermissionDeniedError"},
      {StatusCode::kUnimplemented, "UnimplementedError"},
      {StatusCode::kInternal, "InternalError"},
      {StatusCode::kDeadlineExceeded, "DeadlineExceededError"},
  };
  for (const auto& [code, name] : kNames) {
    // A timeout is an UnavailableError too, so code that retries on UnavailableError still
    // retries it; code that must not retry a timeout at once catches DeadlineExceededError.
    PyObject* parent =
        code == StatusCode::kDeadlineExceeded ? g_errors[static_cast<int>(StatusCode::kUnavailable)] : base.ptr();
    py::object sub =
        py::reinterpret_steal<py::object>(PyErr_NewException((std::string("kvtier.") + name).c_str(), parent, nullptr));
    m.attr(name) = sub;
    g_errors[static_cast<int>(code)] = sub.release().ptr();  // kept for the process's life
  }
  base.inc_ref();

  py::class_<Page>(m, "Page", py::buffer_protocol(),
                   "One page of a tier: a buffer over shared memory, writable only while the session may write it.")
      .def_buffer([](Page& p) {
        const bool writable = Call(p.handle, [&](Client& c) { return c.PageWritable(p.tier, p.page); });
        return py::buffer_info(p.data, 1, py::format_descriptor<uint8_t>::format(), 1, {p.size}, {1}, !writable);
      })
      .def_property_readonly(
          "writable",
          [](const Page& p) { return Call(p.handle, [&](Client& c) { return c.PageWritable(p.tier, p.page); }); })
      .def_property_readonly("tier", [](const Page& p) { return std::string(TierKindName(p.tier)); })
      .def_property_readonly("page", [](const Page& p) { return p.page; })
      .def_property_readonly("nbytes", [](const Page& p) { return p.size; })
      .def_property_readonly("address", [](const Page& p) { return reinterpret_cast<uintptr_t>(p.data); })
      .def("__len__", [](const Page& p) { return p.size; });

  py::class_<ClientHandle, Handle>(m, "Client")
      .def(py::init(&Connect), py::arg("layout"), py::arg("socket") = "", py::arg("name") = "python",
           py::arg("hash_bytes") = 16, py::arg("timeout_ms") = 60000, py::arg("device") = "auto",
           py::arg("cuda_device") = 0, py::arg("routable_id") = "", py::arg("data_parallel_rank") = -1,
           py::arg("event_hashes") = "vllm", py::arg("event_group") = -1, py::arg("event_spec_kind") = "",
           py::arg("event_sliding_window") = 0, py::arg("event_block_tokens") = 0)
      .def("close", [](const Handle& h) { Call(h, [](Client& c) { c.Close(); }); })
      // Every accessor under the client's lock: close() on another thread changes what they read.
      .def_property_readonly("closed", [](const Handle& h) { return Call(h, [](Client& c) { return c.closed(); }); })
      .def_property_readonly("session_id",
                             [](const Handle& h) { return Call(h, [](Client& c) { return c.session_id(); }); })
      .def_property_readonly("daemon_epoch",
                             [](const Handle& h) { return Call(h, [](Client& c) { return c.daemon_epoch(); }); })
      .def_property_readonly(
          "namespace_id",
          [](const Handle& h) { return Call(h, [](Client& c) { return std::string(c.namespace_id()); }); })
      .def_property_readonly("hash_bytes",
                             [](const Handle& h) { return Call(h, [](Client& c) { return c.hash_bytes(); }); })
      .def_property_readonly(
          "device_backend",
          [](const Handle& h) { return Call(h, [](Client& c) { return std::string(c.device_backend()); }); })
      .def("open_device",
           [](const Handle& h) { return std::string(Unwrap(Call(h, [](Client& c) { return c.OpenDevice(); }))); })
      .def(
          "page_bytes",
          [](const Handle& h, const std::string& tier) {
            const TierKind t = ParseTier(tier);
            return Call(h, [&](Client& c) { return c.page_bytes(t); });
          },
          py::arg("tier"))
      .def(
          "allocate",
          [](const Handle& h, uint32_t count, const std::string& tier) {
            const TierKind t = ParseTier(tier);
            return Unwrap(Call(h, [&](Client& c) { return c.Allocate(t, count); }));
          },
          py::arg("count"), py::arg("tier") = "host")
      .def(
          "page",
          [](const Handle& h, uint32_t page, const std::string& tier) {
            const TierKind t = ParseTier(tier);
            const std::span<uint8_t> bytes = Call(h, [&](Client& c) { return c.PageBytes(t, page); });
            if (bytes.empty())
              Raise(NotFound("page " + std::to_string(page) + " of the " + tier + " tier is not mapped here"));
            return Page{h, t, page, bytes.data(), bytes.size()};
          },
          py::arg("page"), py::arg("tier") = "host")
      .def(
          "page_address",
          [](const Handle& h, uint32_t page, const std::string& tier) {
            const TierKind t = ParseTier(tier);
            return reinterpret_cast<uintptr_t>(Call(h, [&](Client& c) { return c.PageAddress(t, page); }));
          },
          py::arg("page"), py::arg("tier") = "host")
      .def(
          "commit",
          [](const Handle& h, const std::vector<PageId>& pages, const std::vector<py::bytes>& hashes,
             const std::optional<std::vector<py::bytes>>& parents, const std::string& tier, bool retain,
             const std::vector<uint32_t>& token_ids, const py::bytes& extra_keys, const std::string& lora_name,
             uint32_t lora_id) {
            if (pages.size() != hashes.size() || (parents && parents->size() != pages.size())) {
              Raise(InvalidArgument("commit: one hash (and parent) per page"));
            }
            const TierKind t = ParseTier(tier);
            std::vector<CommitEntry> e(pages.size());
            for (size_t i = 0; i < pages.size(); ++i) {
              e[i].page = pages[i];
              e[i].hash = HashOf(hashes[i]);
              if (parents) e[i].parent = ParentsOf(std::vector<py::bytes>{(*parents)[i]})[0];
            }
            const std::string extra = extra_keys;
            const CommitKeys keys = KeysOf(token_ids, extra, lora_name, lora_id);
            return Results(Unwrap(Call(h, [&](Client& c) { return c.Commit(t, e, retain, keys); })));
          },
          py::arg("pages"), py::arg("hashes"), py::arg("parents") = py::none(), py::arg("tier") = "host",
          py::arg("retain") = false, py::arg("token_ids") = std::vector<uint32_t>(),
          py::arg("extra_keys") = py::bytes(), py::arg("lora_name") = "", py::arg("lora_id") = 0)
      .def(
          "release",
          [](const Handle& h, const std::vector<PageId>& pages, const std::vector<py::bytes>& hashes,
             const std::string& tier) {
            const TierKind t = ParseTier(tier);
            const auto hs = HashesOf(hashes);
            auto r = Unwrap(Call(h, [&](Client& c) { return c.Release(t, pages, hs); }));
            py::list out;
            for (const Status& s : r) out.append(std::string(StatusCodeName(s.code())));
            return out;
          },
          py::arg("pages") = std::vector<PageId>{}, py::arg("hashes") = std::vector<py::bytes>{},
          py::arg("tier") = "host")
      .def(
          "lookup",
          [](const Handle& h, const std::vector<py::bytes>& chain) {
            const auto hs = HashesOf(chain);
            LookupResult r = Unwrap(Call(h, [&](Client& c) { return c.Lookup(hs); }));
            py::list tiers;
            for (TierKind t : r.tiers) tiers.append(std::string(TierKindName(t)));
            return py::make_tuple(r.matched, tiers);
          },
          py::arg("chain"))
      .def(
          "acquire",
          [](const Handle& h, const std::vector<py::bytes>& hashes, bool prefix) {
            const auto hs = HashesOf(hashes);
            return Results(Unwrap(Call(h, [&](Client& c) { return prefix ? c.AcquirePrefix(hs) : c.Acquire(hs); })));
          },
          py::arg("hashes"), py::arg("prefix") = false)
      .def(
          "start_lookup",
          [](const Handle& h, const std::vector<py::bytes>& chain) {
            const auto hs = HashesOf(chain);
            return Unwrap(Call(h, [&](Client& c) { return c.StartLookup(hs); }));
          },
          py::arg("chain"))
      .def(
          "wait_lookup",
          [](const Handle& h, Ticket t) {
            LookupResult r = Unwrap(Call(h, [&](Client& c) { return c.WaitLookup(t); }));
            py::list tiers;
            for (TierKind k : r.tiers) tiers.append(std::string(TierKindName(k)));
            return py::make_tuple(r.matched, tiers);
          },
          py::arg("ticket"))
      .def(
          "start_acquire",
          [](const Handle& h, const std::vector<py::bytes>& hashes, bool prefix) {
            const auto hs = HashesOf(hashes);
            return Unwrap(Call(h, [&](Client& c) { return c.StartAcquire(hs, prefix); }));
          },
          py::arg("hashes"), py::arg("prefix") = false)
      .def(
          "wait_acquire",
          [](const Handle& h, Ticket t) {
            return Results(Unwrap(Call(h, [&](Client& c) { return c.WaitAcquire(t); })));
          },
          py::arg("ticket"))
      .def(
          "ping", [](const Handle& h, size_t payload) { Check(Call(h, [&](Client& c) { return c.Ping(payload); })); },
          py::arg("payload_bytes") = 0)
      .def("alive", [](const Handle& h) { Check(Call(h, [](Client& c) { return c.Alive(); })); })
      .def(
          "hint",
          [](const Handle& h, const std::string& session, const std::vector<py::bytes>& chain, int64_t ttl_ms, bool end,
             uint64_t hit_tokens) {
            const auto hs = HashesOf(chain);
            return Unwrap(Call(h, [&](Client& c) { return c.Hint(session, hs, ttl_ms, end, hit_tokens); }));
          },
          py::arg("session"), py::arg("chain"), py::arg("ttl_ms") = -1, py::arg("end") = false,
          py::arg("hit_tokens") = 0)
      .def(
          "store_blocks",
          [](const Handle& h, const std::vector<uintptr_t>& layers, uint32_t num_blocks, int kind,
             const std::vector<uint32_t>& blocks, const std::vector<py::bytes>& hashes,
             const std::optional<std::vector<py::bytes>>& parents, uintptr_t stream, uint64_t block_stride,
             const std::vector<uint32_t>& token_ids, const py::bytes& extra_keys, const std::string& lora_name,
             uint32_t lora_id) {
            const EngineKv kv = KvOf(layers, num_blocks, kind, stream, block_stride);
            const auto hs = HashesOf(hashes);
            const auto ps = ParentsOf(parents);
            const std::string extra = extra_keys;
            const CommitKeys keys = KeysOf(token_ids, extra, lora_name, lora_id);
            return Results(Unwrap(Call(h, [&](Client& c) { return c.StoreBlocks(kv, blocks, hs, ps, keys); })));
          },
          py::arg("layers"), py::arg("num_blocks"), py::arg("kind"), py::arg("blocks"), py::arg("hashes"),
          py::arg("parents") = py::none(), py::arg("stream") = 0, py::arg("block_stride") = 0,
          py::arg("token_ids") = std::vector<uint32_t>(), py::arg("extra_keys") = py::bytes(),
          py::arg("lora_name") = "", py::arg("lora_id") = 0)
      .def(
          "start_load",
          [](const Handle& h, const std::vector<uintptr_t>& layers, uint32_t num_blocks, int kind,
             const std::vector<py::bytes>& chain, const std::vector<uint32_t>& blocks, uint64_t block_stride) {
            const EngineKv kv = KvOf(layers, num_blocks, kind, 0, block_stride);
            const auto hs = HashesOf(chain);
            KvLoad load = Unwrap(Call(h, [&](Client& c) { return c.StartLoad(kv, hs, blocks); }));
            return LayeredLoad{h, std::make_shared<KvLoad>(std::move(load))};
          },
          py::arg("layers"), py::arg("num_blocks"), py::arg("kind"), py::arg("chain"), py::arg("blocks"),
          py::arg("block_stride") = 0)
      .def(
          "load_blocks",
          [](const Handle& h, const std::vector<uintptr_t>& layers, uint32_t num_blocks, int kind,
             const std::vector<py::bytes>& chain, const std::vector<uint32_t>& blocks, uintptr_t stream,
             uint64_t block_stride) {
            const EngineKv kv = KvOf(layers, num_blocks, kind, stream, block_stride);
            const auto hs = HashesOf(chain);
            return Unwrap(Call(h, [&](Client& c) { return c.LoadBlocks(kv, hs, blocks); }));
          },
          py::arg("layers"), py::arg("num_blocks"), py::arg("kind"), py::arg("chain"), py::arg("blocks"),
          py::arg("stream") = 0, py::arg("block_stride") = 0);

  py::class_<LayeredLoad>(m, "KvLoad")
      .def_property_readonly("loaded", [](const LayeredLoad& l) { return l.load->loaded(); })
      .def(
          "scatter",
          [](const LayeredLoad& l, uint32_t first, uint32_t last, uintptr_t stream, bool wait) {
            Check(Call(l.handle, [&](Client& c) {
              return c.ScatterLayers(*l.load, first, last, reinterpret_cast<void*>(stream), wait);
            }));
          },
          py::arg("first"), py::arg("last"), py::arg("stream") = 0, py::arg("wait") = true)
      .def("finish",
           [](const LayeredLoad& l) { Check(Call(l.handle, [&](Client& c) { return c.FinishLoad(*l.load); })); });

  py::class_<ControlClient, std::shared_ptr<ControlClient>>(m, "ControlClient")
      .def(py::init([](const std::string& socket, const std::string& name, int timeout_ms) {
             ControlClientOptions o;
             o.socket_path = socket;
             o.name = name;
             o.timeout_ms = timeout_ms;
             Result<std::unique_ptr<ControlClient>> c = [&] {
               py::gil_scoped_release nogil;
               return ControlClient::Connect(o);
             }();
             return std::shared_ptr<ControlClient>(Unwrap(std::move(c)));
           }),
           py::arg("socket") = "", py::arg("name") = "python-control", py::arg("timeout_ms") = 60000)
      .def(
          "stats",
          [](ControlClient& c, bool sessions, bool agent_sessions) {
            Result<DaemonStats> s = [&] {
              py::gil_scoped_release nogil;
              return c.Stats(sessions, agent_sessions);
            }();
            return StatsDict(Unwrap(std::move(s)));
          },
          py::arg("sessions") = false, py::arg("agent_sessions") = false)
      .def("ping",
           [](ControlClient& c) {
             Status st = [&] {
               py::gil_scoped_release nogil;
               return c.Ping();
             }();
             Check(st);
           })
      .def(
          "hint",
          [](ControlClient& c, const std::string& namespace_id, const std::string& session,
             const std::vector<py::bytes>& chain, int64_t ttl_ms, bool end, bool prefetch) {
            const auto hs = HashesOf(chain);
            Result<uint32_t> r = [&] {
              py::gil_scoped_release nogil;
              return c.Hint(namespace_id, session, hs, ttl_ms, end, prefetch);
            }();
            return Unwrap(std::move(r));
          },
          py::arg("namespace_id"), py::arg("session"), py::arg("chain"), py::arg("ttl_ms") = -1, py::arg("end") = false,
          py::arg("prefetch") = false);
}
