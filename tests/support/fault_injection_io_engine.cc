#include "tests/support/fault_injection_io_engine.h"

#include <errno.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

namespace kvtier {

Result<std::vector<IoFault>> ParseIoFaults(const std::string& spec) {
  std::vector<IoFault> out;
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    std::stringstream parts(item);
    std::string op, nth, kind;
    if (!std::getline(parts, op, ':') || !std::getline(parts, nth, ':') || !std::getline(parts, kind)) {
      return InvalidArgument("io fault '" + item + "' is not op:nth:kind");
    }
    IoFault f;
    if (op == "read")
      f.op = IoFault::Op::kRead;
    else if (op == "write")
      f.op = IoFault::Op::kWrite;
    else if (op == "sync")
      f.op = IoFault::Op::kSync;
    else if (op == "any")
      f.op = IoFault::Op::kAny;
    else
      return InvalidArgument("io fault op '" + op + "'");
    char* end = nullptr;
    f.nth = std::strtoull(nth.c_str(), &end, 10);
    if (nth.empty() || *end != '\0' || f.nth == 0) return InvalidArgument("io fault nth '" + nth + "'");
    if (kind == "eio")
      f.kind = IoFault::Kind::kEio;
    else if (kind == "enospc")
      f.kind = IoFault::Kind::kEnospc;
    else if (kind == "eagain")
      f.kind = IoFault::Kind::kEagain;
    else if (kind == "short")
      f.kind = IoFault::Kind::kShort;
    else if (kind.rfind("stall", 0) == 0 && kind.size() > 5 &&
             kind.find_first_not_of("0123456789", 5) == std::string::npos) {
      f.kind = IoFault::Kind::kStall;
      f.stall_ms = static_cast<uint32_t>(std::strtoul(kind.c_str() + 5, nullptr, 10));
    } else
      return InvalidArgument("io fault kind '" + kind + "'");
    out.push_back(f);
  }
  return out;
}

FaultInjectionIoEngine::FaultInjectionIoEngine(std::unique_ptr<IoEngine> inner, std::vector<IoFault> faults)
    : inner_(std::move(inner)), faults_(std::move(faults)) {}

const IoFault* FaultInjectionIoEngine::Match(const IoRequest& r) {
  const int op = r.op == IoOp::kRead ? 0 : r.op == IoOp::kWrite ? 1 : 2;
  ++counts_[op];
  ++counts_[3];
  for (const IoFault& f : faults_) {
    const int fop = static_cast<int>(f.op);
    if (counts_[fop] == f.nth && (fop == op || fop == 3)) return &f;
  }
  return nullptr;
}

Status FaultInjectionIoEngine::Enqueue(const IoRequest& request) {
  if (in_flight() >= capacity()) return ResourceExhausted("io queue full");
  const IoFault* f = Match(request);
  if (f == nullptr) return inner_->Enqueue(request);
  ++injected_count_;
  if (f->kind == IoFault::Kind::kStall) {
    std::this_thread::sleep_for(std::chrono::milliseconds(f->stall_ms));
    return inner_->Enqueue(request);
  }
  if (f->kind == IoFault::Kind::kShort && request.op != IoOp::kFdatasync && request.len > 1) {
    IoRequest half = request;
    half.len = request.len / 2;  // completes "successfully" with half the bytes
    return inner_->Enqueue(half);
  }
  const int err = f->kind == IoFault::Kind::kEnospc ? ENOSPC : f->kind == IoFault::Kind::kEagain ? EAGAIN : EIO;
  injected_.push_back(IoCompletion{request.tag, -err});
  const uint64_t one = 1;
  (void)!::write(inner_->notify_fd(), &one, sizeof(one));  // an eventfd, by the contract
  return Status::Ok();
}

std::vector<IoCompletion> FaultInjectionIoEngine::Reap() {
  std::vector<IoCompletion> out = inner_->Reap();
  out.insert(out.end(), injected_.begin(), injected_.end());
  injected_.clear();
  return out;
}

}  // namespace kvtier
