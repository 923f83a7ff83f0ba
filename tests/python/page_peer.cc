// The C++ side of the Python tests' cross-process checks: an engine process on the C++
// client that reads a block's bytes into a file, or stores a file's bytes as a block.
//   kvtier-py-peer read  SOCKET MODEL LAYERS KV_HEADS HEAD_DIM DTYPE TOKENS HASH_HEX FILE
//   kvtier-py-peer write SOCKET MODEL LAYERS KV_HEADS HEAD_DIM DTYPE TOKENS HASH_HEX FILE
// Exit 0 on success; 3 when the block is not cached (read); 1 on any other error.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/client.h"

int main(int argc, char** argv) {
  using namespace kvtier;
  if (argc != 11) {
    std::fprintf(stderr, "usage: %s read|write SOCKET MODEL LAYERS KV_HEADS HEAD_DIM DTYPE TOKENS HASH_HEX FILE\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  ClientOptions o;
  o.socket_path = argv[2];
  o.engine_name = "py-peer";
  o.layout.model_id = argv[3];
  o.layout.num_layers = static_cast<uint32_t>(std::atoi(argv[4]));
  o.layout.kv_heads = static_cast<uint32_t>(std::atoi(argv[5]));
  o.layout.head_dim = static_cast<uint32_t>(std::atoi(argv[6]));
  if (!ParseDType(argv[7], &o.layout.dtype)) return 2;
  o.layout.tokens_per_block = static_cast<uint32_t>(std::atoi(argv[8]));
  o.layout.block_bytes = o.layout.NaturalBlockBytes();
  std::string raw;
  if (!HexDecode(argv[9], &raw) || !BlockHash::ValidSize(raw.size())) return 2;
  o.hash_bytes = raw.size();
  const BlockHash hash(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(raw.data()), raw.size()));
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "connect: %s\n", c.status().ToString().c_str());
    return 1;
  }
  const size_t n = o.layout.block_bytes;
  if (mode == "read") {
    auto got = (*c)->Acquire({&hash, 1});
    if (!got.ok()) return 1;
    if (!(*got)[0].status.ok()) return 3;
    auto bytes = (*c)->PageBytes((*got)[0].tier, (*got)[0].page);
    std::ofstream(argv[10], std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<long>(n));
    return (*c)->Release(TierKind::kHost, {}, {&hash, 1}).ok() ? 0 : 1;
  }
  std::ifstream in(argv[10], std::ios::binary);
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() != n) return 1;
  auto pages = (*c)->Allocate(TierKind::kHost, 1);
  if (!pages.ok()) return 1;
  std::memcpy((*c)->PageBytes(TierKind::kHost, (*pages)[0]).data(), data.data(), n);
  CommitEntry e{(*pages)[0], hash, {}};
  auto r = (*c)->Commit(TierKind::kHost, {&e, 1});
  return r.ok() && (*r)[0].status.ok() ? 0 : 1;
}
