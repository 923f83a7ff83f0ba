// FlatIdIndex against std::unordered_map under random inserts and erases, with hashes
// crowded into few homes so runs wrap around the array and erases shift entries back.
#include "storage/policy/flat_id_index.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace kvtier {
namespace {

// Records: id -> key; the index maps hash(key) -> id.
struct Records {
  std::vector<uint64_t> key;
  uint64_t HashOf(uint64_t k, uint64_t crowd) const {
    // Few distinct low bits (homes) when `crowd` is small, many hash collisions overall.
    return (k * 0x9e3779b97f4a7c15ull) % crowd | (k << 32);
  }
};

void RunRandom(uint64_t crowd, uint32_t seed) {
  Records r;
  FlatIdIndex index;
  std::unordered_map<uint64_t, uint32_t> model;  // key -> id
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> free_ids;
  for (int step = 0; step < 200'000; ++step) {
    const uint64_t k = rng() % 6000;
    const uint64_t h = r.HashOf(k, crowd);
    auto is = [&](uint32_t id) { return r.key[id] == k; };
    const uint32_t found = index.Find(h, is);
    auto it = model.find(k);
    ASSERT_EQ(found, it == model.end() ? FlatIdIndex::kNone : it->second) << "step " << step;
    if (it == model.end()) {
      uint32_t id;
      if (!free_ids.empty()) {
        id = free_ids.back();
        free_ids.pop_back();
        r.key[id] = k;
      } else {
        id = static_cast<uint32_t>(r.key.size());
        r.key.push_back(k);
      }
      index.Insert(h, id);
      model[k] = id;
    } else if (rng() % 3 != 0) {
      ASSERT_TRUE(index.Erase(h, it->second));
      free_ids.push_back(it->second);
      model.erase(it);
    }
    ASSERT_EQ(index.size(), model.size());
    ASSERT_LE(index.size() * 2, index.capacity());
  }
  // Every key the model holds is found, and an erased id is not erased twice.
  for (const auto& [key, id] : model) {
    const auto k = key;  // a copy the lambda can capture (clang 14 cannot capture bindings)
    ASSERT_EQ(index.Find(r.HashOf(k, crowd), [&](uint32_t i) { return r.key[i] == k; }), id);
  }
  if (!free_ids.empty()) {
    const uint32_t gone = free_ids.back();
    EXPECT_FALSE(index.Erase(r.HashOf(r.key[gone], crowd), gone));
  }
}

TEST(FlatIdIndex, MatchesAMapUnderRandomInsertsAndErases) { RunRandom(1ull << 40, 1); }

TEST(FlatIdIndex, CrowdedHomesWrapAroundAndShiftBackOnErase) {
  // 64 homes for thousands of keys: long runs, many across the array's end.
  RunRandom(64, 2);
}

TEST(FlatIdIndex, HomesNearTheEndWrapToTheStart) {
  // Every key's home is one of the last slots of the smallest array.
  Records r;
  FlatIdIndex index;
  const uint64_t last = index.capacity() - 1;
  for (uint32_t id = 0; id < 40; ++id) {
    r.key.push_back(id);
    index.Insert((uint64_t{id} << 32) | (last - id % 3), id);
  }
  for (uint32_t id = 0; id < 40; id += 2) ASSERT_TRUE(index.Erase((uint64_t{id} << 32) | (last - id % 3), id));
  for (uint32_t id = 0; id < 40; ++id) {
    const uint32_t want = id % 2 ? id : FlatIdIndex::kNone;
    EXPECT_EQ(index.Find((uint64_t{id} << 32) | (last - id % 3), [&](uint32_t i) { return r.key[i] == id; }), want);
  }
}

}  // namespace
}  // namespace kvtier
