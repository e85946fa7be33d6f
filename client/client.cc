#include "client/client.h"

#include "common/checkpoint_file.h"
#include "common/checkpoint_memfd.h"
#include "common/checkpoint_pool.h"
#include "common/config.h"
#include "common/job_token.h"
#include "common/trace.h"
#include "proto/checkpoint.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <array>

namespace shardmix {
namespace {

std::optional<int> env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0) return std::nullopt;
  return static_cast<int>(x);
}

std::string this_host() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// A mapping of one shared region received from the daemon.
struct Mapping {
  const std::byte* data = nullptr;
  std::uint64_t length = 0;
  ~Mapping() {
    if (data != nullptr) ::munmap(const_cast<std::byte*>(data), length);
  }
};

std::string resolve_run_dir(const ClientOptions& options) {
  if (!options.run_dir.empty()) return options.run_dir;
  const char* env = std::getenv("SHARDMIX_RUN_DIR");
  return env != nullptr && *env != '\0' ? env : "/tmp/shardmix-" + std::to_string(::geteuid());
}

// The daemons' run dir is 0700 (docs/security.md): a trainer of another user can never
// read RUN_DIR/ready, so waiting SHARDMIX_CONNECT_TIMEOUT for it would only end in a
// misleading "no daemons became ready". Returns that refusal, naming the dir and its
// owner, when `path` in `run_dir` exists for us only as EACCES; ok otherwise.
Status run_dir_refusal(const std::string& run_dir, const std::string& path) {
  if (::faccessat(AT_FDCWD, path.c_str(), R_OK, AT_EACCESS) == 0 || errno != EACCES) return Status::ok_status();
  struct stat st{};
  if (::stat(run_dir.c_str(), &st) != 0) return Status::ok_status();
  const bool may_enter = ::faccessat(AT_FDCWD, run_dir.c_str(), X_OK, AT_EACCESS) == 0;
  return make_error(StatusCode::kPermissionDenied,
                    "uid {} may not {} the run dir {} (owned by uid {}, mode {:04o}): its daemons serve only their "
                    "own user; run the trainers as uid {} or give each user its own SHARDMIX_RUN_DIR",
                    ::geteuid(), may_enter ? "read " + path + " in" : "enter", run_dir, st.st_uid,
                    st.st_mode & 07777, st.st_uid);
}

Result<std::map<std::string, std::string>> read_ready_file(const std::string& run_dir, double timeout_s) {
  const std::string path = run_dir + "/ready";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    std::ifstream in(path);
    if (in) {
      std::map<std::string, std::string> kv;
      std::string line;
      while (std::getline(in, line)) {
        const auto eq = line.find('=');
        if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
      }
      return kv;
    }
    SHARDMIX_RETURN_IF_ERROR(run_dir_refusal(run_dir, path));
    if (std::chrono::steady_clock::now() > deadline) {
      return make_error(StatusCode::kUnavailable,
                        "no ShardMix daemons became ready: {} did not appear within {:.0f} s (are the daemons "
                        "running with the same SHARDMIX_RUN_DIR? still loading? SHARDMIX_CONNECT_TIMEOUT sets the "
                        "wait)",
                        path, timeout_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The job token to present (common/job_token.h): SHARDMIX_JOB_TOKEN, else RUN_DIR/token,
// which every daemon writes before rank 0 writes RUN_DIR/ready (waited for up to `timeout_s`).
Result<std::uint32_t> find_job_token(const std::string& run_dir, double timeout_s) {
  if (auto from_env = job_token_from_env()) return *from_env;
  const std::string path = run_dir + "/" + kJobTokenFile;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    auto token = read_job_token_file(path);
    if (token.ok() || token.status().code() != StatusCode::kNotFound) return token;
    if (std::chrono::steady_clock::now() > deadline) {
      return make_error(StatusCode::kUnavailable,
                        "no job token: {} is unset and {} did not appear within {:.0f} s (are the daemons running "
                        "with the same SHARDMIX_RUN_DIR? still loading?)",
                        kJobTokenEnv, path, timeout_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// A connected Unix stream socket to the daemon of `node` at `path`.
Result<int> connect_socket(const std::string& path, std::uint32_t node) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return make_error(StatusCode::kInvalidArgument, "socket path {} is too long", path);
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(StatusCode::kIoError, "socket(): {}", std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int error = errno;
    ::close(fd);
    return make_error(StatusCode::kUnavailable, "cannot connect to the daemon of node {} at {}: {}", node, path,
                      std::strerror(error));
  }
  return fd;
}

}  // namespace

std::string LauncherRank::describe() const {
  std::string text = std::to_string(world_size) + " trainers (rank " + std::to_string(rank);
  if (local_rank >= 0) text += ", local rank " + std::to_string(local_rank);
  if (local_size >= 0) text += (local_rank >= 0 ? " of " : ", ") + std::to_string(local_size) + " per node";
  if (nodes >= 0) text += ", " + std::to_string(nodes) + " nodes";
  return text + "; from " + source + ")";
}

LauncherRank detect_launcher_rank() {
  auto fill = [](LauncherRank r, const char* local_rank, const char* local_size) {
    r.local_rank = local_rank ? env_int(local_rank).value_or(-1) : -1;
    r.local_size = local_size ? env_int(local_size).value_or(-1) : -1;
    if (r.nodes < 0 && r.local_size > 0 && r.world_size % r.local_size == 0) r.nodes = r.world_size / r.local_size;
    return r;
  };
  auto pair = [](const char* rank, const char* size) -> std::optional<LauncherRank> {
    auto r = env_int(rank);
    auto w = env_int(size);
    if (!r || !w || *w == 0 || *r >= *w) return std::nullopt;
    LauncherRank out;
    out.rank = *r;
    out.world_size = *w;
    out.source = rank;
    return out;
  };
  if (auto r = pair("SHARDMIX_RANK", "SHARDMIX_WORLD_SIZE")) {
    return fill(*r, "SHARDMIX_LOCAL_RANK", "SHARDMIX_LOCAL_SIZE");
  }
  if (auto r = pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")) {
    // MPMD: "N M" app context sizes, and which one is ours.
    std::vector<int> apps;
    if (const char* ctx = std::getenv("OMPI_APP_CTX_NUM_PROCS"); ctx != nullptr) {
      std::istringstream in(ctx);
      for (int n; in >> n;) apps.push_back(n);
    }
    const int app = env_int("OMPI_MCA_orte_app_num").value_or(0);
    if (apps.size() > 1 && app < static_cast<int>(apps.size())) {
      int first = 0;
      for (int a = 0; a < app; ++a) first += apps[static_cast<std::size_t>(a)];
      if (r->rank >= first && r->rank - first < apps[static_cast<std::size_t>(app)]) {
        r->rank -= first;
        r->world_size = apps[static_cast<std::size_t>(app)];
        r->source = "OMPI_COMM_WORLD_RANK, app context " + std::to_string(app) + " of an MPMD job";
        return *r;  // the node's local ranks mix the apps' processes: unknown
      }
    }
    return fill(*r, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
  }
  if (auto r = pair("PMI_RANK", "PMI_SIZE")) return fill(*r, "MPI_LOCALRANKID", "MPI_LOCALNRANKS");
  if (auto r = pair("SLURM_PROCID", "SLURM_NTASKS")) {
    r->nodes = env_int("SLURM_NNODES").value_or(-1);
    LauncherRank out = fill(*r, "SLURM_LOCALID", nullptr);
    if (out.nodes > 0 && out.world_size % out.nodes == 0) out.local_size = out.world_size / out.nodes;
    return out;
  }
  if (auto r = pair("RANK", "WORLD_SIZE")) return fill(*r, "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return {};
}

// `requested` if >= 0, else the environment variable `name` (seconds, or a duration such
// as "90s"), else `fallback`. A value that is neither is an error naming the variable,
// not a silent fallback; so is one beyond a day (poll takes int milliseconds).
static Result<double> timeout_s(double requested, const char* name, double fallback) {
  constexpr double kMaxSeconds = 86400;
  double seconds = requested;
  if (seconds < 0) {
    const char* env = std::getenv(name);
    if (env == nullptr || *env == '\0') return fallback;
    char* end = nullptr;
    seconds = std::strtod(env, &end);
    if (end == env || *end != '\0' || seconds < 0) {
      auto d = parse_duration(env, name);
      if (!d.ok()) {
        return make_error(StatusCode::kInvalidArgument, "{}={}: not seconds or a duration such as \"90s\"", name,
                          env);
      }
      seconds = std::chrono::duration<double>(*d).count();
    }
  }
  if (seconds > kMaxSeconds) {
    return make_error(StatusCode::kInvalidArgument, "{}: {} s is more than a day ({} s at most)", name, seconds,
                      kMaxSeconds);
  }
  return seconds;
}
static Result<double> connect_timeout_s(double requested) {
  return timeout_s(requested, "SHARDMIX_CONNECT_TIMEOUT", 300);
}
static Result<double> receive_timeout_s(double requested) {
  return timeout_s(requested, "SHARDMIX_RECEIVE_TIMEOUT", 30);
}
static Result<double> progress_timeout_s(double requested) {
  return timeout_s(requested, "SHARDMIX_PROGRESS_TIMEOUT", 600);
}

// The socket protocol, blocking with timeouts. Owned by Client; iterators point into it.
class DaemonConnection {
 public:
  ~DaemonConnection() {
    if (fd_ >= 0) close_socket();
    for (const int fd : received_fds_) ::close(fd);
  }

  static Result<std::unique_ptr<DaemonConnection>> open(const ClientOptions& options);

  Status send(const std::vector<std::uint8_t>& frame) {
    if (fd_ < 0) return lost("");
    std::size_t done = 0;
    while (done < frame.size()) {
      const ssize_t n = ::send(fd_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int error = errno;
        // The daemon usually says why before it closes (an Error frame behind batches we
        // have not read yet): report that, not the broken pipe.
        Status reason = pending_error();
        if (!reason.ok()) return reason;
        return lost(std::string(std::strerror(error)) + " (did the daemon stop or crash?)");
      }
      done += static_cast<std::size_t>(n);
    }
    return Status::ok_status();
  }

  // Reads one frame; an Error frame from the daemon becomes its Status. Keepalives are
  // skipped here: they only restart the receive timeout.
  Status receive(proto::FrameHeader& header, std::vector<std::uint8_t>& payload, int* fds = nullptr) {
    std::array<std::uint8_t, sizeof(proto::FrameHeader)> raw{};
    const auto started = std::chrono::steady_clock::now();
    for (;;) {
      SHARDMIX_RETURN_IF_ERROR(read_exact(raw.data(), raw.size(), fds));
      if (auto err = proto::decode_header(raw, header); !err.empty()) {
        return Status(StatusCode::kProtocol, "daemon of node " + std::to_string(node_) + ": " + err);
      }
      if (header.type != static_cast<std::uint16_t>(proto::FrameType::kKeepalive)) break;
      if (header.payload_bytes != 0) {
        return make_error(StatusCode::kProtocol, "daemon of node {}: a keepalive frame with {} payload bytes", node_,
                          header.payload_bytes);
      }
      // The backstop for a live daemon that never delivers (a stalled scheduler): the
      // keepalives prove it runs, not that it will ever answer (decision 0036).
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (waited >= progress_timeout_s_) {
        return make_error(StatusCode::kUnavailable,
                          "the daemon of node {} ({}) is alive (it sends keepalives) but sent nothing else for "
                          "{:.0f} s (ClientOptions::progress_timeout_s, SHARDMIX_PROGRESS_TIMEOUT)",
                          node_, socket_path_, progress_timeout_s_);
      }
      // A signal that arrived while this thread was not blocked in poll or recv (say,
      // while it read the last keepalive) interrupted no system call: ask the hook here
      // too, so such a Ctrl-C waits one keepalive interval, not for the next batch.
      SHARDMIX_RETURN_IF_ERROR(after_signal());
    }
    payload.resize(header.payload_bytes);
    SHARDMIX_RETURN_IF_ERROR(read_exact(payload.data(), payload.size(), nullptr));
    if (header.type == static_cast<std::uint16_t>(proto::FrameType::kError)) {
      proto::ErrorFrame e;
      if (auto err = proto::decode(payload, e); !err.empty()) return Status(StatusCode::kProtocol, err);
      return Status(static_cast<StatusCode>(e.code), "daemon of node " + std::to_string(node_) + ": " + e.message);
    }
    return Status::ok_status();
  }

  // Starts a new pass over `epoch`. Each pass gets a fresh stream id: frames of an
  // abandoned pass (even over the same epoch) are recognised and dropped.
  // With `resume` (a checkpoint blob), the daemon continues from its position.
  Status start_epoch(std::uint64_t epoch, std::span<const std::uint8_t> resume = {}) {
    Position restored;
    restored.started = true;
    restored.epoch = epoch;
    if (!resume.empty()) {
      proto::Checkpoint c;
      if (auto err = proto::decode_checkpoint(resume, c); !err.empty()) {
        return make_error(StatusCode::kInvalidArgument, "cannot resume epoch {}: {}", epoch, err);
      }
      if (c.epoch != epoch) {
        return make_error(StatusCode::kInvalidArgument, "cannot resume epoch {} from a checkpoint of epoch {}", epoch,
                          c.epoch);
      }
      restored.batches = c.batches_consumed;
      restored.samples = c.samples_consumed;
      restored.early.insert(c.early.begin(), c.early.end());
      restored.late.insert(c.late.begin(), c.late.end());
    }
    std::vector<std::uint8_t> out;
    proto::StartEpoch start{epoch, next_stream_, {}};
    start.resume.assign(resume.begin(), resume.end());
    proto::encode(out, start);
    SHARDMIX_RETURN_IF_ERROR(send(out));
    current_stream_ = next_stream_++;
    in_epoch_ = true;
    position_ = std::move(restored);
    return Status::ok_status();
  }

  // A batch was handed to the trainer: its samples count as delivered.
  void delivered(const proto::BatchFrame& frame) {
    Position& p = position_;
    const std::uint64_t end = p.samples + frame.samples.size();
    for (const std::uint64_t position : frame.positions) {
      if (position < p.samples) {
        p.late.erase(position);
      } else {
        p.early.insert(position);
      }
    }
    for (std::uint64_t position = p.samples; position < end; ++position) {
      if (p.early.erase(position) == 0) p.late.insert(position);
    }
    p.samples = end;
    ++p.batches;
  }

  Result<std::vector<std::uint8_t>> checkpoint() const {
    if (!position_.started) {
      return make_error(StatusCode::kInvalidArgument, "checkpoint() before any epoch was started: nothing to save");
    }
    proto::Checkpoint c;
    const bool redealt = welcome_.resumed_epoch == position_.epoch;
    c.flags = redealt ? proto::kCheckpointRedealt : 0;
    c.plan_digest = redealt ? welcome_.resumed_digest : welcome_.plan_digest;
    c.num_samples = welcome_.num_samples;
    c.seed = welcome_.seed;
    c.nodes = welcome_.nodes;
    c.trainers_per_node = welcome_.trainers_per_node;
    c.batch_size = welcome_.batch_size;
    c.drop_last = welcome_.drop_last != 0;
    c.window = welcome_.window;
    c.rank = static_cast<std::uint32_t>(who_.rank);
    c.world_size = static_cast<std::uint32_t>(who_.world_size);
    c.epoch = position_.epoch;
    c.batches_consumed = position_.batches;
    c.samples_consumed = position_.samples;
    c.early.assign(position_.early.begin(), position_.early.end());
    c.late.assign(position_.late.begin(), position_.late.end());
    return proto::encode_checkpoint(c);
  }

  Status release(std::uint64_t epoch, std::uint64_t batch, std::uint64_t wait_us) {
    std::vector<std::uint8_t> out;
    proto::encode(out, proto::Release{epoch, current_stream_, batch, wait_us});
    return send(out);
  }

  // Next batch of the current pass, or nullopt at its end.
  Result<std::optional<proto::BatchFrame>> next_batch() {
    while (true) {
      proto::FrameHeader header{};
      SHARDMIX_RETURN_IF_ERROR(receive(header, payload_));
      const auto type = static_cast<proto::FrameType>(header.type);
      if (type == proto::FrameType::kBatch) {
        proto::BatchFrame frame;
        if (auto err = proto::decode(payload_, frame); !err.empty()) return Status(StatusCode::kProtocol, err);
        if (frame.stream != current_stream_) continue;  // leftovers of an abandoned pass
        return std::optional<proto::BatchFrame>(std::move(frame));
      }
      if (type == proto::FrameType::kEpochEnd) {
        proto::EpochStats stats;
        if (auto err = proto::decode(payload_, stats); !err.empty()) return Status(StatusCode::kProtocol, err);
        if (stats.stream != current_stream_) continue;
        last_stats_ = stats;
        in_epoch_ = false;
        return std::optional<proto::BatchFrame>();
      }
      return make_error(StatusCode::kProtocol, "daemon of node {} sent an unexpected frame type {}", node_, header.type);
    }
  }

  Result<const std::byte*> locate(const proto::SampleDescriptor& d) const {
    const Mapping& m = d.region == static_cast<std::uint8_t>(proto::Region::kArena) ? arena_ : staging_;
    if (d.offset > m.length || d.length > m.length - d.offset) {
      return make_error(StatusCode::kProtocol,
                        "daemon of node {} described sample {} at [{}, +{}) outside its {}-byte region", node_,
                        d.sample_id, d.offset, d.length, m.length);
    }
    return m.data + d.offset;
  }

  Result<const Catalog*> catalog() {
    if (catalog_) return &*catalog_;
    if (in_epoch_) return make_error(StatusCode::kInvalidArgument, "fetch the catalog before or between epochs");
    std::vector<std::uint8_t> out;
    proto::encode_get_catalog(out);
    SHARDMIX_RETURN_IF_ERROR(send(out));
    proto::FrameHeader header{};
    SHARDMIX_RETURN_IF_ERROR(receive(header, payload_));
    if (header.type != static_cast<std::uint16_t>(proto::FrameType::kCatalog)) {
      return make_error(StatusCode::kProtocol, "expected the catalog, got frame type {}", header.type);
    }
    auto c = Catalog::deserialize(payload_);
    if (!c.ok()) return c.status();
    catalog_ = std::move(*c);
    return &*catalog_;
  }

  // ---- model checkpoints (docs/decisions/0056) ----

  Result<std::uint64_t> save_checkpoint(std::string_view name, std::uint64_t size,
                                        const std::function<void(std::span<std::uint8_t>)>& write) {
    SHARDMIX_ASSIGN_OR_RETURN(CheckpointLease lease, lease_checkpoint(name, size));
    try {
      write(lease.bytes);
    } catch (...) {
      (void)abandon_lease(lease);  // the caller's exception is the one to see
      throw;
    }
    return save_lease(lease, size);
  }

  // A lease (decision 0069): the daemon allocates `size` bytes of its checkpoint pool and
  // passes its memfd and the runs of it that make them; they are mapped side by side here
  // and the memfd closed at once, so this process can reach those runs only, and only
  // through the mapping that save_lease and abandon_lease unmap.
  Result<CheckpointLease> lease_checkpoint(std::string_view name, std::uint64_t size) {
    SHARDMIX_RETURN_IF_ERROR(validate_checkpoint_name(name));
    SHARDMIX_ASSIGN_OR_RETURN(DaemonConnection * channel, checkpoint_channel());
    if (channel->lease_id_ != 0) SHARDMIX_RETURN_IF_ERROR(end_lease(*channel, false, 0).status());
    const std::int64_t begin = trace::start();
    const std::uint64_t request = next_request_++;
    std::vector<std::uint8_t> frame;
    proto::encode_checkpoint_lease(frame, proto::CheckpointSave{request, size, std::string(name)});
    SHARDMIX_RETURN_IF_ERROR(channel->send(frame));
    Result<proto::CheckpointLeaseGrant> answer = channel->checkpoint_answer<proto::CheckpointLeaseGrant>(
        proto::FrameType::kCheckpointLeaseGrant, "a checkpoint lease", request);
    std::vector<int> fds = std::exchange(channel->received_fds_, {});
    struct Closer {
      std::vector<int>& fds;
      ~Closer() {
        for (int fd : fds) ::close(fd);
      }
    } closer{fds};
    SHARDMIX_ASSIGN_OR_RETURN(proto::CheckpointLeaseGrant grant, std::move(answer));
    if (grant.code != 0) {
      return Status(static_cast<StatusCode>(grant.code), "daemon of node " + std::to_string(node_) + ": " + grant.message);
    }
    channel->lease_id_ = grant.lease;  // from here on the daemon holds it for us: given back below on any error
    std::vector<MemfdRun> runs;
    for (std::size_t i = 0; i < grant.run_offsets.size(); ++i) runs.push_back({grant.run_offsets[i], grant.run_lengths[i]});
    Result<SideBySideMapping> view = make_error(StatusCode::kProtocol, "the daemon of node {} leased {} bytes for "
                                                "checkpoint '{}' but passed no memfd", node_, size, name);
    if (runs.empty()) {
      view = SideBySideMapping();
    } else if (!fds.empty()) {
      view = SideBySideMapping::map(fds.front(), runs);
    }
    if (view.ok() && grant.size != size) {
      view = make_error(StatusCode::kProtocol, "the daemon of node {} leased {} bytes for checkpoint '{}', not {}", node_,
                        grant.size, name, size);
    }
    if (!view.ok()) {
      const Status failed(view.status().code(), fmt::format("checkpoint {}: its lease of {} bytes: {}", name, size,
                                                            view.status().message()));
      (void)end_lease(*channel, false, 0);
      return failed;
    }
    // Not inherited by a child process (a fork()ed DataLoader worker): only this process
    // writes the lease, and only until it is saved.
    if (!view->bytes().empty()) (void)::madvise(view->bytes().data(), view->bytes().size(), MADV_DONTFORK);
    channel->lease_view_ = std::move(*view);
    channel->lease_begin_ = begin;
    channel->held_lease_ = ++lease_serial_;
    return CheckpointLease{channel->held_lease_, std::string(name), channel->lease_view_.bytes().first(size)};
  }

  Result<std::uint64_t> save_lease(const CheckpointLease& lease, std::uint64_t length) {
    SHARDMIX_RETURN_IF_ERROR(check_lease(lease));
    if (length > lease.bytes.size()) {
      return make_error(StatusCode::kInvalidArgument, "checkpoint {}: saving {} bytes of a lease of {}", lease.name,
                        length, lease.bytes.size());
    }
    DaemonConnection& channel = *checkpoints_;  // held: check_lease found it open
    const std::int64_t begin = channel.lease_begin_;
    SHARDMIX_ASSIGN_OR_RETURN(proto::CheckpointReply reply, end_lease(channel, true, length));
    trace::span(trace::What::kCheckpointSave, 0, begin, trace::kAlways, {reply.version, length});
    return reply.version;
  }

  Status abandon_lease(const CheckpointLease& lease) {
    SHARDMIX_RETURN_IF_ERROR(check_lease(lease));
    return end_lease(*checkpoints_, false, 0).status();
  }

  // Held: handed out by this client on the checkpoint connection still open, and not saved
  // or abandoned since. A connection closes its lease with it (close_socket).
  bool holds_lease(const CheckpointLease& lease) const {
    return lease.id != 0 && checkpoints_ && checkpoints_->fd_ >= 0 && checkpoints_->held_lease_ == lease.id;
  }

  Status check_lease(const CheckpointLease& lease) const {
    if (holds_lease(lease)) return Status::ok_status();
    return make_error(StatusCode::kInvalidArgument,
                      "checkpoint {}: lease {} is not this client's (it was saved, abandoned or replaced by a newer "
                      "one, or its connection to the daemon was closed)",
                      lease.name, lease.id);
  }

  // Unmaps the lease first, so that nothing here can write into memory the daemon saves
  // or reuses, then commits it (`commit`) or gives it back.
  Result<proto::CheckpointReply> end_lease(DaemonConnection& channel, bool commit, std::uint64_t length) {
    channel.lease_view_ = SideBySideMapping();
    const std::uint64_t lease = std::exchange(channel.lease_id_, 0);
    channel.held_lease_ = 0;
    const std::uint64_t request = next_request_++;
    std::vector<std::uint8_t> frame;
    proto::encode(frame, commit ? proto::FrameType::kCheckpointCommit : proto::FrameType::kCheckpointAbandon,
                  proto::CheckpointCommit{request, lease, length});
    SHARDMIX_RETURN_IF_ERROR(channel.send(frame));
    return channel.checkpoint_reply(request);
  }

  // This client's save buffer (decision 0068), made on first use and kept: its pages are
  // allocated once, not once a save.
  Result<CheckpointSaveBuffer*> save_buffer() {
    if (!save_buffer_) {
      SHARDMIX_ASSIGN_OR_RETURN(CheckpointSaveBuffer made, CheckpointSaveBuffer::create());
      save_buffer_.emplace(std::move(made));
    }
    return &*save_buffer_;
  }

  // The first `size` bytes the caller wrote into the save buffer's descriptor.
  Result<std::uint64_t> save_checkpoint_buffer(std::string_view name, std::uint64_t size) {
    SHARDMIX_RETURN_IF_ERROR(validate_checkpoint_name(name));
    SHARDMIX_ASSIGN_OR_RETURN(DaemonConnection * channel, checkpoint_channel());
    SHARDMIX_ASSIGN_OR_RETURN(CheckpointSaveBuffer * buffer, save_buffer());
    struct stat st {};
    if (::fstat(buffer->fd(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) < size) {
      return make_error(StatusCode::kInvalidArgument, "checkpoint {}: the save buffer holds {} bytes, not the {} to save",
                        name, st.st_size, size);
    }
    return hand_over_buffer(*channel, name, size);
  }

  // The save buffer's first `size` bytes as the next version of `name`. After a save that
  // failed, the daemon may not have finished copying the buffer (its reply can be an error
  // while the copy is still queued), so the next save gets a new buffer rather than
  // writing into this one; the daemon's own descriptor keeps the old one alive.
  Result<std::uint64_t> hand_over_buffer(DaemonConnection& channel, std::string_view name, std::uint64_t size) {
    Result<std::uint64_t> version = hand_over_checkpoint(channel, name, size, save_buffer_->fd());
    if (!version.ok()) save_buffer_.reset();
    return version;
  }

  // A memfd the caller filled (e.g. a serializer wrote to it as a file): sealed here and
  // handed over as it is, so its pages are the node's only copy.
  Result<std::uint64_t> save_checkpoint_memfd(std::string_view name, int fd) {
    SHARDMIX_RETURN_IF_ERROR(validate_checkpoint_name(name));
    SHARDMIX_ASSIGN_OR_RETURN(DaemonConnection * channel, checkpoint_channel());
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      return make_error(StatusCode::kInvalidArgument, "checkpoint {}: descriptor {}: {}", name, fd, std::strerror(errno));
    }
    SHARDMIX_RETURN_IF_ERROR(seal_checkpoint_memfd(fd, name));
    return hand_over_checkpoint(*channel, name, static_cast<std::uint64_t>(st.st_size), fd);
  }

  // Sends a sealed memfd of `size` bytes as the next version of `name` and waits for the
  // daemon's reply: the version number once the node holds it.
  Result<std::uint64_t> hand_over_checkpoint(DaemonConnection& channel, std::string_view name, std::uint64_t size,
                                             int fd) {
    const std::int64_t begin = trace::start();
    const std::uint64_t request = next_request_++;
    std::vector<std::uint8_t> frame;
    proto::encode(frame, proto::CheckpointSave{request, size, std::string(name)});
    SHARDMIX_RETURN_IF_ERROR(channel.send_with_memfd(frame, fd));
    SHARDMIX_ASSIGN_OR_RETURN(proto::CheckpointReply reply, channel.checkpoint_reply(request));
    trace::span(trace::What::kCheckpointSave, 0, begin, trace::kAlways, {reply.version, size});
    return reply.version;
  }

  Status wait_durable(std::string_view name) {
    SHARDMIX_ASSIGN_OR_RETURN(DaemonConnection * channel, checkpoint_channel());
    const std::uint64_t request = next_request_++;
    std::vector<std::uint8_t> frame;
    proto::encode(frame, proto::FrameType::kCheckpointWaitDurable, proto::CheckpointRequest{request, std::string(name)});
    SHARDMIX_RETURN_IF_ERROR(channel->send(frame));
    return channel->checkpoint_reply(request).status();
  }

  // The reply's memfd goes to `memfd` (owned by the caller from then on).
  Result<proto::CheckpointReply> load_checkpoint(std::string_view name, int& memfd) {
    SHARDMIX_ASSIGN_OR_RETURN(DaemonConnection * channel, checkpoint_channel());
    const std::uint64_t request = next_request_++;
    std::vector<std::uint8_t> frame;
    proto::encode(frame, proto::FrameType::kCheckpointLoad, proto::CheckpointRequest{request, std::string(name)});
    SHARDMIX_RETURN_IF_ERROR(channel->send(frame));
    auto reply = channel->checkpoint_reply(request);
    std::vector<int> fds = std::exchange(channel->received_fds_, {});
    if (reply.ok() && !fds.empty()) memfd = fds.front();
    for (std::size_t i = memfd >= 0 ? 1 : 0; i < fds.size(); ++i) ::close(fds[i]);
    if (reply.ok() && memfd < 0) {
      return make_error(StatusCode::kProtocol, "the daemon of node {} loaded checkpoint '{}' but passed no memfd",
                        node_, name);
    }
    return reply;
  }

  Result<std::vector<CheckpointVersion>> list_checkpoints() {
    SHARDMIX_ASSIGN_OR_RETURN(DaemonConnection * channel, checkpoint_channel());
    const std::uint64_t request = next_request_++;
    std::vector<std::uint8_t> frame;
    proto::encode(frame, proto::FrameType::kCheckpointList, proto::CheckpointRequest{request, {}});
    SHARDMIX_RETURN_IF_ERROR(channel->send(frame));
    SHARDMIX_ASSIGN_OR_RETURN(proto::CheckpointListing listing,
                              channel->checkpoint_answer<proto::CheckpointListing>(
                                  proto::FrameType::kCheckpointListing, "a checkpoint listing", request));
    std::vector<CheckpointVersion> out;
    std::size_t offset = 0;
    for (std::size_t i = 0; i < listing.versions.size(); ++i) {
      out.push_back(CheckpointVersion{listing.names.substr(offset, listing.name_bytes[i]), listing.versions[i]});
      offset += listing.name_bytes[i];
    }
    return out;
  }

  // This trainer's position in the epoch it iterates (or last iterated).
  struct Position {
    bool started = false;
    std::uint64_t epoch = 0;
    std::uint64_t batches = 0;         // batches handed to the trainer
    std::uint64_t samples = 0;         // samples in them
    std::set<std::uint64_t> early;     // delivered plan positions >= samples
    std::set<std::uint64_t> late;      // undelivered plan positions < samples
  };
  Position position_;
  proto::Welcome welcome_;
  LauncherRank who_;
  std::uint32_t node_ = 0;
  std::optional<proto::EpochStats> last_stats_;

 private:
  // No byte within the receive timeout, although a live daemon sends at least a keepalive
  // every kKeepaliveInterval.
  Status silent() const {
    return make_error(StatusCode::kUnavailable,
                      "the daemon of node {} ({}) sent nothing for {:.0f} s, not even its keepalive (one every {} ms): "
                      "it is stopped, hung or starved of CPU (ClientOptions::receive_timeout_s, "
                      "SHARDMIX_RECEIVE_TIMEOUT)",
                      node_, socket_path_, receive_timeout_s_, proto::kKeepaliveInterval.count());
  }

  // Blocks until the socket has bytes (or an error, which the next recv reports), within
  // the receive timeout; a signal asks ClientOptions::interrupted whether to go on.
  Status wait_readable() {
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(receive_timeout_s_ * 1000));
      if (ready > 0 || (ready < 0 && errno != EINTR)) return Status::ok_status();
      if (ready == 0) return silent();
      SHARDMIX_RETURN_IF_ERROR(after_signal());
    }
  }

  // A system call of a wait failed with EINTR: ok to retry it, unless the trainer's hook
  // says to stop waiting.
  Status after_signal() { return interrupted_ && interrupted_() ? interrupt() : Status::ok_status(); }

  // The trainer asked to stop waiting (ClientOptions::interrupted, on a signal). A frame
  // may be half read, so the connection cannot go on: close it, and the daemon frees what
  // this trainer held as for any disconnect.
  Status interrupt() {
    close_socket();
    return make_error(StatusCode::kCancelled,
                      "interrupted by a signal while waiting for the daemon of node {} ({}); the connection is "
                      "closed: connect again to go on",
                      node_, socket_path_);
  }

  // Closes the socket; the daemon then frees what this connection held. A checkpoint
  // lease is among that, and its chunks may go to another checkpoint at once, so this
  // process's mapping of it goes first: a write through a stale lease then faults rather
  // than landing in another version.
  void close_socket() {
    lease_view_ = SideBySideMapping();
    lease_id_ = 0;
    held_lease_ = 0;
    ::close(std::exchange(fd_, -1));
    inbox_begin_ = inbox_end_ = 0;
  }

  Status lost(const std::string& why) {
    return make_error(StatusCode::kUnavailable, "lost the connection to the daemon of node {} ({}): {}", node_,
                      socket_path_, fd_ < 0 ? "it was closed when a wait was interrupted; connect again" : why);
  }

  // Reads exactly n bytes: first what an earlier receive buffered, then, without fds,
  // through the inbox: one recv takes whatever the daemon has queued (often several batch
  // frames), so a trainer that is behind pays one system call for many frames instead of
  // a poll and a recv per header and per payload. Payloads larger than the inbox are read
  // straight into `out`. With fds (the Welcome, the first frame) nothing is buffered yet
  // and the bytes are read exactly, with their SCM_RIGHTS descriptors.
  Status read_exact(std::uint8_t* out, std::size_t n, int* fds) {
    if (fd_ < 0) return lost("");
    // A checkpoint connection buffers nothing: a recv that ran into a load's reply would drop its memfd.
    if (keep_all_descriptors_ || (fds != nullptr && inbox_begin_ == inbox_end_)) {
      return read_exact_unbuffered(out, n, fds);
    }
    std::size_t done = std::min(n, inbox_end_ - inbox_begin_);
    // Not memcpy of 0 bytes: before the first recv the inbox has no storage (data() is null).
    if (done > 0) std::memcpy(out, inbox_.data() + inbox_begin_, done);
    inbox_begin_ += done;
    while (done < n) {
      if (n - done >= kInboxBytes) return read_exact_unbuffered(out + done, n - done, nullptr);
      if (inbox_.size() < kInboxBytes) inbox_.resize(kInboxBytes);
      ssize_t got = ::recv(fd_, inbox_.data(), inbox_.size(), MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        // Nothing queued: block until the daemon sends (the one wait of a starving trainer).
        SHARDMIX_RETURN_IF_ERROR(wait_readable());
        continue;
      }
      if (got < 0 && errno == EINTR) {
        SHARDMIX_RETURN_IF_ERROR(after_signal());
        continue;
      }
      if (got < 0) return lost(std::strerror(errno));
      if (got == 0) return lost("the daemon closed the connection (did it stop or crash?)");
      const std::size_t take = std::min(n - done, static_cast<std::size_t>(got));
      std::memcpy(out + done, inbox_.data(), take);
      done += take;
      inbox_begin_ = take;
      inbox_end_ = static_cast<std::size_t>(got);
    }
    return Status::ok_status();
  }

  Status read_exact_unbuffered(std::uint8_t* out, std::size_t n, int* fds) {
    if (fd_ < 0) return lost("");
    std::size_t done = 0;
    while (done < n) {
      SHARDMIX_RETURN_IF_ERROR(wait_readable());
      iovec iov{out + done, n - done};
      alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      const bool take_fds = keep_all_descriptors_ || (fds != nullptr && done == 0);
      if (take_fds) {
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
      }
      const ssize_t got = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
      if (got < 0 && errno == EINTR) {
        SHARDMIX_RETURN_IF_ERROR(after_signal());
        continue;
      }
      if (got < 0) return lost(std::strerror(errno));
      if (got == 0) return lost("the daemon closed the connection (did it stop or crash?)");
      if (take_fds) {
        // Keep exactly the two descriptors of a well-formed SCM_RIGHTS message; close
        // anything else that arrived, so a confused peer cannot leak fds (and the RAM
        // they pin) into the trainer.
        const std::vector<int> got = received_descriptors(msg);
        for (std::size_t i = 0; i < got.size(); ++i) {
          if (keep_all_descriptors_) {
            received_fds_.push_back(got[i]);  // the caller takes the one it expects
          } else if (got.size() == 2 && fds[i] < 0) {
            fds[i] = got[i];
          } else {
            ::close(got[i]);
          }
        }
        if ((msg.msg_flags & MSG_CTRUNC) != 0) {
          return make_error(StatusCode::kProtocol, "the daemon of node {} sent more descriptors than expected", node_);
        }
      }
      done += static_cast<std::size_t>(got);
    }
    return Status::ok_status();
  }

  // After a failed send: reads what the daemon left in the socket, looking for its Error
  // frame; ok if there is none (a crash). Bounded: the peer has closed, so reads end at EOF.
  Status pending_error() {
    const double saved = receive_timeout_s_;
    receive_timeout_s_ = 1;
    Status found;
    proto::FrameHeader header{};
    std::vector<std::uint8_t> payload;
    for (int frames = 0; frames < 4096; ++frames) {
      header = {};
      Status s = receive(header, payload);
      if (s.ok()) continue;  // a batch or epoch end queued before the error
      if (header.type == static_cast<std::uint16_t>(proto::FrameType::kError)) found = s;  // the daemon's reason
      break;
    }
    receive_timeout_s_ = saved;
    return found;
  }

  // The checkpoint connection to this trainer's daemon: opened on first use with a
  // CheckpointHello (same socket and job token), so checkpoint requests never share the
  // batch stream. Its waits have no progress backstop: a save waiting for room or a
  // wait_durable on slow storage may take long; keepalives show the daemon is alive.
  Result<DaemonConnection*> checkpoint_channel() {
    if (checkpoints_ && checkpoints_->fd_ >= 0) return checkpoints_.get();
    auto c = std::make_unique<DaemonConnection>();
    c->receive_timeout_s_ = receive_timeout_s_;
    c->progress_timeout_s_ = std::numeric_limits<double>::infinity();
    c->interrupted_ = interrupted_;
    c->node_ = node_;
    c->socket_path_ = socket_path_;
    c->keep_all_descriptors_ = true;
    SHARDMIX_ASSIGN_OR_RETURN(c->fd_, connect_socket(socket_path_, node_));
    std::vector<std::uint8_t> hello;
    proto::encode_checkpoint_hello(hello, proto::Hello{static_cast<std::uint32_t>(who_.rank),
                                                       static_cast<std::uint32_t>(who_.world_size),
                                                       static_cast<std::uint32_t>(::getpid())});
    proto::set_hello_job_token(hello, job_token_);
    SHARDMIX_RETURN_IF_ERROR(c->send(hello));
    proto::FrameHeader header{};
    SHARDMIX_RETURN_IF_ERROR(c->receive(header, c->payload_));
    proto::CheckpointWelcome welcome;
    if (header.type != static_cast<std::uint16_t>(proto::FrameType::kCheckpointWelcome)) {
      return make_error(StatusCode::kProtocol, "expected a checkpoint welcome from the daemon of node {}, got frame type {}",
                        node_, header.type);
    }
    if (auto err = proto::decode(c->payload_, welcome); !err.empty()) return Status(StatusCode::kProtocol, err);
    checkpoints_ = std::move(c);
    return checkpoints_.get();
  }

  // The frame's header alone, then its payload with the memfd attached to its first byte:
  // the daemon reads headers with plain reads, which would drop a descriptor.
  Status send_with_memfd(const std::vector<std::uint8_t>& frame, int memfd) {
    const std::span<const std::uint8_t> bytes(frame);
    SHARDMIX_RETURN_IF_ERROR(send(std::vector<std::uint8_t>(bytes.begin(), bytes.begin() + sizeof(proto::FrameHeader))));
    std::size_t done = sizeof(proto::FrameHeader);
    while (done < bytes.size()) {
      const bool first = done == sizeof(proto::FrameHeader);
      const ssize_t n = send_with_descriptors(fd_, bytes.subspan(done), first ? std::span(&memfd, 1) : std::span<const int>(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return lost(std::string(std::strerror(errno)) + " (did the daemon stop or crash?)");
      done += static_cast<std::size_t>(n);
    }
    return Status::ok_status();
  }

  // The reply to checkpoint request `request`: its error as a Status, naming what failed.
  Result<proto::CheckpointReply> checkpoint_reply(std::uint64_t request) {
    SHARDMIX_ASSIGN_OR_RETURN(proto::CheckpointReply reply,
                              checkpoint_answer<proto::CheckpointReply>(proto::FrameType::kCheckpointReply,
                                                                        "a checkpoint reply", request));
    if (reply.code != 0) return Status(static_cast<StatusCode>(reply.code), "daemon of node " + std::to_string(node_) + ": " + reply.message);
    return reply;
  }

  // The next frame on this checkpoint connection, which must be a `type` frame (`what` in
  // errors) answering request `request`.
  // Any failure here leaves the connection out of step with the daemon (an answer missing,
  // unread or unreadable), so the connection is closed: the daemon then frees what it held
  // for it (a lease granted in the answer this could not read), and the next checkpoint call
  // opens a new one.
  template <typename Answer>
  Result<Answer> checkpoint_answer(proto::FrameType type, std::string_view what, std::uint64_t request) {
    Result<Answer> answer = read_checkpoint_answer<Answer>(type, what, request);
    if (!answer.ok() && fd_ >= 0) close_socket();
    return answer;
  }
  template <typename Answer>
  Result<Answer> read_checkpoint_answer(proto::FrameType type, std::string_view what, std::uint64_t request) {
    proto::FrameHeader header{};
    SHARDMIX_RETURN_IF_ERROR(receive(header, payload_));
    if (header.type != static_cast<std::uint16_t>(type)) {
      return make_error(StatusCode::kProtocol, "expected {} from the daemon of node {}, got frame type {}", what, node_,
                        header.type);
    }
    Answer answer;
    if (auto err = proto::decode(payload_, answer); !err.empty()) return Status(StatusCode::kProtocol, err);
    if (answer.request != request) {
      return make_error(StatusCode::kProtocol, "the daemon of node {} answered request {}, not {}", node_,
                        answer.request, request);
    }
    return answer;
  }

  // Bytes received but not consumed yet (read_exact).
  static constexpr std::size_t kInboxBytes = 64 * 1024;
  std::vector<std::uint8_t> inbox_;
  std::size_t inbox_begin_ = 0;
  std::size_t inbox_end_ = 0;
  int fd_ = -1;
  // A checkpoint connection: every descriptor that arrives is kept in received_fds_.
  bool keep_all_descriptors_ = false;
  std::vector<int> received_fds_;
  std::uint32_t job_token_ = 0;
  std::unique_ptr<DaemonConnection> checkpoints_;  // opened on first use
  std::uint64_t next_request_ = 1;
  std::string socket_path_;
  double receive_timeout_s_ = 30;
  double progress_timeout_s_ = 600;
  std::function<bool()> interrupted_;
  Mapping arena_;
  Mapping staging_;
  std::vector<std::uint8_t> payload_;
  std::optional<Catalog> catalog_;
  std::optional<CheckpointSaveBuffer> save_buffer_;  // made on the first save_buffer
  // On a checkpoint connection: the lease it holds (decision 0069) as the daemon numbers it
  // (per connection, 0: none) and as this client numbers it (CheckpointLease::id, never
  // reused by the client, so a lease from a closed connection never matches a new one),
  // and this process's mapping of it.
  std::uint64_t lease_id_ = 0;
  std::uint64_t held_lease_ = 0;
  SideBySideMapping lease_view_;
  std::int64_t lease_begin_ = 0;  // trace start of the save it is for
  // On the batch connection: the last CheckpointLease::id handed out.
  std::uint64_t lease_serial_ = 0;
  bool in_epoch_ = false;
  std::uint64_t next_stream_ = 1;
  std::uint64_t current_stream_ = 0;
};

// telemetry.trace_dir, as the daemons published it: this trainer's recorder (common/trace.h).
static Status start_trace(const std::map<std::string, std::string>& ready, int rank, std::uint32_t node) {
  auto published = trace::parse_ready(ready);
  if (!published.ok()) return published.status();
  if (!published->has_value()) return Status::ok_status();
  const trace::ReadyTrace& t = **published;
  trace::Settings settings;
  settings.path = fmt::format("{}/trainer-{}-{}.json", t.dir, node, rank);
  settings.process_name = fmt::format("trainer {} (node {})", rank, node);
  settings.pid = trace::trainer_pid(static_cast<std::uint32_t>(rank));
  settings.role = "trainer";
  settings.node = node;
  settings.sample_fraction = t.sample_fraction;
  settings.max_events_per_thread = t.max_events;
  return trace::enable(std::move(settings));
}

Result<std::unique_ptr<DaemonConnection>> DaemonConnection::open(const ClientOptions& options) {
  auto c = std::make_unique<DaemonConnection>();
  SHARDMIX_ASSIGN_OR_RETURN(c->receive_timeout_s_, receive_timeout_s(options.receive_timeout_s));
  SHARDMIX_ASSIGN_OR_RETURN(c->progress_timeout_s_, progress_timeout_s(options.progress_timeout_s));
  c->interrupted_ = options.interrupted;
  SHARDMIX_ASSIGN_OR_RETURN(const double ready_timeout, connect_timeout_s(options.ready_timeout_s));
  c->who_ = detect_launcher_rank();
  if (options.rank >= 0) c->who_.rank = options.rank;
  if (options.world_size >= 0) c->who_.world_size = options.world_size;

  const std::string run_dir = resolve_run_dir(options);
  int daemon = options.daemon >= 0 ? options.daemon : env_int("SHARDMIX_DAEMON").value_or(-1);
  std::map<std::string, std::string> published;  // RUN_DIR/ready, for the trace keys
  if (daemon < 0) {
    // Our node is rank / trainers_per_node, as the daemons published it.
    auto ready = read_ready_file(run_dir, ready_timeout);
    if (!ready.ok()) return ready.status();
    published = *ready;
    const int daemons = std::atoi((*ready)["daemons"].c_str());
    const int per_node = std::atoi((*ready)["trainers_per_node"].c_str());
    if (daemons <= 0 || per_node <= 0) {
      return make_error(StatusCode::kCorrupt, "{}/ready is malformed (daemons={}, trainers_per_node={})", run_dir,
                        (*ready)["daemons"], (*ready)["trainers_per_node"]);
    }
    // Daemons on this host (several when "nodes" are emulated on one machine): the
    // launcher's local size and rank must match them too, when it tells them.
    const LauncherRank& who = c->who_;
    const std::string here = this_host();
    int daemons_here = 0, first_here = -1;
    for (int r = 0; r < daemons; ++r) {
      if ((*ready)["host." + std::to_string(r)] != here) continue;
      ++daemons_here;
      if (first_here < 0) first_here = r;
    }
    // When the launcher counts as many nodes as there are daemons, its nodes are the
    // daemons' nodes (also when they are emulated on one host); otherwise compare per host.
    const bool launcher_nodes = who.nodes == daemons;
    const bool known_here = launcher_nodes || daemons_here > 0;
    const int local_expected = launcher_nodes ? per_node : daemons_here * per_node;
    const int local_rank_expected = launcher_nodes ? who.rank % per_node : who.rank - first_here * per_node;
    const bool sizes_differ = who.world_size != daemons * per_node;
    const bool per_node_differs = known_here && who.local_size > 0 && who.local_size != local_expected;
    const bool order_differs = known_here && !sizes_differ && !per_node_differs && who.local_rank >= 0 &&
                               who.local_rank != local_rank_expected;
    if (sizes_differ || per_node_differs || order_differs) {
      return make_error(StatusCode::kInvalidArgument,
                        "trainer layout does not match the daemons': the launcher started {}; the daemons serve {} "
                        "nodes x service.trainers_per_node {} = {} trainers ({} {}), trainer rank R on node R / {}{}",
                        who.describe(), daemons, per_node, daemons * per_node, local_expected,
                        launcher_nodes ? std::string("per node") : "on this host " + here, per_node,
                        order_differs ? "; this rank is on the wrong node: map trainers to nodes in blocks of "
                                        "trainers_per_node (mpirun --map-by ppr:N:node, srun --distribution=block)"
                                      : "");
    }
    daemon = c->who_.rank / per_node;
    const std::string host = (*ready)["host." + std::to_string(daemon)];
    if (!host.empty() && host != this_host()) {
      return make_error(StatusCode::kInvalidArgument,
                        "trainer rank {} belongs to node {} on host {}, but runs on host {}: start trainers with "
                        "the same node mapping as the daemons (e.g. --map-by ppr:{}:node)",
                        c->who_.rank, daemon, host, this_host(), per_node);
    }
  }
  // An explicitly chosen daemon (tests, several "nodes" on one machine) is connected to
  // directly: a missing socket is reported by connect() below.
  c->node_ = static_cast<std::uint32_t>(daemon);
  c->socket_path_ = run_dir + "/d" + std::to_string(daemon) + ".sock";

  SHARDMIX_ASSIGN_OR_RETURN(c->fd_, connect_socket(c->socket_path_, c->node_));
  std::vector<std::uint8_t> hello;
  proto::encode(hello, proto::Hello{static_cast<std::uint32_t>(c->who_.rank),
                                    static_cast<std::uint32_t>(c->who_.world_size),
                                    static_cast<std::uint32_t>(::getpid())});
  auto token = find_job_token(run_dir, ready_timeout);
  if (!token.ok()) return token.status();
  c->job_token_ = *token;
  proto::set_hello_job_token(hello, *token);
  SHARDMIX_RETURN_IF_ERROR(c->send(hello));

  proto::FrameHeader header{};
  std::vector<std::uint8_t> payload;
  int fds[2] = {-1, -1};
  struct FdCloser {  // the mappings keep the memory; the descriptors are closed on every path
    int* fds;
    ~FdCloser() {
      for (int i = 0; i < 2; ++i)
        if (fds[i] >= 0) ::close(fds[i]);
    }
  } closer{fds};
  SHARDMIX_RETURN_IF_ERROR(c->receive(header, payload, fds));
  if (header.type != static_cast<std::uint16_t>(proto::FrameType::kWelcome)) {
    return make_error(StatusCode::kProtocol, "expected a welcome from the daemon, got frame type {}", header.type);
  }
  if (auto err = proto::decode(payload, c->welcome_); !err.empty()) return Status(StatusCode::kProtocol, err);
  if (fds[0] < 0 || fds[1] < 0) {
    return Status(StatusCode::kProtocol, "the daemon's welcome carried no shared-memory descriptors");
  }
  auto map = [&](int fd, std::uint64_t length, Mapping& into, const char* what) -> Status {
    void* p = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      return make_error(StatusCode::kResourceExhausted, "mapping the daemon's {} ({} bytes): {}", what, length,
                        std::strerror(errno));
    }
    into.data = static_cast<const std::byte*>(p);
    into.length = length;
    return Status::ok_status();
  };
  SHARDMIX_RETURN_IF_ERROR(map(fds[0], c->welcome_.arena_bytes, c->arena_, "cache arena"));
  SHARDMIX_RETURN_IF_ERROR(map(fds[1], c->welcome_.staging_bytes, c->staging_, "staging area"));
  if (published.empty()) {
    // An explicitly chosen daemon: the ready file is there by now, or tracing stays off.
    if (auto ready = read_ready_file(run_dir, 0); ready.ok()) published = *ready;
  }
  SHARDMIX_RETURN_IF_ERROR(start_trace(published, c->who_.rank, c->node_));
  return c;
}

Result<std::string> query_daemon_stats(const ClientOptions& options, int daemon) {
  const std::string run_dir = resolve_run_dir(options);
  SHARDMIX_ASSIGN_OR_RETURN(const double ready_timeout, connect_timeout_s(options.ready_timeout_s));
  SHARDMIX_ASSIGN_OR_RETURN(const double timeout, receive_timeout_s(options.receive_timeout_s));
  if (daemon < 0) {
    auto ready = read_ready_file(run_dir, ready_timeout);
    if (!ready.ok()) return ready.status();
    const int daemons = std::atoi((*ready)["daemons"].c_str());
    const std::string host = this_host();
    for (int r = 0; r < daemons && daemon < 0; ++r) {
      if ((*ready)["host." + std::to_string(r)] == host) daemon = r;
    }
    if (daemon < 0) {
      return make_error(StatusCode::kNotFound, "{}/ready lists no daemon on host {}; choose one with --daemon", run_dir,
                        host);
    }
  }
  const std::string path = run_dir + "/d" + std::to_string(daemon) + ".sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(StatusCode::kIoError, "socket(): {}", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return make_error(StatusCode::kInvalidArgument, "socket path {} is too long", path);
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return make_error(StatusCode::kUnavailable, "cannot connect to the daemon of node {} at {}: {}", daemon, path,
                      std::strerror(errno));
  }
  std::vector<std::uint8_t> request;
  proto::encode_get_stats(request);
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    return make_error(StatusCode::kUnavailable, "sending to the daemon of node {}: {}", daemon, std::strerror(errno));
  }
  auto read_exact = [&](std::uint8_t* out, std::size_t n) -> Status {
    std::size_t done = 0;
    while (done < n) {
      pollfd p{fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(timeout * 1000));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        return make_error(StatusCode::kUnavailable, "the daemon of node {} sent nothing for {:.0f} s", daemon, timeout);
      }
      const ssize_t got = ::recv(fd, out + done, n - done, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        return make_error(StatusCode::kUnavailable, "the daemon of node {} closed the connection{}", daemon,
                          got < 0 ? std::string(": ") + std::strerror(errno) : std::string());
      }
      done += static_cast<std::size_t>(got);
    }
    return Status::ok_status();
  };
  std::array<std::uint8_t, sizeof(proto::FrameHeader)> raw{};
  SHARDMIX_RETURN_IF_ERROR(read_exact(raw.data(), raw.size()));
  proto::FrameHeader header{};
  if (auto err = proto::decode_header(raw, header); !err.empty()) {
    return Status(StatusCode::kProtocol, "daemon of node " + std::to_string(daemon) + ": " + err);
  }
  std::vector<std::uint8_t> payload(header.payload_bytes);
  SHARDMIX_RETURN_IF_ERROR(read_exact(payload.data(), payload.size()));
  if (header.type == static_cast<std::uint16_t>(proto::FrameType::kError)) {
    proto::ErrorFrame e;
    if (auto err = proto::decode(payload, e); !err.empty()) return Status(StatusCode::kProtocol, err);
    return Status(static_cast<StatusCode>(e.code), "daemon of node " + std::to_string(daemon) + ": " + e.message);
  }
  if (header.type != static_cast<std::uint16_t>(proto::FrameType::kStats)) {
    return make_error(StatusCode::kProtocol, "expected statistics from the daemon, got frame type {}", header.type);
  }
  std::string text;
  if (auto err = proto::decode_stats(payload, text); !err.empty()) return Status(StatusCode::kProtocol, err);
  return text;
}

// ---- iterator ----

EpochIterator::EpochIterator(DaemonConnection* connection, std::uint64_t epoch, std::span<const std::uint8_t> resume)
    : connection_(connection), epoch_(epoch), done_(false) {
  waiting_since_ = std::chrono::steady_clock::now();
  trace_wait_ = trace::start();
  Status s = connection_->start_epoch(epoch, resume);
  if (!s.ok()) throw Error(s);
  fetch_next();
}

void EpochIterator::fetch_next() {
  auto next = connection_->next_batch();
  if (!next.ok()) {
    done_ = true;
    throw Error(next.status());
  }
  if (!next->has_value()) {
    done_ = true;
    holding_ = false;
    batch_ = Batch{};
    return;
  }
  proto::BatchFrame& frame = **next;
  batch_.epoch_ = frame.epoch;
  batch_.index_ = frame.batch;
  batch_.samples_.clear();
  batch_.skipped_.clear();
  batch_.samples_.reserve(frame.samples.size());
  for (const proto::SampleDescriptor& d : frame.samples) {
    if ((d.flags & proto::kSampleSkipped) != 0) {
      batch_.skipped_.push_back(d.sample_id);
      continue;
    }
    auto where = connection_->locate(d);
    if (!where.ok()) {
      done_ = true;
      throw Error(where.status());
    }
    Sample& sample = batch_.samples_.emplace_back();
    sample.data_ = *where;
    sample.desc_ = d;
  }
  connection_->delivered(frame);
  holding_ = true;
  trace::span(trace::What::kWaitBatch, 0, trace_wait_, trace_key(), {batch_.epoch_, batch_.index_});
  trace_hold_ = trace::start();
  // The wait for this batch goes back to the daemon in its Release (trainer stall time).
  wait_us_ = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - waiting_since_).count());
}

EpochIterator& EpochIterator::operator++() {
  if (done_) return *this;
  if (holding_) {
    trace::hold(trace_hold_, trace_key(), batch_.samples_.size(), [&](std::size_t i) { return batch_.samples_[i].id(); });
  }
  waiting_since_ = std::chrono::steady_clock::now();
  trace_wait_ = trace::start();
  if (holding_) {
    Status s = connection_->release(epoch_, batch_.index_, wait_us_);
    holding_ = false;
    if (!s.ok()) {
      done_ = true;
      throw Error(s);
    }
  }
  fetch_next();
  return *this;
}

trace::Key EpochIterator::trace_key() const {
  return {batch_.epoch_, static_cast<std::uint64_t>(connection_->who_.rank), batch_.index_};
}

EpochIterator Epoch::begin() { return EpochIterator(connection_, epoch_, resume_); }
const std::optional<proto::EpochStats>& Epoch::stats() const { return connection_->last_stats_; }

// ---- client ----

Client::Client(std::unique_ptr<DaemonConnection> connection) : connection_(std::move(connection)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;
Client::~Client() {
  // The trace so far (telemetry.trace_dir); exit writes it again with anything later.
  if (connection_) {
    if (Status s = trace::write(); !s.ok()) std::fprintf(stderr, "shardmix: %s\n", s.to_string().c_str());
  }
}

Result<Client> Client::try_connect(const ClientOptions& options) {
  auto c = DaemonConnection::open(options);
  if (!c.ok()) return c.status();
  return Client(std::move(*c));
}

Client Client::connect(const ClientOptions& options) {
  auto c = try_connect(options);
  if (!c.ok()) throw Error(c.status());
  return std::move(*c);
}

Epoch Client::epoch(std::uint64_t epoch) { return Epoch(connection_.get(), epoch); }
Epoch Client::epoch(std::uint64_t epoch, std::span<const std::uint8_t> resume_from) {
  Epoch e(connection_.get(), epoch);
  e.resume_.assign(resume_from.begin(), resume_from.end());
  return e;
}

std::vector<std::uint8_t> Client::checkpoint() const {
  auto blob = connection_->checkpoint();
  if (!blob.ok()) throw Error(blob.status());
  return std::move(*blob);
}

std::optional<std::uint64_t> Client::resumed_epoch() const {
  if (connection_->welcome_.resumed_epoch == proto::kNoResumedEpoch) return std::nullopt;
  return connection_->welcome_.resumed_epoch;
}

CheckpointInfo Client::inspect_checkpoint(std::span<const std::uint8_t> blob) {
  proto::Checkpoint c;
  if (auto err = proto::decode_checkpoint(blob, c); !err.empty()) throw Error(Status(StatusCode::kInvalidArgument, err));
  CheckpointInfo info;
  info.epoch = c.epoch;
  info.batches_consumed = c.batches_consumed;
  info.samples_consumed = c.samples_consumed;
  info.rank = static_cast<int>(c.rank);
  info.world_size = static_cast<int>(c.world_size);
  info.redealt = c.redealt();
  return info;
}
int Client::rank() const { return connection_->who_.rank; }
int Client::world_size() const { return connection_->who_.world_size; }
std::uint32_t Client::node() const { return connection_->node_; }
std::uint64_t Client::batches_per_epoch() const { return connection_->welcome_.batches_per_epoch; }
std::uint64_t Client::samples_per_epoch() const { return connection_->welcome_.samples_this_trainer; }
std::uint64_t Client::dataset_samples() const { return connection_->welcome_.num_samples; }
const std::optional<proto::EpochStats>& Client::last_epoch_stats() const { return connection_->last_stats_; }

LoadedCheckpoint::LoadedCheckpoint(LoadedCheckpoint&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)), version_(other.version_) {}
LoadedCheckpoint& LoadedCheckpoint::operator=(LoadedCheckpoint&& other) noexcept {
  if (this != &other) {
    this->~LoadedCheckpoint();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    version_ = other.version_;
  }
  return *this;
}
LoadedCheckpoint::~LoadedCheckpoint() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  data_ = nullptr;
}

template <typename T>
static T value_or_throw(Result<T> result) {
  if (!result.ok()) throw Error(result.status());
  return std::move(result).value();
}

std::uint64_t Client::save(std::string_view name, std::span<const std::uint8_t> bytes) {
  return save(name, bytes.size(), [bytes](std::span<std::uint8_t> into) {
    if (!bytes.empty()) std::memcpy(into.data(), bytes.data(), bytes.size());
  });
}

std::uint64_t Client::save(std::string_view name, std::uint64_t size,
                           const std::function<void(std::span<std::uint8_t>)>& write) {
  return value_or_throw(connection_->save_checkpoint(name, size, write));
}

CheckpointLease Client::lease_checkpoint(std::string_view name, std::uint64_t size) {
  return value_or_throw(connection_->lease_checkpoint(name, size));
}

std::uint64_t Client::save_lease(const CheckpointLease& lease, std::uint64_t length) {
  return value_or_throw(connection_->save_lease(lease, length));
}

void Client::abandon_lease(const CheckpointLease& lease) {
  if (Status s = connection_->abandon_lease(lease); !s.ok()) throw Error(s);
}

bool Client::holds_lease(const CheckpointLease& lease) const { return connection_->holds_lease(lease); }

int Client::checkpoint_buffer_fd() {
  Result<CheckpointSaveBuffer*> buffer = connection_->save_buffer();
  if (!buffer.ok()) throw Error(buffer.status());
  return (*buffer)->fd();
}

std::uint64_t Client::save_buffer(std::string_view name, std::uint64_t size) {
  return value_or_throw(connection_->save_checkpoint_buffer(name, size));
}

std::uint64_t Client::save_memfd(std::string_view name, int fd) {
  return value_or_throw(connection_->save_checkpoint_memfd(name, fd));
}

void Client::wait_durable(std::string_view name) {
  if (Status s = connection_->wait_durable(name); !s.ok()) throw Error(s);
}

LoadedCheckpoint Client::load(std::string_view name) {
  int memfd = -1;
  const proto::CheckpointReply reply = value_or_throw(connection_->load_checkpoint(name, memfd));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{memfd};
  LoadedCheckpoint loaded;
  loaded.version_ = reply.version;
  if (reply.length == 0) return loaded;
  struct stat st{};
  if (::fstat(memfd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < reply.length) {
    throw Error(make_error(StatusCode::kProtocol, "checkpoint '{}': the daemon's memfd holds fewer than {} bytes", name,
                           reply.length));
  }
  void* p = ::mmap(nullptr, reply.length, PROT_READ, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) {
    throw Error(make_error(StatusCode::kResourceExhausted, "checkpoint '{}': mapping {} bytes: {}", name, reply.length,
                           std::strerror(errno)));
  }
  loaded.data_ = static_cast<const std::uint8_t*>(p);
  loaded.size_ = reply.length;
  return loaded;
}

std::vector<CheckpointVersion> Client::list() { return value_or_throw(connection_->list_checkpoints()); }

const Catalog& Client::catalog() {
  auto c = connection_->catalog();
  if (!c.ok()) throw Error(c.status());
  return **c;
}

}  // namespace shardmix
