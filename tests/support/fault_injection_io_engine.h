#pragma once
// FaultInjectionIoEngine: an IoEngine wrapper that makes chosen requests fail, for tests
// (as RocksDB's FaultInjectionTestFS and Seastar's allocation-failure sweep).
//
// A fault names which requests it hits — the Nth (1-based) read, write, sync or any
// request — and how: -EIO, -ENOSPC, -EAGAIN, a short transfer (the request is issued
// with half its length and completes with that count), or a stall (the submitting thread
// blocks for that long in Enqueue, as in a submission queue stuck behind a hung device,
// and the request then goes through). Everything else passes through.
// Spec strings, for the command line and the environment: "write:3:eio,read:1:short,
// write:1:stall5000" (milliseconds).
// Not thread-safe, like the engine it wraps.

#include <memory>
#include <string>
#include <vector>

#include "storage/io/io_engine.h"

namespace kvtier {

struct IoFault {
  enum class Op { kRead, kWrite, kSync, kAny } op = IoFault::Op::kAny;
  uint64_t nth = 1;
  enum class Kind { kEio, kEnospc, kEagain, kShort, kStall } kind = IoFault::Kind::kEio;
  uint32_t stall_ms = 0;  // kStall
};

// Parses "op:nth:kind[,op:nth:kind...]" with op in read|write|sync|any and kind in
// eio|enospc|eagain|short|stallMS.
Result<std::vector<IoFault>> ParseIoFaults(const std::string& spec);

class FaultInjectionIoEngine final : public IoEngine {
 public:
  FaultInjectionIoEngine(std::unique_ptr<IoEngine> inner, std::vector<IoFault> faults);

  std::string_view name() const override { return inner_->name(); }
  Status RegisterBuffer(uint32_t index, uint8_t* addr, size_t len) override {
    return inner_->RegisterBuffer(index, addr, len);
  }
  Status Enqueue(const IoRequest& request) override;
  Status Submit() override { return inner_->Submit(); }
  std::vector<IoCompletion> Reap() override;
  int notify_fd() const override { return inner_->notify_fd(); }
  size_t in_flight() const override { return inner_->in_flight() + injected_.size(); }
  size_t capacity() const override { return inner_->capacity(); }

  // Requests that were failed or shortened so far.
  uint64_t injected() const { return injected_count_; }

 private:
  const IoFault* Match(const IoRequest& r);

  std::unique_ptr<IoEngine> inner_;
  std::vector<IoFault> faults_;
  uint64_t counts_[4] = {0, 0, 0, 0};  // read, write, sync, any
  std::vector<IoCompletion> injected_;
  uint64_t injected_count_ = 0;
};

}  // namespace kvtier
