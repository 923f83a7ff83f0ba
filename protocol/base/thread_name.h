#pragma once
// NameThisThread: names the calling thread, as `top -H`, `ps -L`, perf and gdb show it.
// The kernel keeps 15 bytes; a longer name is cut. kvtierd's threads and their names are
// docs/architecture.md's Threads table (a test checks that every thread a running daemon
// has is in it).

#include <pthread.h>

#include <string>
#include <string_view>

namespace kvtier {

inline void NameThisThread(std::string_view name) {
  const std::string n(name.substr(0, 15));
  (void)::pthread_setname_np(::pthread_self(), n.c_str());
}

}  // namespace kvtier
