// Errors as values for the core and the wire; exceptions only at the client edge
// (shardmix::Error, client/client.h); a broken invariant (a bug of ours, never bad input)
// stops the process through invariant_failed. The whole policy: docs/decisions/0046.
// A Status message names the thing that failed: file, offset, config key, peer rank.
// Thread-safety: value types; safe to copy between threads, not to mutate concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace shardmix {

enum class StatusCode : std::uint8_t {
  kOk = 0,
  kInvalidArgument,   // bad config value, bad command-line input
  kNotFound,          // missing file or directory
  kIoError,           // read/write/stat failed
  kCorrupt,           // bytes that do not decode (file or frame)
  kUnavailable,       // peer or daemon gone, retry might help
  kProtocol,          // peer speaks another protocol version or broke framing
  kResourceExhausted, // capacity, staging or memory limits
  kPermissionDenied,  // credentials, file modes
  kCancelled,         // shutdown in progress
  kInternal,          // a bug: an invariant did not hold
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "io_error: /data/x.jpg: short read at offset 4096"
  std::string to_string() const;
  // Prefixes the message with where it happened: "loading rank 2: <message>".
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(StatusCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}

// Result<T>: a T or a non-ok Status. Accessing value() of an error is a bug (aborts).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {    // NOLINT: implicit by design
    if (std::get<Status>(data_).ok()) {
      data_ = Status(StatusCode::kInternal, "Result constructed from an ok Status");
    }
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(data_);
  }
  T& value() & { check(); return std::get<T>(data_); }
  const T& value() const& { check(); return std::get<T>(data_); }
  T&& value() && { check(); return std::get<T>(std::move(data_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void check() const;
  std::variant<T, Status> data_;
};

// A bug of ours, not bad input: an invariant the code itself guarantees did not hold.
// Prints "shardmix: invariant failed: <message>" to stderr and aborts (a core dump, and a
// death test can match the message). Never use it for anything a user, a file or a peer
// can cause: those are a Status.
[[noreturn]] void invariant_failed(std::string_view message);
template <typename... Args>
[[noreturn]] void invariant_failed(fmt::format_string<Args...> format, Args&&... args) {
  invariant_failed(std::string_view(fmt::format(format, std::forward<Args>(args)...)));
}

[[noreturn]] void die_on_bad_result_access(const Status& status);

template <typename T>
void Result<T>::check() const {
  if (!ok()) die_on_bad_result_access(std::get<Status>(data_));
}

}  // namespace shardmix

#define SHARDMIX_CONCAT_INNER(a, b) a##b
#define SHARDMIX_CONCAT(a, b) SHARDMIX_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define SHARDMIX_RETURN_IF_ERROR(expr)                  \
  do {                                                  \
    ::shardmix::Status shardmix_status_ = (expr);       \
    if (!shardmix_status_.ok()) return shardmix_status_; \
  } while (0)

#define SHARDMIX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()

// SHARDMIX_ASSIGN_OR_RETURN(auto x, make_x()); returns the Status on error.
#define SHARDMIX_ASSIGN_OR_RETURN(lhs, expr) \
  SHARDMIX_ASSIGN_OR_RETURN_IMPL(SHARDMIX_CONCAT(shardmix_result_, __LINE__), lhs, expr)
