#pragma once
// Checks of a config against the machine it is to run on — what ParseConfig cannot know
// from the text alone: the memory the pools would take, the NVMe files named. kvtierd runs
// them at start, before it creates anything, and `kvtierd --check-config` runs the same.
// Thread-compatible (reads /proc, /sys and the file system).

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "protocol/base/status.h"

namespace kvtier {

// Memory this process may use: MemTotal, or the cgroup's memory limit when lower; and
// MemAvailable. nullopt where unknown.
struct HostMemory {
  std::optional<uint64_t> limit_bytes;
  std::string limit_source;  // "MemTotal" or the cgroup file that set the limit
  std::optional<uint64_t> available_bytes;
};
HostMemory ReadHostMemory();

// socket.group as a gid: a number, or a group name looked up in the group database;
// kInvalidArgument naming the key for a group that does not exist.
Result<gid_t> ResolveGroup(const std::string& name);

// The contents of a file holding a secret (config key `key`), without one trailing
// newline. kInvalidArgument naming the key when it cannot be read, is empty, belongs to
// another user than kvtierd's or root, or may be read by group or others (a secret belongs
// to kvtierd alone: mode 0600 or 0400).
Result<std::string> ReadSecretFile(const std::string& key, const std::string& path);

// kInvalidArgument naming the key when:
//  - socket.group names no group, or data_dir exists and is not a directory;
//  - the host pool (plus a host-emulated GPU pool) is larger than the memory limit and
//    tiers.host.overcommit is off (a pool that big is OOM-killed once it fills);
//  - two tiers.nvme.files entries are the same file (by path after symlinks, or by device
//    and inode when they exist): their slots would alias;
//  - an NVMe file's directory does not exist (kvtierd creates files, not directories;
//    data_dir itself is the exception: kvtierd creates it);
//  - tiers.remote.password_file or secret_file cannot be read as ReadSecretFile says, or
//    the secret is shorter than RemoteCodec::kMinSecretBytes.
// kFailedPrecondition naming the key when events are on and an ipc endpoint is one another
// process listens on (CheckEventEndpoints).
// Appends to `warnings` what does not stop the start (a pool above what is available now;
// a remote tier whose values are not authenticated; an event endpoint on every interface).
Status CheckConfigOnHost(const DaemonConfig& config, const HostMemory& memory, std::vector<std::string>* warnings);

}  // namespace kvtier
