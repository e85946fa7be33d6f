// The per-job token (docs/decisions/0024-job-token-in-the-hello-header.md): a 32-bit value that ties a
// trainer to the daemons of its own job. Same-user accident protection, not a secret
// against an attacker (docs/security.md says what it does and does not defend).
//
// Source, first match wins, on both sides:
//   SHARDMIX_JOB_TOKEN   any text; the token is its 32-bit FNV-1a hash. The launch
//                        scripts export one random value to the daemons and the trainers.
//   RUN_DIR/token        written 0600 by every daemon (run dirs are often node-local) before
//                        rank 0 writes RUN_DIR/ready; the value is rank 0's (it draws a random
//                        token when SHARDMIX_JOB_TOKEN is unset). Trainers read it.
// The trainer sends it in the Hello frame's header (proto::set_hello_job_token).
// Thread-safety: pure functions plus file and environment reads; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace shardmix {

inline constexpr const char* kJobTokenEnv = "SHARDMIX_JOB_TOKEN";
inline constexpr const char* kJobTokenFile = "token";  // inside the run dir

// FNV-1a of `text`, never 0 (0 means "no token" on the wire).
std::uint32_t job_token_from_text(std::string_view text);
// From SHARDMIX_JOB_TOKEN, if set and not empty.
std::optional<std::uint32_t> job_token_from_env();
// 32 random bits from getrandom(2), never 0.
std::uint32_t random_job_token();

// Writes the token as 8 hex digits to `path`, mode 0600, atomically (tmp + rename).
Status write_job_token_file(const std::string& path, std::uint32_t token);
// Reads a token file; refuses one that is not ours (owner uid) or is readable by others.
Result<std::uint32_t> read_job_token_file(const std::string& path);

}  // namespace shardmix
