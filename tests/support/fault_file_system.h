#pragma once
// A RocksDB FileSystem over the machine's whose file writes fail as a full disk does
// (IOStatus::NoSpace) while SetFull(true): what the NVMe index meets on a full file
// system, injected without mounting anything (RocksDbIndexOptions::file_system).

#include <rocksdb/file_system.h>

#include <atomic>
#include <memory>
#include <string>

namespace kvtier::testing {

class FullableFileSystem : public rocksdb::FileSystemWrapper {
 public:
  FullableFileSystem() : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  static const char* kClassName() { return "FullableFileSystem"; }
  const char* Name() const override { return kClassName(); }

  void SetFull(bool full) { full_.store(full); }
  bool full() const { return full_.load(); }
  // Writes refused so far.
  uint64_t refused() const { return refused_.load(); }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r, rocksdb::IODebugContext* d) override {
    if (Refuse()) return rocksdb::IOStatus::NoSpace("injected: the file system is full");
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, r, d);
    if (s.ok()) *r = std::make_unique<File>(std::move(*r), this);
    return s;
  }

 private:
  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> f, FullableFileSystem* fs)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(f)), fs_(fs) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* d) override {
      if (fs_->Refuse()) return rocksdb::IOStatus::NoSpace("injected: the file system is full");
      return target()->Append(data, o, d);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v, rocksdb::IODebugContext* d) override {
      if (fs_->Refuse()) return rocksdb::IOStatus::NoSpace("injected: the file system is full");
      return target()->Append(data, o, v, d);
    }

   private:
    FullableFileSystem* fs_;
  };

  bool Refuse() {
    if (!full_.load()) return false;
    refused_.fetch_add(1);
    return true;
  }

  std::atomic<bool> full_{false};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace kvtier::testing
