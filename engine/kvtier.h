/* kvtier.h: the C ABI of the kvtier engine client, for Python (ctypes/cffi), Rust and
 * other bindings. A thin layer over kvtier::Client (engine/client.h); the same rules hold:
 * one kvtier_client is one session, closing it ends the session, and no call aborts the
 * process.
 *
 * Errors: every call returns a kvtier_status (0 = KVTIER_OK). The message of the last
 * failed call on a client is kvtier_last_error(client), valid until its next call.
 * Arrays passed in are read during the call only; arrays passed out are written by the
 * call and must have the room the comment names. Hashes are passed flat: n x hash_bytes.
 *
 * Thread-compatible: one client per thread, or serialize calls on it. */
#ifndef KVTIER_H_
#define KVTIER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as the protocol's Status enum. */
typedef enum kvtier_status {
  KVTIER_OK = 0,
  KVTIER_INVALID_ARGUMENT = 1,
  KVTIER_NOT_FOUND = 2,
  KVTIER_ALREADY_EXISTS = 3,
  KVTIER_RESOURCE_EXHAUSTED = 4,
  KVTIER_FAILED_PRECONDITION = 5,
  KVTIER_ABORTED = 6,
  KVTIER_UNAVAILABLE = 7,
  KVTIER_DATA_LOSS = 8,
  KVTIER_PERMISSION_DENIED = 9,
  KVTIER_UNIMPLEMENTED = 10,
  KVTIER_INTERNAL = 11,
  KVTIER_DEADLINE_EXCEEDED = 12 /* no response within the client's timeout */
} kvtier_status;

typedef enum kvtier_tier { KVTIER_TIER_GPU = 0, KVTIER_TIER_HOST = 1, KVTIER_TIER_NVME = 2 } kvtier_tier;

typedef enum kvtier_dtype {
  KVTIER_DTYPE_FP16 = 1,
  KVTIER_DTYPE_BF16 = 2,
  KVTIER_DTYPE_FP8_E4M3 = 3,
  KVTIER_DTYPE_FP8_E5M2 = 4,
  KVTIER_DTYPE_INT8 = 5,
  KVTIER_DTYPE_FP32 = 6
} kvtier_dtype;

typedef struct kvtier_layout {
  const char* model_id;
  uint32_t num_layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  kvtier_dtype dtype;
  uint32_t tokens_per_block;
  uint64_t block_bytes; /* 0: 2 x layers x kv_heads x head_dim x dtype bytes x tokens */
} kvtier_layout;

typedef struct kvtier_block_result {
  kvtier_status status;
  kvtier_tier tier;
  uint32_t page;
  int duplicate; /* commit: the block existed already */
} kvtier_block_result;

typedef struct kvtier_client kvtier_client;

/* An engine's paged KV cache: one tensor per layer (device memory, or host memory with
 * the host-emulated backend), laid out [2, num_blocks, tokens, heads, dim] (KV_FIRST) or
 * [num_blocks, 2, tokens, heads, dim] (BLOCK_FIRST), geometry from the connect layout. */
typedef enum kvtier_kv_layout { KVTIER_KV_FIRST = 0, KVTIER_BLOCK_FIRST = 1 } kvtier_kv_layout;
typedef struct kvtier_engine_kv {
  kvtier_kv_layout layout;
  uint32_t num_blocks;
  void* const* layers; /* num_layers tensors */
  uint32_t num_layers;
  void* stream; /* cudaStream_t, or NULL */
} kvtier_engine_kv;

/* Connects to socket_path (NULL or "": $KVTIER_SOCKET, else ./var/kvtierd.sock) and says
 * Hello. hash_bytes is 16 or 32. On success *out is a new client. */
kvtier_status kvtier_connect(const char* socket_path, const char* engine_name, const kvtier_layout* layout,
                             uint32_t hash_bytes, kvtier_client** out);
/* Ends the session (the daemon frees its leases and references). NULL is a no-op. */
void kvtier_close(kvtier_client* client);
/* Message of the last failed call on client ("" if none); with NULL, the last failed
 * kvtier_connect of this thread. */
const char* kvtier_last_error(const kvtier_client* client);
const char* kvtier_status_name(kvtier_status status);

/* Leases n pages; pages_out has room for n. */
kvtier_status kvtier_allocate(kvtier_client* client, kvtier_tier tier, uint32_t n, uint32_t* pages_out);
/* pages[i] becomes block hashes[i]; parents may be NULL (no parents) or n hashes (all-zero:
 * none). results has room for n. */
kvtier_status kvtier_commit(kvtier_client* client, kvtier_tier tier, const uint32_t* pages, const uint8_t* hashes,
                            const uint8_t* parents, size_t n, int retain, kvtier_block_result* results);
/* Releases leased pages or references by page; statuses (may be NULL) has room for n. */
kvtier_status kvtier_release_pages(kvtier_client* client, kvtier_tier tier, const uint32_t* pages, size_t n,
                                   kvtier_status* statuses);
/* Releases references by hash; statuses (may be NULL) has room for n. */
kvtier_status kvtier_release_hashes(kvtier_client* client, const uint8_t* hashes, size_t n, kvtier_status* statuses);
/* Longest cached prefix of a chain of n hashes: *matched, and tiers_out (may be NULL; room
 * for n) the tier of each matched block. */
kvtier_status kvtier_lookup(kvtier_client* client, const uint8_t* hashes, size_t n, size_t* matched,
                            kvtier_tier* tiers_out);
/* References n blocks; results has room for n (NOT_FOUND per missing block). */
kvtier_status kvtier_acquire(kvtier_client* client, const uint8_t* hashes, size_t n, kvtier_block_result* results);
/* An agentic session's hint: session (NUL-terminated, at most 256 bytes) used the cached
 * prefix of a chain of n hashes; it expects to be back within ttl_ms (-1: its last TTL
 * stands); end != 0: it has ended; hit_tokens: what its request loaded from kvtierd.
 * *blocks (may be NULL): the blocks the hint named. */
kvtier_status kvtier_hint(kvtier_client* client, const char* session, const uint8_t* hashes, size_t n, int64_t ttl_ms,
                          int end, uint64_t hit_tokens, uint32_t* blocks);

/* Pipelined lookup and acquire: start returns a ticket at once; wait blocks for it. */
kvtier_status kvtier_lookup_start(kvtier_client* client, const uint8_t* hashes, size_t n, uint64_t* ticket);
kvtier_status kvtier_lookup_wait(kvtier_client* client, uint64_t ticket, size_t* matched, kvtier_tier* tiers_out,
                                 size_t tiers_room);
kvtier_status kvtier_acquire_start(kvtier_client* client, const uint8_t* hashes, size_t n, uint64_t* ticket);
kvtier_status kvtier_acquire_wait(kvtier_client* client, uint64_t ticket, kvtier_block_result* results,
                                  size_t results_room);

/* Store: lease host pages, gather engine blocks into them on the engine's stream, commit
 * as hashes (parents may be NULL). results has room for n. */
kvtier_status kvtier_store_blocks(kvtier_client* client, const kvtier_engine_kv* kv, const uint32_t* engine_blocks,
                                  const uint8_t* hashes, const uint8_t* parents, size_t n,
                                  kvtier_block_result* results);
/* Load: lookup + acquire the cached prefix of n hashes, scatter it into engine_blocks,
 * release. *loaded: blocks loaded (a prefix of the chain). */
kvtier_status kvtier_load_blocks(kvtier_client* client, const kvtier_engine_kv* kv, const uint8_t* hashes, size_t n,
                                 const uint32_t* engine_blocks, size_t* loaded);

/* Address of a page in this process: host memory (host tier), device memory (GPU tier), or NULL. */
void* kvtier_page_data(const kvtier_client* client, kvtier_tier tier, uint32_t page);
/* Bytes per page of a tier (0: tier not offered). */
uint64_t kvtier_page_bytes(const kvtier_client* client, kvtier_tier tier);
uint64_t kvtier_session_id(const kvtier_client* client);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_H_ */
