#pragma once
// ZeroedArray<T>: a fixed-size array of T whose bytes start as zero, from calloc. For
// per-slot arrays of a drive-sized tier (tens of millions of entries): calloc of a large
// size maps fresh zero pages that cost nothing until written, where std::vector's assign
// writes every byte up front (a quarter of a second for 10M slots at start on a small VM).
// REQUIRES: a T whose all-zero bytes are a valid value (integers, enums with a zero
// enumerator, std::atomic of those).

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <type_traits>

namespace kvtier {

template <typename T>
class ZeroedArray {
  static_assert(std::is_trivially_destructible_v<T>);

 public:
  ZeroedArray() = default;
  explicit ZeroedArray(size_t n) : p_(static_cast<T*>(std::calloc(n ? n : 1, sizeof(T)))), n_(n) {
    if (!p_) throw std::bad_alloc();
  }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_.get()[i]; }
  const T& operator[](size_t i) const { return p_.get()[i]; }
  T* data() { return p_.get(); }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> p_;
  size_t n_ = 0;
};

}  // namespace kvtier
