#pragma once
// FakeRedisNode: a hostile or broken "Redis node" for tests of what kvtier does with
// replies it must not trust: it listens on a loopback port below the kernel's ephemeral
// range (bound and kept, so no other process can take it between pick and use), reads
// RESP commands and answers each with whatever `handler` returns (raw RESP bytes). One
// thread serves every connection with poll and non-blocking sockets: a client that stops
// reading holds up no other (it is closed after 2 s without progress); every wait is
// bounded; the destructor closes everything.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "protocol/base/status.h"

namespace kvtier::testing {

class FakeRedisNode {
 public:
  // Raw RESP bytes, owned or shared (a reply of megabytes sent many times is not copied).
  struct Reply {
    Reply(std::string raw) : bytes(std::make_shared<const std::string>(std::move(raw))) {}  // NOLINT
    Reply(const char* raw) : Reply(std::string(raw)) {}                                     // NOLINT
    Reply(std::shared_ptr<const std::string> raw) : bytes(std::move(raw)) {}                // NOLINT
    std::shared_ptr<const std::string> bytes;
  };
  // The command's arguments (e.g. {"GET", "k"}) to the raw reply; an empty reply answers
  // nothing (a frozen node).
  using Handler = std::function<Reply(const std::vector<std::string>& args)>;
  explicit FakeRedisNode(Handler handler);
  ~FakeRedisNode();

  // Listens on `port`, or on one picked in [20000, 30000) when 0; kInternal when it (or
  // none) could be bound.
  Status Start(int port = 0);
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Commands answered so far.
  uint64_t commands() const { return commands_.load(); }

  // RESP helpers for handlers.
  static std::string Bulk(const std::string& s);
  // CLUSTER SLOTS naming one master, 127.0.0.1:port, for every slot.
  static std::string SlotsForOne(int port);
  // CLUSTER SLOTS naming `masters` masters (127.0.0.1:2, :3, ...: ports nothing listens
  // on), each for a 16-slot range.
  static std::string SlotsForMany(int masters);

 private:
  void Run();

  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::atomic<uint64_t> commands_{0};
  std::thread thread_;
};

}  // namespace kvtier::testing
