#pragma once
// Mutex and MutexLock: std::mutex with clang's thread-safety annotations, so that
// `-Wthread-safety` (the `make check-thread-safety` build, in CI) proves at compile time
// that every member marked KVTIER_GUARDED_BY(mu_) is touched only with mu_ held, and that
// every function marked KVTIER_REQUIRES(mu_) is called so. The annotations cost nothing at
// run time and are empty for other compilers.
//
//   class Queue {
//     Mutex mu_;
//     std::deque<Job> jobs_ KVTIER_GUARDED_BY(mu_);
//     std::condition_variable cv_;
//     void Push(Job j) { MutexLock l(&mu_); jobs_.push_back(std::move(j)); cv_.notify_one(); }
//     Job Pop() {
//       MutexLock l(&mu_);
//       cv_.wait(l.native(), [&] { mu_.AssertHeld(); return !jobs_.empty(); });
//       ...
//     }
//   };
//
// A condition variable waits on MutexLock::native() (the std::unique_lock underneath); the
// analysis treats the lock as held across the wait, as it is when the wait returns. A
// predicate lambda is analysed on its own: it says mu_.AssertHeld() first.

#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define KVTIER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KVTIER_THREAD_ANNOTATION(x)
#endif

#define KVTIER_CAPABILITY(x) KVTIER_THREAD_ANNOTATION(capability(x))
#define KVTIER_SCOPED_CAPABILITY KVTIER_THREAD_ANNOTATION(scoped_lockable)
#define KVTIER_GUARDED_BY(x) KVTIER_THREAD_ANNOTATION(guarded_by(x))
#define KVTIER_REQUIRES(...) KVTIER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define KVTIER_REQUIRES_SHARED(...) KVTIER_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define KVTIER_ACQUIRE(...) KVTIER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define KVTIER_ACQUIRE_SHARED(...) KVTIER_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define KVTIER_RELEASE(...) KVTIER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define KVTIER_RELEASE_SHARED(...) KVTIER_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define KVTIER_ASSERT_CAPABILITY(x) KVTIER_THREAD_ANNOTATION(assert_capability(x))
#define KVTIER_ASSERT_SHARED_CAPABILITY(x) KVTIER_THREAD_ANNOTATION(assert_shared_capability(x))

namespace kvtier {

class KVTIER_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() KVTIER_ACQUIRE() { mu_.lock(); }
  void Unlock() KVTIER_RELEASE() { mu_.unlock(); }
  // Tells the analysis the caller holds it (a condition variable's predicate, a callback
  // run under the lock); checks nothing at run time.
  void AssertHeld() const KVTIER_ASSERT_CAPABILITY(this) {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope; Unlock/Lock in between for work done without it.
class KVTIER_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) KVTIER_ACQUIRE(mu) : lock_(mu->mu_) {}
  ~MutexLock() KVTIER_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() KVTIER_RELEASE() { lock_.unlock(); }
  void Lock() KVTIER_ACQUIRE() { lock_.lock(); }
  // For std::condition_variable::wait and friends.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

// std::shared_mutex, annotated: many readers or one writer.
class KVTIER_CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() KVTIER_ACQUIRE() { mu_.lock(); }
  void Unlock() KVTIER_RELEASE() { mu_.unlock(); }
  void LockShared() KVTIER_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void UnlockShared() KVTIER_RELEASE_SHARED() { mu_.unlock_shared(); }
  // As Mutex::AssertHeld, for a caller holding it shared (or exclusively).
  void AssertReaderHeld() const KVTIER_ASSERT_SHARED_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

class KVTIER_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) KVTIER_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterLock() KVTIER_RELEASE() { mu_->Unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex* mu_;
};

class KVTIER_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) KVTIER_ACQUIRE_SHARED(mu) : mu_(mu) { mu_->LockShared(); }
  ~ReaderLock() KVTIER_RELEASE() { mu_->UnlockShared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex* mu_;
};

}  // namespace kvtier
