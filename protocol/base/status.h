#pragma once
// Status and Result<T>: the one error convention across kvtier's module boundaries.
//
// Codes are a small abseil-like set, frozen in protocol/kvtier.fbs (enum Status) so that
// every error a client can cause travels unchanged to it. Each code has a retry meaning:
//   kInvalidArgument     the request is wrong; do not retry it unchanged
//   kNotFound            the thing does not exist (a lookup miss, an unknown page)
//   kAlreadyExists       it exists already (e.g. a duplicate commit when that is an error)
//   kResourceExhausted   a tier or a quota is full; retry later or ask for less
//   kFailedPrecondition  the state does not allow it (page not leased by you, ...)
//   kAborted             gave up on a conflict; retry the whole operation
//   kUnavailable         transient (daemon draining, I/O backpressure); retry the call
//   kDataLoss            bytes failed their checksum; treated as a miss
//   kPermissionDenied    the caller may not do this
//   kUnimplemented       the operation or option is not supported here
//   kInternal            a bug or an unexpected system error
//   kDeadlineExceeded    no answer within the caller's timeout; the other side may still
//                        act on the request (retry with care, or with a longer timeout)
//
// Status is cheap on the OK path (no allocation). Both types are [[nodiscard]].

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kvtier {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kAlreadyExists = 3,
  kResourceExhausted = 4,
  kFailedPrecondition = 5,
  kAborted = 6,
  kUnavailable = 7,
  kDataLoss = 8,
  kPermissionDenied = 9,
  kUnimplemented = 10,
  kInternal = 11,
  kDeadlineExceeded = 12,
};
inline constexpr int kMaxStatusCode = 12;

// "OK", "INVALID_ARGUMENT", ...
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "NOT_FOUND: no such page" (or "OK").
  std::string ToString() const;

  // Returns a copy with "context: " prepended to the message.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) { return a.code_ == b.code_ && a.message_ == b.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }

// Converts a (positive) errno value, in the one place a module meets the OS.
// EAGAIN/EINTR/EBUSY -> kUnavailable, ENOSPC/ENOMEM -> kResourceExhausted,
// ENOENT -> kNotFound, EEXIST -> kAlreadyExists, EACCES/EPERM -> kPermissionDenied,
// EINVAL -> kInvalidArgument, ENOSYS/EOPNOTSUPP -> kUnimplemented, EIO -> kDataLoss is NOT
// assumed (an I/O error is kInternal: the bytes were never verified, they are just absent).
Status ErrnoStatus(int err, std::string_view what);

// A value or a non-OK Status.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  // An OK status carries no value: such a Result is kInternal (as abseil's StatusOr), never
  // a Result that is not ok() yet whose status() says OK.
  Result(Status status)  // NOLINT: implicit by design
      : v_(status.ok() ? Status(StatusCode::kInternal, "a Result was made of an OK status, without a value")
                       : std::move(status)) {}

  bool ok() const { return v_.index() == 1; }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<0>(v_);
  }
  T& value() & { return std::get<1>(v_); }
  const T& value() const& { return std::get<1>(v_); }
  T&& value() && { return std::get<1>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<Status, T> v_;
};

namespace internal {
inline Status AsStatus(Status s) { return s; }
template <class T>
Status AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace kvtier

#define KVTIER_CONCAT_INNER_(a, b) a##b
#define KVTIER_CONCAT_(a, b) KVTIER_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status or a Result) is not OK.
#define KVTIER_RETURN_IF_ERROR(expr)                                        \
  do {                                                                      \
    ::kvtier::Status kvtier_status_ = ::kvtier::internal::AsStatus((expr)); \
    if (!kvtier_status_.ok()) return kvtier_status_;                        \
  } while (0)

// `lhs = value of expr`, or returns the error of the Result `expr`.
#define KVTIER_ASSIGN_OR_RETURN(lhs, expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_CONCAT_(kvtier_result_, __LINE__), lhs, expr)
#define KVTIER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
