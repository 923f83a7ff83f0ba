/* Exercises the C ABI from C: two clients, one stores a block, the other finds and reads
 * it. Exit 0 and "c api ok" on success; the failing step otherwise. */
#include <stdio.h>
#include <string.h>

#include "engine/kvtier.h"

#define CHECK(cond, what)                                              \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "c api: %s failed: %s\n", what, kvtier_last_error(NULL)); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

int main(int argc, char** argv) {
  kvtier_layout layout = {"c-model", 2, 2, 64, KVTIER_DTYPE_BF16, 16, 0};
  kvtier_client* a = NULL;
  kvtier_client* b = NULL;
  uint32_t page = 0;
  uint8_t hash[16];
  kvtier_block_result res;
  size_t matched = 99;
  kvtier_tier tiers[1];
  uint8_t* bytes;
  size_t i;
  if (argc < 2) return 2;
  for (i = 0; i < sizeof(hash); ++i) hash[i] = (uint8_t)(i * 3 + 1);

  CHECK(kvtier_connect(argv[1], "c-writer", &layout, 16, &a) == KVTIER_OK, "connect a");
  CHECK(kvtier_connect(argv[1], "c-reader", &layout, 16, &b) == KVTIER_OK, "connect b");
  CHECK(kvtier_page_bytes(a, KVTIER_TIER_HOST) >= 16384, "page_bytes");
  CHECK(kvtier_allocate(a, KVTIER_TIER_HOST, 1, &page) == KVTIER_OK, "allocate");
  bytes = (uint8_t*)kvtier_page_data(a, KVTIER_TIER_HOST, page);
  CHECK(bytes != NULL, "page_data a");
  memset(bytes, 0xc5, 16384);
  CHECK(kvtier_commit(a, KVTIER_TIER_HOST, &page, hash, NULL, 1, 0, &res) == KVTIER_OK, "commit");
  CHECK(res.status == KVTIER_OK && !res.duplicate, "commit result");

  CHECK(kvtier_lookup(b, hash, 1, &matched, tiers) == KVTIER_OK, "lookup");
  CHECK(matched == 1 && tiers[0] == KVTIER_TIER_HOST, "lookup result");
  CHECK(kvtier_acquire(b, hash, 1, &res) == KVTIER_OK && res.status == KVTIER_OK, "acquire");
  bytes = (uint8_t*)kvtier_page_data(b, KVTIER_TIER_HOST, res.page);
  CHECK(bytes != NULL && bytes[0] == 0xc5 && bytes[16383] == 0xc5, "bytes seen by b");
  CHECK(kvtier_release_hashes(b, hash, 1, NULL) == KVTIER_OK, "release");
  /* An agentic session's hint names the cached prefix of its chain; an empty id is refused. */
  uint32_t hinted = 0;
  CHECK(kvtier_hint(b, "c-session", hash, 1, 30000, 0, 16, &hinted) == KVTIER_OK && hinted == 1, "hint");
  CHECK(kvtier_hint(b, "", hash, 1, -1, 1, 0, NULL) == KVTIER_INVALID_ARGUMENT, "hint without a session id");

  /* A per-call error is reported, and the client stays usable. */
  CHECK(kvtier_allocate(a, KVTIER_TIER_HOST, 100000, &page) == KVTIER_INVALID_ARGUMENT, "oversized allocate");
  CHECK(strlen(kvtier_last_error(a)) > 0, "last_error set");
  CHECK(kvtier_lookup(a, hash, 1, &matched, NULL) == KVTIER_OK && matched == 1, "lookup after error");
  kvtier_close(a);
  kvtier_close(b);
  CHECK(kvtier_connect("/nonexistent/kvtier.sock", "x", &layout, 16, &a) == KVTIER_UNAVAILABLE,
        "connect to nothing");
  printf("c api ok\n");
  return 0;
}
