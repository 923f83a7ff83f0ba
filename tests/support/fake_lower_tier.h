#pragma once
// FakeLowerTier: a LowerTier (storage/lower_tier.h) over a map that outlives it (a
// "restart" opens a new tier over the same map), for tests of the seam: every answer is
// posted, never delivered inside the call, and dropped once the tier is gone; a value of
// another layout, or whose bytes changed in the map, is kDataLoss. Knobs: `available_`, `capacity` (values held; a Put
// past it is kResourceExhausted), and counts of the calls made.
//
// Thread-compatible: every method on the owner's thread.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "protocol/base/post.h"
#include "storage/lower_tier.h"

namespace kvtier::testing {

class FakeLowerTier final : public LowerTier {
 public:
  struct Value {
    LowerBlockMeta meta;
    std::vector<uint8_t> bytes;
    size_t checksum = 0;  // of bytes, as put
  };
  using Store = std::map<std::string, Value>;

  FakeLowerTier(std::shared_ptr<Store> store, Post post) : store_(std::move(store)), post_(std::move(post)) {}

  TierKind kind() const override { return TierKind::kRemote; }
  std::string Describe() const override { return "fake: " + std::to_string(store_->size()) + " blocks"; }
  bool available() const override { return available_; }
  LowerTierReport Report() const override {
    LowerTierReport r;
    r.figures = {{"blocks", static_cast<double>(store_->size()), false, "kvtier_fake_blocks", "Blocks held."}};
    r.checksum_failures = checksum_failures_;
    return r;
  }

  void Exists(std::vector<std::string> keys, std::function<void(std::vector<bool>)> done) override {
    ++exists_calls;
    std::vector<bool> found;
    for (const auto& k : keys) found.push_back(store_->count(k) > 0);
    Answer([done = std::move(done), found = std::move(found)] { done(found); });
  }
  void Put(const std::string& key, LowerBlockMeta meta, std::span<const uint8_t> data,
           std::function<void(Status)> done) override {
    if (store_->size() >= capacity && !store_->count(key)) {
      Answer([done = std::move(done)] { done(ResourceExhausted("fake tier full")); });
      return;
    }
    (*store_)[key] = Value{std::move(meta), {data.begin(), data.end()}, Checksum(data)};
    Answer([done = std::move(done)] { done(Status::Ok()); });
  }
  void Fetch(const std::string& key, const std::string& fingerprint, uint32_t length, std::span<uint8_t> dst,
             std::function<void(Status, LowerBlockMeta)> done) override {
    ++fetches;
    auto it = store_->find(key);
    Status st;
    LowerBlockMeta meta;
    if (it == store_->end()) {
      st = NotFound("not in the fake tier");
    } else if (it->second.meta.fingerprint != fingerprint || it->second.meta.length != length ||
               it->second.bytes.size() != length || length > dst.size()) {
      st = DataLoss("stored for another layout");  // never served
    } else if (Checksum(it->second.bytes) != it->second.checksum) {
      ++checksum_failures_;
      st = DataLoss("the value does not verify");
    } else {
      std::copy(it->second.bytes.begin(), it->second.bytes.end(), dst.begin());
      meta = it->second.meta;
    }
    Answer([done = std::move(done), st, meta = std::move(meta)] { done(st, meta); });
  }
  void Delete(const std::string& key) override { store_->erase(key); }

  bool available_ = true;
  size_t capacity = SIZE_MAX;
  int exists_calls = 0, fetches = 0;

 private:
  static size_t Checksum(std::span<const uint8_t> b) {
    return std::hash<std::string_view>()(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  }
  void Answer(std::function<void()> fn) {
    post_([alive = std::weak_ptr<bool>(alive_), fn = std::move(fn)] {
      if (alive.lock()) fn();
    });
  }

  std::shared_ptr<Store> store_;
  Post post_;
  uint64_t checksum_failures_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace kvtier::testing
