#pragma once
// A BlockIndexStore that counts the keys read through it (Get and MultiGet), those read on
// the thread that made it (a test's control thread) and, when given a KeyReads, the reads of
// each key; it passes every call to the store it wraps: tests see how much of the index a
// request reads, where, and whether it reads an entry twice.
//
// Thread-compatible, as the store it wraps.

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "storage/nvme/block_index_store.h"

namespace kvtier::testing {

class CountingBlockIndexStore final : public BlockIndexStore {
 public:
  // Reads of each key, from any thread.
  class KeyReads {
   public:
    void Add(std::string_view key) {
      std::lock_guard<std::mutex> l(mu_);
      ++n_[std::string(key)];
    }
    void Clear() {
      std::lock_guard<std::mutex> l(mu_);
      n_.clear();
    }
    // Keys read, and the most reads of one key.
    size_t keys() {
      std::lock_guard<std::mutex> l(mu_);
      return n_.size();
    }
    uint32_t most() {
      std::lock_guard<std::mutex> l(mu_);
      uint32_t m = 0;
      for (const auto& [k, n] : n_) m = std::max(m, n);
      return m;
    }

   private:
    std::mutex mu_;
    std::map<std::string, uint32_t> n_;
  };

  // The counters outlive the store (the test keeps them after handing the store over);
  // `keys_read_here` may be null.
  CountingBlockIndexStore(std::unique_ptr<BlockIndexStore> inner, std::atomic<uint64_t>* keys_read,
                          std::atomic<uint64_t>* keys_read_here = nullptr)
      : inner_(std::move(inner)), keys_read_(keys_read), keys_read_here_(keys_read_here) {}

  void set_key_reads(std::shared_ptr<KeyReads> r) { key_reads_ = std::move(r); }

  std::string_view name() const override { return inner_->name(); }
  Result<std::optional<BlockRecord>> Get(std::string_view key) override {
    Count(1);
    if (key_reads_) key_reads_->Add(key);
    return inner_->Get(key);
  }
  Result<std::vector<std::optional<BlockRecord>>> MultiGet(std::span<const std::string> keys) override {
    Count(keys.size());
    for (const std::string& k : keys) {
      if (key_reads_) key_reads_->Add(k);
    }
    return inner_->MultiGet(keys);
  }
  Result<std::optional<std::string>> KeyOfSlot(uint32_t slot) override { return inner_->KeyOfSlot(slot); }
  Status Apply(std::span<const IndexMutation> batch, bool sync) override { return inner_->Apply(batch, sync); }
  Status Scan(const std::function<bool(std::string_view, const BlockRecord&)>& fn) override { return inner_->Scan(fn); }
  Result<std::optional<std::string>> GetMeta(std::string_view name) override { return inner_->GetMeta(name); }
  Status PutMeta(std::string_view name, std::string_view value) override { return inner_->PutMeta(name, value); }
  Status Clear() override { return inner_->Clear(); }
  Status Flush() override { return inner_->Flush(); }
  Status Resume() override { return inner_->Resume(); }
  uint64_t MemoryUsage() override { return inner_->MemoryUsage(); }
  Status Compact() override { return inner_->Compact(); }

 private:
  void Count(uint64_t n) {
    *keys_read_ += n;
    if (keys_read_here_ != nullptr && std::this_thread::get_id() == here_) *keys_read_here_ += n;
  }

  std::unique_ptr<BlockIndexStore> inner_;
  std::atomic<uint64_t>* keys_read_;
  std::atomic<uint64_t>* keys_read_here_;
  std::shared_ptr<KeyReads> key_reads_;
  const std::thread::id here_ = std::this_thread::get_id();
};

}  // namespace kvtier::testing
