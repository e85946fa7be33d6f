#include "client/client.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
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

Result<std::map<std::string, std::string>> read_ready_file(const std::string& path, double timeout_s) {
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
    if (std::chrono::steady_clock::now() > deadline) {
      return make_error(StatusCode::kUnavailable,
                        "no ShardMix daemons became ready: {} did not appear within {:.0f} s (are the daemons "
                        "running with the same SHARDMIX_RUN_DIR?)",
                        path, timeout_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

LauncherRank detect_launcher_rank() {
  const std::pair<const char*, const char*> sources[] = {
      {"SHARDMIX_RANK", "SHARDMIX_WORLD_SIZE"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"PMI_RANK", "PMI_SIZE"},                 {"SLURM_PROCID", "SLURM_NTASKS"},
      {"RANK", "WORLD_SIZE"},
  };
  for (const auto& [rank_var, size_var] : sources) {
    auto r = env_int(rank_var);
    auto w = env_int(size_var);
    if (r && w) return {*r, *w, rank_var};
  }
  return {};
}

// The socket protocol, blocking with timeouts. Owned by Client; iterators point into it.
class DaemonConnection {
 public:
  ~DaemonConnection() {
    if (fd_ >= 0) ::close(fd_);
  }

  static Result<std::unique_ptr<DaemonConnection>> open(const ClientOptions& options);

  Status send(const std::vector<std::uint8_t>& frame) {
    std::size_t done = 0;
    while (done < frame.size()) {
      const ssize_t n = ::send(fd_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return lost(std::strerror(errno));
      done += static_cast<std::size_t>(n);
    }
    return Status::ok_status();
  }

  // Reads one frame; an Error frame from the daemon becomes its Status.
  Status receive(proto::FrameHeader& header, std::vector<std::uint8_t>& payload, int* fds = nullptr) {
    std::array<std::uint8_t, sizeof(proto::FrameHeader)> raw{};
    SHARDMIX_RETURN_IF_ERROR(read_exact(raw.data(), raw.size(), fds));
    if (auto err = proto::decode_header(raw, header); !err.empty()) {
      return Status(StatusCode::kProtocol, "daemon of node " + std::to_string(node_) + ": " + err);
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
  Status start_epoch(std::uint64_t epoch) {
    std::vector<std::uint8_t> out;
    proto::encode(out, proto::StartEpoch{epoch, next_stream_});
    SHARDMIX_RETURN_IF_ERROR(send(out));
    current_stream_ = next_stream_++;
    in_epoch_ = true;
    return Status::ok_status();
  }

  Status release(std::uint64_t epoch, std::uint64_t batch) {
    std::vector<std::uint8_t> out;
    proto::encode(out, proto::Release{epoch, current_stream_, batch});
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

  proto::Welcome welcome_;
  LauncherRank who_;
  std::uint32_t node_ = 0;
  std::optional<proto::EpochStats> last_stats_;

 private:
  Status lost(const std::string& why) {
    return make_error(StatusCode::kUnavailable, "lost the connection to the daemon of node {} ({}): {}", node_,
                      socket_path_, why);
  }

  Status read_exact(std::uint8_t* out, std::size_t n, int* fds) {
    std::size_t done = 0;
    while (done < n) {
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(receive_timeout_s_ * 1000));
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        return make_error(StatusCode::kUnavailable, "the daemon of node {} sent nothing for {:.0f} s", node_,
                          receive_timeout_s_);
      }
      iovec iov{out + done, n - done};
      alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      if (fds != nullptr && done == 0) {
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
      }
      const ssize_t got = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return lost(std::strerror(errno));
      if (got == 0) return lost("the daemon closed the connection (did it stop or crash?)");
      if (fds != nullptr && done == 0) {
        // Keep exactly the two descriptors of a well-formed SCM_RIGHTS message; close
        // anything else that arrived, so a confused peer cannot leak fds (and the RAM
        // they pin) into the trainer.
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
          if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
          const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          std::vector<int> got(n);
          std::memcpy(got.data(), CMSG_DATA(c), n * sizeof(int));
          for (std::size_t i = 0; i < n; ++i) {
            if (n == 2 && fds[i] < 0) {
              fds[i] = got[i];
            } else {
              ::close(got[i]);
            }
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

  int fd_ = -1;
  std::string socket_path_;
  double receive_timeout_s_ = 600;
  Mapping arena_;
  Mapping staging_;
  std::vector<std::uint8_t> payload_;
  std::optional<Catalog> catalog_;
  bool in_epoch_ = false;
  std::uint64_t next_stream_ = 1;
  std::uint64_t current_stream_ = 0;
};

Result<std::unique_ptr<DaemonConnection>> DaemonConnection::open(const ClientOptions& options) {
  auto c = std::make_unique<DaemonConnection>();
  c->receive_timeout_s_ = options.receive_timeout_s;
  c->who_ = detect_launcher_rank();
  if (options.rank >= 0) c->who_.rank = options.rank;
  if (options.world_size >= 0) c->who_.world_size = options.world_size;

  std::string run_dir = options.run_dir;
  if (run_dir.empty()) {
    const char* env = std::getenv("SHARDMIX_RUN_DIR");
    run_dir = env != nullptr && *env != '\0' ? env : "/tmp/shardmix-" + std::to_string(::geteuid());
  }
  int daemon = options.daemon >= 0 ? options.daemon : env_int("SHARDMIX_DAEMON").value_or(-1);
  if (daemon < 0) {
    // Our node is rank / trainers_per_node, as the daemons published it.
    auto ready = read_ready_file(run_dir + "/ready", options.ready_timeout_s);
    if (!ready.ok()) return ready.status();
    const int daemons = std::atoi((*ready)["daemons"].c_str());
    const int per_node = std::atoi((*ready)["trainers_per_node"].c_str());
    if (daemons <= 0 || per_node <= 0) {
      return make_error(StatusCode::kCorrupt, "{}/ready is malformed (daemons={}, trainers_per_node={})", run_dir,
                        (*ready)["daemons"], (*ready)["trainers_per_node"]);
    }
    if (c->who_.world_size != daemons * per_node) {
      return make_error(StatusCode::kInvalidArgument,
                        "trainer layout does not match the daemons: {} trainers (from {}) but {} daemons x {} "
                        "trainers per node = {}",
                        c->who_.world_size, c->who_.source, daemons, per_node, daemons * per_node);
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

  c->fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd_ < 0) return make_error(StatusCode::kIoError, "socket(): {}", std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (c->socket_path_.size() >= sizeof(addr.sun_path)) {
    return make_error(StatusCode::kInvalidArgument, "socket path {} is too long", c->socket_path_);
  }
  std::strncpy(addr.sun_path, c->socket_path_.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(c->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return make_error(StatusCode::kUnavailable, "cannot connect to the daemon of node {} at {}: {}", daemon,
                      c->socket_path_, std::strerror(errno));
  }
  std::vector<std::uint8_t> hello;
  proto::encode(hello, proto::Hello{static_cast<std::uint32_t>(c->who_.rank),
                                    static_cast<std::uint32_t>(c->who_.world_size),
                                    static_cast<std::uint32_t>(::getpid())});
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
  return c;
}

// ---- iterator ----

EpochIterator::EpochIterator(DaemonConnection* connection, std::uint64_t epoch)
    : connection_(connection), epoch_(epoch), done_(false) {
  Status s = connection_->start_epoch(epoch);
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
  batch_.samples_.resize(frame.samples.size());
  for (std::size_t i = 0; i < frame.samples.size(); ++i) {
    auto where = connection_->locate(frame.samples[i]);
    if (!where.ok()) {
      done_ = true;
      throw Error(where.status());
    }
    batch_.samples_[i].data_ = *where;
    batch_.samples_[i].desc_ = frame.samples[i];
  }
  holding_ = true;
}

EpochIterator& EpochIterator::operator++() {
  if (done_) return *this;
  if (holding_) {
    Status s = connection_->release(epoch_, batch_.index_);
    holding_ = false;
    if (!s.ok()) {
      done_ = true;
      throw Error(s);
    }
  }
  fetch_next();
  return *this;
}

EpochIterator Epoch::begin() { return EpochIterator(connection_, epoch_); }
const std::optional<proto::EpochStats>& Epoch::stats() const { return connection_->last_stats_; }

// ---- client ----

Client::Client(std::unique_ptr<DaemonConnection> connection) : connection_(std::move(connection)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&&) noexcept = default;
Client::~Client() = default;

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
int Client::rank() const { return connection_->who_.rank; }
int Client::world_size() const { return connection_->who_.world_size; }
std::uint32_t Client::node() const { return connection_->node_; }
std::uint64_t Client::batches_per_epoch() const { return connection_->welcome_.batches_per_epoch; }
std::uint64_t Client::samples_per_epoch() const { return connection_->welcome_.samples_this_trainer; }
std::uint64_t Client::dataset_samples() const { return connection_->welcome_.num_samples; }
const std::optional<proto::EpochStats>& Client::last_epoch_stats() const { return connection_->last_stats_; }

const Catalog& Client::catalog() {
  auto c = connection_->catalog();
  if (!c.ok()) throw Error(c.status());
  return **c;
}

}  // namespace shardmix
