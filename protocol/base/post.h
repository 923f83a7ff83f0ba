#pragma once
// Post: runs a function later on the thread that owns a component (in the daemon, the
// control loop: boost::asio::post onto its io_context). A component that answers
// asynchronously takes one and delivers every callback through it, never inside the call
// that started the work.

#include <functional>

namespace kvtier {

using Post = std::function<void(std::function<void()>)>;

}  // namespace kvtier
