// The C ABI (engine/kvtier.h) over kvtier::Client. No exception or abort crosses it: the
// client reports errors as Status, and every entry point runs its body in Guarded, which
// turns what the standard library may still throw (std::bad_alloc from a vector, a
// length_error) into a status and the last error.
#include <cstring>
#include <new>
#include <string>

#include "engine/client.h"
#include "engine/kvtier.h"

struct kvtier_client {
  std::unique_ptr<kvtier::Client> client;
  std::string last_error;
};

namespace {

// kvtier_connect's failures, for kvtier_last_error(NULL).
thread_local std::string g_connect_error;

using kvtier::BlockHash;
using kvtier::Status;

kvtier_status Fail(kvtier_client* c, const Status& s) {
  if (c) c->last_error = s.ToString();
  return static_cast<kvtier_status>(s.code());
}

kvtier_status Ok(kvtier_client* c) {
  c->last_error.clear();
  return KVTIER_OK;
}

std::vector<BlockHash> Hashes(const kvtier_client* c, const uint8_t* flat, size_t n) {
  const size_t hb = c->client->hash_bytes();
  std::vector<BlockHash> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.emplace_back(std::span<const uint8_t>(flat + i * hb, hb));
  return out;
}

kvtier::TierKind Tier(kvtier_tier t) { return static_cast<kvtier::TierKind>(t); }

void CopyResults(const std::vector<kvtier::BlockResult>& in, kvtier_block_result* out, size_t room) {
  for (size_t i = 0; i < in.size() && i < room; ++i) {
    out[i].status = static_cast<kvtier_status>(in[i].status.code());
    out[i].tier = static_cast<kvtier_tier>(in[i].tier);
    out[i].page = in[i].page;
    out[i].duplicate = in[i].duplicate ? 1 : 0;
  }
}

// Runs `body`; an exception becomes KVTIER_RESOURCE_EXHAUSTED (out of memory) or
// KVTIER_INTERNAL, recorded as the last error of `c` (of kvtier_connect when c is null).
template <class Body>
kvtier_status Guarded(kvtier_client* c, Body&& body) noexcept {
  std::string what;
  kvtier_status code = KVTIER_INTERNAL;
  try {
    return body();
  } catch (const std::bad_alloc&) {
    what = "out of memory";
    code = KVTIER_RESOURCE_EXHAUSTED;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  try {
    (c ? c->last_error : g_connect_error) = "kvtier C ABI: " + what;
  } catch (...) {
  }
  return code;
}

#define KVTIER_C_GUARD(c) \
  if ((c) == nullptr || !(c)->client) return KVTIER_INVALID_ARGUMENT;

}  // namespace

extern "C" {

kvtier_status kvtier_connect(const char* socket_path, const char* engine_name, const kvtier_layout* layout,
                             uint32_t hash_bytes, kvtier_client** out) {
  return Guarded(nullptr, [&]() -> kvtier_status {
    if (out == nullptr || layout == nullptr || layout->model_id == nullptr) return KVTIER_INVALID_ARGUMENT;
    *out = nullptr;
    kvtier::ClientOptions o;
    if (socket_path) o.socket_path = socket_path;
    if (engine_name) o.engine_name = engine_name;
    o.layout.model_id = layout->model_id;
    o.layout.num_layers = layout->num_layers;
    o.layout.kv_heads = layout->kv_heads;
    o.layout.head_dim = layout->head_dim;
    o.layout.dtype = static_cast<kvtier::DType>(layout->dtype);
    o.layout.tokens_per_block = layout->tokens_per_block;
    o.layout.block_bytes = layout->block_bytes ? layout->block_bytes : o.layout.NaturalBlockBytes();
    o.hash_bytes = hash_bytes;
    auto c = kvtier::Client::Connect(o);
    if (!c.ok()) {
      g_connect_error = c.status().ToString();
      return static_cast<kvtier_status>(c.status().code());
    }
    auto* handle = new (std::nothrow) kvtier_client;
    if (handle == nullptr) return KVTIER_RESOURCE_EXHAUSTED;
    handle->client = std::move(c).value();
    *out = handle;
    return KVTIER_OK;
  });
}

void kvtier_close(kvtier_client* client) { delete client; }

const char* kvtier_last_error(const kvtier_client* client) {
  return client ? client->last_error.c_str() : g_connect_error.c_str();
}

const char* kvtier_status_name(kvtier_status status) {
  const int v = static_cast<int>(status);
  if (v < 0 || v > kvtier::kMaxStatusCode) return "UNKNOWN";
  return kvtier::StatusCodeName(static_cast<kvtier::StatusCode>(v)).data();
}

kvtier_status kvtier_allocate(kvtier_client* c, kvtier_tier tier, uint32_t n, uint32_t* pages_out) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    if (pages_out == nullptr && n > 0) return Fail(c, kvtier::InvalidArgument("pages_out is NULL"));
    auto r = c->client->Allocate(Tier(tier), n);
    if (!r.ok()) return Fail(c, r.status());
    std::memcpy(pages_out, r->data(), r->size() * sizeof(uint32_t));
    return Ok(c);
  });
}

kvtier_status kvtier_commit(kvtier_client* c, kvtier_tier tier, const uint32_t* pages, const uint8_t* hashes,
                            const uint8_t* parents, size_t n, int retain, kvtier_block_result* results) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    if (n > 0 && (pages == nullptr || hashes == nullptr || results == nullptr)) {
      return Fail(c, kvtier::InvalidArgument("NULL array"));
    }
    std::vector<kvtier::CommitEntry> entries(n);
    auto hs = Hashes(c, hashes, n);
    std::vector<BlockHash> ps;
    if (parents) ps = Hashes(c, parents, n);
    for (size_t i = 0; i < n; ++i) {
      entries[i].page = pages[i];
      entries[i].hash = hs[i];
      if (parents && !ps[i].IsZero()) entries[i].parent = ps[i];
    }
    auto r = c->client->Commit(Tier(tier), entries, retain != 0);
    if (!r.ok()) return Fail(c, r.status());
    CopyResults(*r, results, n);
    return Ok(c);
  });
}

kvtier_status kvtier_release_pages(kvtier_client* c, kvtier_tier tier, const uint32_t* pages, size_t n,
                                   kvtier_status* statuses) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    if (n > 0 && pages == nullptr) return Fail(c, kvtier::InvalidArgument("pages is NULL"));
    auto r = c->client->Release(Tier(tier), std::span<const uint32_t>(pages, n));
    if (!r.ok()) return Fail(c, r.status());
    for (size_t i = 0; statuses && i < r->size() && i < n; ++i) {
      statuses[i] = static_cast<kvtier_status>((*r)[i].code());
    }
    return Ok(c);
  });
}

kvtier_status kvtier_release_hashes(kvtier_client* c, const uint8_t* hashes, size_t n, kvtier_status* statuses) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    if (n > 0 && hashes == nullptr) return Fail(c, kvtier::InvalidArgument("hashes is NULL"));
    auto hs = Hashes(c, hashes, n);
    auto r = c->client->Release(kvtier::TierKind::kHost, {}, hs);
    if (!r.ok()) return Fail(c, r.status());
    for (size_t i = 0; statuses && i < r->size() && i < n; ++i) {
      statuses[i] = static_cast<kvtier_status>((*r)[i].code());
    }
    return Ok(c);
  });
}

kvtier_status kvtier_lookup_start(kvtier_client* c, const uint8_t* hashes, size_t n, uint64_t* ticket) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    if ((n > 0 && hashes == nullptr) || ticket == nullptr) return Fail(c, kvtier::InvalidArgument("NULL argument"));
    auto t = c->client->StartLookup(Hashes(c, hashes, n));
    if (!t.ok()) return Fail(c, t.status());
    *ticket = *t;
    return Ok(c);
  });
}

kvtier_status kvtier_lookup_wait(kvtier_client* c, uint64_t ticket, size_t* matched, kvtier_tier* tiers_out,
                                 size_t tiers_room) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    auto r = c->client->WaitLookup(ticket);
    if (!r.ok()) return Fail(c, r.status());
    if (matched) *matched = r->matched;
    for (size_t i = 0; tiers_out && i < r->tiers.size() && i < tiers_room; ++i) {
      tiers_out[i] = static_cast<kvtier_tier>(r->tiers[i]);
    }
    return Ok(c);
  });
}

kvtier_status kvtier_lookup(kvtier_client* c, const uint8_t* hashes, size_t n, size_t* matched,
                            kvtier_tier* tiers_out) {
  uint64_t t = 0;
  kvtier_status s = kvtier_lookup_start(c, hashes, n, &t);
  if (s != KVTIER_OK) return s;
  return kvtier_lookup_wait(c, t, matched, tiers_out, n);
}

kvtier_status kvtier_hint(kvtier_client* c, const char* session, const uint8_t* hashes, size_t n, int64_t ttl_ms,
                          int end, uint64_t hit_tokens, uint32_t* blocks) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    if (session == nullptr || (n > 0 && hashes == nullptr)) return Fail(c, kvtier::InvalidArgument("NULL argument"));
    auto r = c->client->Hint(session, Hashes(c, hashes, n), ttl_ms, end != 0, hit_tokens);
    if (!r.ok()) return Fail(c, r.status());
    if (blocks) *blocks = *r;
    return Ok(c);
  });
}

kvtier_status kvtier_acquire_start(kvtier_client* c, const uint8_t* hashes, size_t n, uint64_t* ticket) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    if ((n > 0 && hashes == nullptr) || ticket == nullptr) return Fail(c, kvtier::InvalidArgument("NULL argument"));
    auto t = c->client->StartAcquire(Hashes(c, hashes, n));
    if (!t.ok()) return Fail(c, t.status());
    *ticket = *t;
    return Ok(c);
  });
}

kvtier_status kvtier_acquire_wait(kvtier_client* c, uint64_t ticket, kvtier_block_result* results,
                                  size_t results_room) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    auto r = c->client->WaitAcquire(ticket);
    if (!r.ok()) return Fail(c, r.status());
    if (results) CopyResults(*r, results, results_room);
    return Ok(c);
  });
}

kvtier_status kvtier_acquire(kvtier_client* c, const uint8_t* hashes, size_t n, kvtier_block_result* results) {
  uint64_t t = 0;
  kvtier_status s = kvtier_acquire_start(c, hashes, n, &t);
  if (s != KVTIER_OK) return s;
  return kvtier_acquire_wait(c, t, results, n);
}

void* kvtier_page_data(const kvtier_client* c, kvtier_tier tier, uint32_t page) {
  if (c == nullptr || !c->client) return nullptr;
  return c->client->PageAddress(Tier(tier), page);
}

static kvtier::EngineKv EngineKvOf(const kvtier_engine_kv* kv) {
  kvtier::EngineKv e;
  e.layout = static_cast<kvtier::KvLayoutKind>(kv->layout);
  e.num_blocks = kv->num_blocks;
  e.layers.assign(kv->layers, kv->layers + kv->num_layers);
  e.stream = kv->stream;
  return e;
}

kvtier_status kvtier_store_blocks(kvtier_client* c, const kvtier_engine_kv* kv, const uint32_t* engine_blocks,
                                  const uint8_t* hashes, const uint8_t* parents, size_t n,
                                  kvtier_block_result* results) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    if (kv == nullptr || (n > 0 && (engine_blocks == nullptr || hashes == nullptr || results == nullptr)) ||
        (kv->num_layers > 0 && kv->layers == nullptr)) {
      return Fail(c, kvtier::InvalidArgument("NULL argument"));
    }
    auto hs = Hashes(c, hashes, n);
    std::vector<BlockHash> ps;
    if (parents) ps = Hashes(c, parents, n);
    auto r = c->client->StoreBlocks(EngineKvOf(kv), std::span<const uint32_t>(engine_blocks, n), hs, ps);
    if (!r.ok()) return Fail(c, r.status());
    CopyResults(*r, results, n);
    return Ok(c);
  });
}

kvtier_status kvtier_load_blocks(kvtier_client* c, const kvtier_engine_kv* kv, const uint8_t* hashes, size_t n,
                                 const uint32_t* engine_blocks, size_t* loaded) {
  return Guarded(c, [&]() -> kvtier_status {
    KVTIER_C_GUARD(c);
    if (kv == nullptr || loaded == nullptr || (n > 0 && (engine_blocks == nullptr || hashes == nullptr)) ||
        (kv->num_layers > 0 && kv->layers == nullptr)) {
      return Fail(c, kvtier::InvalidArgument("NULL argument"));
    }
    auto r = c->client->LoadBlocks(EngineKvOf(kv), Hashes(c, hashes, n), std::span<const uint32_t>(engine_blocks, n));
    if (!r.ok()) return Fail(c, r.status());
    *loaded = *r;
    return Ok(c);
  });
}

uint64_t kvtier_page_bytes(const kvtier_client* c, kvtier_tier tier) {
  return (c && c->client) ? c->client->page_bytes(Tier(tier)) : 0;
}

uint64_t kvtier_session_id(const kvtier_client* c) { return (c && c->client) ? c->client->session_id() : 0; }

}  // extern "C"
