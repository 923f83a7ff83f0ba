#include "tests/fuzz/seed_inputs.h"

#include <string_view>

#include "daemon/config.h"
#include "daemon/events/kv_events.h"
#include "storage/remote/remote_tier.h"

namespace kvtier::fuzz {
namespace {

std::vector<uint8_t> Bytes(uint8_t mode, std::string_view body) {
  std::vector<uint8_t> v = {mode};
  v.insert(v.end(), body.begin(), body.end());
  return v;
}

// A reply stream as redis_reply's path 0 takes it: chunks of at most 64 bytes, each led by
// its length - 1.
std::vector<uint8_t> Chunked(std::string_view stream) {
  std::vector<uint8_t> v = {0};
  for (size_t at = 0; at < stream.size(); at += 64) {
    const std::string_view c = stream.substr(at, 64);
    v.push_back(static_cast<uint8_t>(c.size() - 1));
    v.insert(v.end(), c.begin(), c.end());
  }
  return v;
}

std::string Value(const RemoteCodec& codec, uint32_t length) {
  const std::string payload(length, '\x5a');
  const RemoteCodec::Nonce nonce{1, 2, 3};  // a fixed one: the seeds are reproducible
  const std::string head =
      codec.EncodeHeader("kvtier:0123", LowerBlockMeta{length, "fp", std::string(16, 'p')},
                         {reinterpret_cast<const uint8_t*>(payload.data()), payload.size()}, &nonce);
  return head + payload;
}

std::string Bulk(std::string_view s) { return "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n"; }

}  // namespace

const std::vector<std::string>& InputTargets() {
  static const std::vector<std::string> t = {"redis_reply", "events", "config"};
  return t;
}

std::vector<std::pair<std::string, std::vector<uint8_t>>> SeedInputs(const std::string& target) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  if (target == "redis_reply") {
    const RemoteCodec unkeyed;
    const RemoteCodec keyed = *RemoteCodec::Keyed("fuzz-fleet-secret-0123456789abcdef");
    out.push_back({"replies", Chunked("+OK\r\n:1\r\n$-1\r\n-MOVED 3999 127.0.0.1:6381\r\n-ASK 12 [::1]:7000\r\n"
                                      "-CLUSTERDOWN The cluster is down\r\n-OOM command not allowed\r\n"
                                      "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n" +
                                      Bulk("hello") + "*2\r\n$1\r\na\r\n:2\r\n")});
    out.push_back({"values", Chunked(Bulk(Value(unkeyed, 16)) + Bulk(Value(keyed, 1000)) + "$999999999\r\n")});
    const std::string slots = "*2\r\n*3\r\n:0\r\n:8191\r\n*3\r\n" + Bulk("127.0.0.1") + ":7000\r\n" + Bulk("id0") +
                              "*3\r\n:8192\r\n:16383\r\n*3\r\n" + Bulk("") + ":7001\r\n" + Bulk("id1");
    out.push_back({"slots", Bytes(1, slots)});
    out.push_back({"standalone", Bytes(1, "-ERR This instance has cluster support disabled\r\n")});
    out.push_back({"value-unkeyed", Bytes(2, Value(unkeyed, 16))});
    out.push_back({"value-keyed", Bytes(2, Value(keyed, 1000))});
  } else if (target == "events") {
    out.push_back({"replay", Bytes(0, std::string("id\xff\xff", 4) + std::string("\0\0\0\0\0\0\0\x07", 8))});
    AnnouncedStates s;
    s[{"kv@10.0.0.1:8000@llama", 2}].hashes[{TierKind::kHost, -1}] = {1, 2, 0xfedcba9876543210ull};
    s[{"kv@node@m", std::nullopt}] = AnnouncedState{true, {{{TierKind::kNvme, -1}, {7}}, {{TierKind::kHost, 2}, {9}}}};
    out.push_back({"state", Bytes(1, EncodeAnnouncedState(s))});
  } else if (target == "config") {
    const std::string d = DefaultConfigYaml();
    out.push_back({"default", std::vector<uint8_t>(d.begin(), d.end())});
    const std::string small =
        "socket: {path: /run/kvtier/k.sock}\n"
        "tiers:\n"
        "  host: {capacity: 1GiB, page_bytes: 2MiB}\n"
        "  remote: {nodes: ['10.0.0.5:7000'], secret_file: /etc/kvtier/secret, max_nodes: 8}\n"
        "events: {publish: 'tcp://127.0.0.1:5590', max_subscribers: 4}\n"
        "security: {tenants: [{name: a, uids: [1000], quota: {host: 1GiB}}]}\n";
    out.push_back({"small", std::vector<uint8_t>(small.begin(), small.end())});
  }
  return out;
}

}  // namespace kvtier::fuzz
