#pragma once
// A BlockIndexStore that counts the keys read through it (Get and MultiGet) and passes
// every call to the store it wraps: tests see how much of the index a request reads.
//
// Thread-compatible, as the store it wraps.

#include <atomic>
#include <memory>

#include "storage/nvme/block_index_store.h"

namespace kvtier::testing {

class CountingBlockIndexStore final : public BlockIndexStore {
 public:
  // `keys_read` outlives the store (the test keeps it after handing the store over).
  CountingBlockIndexStore(std::unique_ptr<BlockIndexStore> inner, std::atomic<uint64_t>* keys_read)
      : inner_(std::move(inner)), keys_read_(keys_read) {}

  std::string_view name() const override { return inner_->name(); }
  Result<std::optional<BlockRecord>> Get(std::string_view key) override {
    ++*keys_read_;
    return inner_->Get(key);
  }
  Result<std::vector<std::optional<BlockRecord>>> MultiGet(std::span<const std::string> keys) override {
    *keys_read_ += keys.size();
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
  std::unique_ptr<BlockIndexStore> inner_;
  std::atomic<uint64_t>* keys_read_;
};

}  // namespace kvtier::testing
