#include "server/client_service.h"

#include "proto/checkpoint.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <deque>
#include <mutex>
#include <future>
#include <optional>
#include <thread>

#include "common/checkpoint_file.h"
#include "common/checkpoint_memfd.h"
#include "common/log.h"
#include "common/read_groups.h"
#include "common/trace.h"
#include "proto/wire.h"

namespace shardmix {
namespace asio = boost::asio;
using stream = asio::local::stream_protocol;

static_assert(proto::kMaxCheckpointNameBytes == kMaxCheckpointNameBytes,
              "a checkpoint frame carries any name common/checkpoint_file.h accepts");


void FabricFetcher::fetch(std::vector<PeerRead> reads, std::function<void(const Status&)> done) {
  // A batch's reads of one peer go out as vectored reads (read_groups.h), all handed to
  // the progress thread at once; they complete there, and only the last one hops to the
  // io thread, carrying the first error.
  struct Group {
    std::atomic<std::size_t> remaining;
    std::mutex mutex;  // guards first_error
    Status first_error;
    std::function<void(const Status&)> done;
  };
  const std::vector<ReadGroup> planned = group_reads_by_peer(reads, fabric_.max_segments_per_read());
  if (planned.empty()) {
    asio::post(io_, [done = std::move(done)] { done(Status::ok_status()); });
    return;
  }
  auto group = std::make_shared<Group>();
  group->remaining = planned.size();
  group->done = std::move(done);
  // An injected straggler delays the whole fetch: the io thread learns of it late, as it
  // would if the peer's NIC or memory were slow.
  const bool slow = slow_peer_.delay.count() > 0 &&
                    std::any_of(reads.begin(), reads.end(), [&](const PeerRead& r) {
                      return static_cast<std::int64_t>(r.peer) == slow_peer_.rank;
                    });
  const auto delay = slow ? slow_peer_.delay : std::chrono::microseconds(0);
  std::vector<fabric::VectorRead> operations;
  operations.reserve(planned.size());
  for (const ReadGroup& planned_group : planned) {
    fabric::VectorRead op;
    op.peer = static_cast<int>(planned_group.peer);
    std::uint64_t bytes = 0;
    for (const std::size_t index : planned_group.reads) {
      const PeerRead& r = reads[index];
      op.segments[op.segment_count++] = fabric::ReadSegment{r.remote_offset, r.length, r.staging_offset};
      bytes += r.length;
    }
    op.done = [this, group, delay, peer = planned_group.peer, traced = trace::begin_read(planned_group.peer), bytes,
               samples = op.segment_count](const Status& status) {
      trace::end_read(traced, peer, bytes, samples);
      if (!status.ok() && peer_error_) peer_error_(peer, status);
      if (!status.ok()) {
        std::lock_guard lock(group->mutex);
        if (group->first_error.ok()) group->first_error = status;
      }
      if (group->remaining.fetch_sub(1) != 1) return;
      if (delay.count() == 0) {
        asio::post(io_, [group] { group->done(group->first_error); });
        return;
      }
      asio::post(io_, [this, group, delay] {
        auto timer = std::make_shared<asio::steady_timer>(io_, delay);
        timer->async_wait([timer, group](const boost::system::error_code&) { group->done(group->first_error); });
      });
    };
    operations.push_back(std::move(op));
  }
  fabric_.read_many(std::move(operations), staging_);
}

// One trainer's connection. Owns the trainer's scheduler once the Hello is accepted.
class TrainerConnection : public std::enable_shared_from_this<TrainerConnection>, public FrameSink {
 public:
  TrainerConnection(ClientService& service, stream::socket socket)
      : service_(service),
        socket_(std::move(socket)),
        log_(log::get("service")),
        keepalive_timer_(socket_.get_executor()) {}

  void start() {
    if (!check_credentials()) return;
    read_header();
  }
  std::uint64_t scheduler_metadata_bytes() const { return scheduler_ ? scheduler_->metadata_bytes() : 0; }
  // Degraded mode: this trainer's samples of `peer` come from storage from now on.
  void peer_dead(std::uint32_t peer) {
    if (scheduler_) scheduler_->peer_dead(peer);
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    finish_pass();
    if (scheduler_ && service_.job_.telemetry != nullptr) service_.job_.telemetry->trainer_disconnected();
    if (scheduler_) {
      scheduler_->close();
      auto& slot = service_.trainer_connection_[scheduler_->local_trainer()];
      if (slot.lock().get() == this) slot.reset();
    }
    keepalive_timer_.cancel();
    if (received_fd_ >= 0) ::close(std::exchange(received_fd_, -1));
    lease_.reset();  // its chunks go back to the pool now, not when the last handler runs
    boost::system::error_code ignored;
    socket_.shutdown(stream::socket::shutdown_both, ignored);
    socket_.close(ignored);
    service_.forget(shared_from_this());
  }

  // The daemon is stopping: a trainer gets an Error frame saying so after what is already
  // queued, then the connection closes (at the latest when the service is destroyed).
  void shut_down(const Status& why) {
    if (closed_ || closing_after_write_) return;
    if (!scheduler_) return close();  // not a trainer yet (e.g. shardmix-stat)
    scheduler_->close();              // no more batches
    std::vector<std::uint8_t> out;
    proto::encode(out, proto::ErrorFrame{static_cast<std::uint16_t>(why.code()), why.message()});
    closing_after_write_ = true;
    write(std::move(out));
  }

  // Whether the trainer closed its end (or died), even if its EOF is not processed yet.
  bool peer_hung_up() {
    if (closed_) return true;
    pollfd p{socket_.native_handle(), POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
  }

  // FrameSink
  void send_batch(const proto::BatchFrame& batch) override {
    std::vector<std::uint8_t> out;
    proto::encode(out, batch);
    write(std::move(out));
  }
  void send_epoch_end(const proto::EpochStats& stats) override {
    // The per-epoch report of this trainer's delivery (docs/shuffle-quality.md).
    const double n = stats.samples > 0 ? static_cast<double>(stats.samples) : 1.0;
    log_->info(
        "trainer {} epoch {}: {} samples in {} batches, local {:.3f} peer {:.3f} storage {:.3f}, {:.0f} peer bytes/sample, "
        "Q {:.3f}, window {} ({} substituted), label entropy mean {:.3f} p5 {:.3f}, affinity {:.3f}, "
        "fetch wait {:.3f} s{}",
        trainer_rank_, stats.epoch, stats.samples, stats.batches, stats.local_samples / n, stats.peer_samples / n,
        stats.storage_samples / n, stats.peer_bytes / n, stats.exchange_fraction, stats.window, stats.substituted_samples,
        stats.label_entropy_mean, stats.label_entropy_p5, stats.affinity, stats.fetch_wait_us / 1e6,
        stats.unreadable_samples > 0 ? fmt::format(", {} unreadable samples skipped", stats.unreadable_samples)
                                     : std::string());
    service_.sample_metadata();
    std::vector<std::uint8_t> out;
    proto::encode(out, stats);
    write(std::move(out));
    if (pass_open_ && stats.stream == pass_stream_) {
      pass_end_ = stats;
      maybe_finish_pass();
    }
  }
  void send_error(const Status& status) override {
    log_->warn("trainer {}: {}", trainer_rank_, status.to_string());
    if (service_.job_.telemetry != nullptr) service_.job_.telemetry->error_sent();
    std::vector<std::uint8_t> out;
    proto::encode(out, proto::ErrorFrame{static_cast<std::uint16_t>(status.code()), status.message()});
    closing_after_write_ = true;
    write(std::move(out));
  }

 private:
  bool check_credentials() {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(socket_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      log_->warn("refusing a connection: SO_PEERCRED failed: {}", std::strerror(errno));
      close();
      return false;
    }
    peer_pid_ = static_cast<std::uint32_t>(cred.pid);
    if (cred.uid != geteuid()) {
      log_->warn("refusing a connection from uid {} (pid {}): only uid {} may use this daemon", cred.uid, cred.pid,
                 geteuid());
      send_error(make_error(StatusCode::kPermissionDenied, "uid {} may not use the daemon of uid {}", cred.uid,
                            geteuid()));
      return false;
    }
    return true;
  }

  void read_header() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(header_bytes_), [self](boost::system::error_code ec, std::size_t) {
      if (ec) return self->on_disconnect(ec);
      if (self->closed_ || self->closing_after_write_) return;
      proto::FrameHeader header{};
      std::string err = proto::decode_header(self->header_bytes_, header);
      if (err.empty()) {
        // Only requests, and only their exact size: a header alone must not make us
        // allocate (kMaxPayloadBytes is for the daemon's own large replies).
        const auto type = static_cast<proto::FrameType>(header.type);
        const std::int64_t expected = proto::request_payload_bytes(type);
        const std::int64_t most = proto::request_payload_max_bytes(type);
        if (expected < 0) {
          err = "frame type " + std::to_string(header.type) + " is not a request";
        } else if (most == expected && header.payload_bytes != expected) {
          err = "frame type " + std::to_string(header.type) + " must carry " + std::to_string(expected) +
                " payload bytes, header says " + std::to_string(header.payload_bytes);
        } else if (header.payload_bytes < expected || header.payload_bytes > most) {
          err = "frame type " + std::to_string(header.type) + " must carry " + std::to_string(expected) + " to " +
                std::to_string(most) + " payload bytes, header says " + std::to_string(header.payload_bytes);
        }
      }
      if (!err.empty()) {
        self->protocol_error(err);
        return;
      }
      self->header_ = header;
      self->payload_.resize(header.payload_bytes);
      if (header.type == static_cast<std::uint16_t>(proto::FrameType::kCheckpointSave)) {
        self->payload_read_ = 0;
        return self->read_payload_with_descriptor();
      }
      self->read_payload();
    });
  }

  void read_payload() {
    auto self = shared_from_this();
    asio::async_read(socket_, asio::buffer(payload_), [self](boost::system::error_code ec, std::size_t) {
      if (ec) return self->on_disconnect(ec);
      self->after_payload();
    });
  }

  // A CheckpointSave's payload arrives with the trainer's memfd (SCM_RIGHTS), which a plain
  // read would drop: read it with recvmsg, keeping the first descriptor and closing any other.
  void read_payload_with_descriptor() {
    auto self = shared_from_this();
    socket_.async_wait(stream::socket::wait_read, [self](boost::system::error_code ec) {
      if (ec) return self->on_disconnect(ec);
      if (self->closed_ || self->closing_after_write_) return;
      iovec iov{self->payload_.data() + self->payload_read_, self->payload_.size() - self->payload_read_};
      alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
      msghdr msg{.msg_name = nullptr, .msg_namelen = 0, .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                 .msg_controllen = sizeof(control), .msg_flags = 0};
      const ssize_t got = ::recvmsg(self->socket_.native_handle(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return self->read_payload_with_descriptor();
      }
      if (got <= 0) {
        return self->on_disconnect(got == 0 ? asio::error::eof
                                            : boost::system::error_code(errno, boost::system::system_category()));
      }
      for (int fd : received_descriptors(msg)) {
        if (self->received_fd_ < 0) {
          self->received_fd_ = fd;
        } else {
          ::close(fd);
        }
      }
      self->payload_read_ += static_cast<std::size_t>(got);
      if (self->payload_read_ < self->payload_.size()) return self->read_payload_with_descriptor();
      self->after_payload();
    });
  }

  void after_payload() {
    if (closed_ || closing_after_write_) return;
    if (!dispatch()) return;
    // Backpressure: a trainer that does not read its replies stops being read.
    if (queued_bytes_ > kMaxQueuedBytes) {
      read_paused_ = true;
    } else {
      read_header();
    }
  }

  // Returns whether to keep reading.
  bool dispatch() {
    const auto type = static_cast<proto::FrameType>(header_.type);
    const bool checkpoint_frame = type >= proto::FrameType::kCheckpointSave;
    if (checkpoint_connection_) {
      if (!checkpoint_frame && type != proto::FrameType::kGetStats) {
        return protocol_error("frame type " + std::to_string(header_.type) +
                              " on a checkpoint connection (it carries checkpoint requests only)"),
               false;
      }
      return dispatch_checkpoint(type);
    }
    if (!scheduler_ && type != proto::FrameType::kHello && type != proto::FrameType::kCheckpointHello &&
        type != proto::FrameType::kGetStats) {
      protocol_error(checkpoint_frame ? "checkpoint requests need a connection opened with a CheckpointHello"
                                      : "the first frame must be a Hello");
      return false;
    }
    switch (type) {
      case proto::FrameType::kGetStats: {
        const NodeTelemetry* telemetry = service_.job_.telemetry;
        std::vector<std::uint8_t> out;
        proto::encode_stats(out, telemetry != nullptr ? telemetry->prometheus_text() : std::string());
        write(std::move(out));
        return true;
      }
      case proto::FrameType::kHello: {
        proto::Hello hello;
        if (auto err = proto::decode(payload_, hello); !err.empty()) return protocol_error(err), false;
        return on_hello(hello, header_.reserved);
      }
      case proto::FrameType::kCheckpointHello: {
        proto::Hello hello;
        if (auto err = proto::decode(payload_, hello); !err.empty()) return protocol_error(err), false;
        return on_checkpoint_hello(hello, header_.reserved);
      }
      case proto::FrameType::kStartEpoch: {
        proto::StartEpoch m;
        if (auto err = proto::decode(payload_, m); !err.empty()) return protocol_error(err), false;
        std::optional<ResumePoint> resume;
        if (!m.resume.empty()) {
          auto point = accept_checkpoint(m.resume, service_.job_, trainer_rank_, m.epoch);
          if (!point.ok()) return send_error(point.status()), false;
          resume = std::move(*point);
        }
        service_.report_epoch_choice(m.epoch);
        finish_pass();  // a pass abandoned before its end is not reported
        pass_open_ = true;
        pass_stream_ = m.stream;
        pass_wait_us_ = 0;
        pass_released_ = 0;
        pass_start_ = wall_seconds_now();
        pass_end_.reset();
        if (resume) {
          Status s = scheduler_->start_epoch(m.epoch, m.stream, *resume);
          if (!s.ok()) return send_error(s), false;
          log_->info("trainer rank {} resumes epoch {} after {} batches ({} samples; {} delivered early)",
                     trainer_rank_, m.epoch, resume->batches_consumed, resume->samples_consumed, resume->early.size());
        } else {
          scheduler_->start_epoch(m.epoch, m.stream);
        }
        return !closed_;
      }
      case proto::FrameType::kRelease: {
        proto::Release m;
        if (auto err = proto::decode(payload_, m); !err.empty()) return protocol_error(err), false;
        Status s = scheduler_->release(m.stream, m.batch);
        if (!s.ok()) return protocol_error(s.message()), false;
        // Mid-epoch: the plans of this pass and the next are both held (the simulator
        // samples here too, so both report the same node_metadata_bytes).
        if (service_.job_.shape != nullptr && m.batch == service_.job_.shape->batches_per_trainer / 2) {
          service_.sample_metadata();
        }
        if (pass_open_ && m.stream == pass_stream_) {
          pass_wait_us_ += m.wait_us;
          ++pass_released_;
          maybe_finish_pass();
        }
        return !closed_;
      }
      case proto::FrameType::kGetCatalog: {
        if (!payload_.empty()) return protocol_error("get-catalog frame has a payload"), false;
        // Owner-side metadata (decisions 0063, 0066): no daemon holds the catalog, so it is
        // assembled from every owner's share for this request and dropped after it. A
        // failure (an owner that does not answer) is the trainer's answer, and its connection
        // goes on (send_error would close it: that is for errors that end the connection).
        std::optional<Catalog> assembled;
        if (service_.job_.catalog == nullptr) {
          Result<Catalog> c = service_.job_.assemble_catalog
                                  ? service_.job_.assemble_catalog()
                                  : Result<Catalog>(make_error(StatusCode::kInvalidArgument,
                                                               "this daemon holds no catalog to serve"));
          if (!c.ok()) {
            std::vector<std::uint8_t> out;
            proto::encode(out, proto::ErrorFrame{static_cast<std::uint16_t>(c.status().code()),
                                                 "the catalog: " + c.status().message()});
            write(std::move(out));
            return true;
          }
          assembled = std::move(*c);
        }
        const Catalog& catalog = assembled ? *assembled : *service_.job_.catalog;
        // Serialized per request, not kept: trainers fetch the catalog rarely (sample_path),
        // and a kept copy cost every daemon ~94 bytes a sample for the whole job. Straight
        // into the reply frame: no second copy.
        std::vector<std::uint8_t> out = catalog.serialize(sizeof(proto::FrameHeader));
        if (out.size() - sizeof(proto::FrameHeader) > proto::kMaxPayloadBytes) {
          send_error(make_error(StatusCode::kResourceExhausted,
                                "the catalog is {} bytes serialized, more than one frame carries ({} bytes): "
                                "read sample paths from the dataset instead",
                                out.size() - sizeof(proto::FrameHeader), proto::kMaxPayloadBytes));
          return false;
        }
        proto::finish_catalog_frame(out);
        write(std::move(out));
        return true;
      }
      default:
        protocol_error("frame type " + std::to_string(header_.type) + " is not a request");
        return false;
    }
  }

  // Refuses (with an Error frame naming the socket) a Hello without this job's token.
  bool job_token_accepted(const proto::Hello& hello, std::uint32_t job_token) {
    const ServedJob& job = service_.job_;
    if (job.job_token != 0 && job_token != job.job_token) {
      // Same uid, another job (or a stale token file): refuse before the trainer maps anything.
      log_->warn("refusing trainer rank {} (pid {}): {} job token", hello.trainer_rank, peer_pid_,
                 job_token == 0 ? "no" : "wrong");
      send_error(make_error(StatusCode::kPermissionDenied,
                            "{}: this daemon belongs to another job (job token mismatch: the trainer {}). Run the "
                            "trainers with the SHARDMIX_JOB_TOKEN of their own daemons (deploy/launch.sh and "
                            "shardmix.sbatch set it), or unset it to use the run dir's token file",
                            service_.socket_path_,
                            job_token == 0 ? "sent none" : "holds another job's token"));
      return false;
    }
    return true;
  }

  bool on_hello(const proto::Hello& hello, std::uint32_t job_token) {
    if (scheduler_) return protocol_error("a second Hello on one connection"), false;
    const ServedJob& job = service_.job_;
    const std::uint32_t trainers = job.nodes * job.trainers_per_node;
    trainer_rank_ = hello.trainer_rank;
    if (!job_token_accepted(hello, job_token)) return false;
    if (hello.world_size != trainers) {
      send_error(make_error(StatusCode::kInvalidArgument,
                            "trainer world size {} does not match the daemons' layout: {} daemons x "
                            "service.trainers_per_node {} = {} trainers",
                            hello.world_size, job.nodes, job.trainers_per_node, trainers));
      return false;
    }
    const std::uint32_t node = hello.trainer_rank / job.trainers_per_node;
    if (node != job.context.node) {
      send_error(make_error(StatusCode::kInvalidArgument,
                            "trainer rank {} belongs to the daemon of node {}, but connected to node {}",
                            hello.trainer_rank, node, job.context.node));
      return false;
    }
    const std::uint32_t local = hello.trainer_rank % job.trainers_per_node;
    if (auto previous = service_.trainer_connection_[local].lock()) {
      // Defensive: should a restarted trainer's Hello ever be handled before the old
      // socket's hang-up (the reactor orders them, so we have not seen it happen), a
      // peer that is really gone must not lock its rank out.
      if (!previous->peer_hung_up()) {
        send_error(make_error(StatusCode::kInvalidArgument, "trainer rank {} is already connected to this daemon",
                              hello.trainer_rank));
        return false;
      }
      log_->info("trainer rank {} reconnected; retiring its previous connection", hello.trainer_rank);
      previous->close();
    }
    service_.trainer_connection_[local] = weak_from_this();
    scheduler_ = std::make_shared<TrainerScheduler>(job.context, local, service_.staging_[local], *job.fetcher, *this);
    for (const std::uint32_t peer : service_.dead_peers_) scheduler_->peer_dead(peer);  // degraded mode
    if (job.telemetry != nullptr) job.telemetry->trainer_connected();
    log_->info("trainer rank {} (pid {}) connected", hello.trainer_rank, peer_pid_);

    proto::Welcome w;
    w.node = job.context.node;
    w.nodes = job.nodes;
    w.trainers_per_node = job.trainers_per_node;
    w.prefetch = job.context.prefetch;
    w.num_samples = job.shape->num_samples;
    w.batches_per_epoch = job.shape->batches_per_trainer;
    w.samples_this_trainer = job.shape->trainer_quota[hello.trainer_rank];
    w.arena_bytes = job.arena->length();
    w.staging_bytes = job.staging->length();
    w.plan_digest = job.plan_digest;
    w.seed = job.seed;
    w.batch_size = job.shape->job.batch_size;
    w.drop_last = job.shape->job.drop_last ? 1 : 0;
    w.window = job.context.window;
    w.resumed_epoch = proto::kNoResumedEpoch;
    if (const RedealtEpoch* redealt = job.context.redealt; redealt != nullptr) {
      w.resumed_epoch = redealt->epoch;
      w.resumed_digest = redealt->digest;
      w.resumed_batches = redealt->batches_per_trainer;
    }
    std::vector<std::uint8_t> out;
    proto::encode(out, w);
    // The Welcome is the first thing written on this socket, so a blocking sendmsg cannot
    // interleave with queued async writes.
    const int fds[2] = {job.arena->readonly_fd(), job.staging->readonly_fd()};  // trainers only read
    std::size_t sent = 0;
    while (sent < out.size()) {
      // The fds go with the first byte only.
      const ssize_t n = send_with_descriptors(socket_.native_handle(), std::span(out).subspan(sent),
                                              sent == 0 ? std::span<const int>(fds) : std::span<const int>(), 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        log_->warn("trainer rank {}: sending the welcome failed: {}", trainer_rank_, std::strerror(errno));
        close();
        return false;
      }
      sent += static_cast<std::size_t>(n);
    }
    last_write_ = std::chrono::steady_clock::now();
    arm_keepalive();
    return true;
  }

  // A checkpoint connection: any rank of this job may save, load or list (a restarted job
  // of another world size loads what the old ranks saved), so only the token is checked.
  bool on_checkpoint_hello(const proto::Hello& hello, std::uint32_t job_token) {
    trainer_rank_ = hello.trainer_rank;
    if (!job_token_accepted(hello, job_token)) return false;
    const CheckpointNode* node = service_.job_.checkpoints;
    if (node == nullptr) {
      send_error(make_error(StatusCode::kInvalidArgument,
                            "the daemon of node {} keeps no model checkpoints: checkpoint.dir is not set in its config",
                            service_.job_.context.node));
      return false;
    }
    checkpoint_connection_ = true;
    log_->info("trainer rank {} (pid {}) opened a checkpoint connection", hello.trainer_rank, peer_pid_);
    proto::CheckpointWelcome w;
    w.node = service_.job_.context.node;
    w.retain = node->options().retain;
    w.capacity_bytes = node->options().capacity_bytes;
    // A peer daemon holds a copy of every save before it returns (docs/decisions/0059).
    w.replication = service_.job_.nodes > 1 ? 1 : 0;
    std::vector<std::uint8_t> out;
    proto::encode(out, w);
    write(std::move(out));
    arm_keepalive();
    return true;
  }

  // Requests on a checkpoint connection. Their outcomes come back as CheckpointReply frames
  // (an error names the checkpoint and keeps the connection); only a malformed frame closes it.
  bool dispatch_checkpoint(proto::FrameType type) {
    CheckpointNode& node = *service_.job_.checkpoints;
    if (type == proto::FrameType::kGetStats) {
      std::vector<std::uint8_t> out;
      proto::encode_stats(out, service_.job_.telemetry != nullptr ? service_.job_.telemetry->prometheus_text() : "");
      write(std::move(out));
      return true;
    }
    if (type == proto::FrameType::kCheckpointSave) {
      proto::CheckpointSave m;
      if (auto err = proto::decode(payload_, m); !err.empty()) return protocol_error(err), false;
      const int fd = std::exchange(received_fd_, -1);
      if (fd < 0) return protocol_error("checkpoint '" + m.name + "': the save frame carried no memfd"), false;
      if (!checkpoint_memfd_is_sealed(fd)) {
        // The trainer's save buffer (decision 0068): its bytes are copied into the node's
        // checkpoint pool, off the io thread (a GiB takes a fraction of a second), and the
        // copy is saved. The trainer waits for the reply before it writes the buffer again.
        asio::post(service_.checkpoint_reads_, [&node, fd, name = m.name, length = m.length,
                                                reply = replier(m.request)] {
          Result<CheckpointBytesPtr> copy = copy_into_pool(node, fd, length, name);
          ::close(fd);
          if (!copy.ok()) return reply(copy.status(), 0, 0, nullptr);
          node.save(name, std::move(*copy), saved(reply, length));
        });
        return true;
      }
      Result<CheckpointBytesPtr> bytes = map_sealed_checkpoint(fd, m.name);
      ::close(fd);
      if (bytes.ok() && (*bytes)->bytes().size() != m.length) {
        bytes = make_error(StatusCode::kInvalidArgument, "checkpoint '{}': its memfd holds {} bytes, the save says {}",
                           m.name, (*bytes)->bytes().size(), m.length);
      }
      if (!bytes.ok()) return reply_checkpoint(m.request, bytes.status()), true;
      node.save(m.name, std::move(*bytes), saved(replier(m.request), m.length));
      return true;
    }
    if (type == proto::FrameType::kCheckpointLease) return lease_checkpoint(node);
    if (type == proto::FrameType::kCheckpointCommit || type == proto::FrameType::kCheckpointAbandon) {
      return end_lease(node, type == proto::FrameType::kCheckpointCommit);
    }
    proto::CheckpointRequest m;
    if (auto err = proto::decode(payload_, m); !err.empty()) return protocol_error(err), false;
    switch (type) {
      case proto::FrameType::kCheckpointWaitDurable:
        node.wait_durable(m.name, [reply = replier(m.request)](const Status& s) { reply(s, 0, 0, nullptr); });
        return true;
      case proto::FrameType::kCheckpointLoad:
        // Off the io thread: a version no longer in RAM is read from its file.
        asio::post(service_.checkpoint_reads_, [&node, name = m.name, reply = replier(m.request)] {
          std::uint64_t version = 0;
          for (const CheckpointId& id : node.list()) {
            if (id.name == name) version = std::max(version, id.version);
          }
          Result<CheckpointBytesPtr> bytes = node.load(name);
          if (bytes.ok()) bytes = checkpoint_bytes_in_memfd(std::move(*bytes), name);
          if (!bytes.ok()) return reply(bytes.status(), 0, 0, nullptr);
          const std::uint64_t length = (*bytes)->bytes().size();
          reply(Status::ok_status(), version, length, std::move(*bytes));
        });
        return true;
      case proto::FrameType::kCheckpointList: {
        proto::CheckpointListing listing;
        listing.request = m.request;
        for (const CheckpointId& id : node.list()) {
          listing.versions.push_back(id.version);
          listing.name_bytes.push_back(static_cast<std::uint32_t>(id.name.size()));
          listing.names += id.name;
        }
        std::vector<std::uint8_t> out;
        proto::encode(out, listing);
        write(std::move(out));
        return true;
      }
      default:
        return protocol_error("frame type " + std::to_string(header_.type) + " is not a request"), false;
    }
  }

  // A lease (decision 0069): a buffer of the node's checkpoint pool, allocated off the io
  // thread (it may evict durable versions and map a GiB), whose memfd and runs the trainer
  // gets to write its checkpoint in place. One per connection at a time, so a trainer that
  // never commits holds one checkpoint's worth of chunks at most, until it disconnects.
  bool lease_checkpoint(CheckpointNode& node) {
    proto::CheckpointSave m;
    if (auto err = proto::decode(payload_, m); !err.empty()) return protocol_error(err), false;
    const auto refuse = [&](const Status& status) { return refuse_lease(m.request, status), true; };
    if (Status valid = validate_checkpoint_name(m.name); !valid.ok()) return refuse(valid);
    if (lease_pending_ || lease_) {
      return refuse(make_error(StatusCode::kInvalidArgument,
                               "checkpoint '{}': this connection holds a lease already (for checkpoint '{}'); commit "
                               "or abandon it first",
                               m.name, lease_ ? lease_->name : *lease_pending_));
    }
    lease_pending_ = m.name;
    asio::post(service_.checkpoint_reads_, [&node, weak = weak_from_this(), io = &service_.io_, m] {
      Result<std::shared_ptr<CheckpointBuffer>> buffer = node.allocate(m.length, m.name);
      asio::post(*io, [weak, m, buffer = std::move(buffer)]() mutable {
        if (auto self = weak.lock()) self->grant_lease(m, std::move(buffer));
      });
    });
    return true;
  }

  void grant_lease(const proto::CheckpointSave& m, Result<std::shared_ptr<CheckpointBuffer>> buffer) {
    lease_pending_.reset();
    if (closed_) return;
    if (!buffer.ok()) return refuse_lease(m.request, buffer.status());
    proto::CheckpointLeaseGrant grant;
    grant.request = m.request;
    lease_ = Lease{next_lease_++, m.name, std::move(*buffer)};
    grant.lease = lease_->id;
    grant.size = m.length;
    for (const MemfdRun& run : lease_->buffer->runs()) {
      grant.run_offsets.push_back(run.offset);
      grant.run_lengths.push_back(run.length);
    }
    std::vector<std::uint8_t> out;
    proto::encode(out, grant);
    // Zero runs (an empty lease): nothing to map, so no memfd either.
    if (grant.run_offsets.empty()) return write(std::move(out));
    write_with_descriptor(std::move(out), lease_->buffer->lease_memfd(), lease_->buffer);
  }

  void refuse_lease(std::uint64_t request, const Status& status) {
    log_->warn("trainer rank {}: {}", trainer_rank_, status.to_string());
    proto::CheckpointLeaseGrant grant;
    grant.request = request;
    grant.code = static_cast<std::uint16_t>(status.code());
    grant.message = status.message();
    std::vector<std::uint8_t> out;
    proto::encode(out, grant);
    write(std::move(out));
  }

  // A commit saves the lease's first `length` bytes, as a save would; an abandon gives the
  // lease back. Either way the connection holds no lease after it.
  bool end_lease(CheckpointNode& node, bool commit) {
    proto::CheckpointCommit m;
    if (auto err = proto::decode(payload_, m); !err.empty()) return protocol_error(err), false;
    if (!lease_ || lease_->id != m.lease) {
      reply_checkpoint(m.request, make_error(StatusCode::kInvalidArgument,
                                             "this connection holds no checkpoint lease {} (it holds {})", m.lease,
                                             lease_ ? fmt::format("lease {}, for checkpoint '{}'", lease_->id,
                                                                  lease_->name)
                                                    : std::string("none")));
      return true;
    }
    // A lease that ends unsaved gives its chunks back before the answer goes out, so the
    // trainer's next request finds them free.
    Lease lease = std::move(*std::exchange(lease_, std::nullopt));
    if (!commit) {
      lease.buffer.reset();
      return reply_checkpoint(m.request, Status::ok_status()), true;
    }
    const std::uint64_t leased = lease.buffer->bytes().size();
    if (m.length > leased) {
      lease.buffer.reset();
      reply_checkpoint(m.request, make_error(StatusCode::kInvalidArgument,
                                             "checkpoint '{}': the commit says {} bytes, its lease holds {}",
                                             lease.name, m.length, leased));
      return true;
    }
    lease.buffer->shrink(m.length);
    node.save(lease.name, std::move(lease.buffer), saved(replier(m.request), m.length));
    return true;
  }

  // The first `length` bytes of the save buffer `fd`, copied into a buffer of the node's
  // checkpoint pool.
  static Result<CheckpointBytesPtr> copy_into_pool(CheckpointNode& node, int fd, std::uint64_t length,
                                                   const std::string& name) {
    SHARDMIX_ASSIGN_OR_RETURN(CheckpointBytesPtr source, map_checkpoint_buffer(fd, length, name));
    SHARDMIX_ASSIGN_OR_RETURN(std::shared_ptr<CheckpointBuffer> copy, node.allocate(length, name));
    if (length > 0) std::memcpy(copy->writable().data(), source->bytes().data(), length);
    return CheckpointBytesPtr(std::move(copy));
  }

  // What a CheckpointNode completion calls, on any thread: the reply is written on the io
  // thread, if this connection is still open (a trainer killed after its save returned is
  // not there to read it; the node keeps the checkpoint anyway).
  using CheckpointReplier = std::function<void(const Status&, std::uint64_t version, std::uint64_t length,
                                               CheckpointBytesPtr memfd)>;
  CheckpointReplier replier(std::uint64_t request) {
    return [weak = weak_from_this(), io = &service_.io_, request](const Status& status, std::uint64_t version,
                                                                  std::uint64_t length, CheckpointBytesPtr memfd) {
      asio::post(*io, [weak, request, status, version, length, memfd = std::move(memfd)]() mutable {
        if (auto self = weak.lock()) self->reply_checkpoint(request, status, version, length, std::move(memfd));
      });
    };
  }

  // What CheckpointNode::save calls back with, as a reply: the version, and `length`.
  static std::function<void(Result<CheckpointId>)> saved(CheckpointReplier reply, std::uint64_t length) {
    return [reply = std::move(reply), length](Result<CheckpointId> id) {
      if (!id.ok()) return reply(id.status(), 0, 0, nullptr);
      reply(Status::ok_status(), id->version, length, nullptr);
    };
  }

  void reply_checkpoint(std::uint64_t request, const Status& status, std::uint64_t version = 0,
                        std::uint64_t length = 0, CheckpointBytesPtr memfd = nullptr) {
    if (!status.ok()) log_->warn("trainer rank {}: {}", trainer_rank_, status.to_string());
    std::vector<std::uint8_t> out;
    proto::encode(out, proto::CheckpointReply{request, static_cast<std::uint16_t>(status.code()), version, length,
                                              status.message()});
    write(std::move(out), status.ok() ? std::move(memfd) : nullptr);
  }

  // The pass is over for telemetry once its EpochEnd is sent and the trainer released
  // every batch (the last Release carries the wait for the last batch).
  void maybe_finish_pass() {
    if (pass_end_ && pass_released_ >= pass_end_->batches) finish_pass();
  }

  // Records the current pass if its EpochEnd was sent (even if the trainer left before
  // releasing every batch); forgets it otherwise.
  void finish_pass() {
    if (!pass_open_) return;
    pass_open_ = false;
    NodeTelemetry* telemetry = service_.job_.telemetry;
    if (!pass_end_ || telemetry == nullptr) return;
    TrainerEpochRecord r;
    r.node = service_.job_.context.node;
    r.trainer_rank = trainer_rank_;
    r.stats = *pass_end_;
    r.stall_us = pass_wait_us_;
    r.released_batches = pass_released_;
    r.node_errors_total = telemetry->errors_total();
    r.node_checkpoints = telemetry->checkpoint_figures();
    r.t_start = pass_start_;
    r.t_end = wall_seconds_now();
    telemetry->add_record(r);
    pass_end_.reset();
  }

  bool protocol_error(const std::string& what) {
    send_error(Status(StatusCode::kProtocol, what));
    return false;
  }

  void on_disconnect(const boost::system::error_code& ec) {
    if (!closed_ && ec != asio::error::eof && ec != asio::error::operation_aborted) {
      log_->info("trainer rank {}: connection lost: {}", trainer_rank_, ec.message());
    } else if (!closed_ && scheduler_) {
      log_->info("trainer rank {} disconnected", trainer_rank_);
    }
    close();
  }

  // A trainer told nothing for kKeepaliveInterval gets a Keepalive, so that its receive
  // timeout measures whether this daemon is alive, not how long its next batch takes
  // (slow storage, a straggling peer). Nothing while replies are queued: the trainer has
  // bytes to read already. A stopped or hung daemon sends none (decision 0036).
  // The timer is due kKeepaliveInterval after the last write, not one interval after it last
  // fired: a period-driven check would let up to two intervals of silence pass (a write just
  // after the timer was armed defers the keepalive to the next tick), which halves the
  // margin against a trainer's receive timeout on a loaded machine. While a write is
  // pending, one interval from now (its completion is not a write to the trainer's inbox
  // we could time from, and a due time in the past would spin).
  void arm_keepalive() {
    const auto now = std::chrono::steady_clock::now();
    keepalive_timer_.expires_at(writes_.empty() ? std::max(last_write_ + proto::kKeepaliveInterval, now)
                                                : now + proto::kKeepaliveInterval);
    keepalive_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed_ || self->closing_after_write_) return;
      if (self->writes_.empty() && std::chrono::steady_clock::now() - self->last_write_ >= proto::kKeepaliveInterval) {
        std::vector<std::uint8_t> out;
        proto::encode_keepalive(out);
        self->write(std::move(out));
      }
      self->arm_keepalive();
    });
  }

  // `memfd`: a checkpoint's sealed memfd, passed with the frame's first byte (a load's reply).
  void write(std::vector<std::uint8_t> bytes, CheckpointBytesPtr memfd = nullptr) {
    const int fd = memfd ? memfd->memfd() : -1;
    write_with_descriptor(std::move(bytes), fd, std::move(memfd));
  }
  // `fd` (unless -1) goes with the frame's first byte; `owner` keeps it open until then.
  void write_with_descriptor(std::vector<std::uint8_t> bytes, int fd, std::shared_ptr<const void> owner) {
    if (closed_) return;
    last_write_ = std::chrono::steady_clock::now();
    queued_bytes_ += bytes.size();
    writes_.push_back(Outgoing{std::move(bytes), fd, fd >= 0 ? std::move(owner) : nullptr});
    if (writes_.size() == 1) write_next();
  }

  void write_next() {
    if (writes_.front().fd >= 0) return write_with_memfd();
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(writes_.front().bytes), [self](boost::system::error_code ec, std::size_t) {
      if (ec) return self->on_disconnect(ec);
      self->written(self->writes_.front().bytes.size());
    });
  }

  // The first part of the front frame, with its descriptor, by one sendmsg; the rest (if
  // the socket took only part) as any other write.
  void write_with_memfd() {
    auto self = shared_from_this();
    socket_.async_wait(stream::socket::wait_write, [self](boost::system::error_code ec) {
      if (ec) return self->on_disconnect(ec);
      if (self->closed_) return;
      Outgoing& front = self->writes_.front();
      const ssize_t n = send_with_descriptors(self->socket_.native_handle(), front.bytes, std::span(&front.fd, 1),
                                              MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->write_with_memfd();
      if (n <= 0) return self->on_disconnect(boost::system::error_code(errno, boost::system::system_category()));
      front.fd = -1;
      front.fd_owner.reset();
      front.bytes.erase(front.bytes.begin(), front.bytes.begin() + n);
      self->queued_bytes_ -= static_cast<std::size_t>(n);
      if (!front.bytes.empty()) return self->write_next();
      self->written(0);
    });
  }

  // The front frame's last `bytes` were written.
  void written(std::size_t bytes) {
    queued_bytes_ -= bytes;
    writes_.pop_front();
    if (read_paused_ && queued_bytes_ <= kMaxQueuedBytes && !closed_) {
      read_paused_ = false;
      read_header();
    }
    if (!writes_.empty()) return write_next();
    if (closing_after_write_) close();
  }

  // Replies queued beyond this stop us reading the trainer's requests until they drain.
  static constexpr std::size_t kMaxQueuedBytes = 64u << 20;

  ClientService& service_;
  stream::socket socket_;
  std::shared_ptr<spdlog::logger> log_;
  std::array<std::uint8_t, sizeof(proto::FrameHeader)> header_bytes_{};
  proto::FrameHeader header_{};
  std::vector<std::uint8_t> payload_;
  struct Outgoing {
    std::vector<std::uint8_t> bytes;
    int fd = -1;                          // sent with the first byte (a load's memfd, a lease's), then
    std::shared_ptr<const void> fd_owner;  // dropped: what keeps `fd` open until then
  };
  std::deque<Outgoing> writes_;
  std::size_t queued_bytes_ = 0;
  asio::steady_timer keepalive_timer_;
  std::chrono::steady_clock::time_point last_write_{};
  bool read_paused_ = false;
  std::shared_ptr<TrainerScheduler> scheduler_;
  std::uint32_t trainer_rank_ = 0;
  std::uint32_t peer_pid_ = 0;
  bool closed_ = false;
  bool closing_after_write_ = false;
  // A checkpoint connection (first frame a CheckpointHello), and the memfd that came with
  // the CheckpointSave being read.
  bool checkpoint_connection_ = false;
  int received_fd_ = -1;
  // This connection's checkpoint lease (decision 0069): granted and not yet committed or
  // abandoned, or being allocated (lease_pending_). At most one of the two.
  struct Lease {
    std::uint64_t id = 0;
    std::string name;
    std::shared_ptr<CheckpointBuffer> buffer;
  };
  std::optional<Lease> lease_;
  std::optional<std::string> lease_pending_;  // the name of the one being allocated
  std::uint64_t next_lease_ = 1;
  std::size_t payload_read_ = 0;
  // The current pass, for telemetry.
  bool pass_open_ = false;
  std::uint64_t pass_stream_ = 0;
  std::uint64_t pass_wait_us_ = 0;
  std::uint64_t pass_released_ = 0;
  double pass_start_ = 0;
  std::optional<proto::EpochStats> pass_end_;
};

Result<ResumePoint> accept_checkpoint(std::span<const std::uint8_t> blob, const ServedJob& job,
                                      std::uint32_t trainer_rank, std::uint64_t epoch) {
  proto::Checkpoint c;
  if (auto err = proto::decode_checkpoint(blob, c); !err.empty()) {
    return make_error(StatusCode::kInvalidArgument, "trainer rank {}: cannot resume epoch {}: {}", trainer_rank, epoch,
                      err);
  }
  const JobShape& shape = job.shape->job;
  auto refuse = [&](const std::string& why) {
    return make_error(StatusCode::kInvalidArgument,
                      "trainer rank {}: cannot resume epoch {} from a checkpoint of rank {} (epoch {}, {} trainers): {}",
                      trainer_rank, epoch, c.rank, c.epoch, c.world_size, why);
  };
  if (c.epoch != epoch) return refuse(fmt::format("it was taken in epoch {}", c.epoch));
  if (c.nodes != shape.nodes || c.trainers_per_node != shape.trainers_per_node) {
    return refuse(fmt::format("it was taken with {} nodes x {} trainers per node, this job has {} x {} "
                              "(a different world size resumes through resume.checkpoint_dir)",
                              c.nodes, c.trainers_per_node, shape.nodes, shape.trainers_per_node));
  }
  if (c.rank != trainer_rank) return refuse("it is another rank's checkpoint");
  if (c.early.size() > c.window) {
    return refuse(fmt::format("it lists {} samples delivered early, more than its shuffle.window {}", c.early.size(),
                              c.window));
  }
  const RedealtEpoch* redealt = job.context.redealt;
  const bool this_redealt = redealt != nullptr && redealt->epoch == epoch;
  if (c.redealt() != this_redealt) {
    return refuse(c.redealt() ? "it was taken in an epoch re-dealt from checkpoints; start the daemons with the "
                                "same resume.checkpoint_dir"
                              : "this daemon re-dealt that epoch from resume.checkpoint_dir; resume it without a "
                                "checkpoint (Client::resumed_epoch())");
  }
  const std::uint64_t expected = this_redealt ? redealt->digest : job.plan_digest;
  if (c.plan_digest != expected) {
    std::vector<std::string> differ;
    if (c.num_samples != job.shape->num_samples) {
      differ.push_back(fmt::format("dataset samples {} vs {}", c.num_samples, job.shape->num_samples));
    }
    if (c.seed != job.seed) differ.push_back(fmt::format("shuffle.seed {} vs {}", c.seed, job.seed));
    if (c.batch_size != shape.batch_size) {
      differ.push_back(fmt::format("batch.size {} vs {}", c.batch_size, shape.batch_size));
    }
    if (c.drop_last != shape.drop_last) differ.push_back("batch.drop_last");
    if (differ.empty()) {
      differ.push_back(this_redealt ? "the checkpoints in resume.checkpoint_dir"
                                    : "the catalog, shuffle.exchange_fraction, shuffle.min_entropy or "
                                      "dataset.placement");
    }
    std::string list;
    for (const auto& d : differ) list += (list.empty() ? "" : ", ") + d;
    return refuse("its plan differs from this job's (" + list + ")");
  }
  ResumePoint point;
  point.batches_consumed = c.batches_consumed;
  point.samples_consumed = c.samples_consumed;
  point.early = std::move(c.early);
  point.late = std::move(c.late);
  return point;
}

ClientService::ClientService(asio::io_context& io, ServedJob job, std::string socket_path)
    : io_(io), job_(std::move(job)), socket_path_(std::move(socket_path)), acceptor_(io), accept_backoff_(io) {
  for (std::uint32_t t = 0; t < job_.trainers_per_node; ++t) {
    staging_.push_back(std::make_shared<StagingAllocator>(t * job_.staging_per_trainer, job_.staging_per_trainer));
  }
  trainer_connection_.resize(job_.trainers_per_node);
}

void ClientService::report_epoch_choice(std::uint64_t epoch) {
  if (reported_epochs_.count(epoch) != 0) return;
  reported_epochs_.insert(epoch);
  if (reported_epochs_.size() > 64) reported_epochs_.erase(reported_epochs_.begin());
  const EpochChoice choice = job_.context.planner->choice(epoch);
  if (!choice.entropy_aware) return;
  auto log = log::get("service");
  if (choice.floor_reached) {
    log->info("epoch {}: shuffle.min_entropy chose exchange_fraction {} (planned label entropy mean {:.3f}, p5 {:.3f}; "
              "{} candidates)",
              epoch, choice.exchange_fraction, choice.planned_label_entropy_mean, choice.planned_label_entropy_p5,
              choice.candidates_evaluated);
  } else {
    log->warn("epoch {}: no exchange_fraction up to the configured ceiling reaches shuffle.min_entropy; using {} "
              "(planned label entropy mean {:.3f})",
              epoch, choice.exchange_fraction, choice.planned_label_entropy_mean);
  }
}

ClientService::~ClientService() {
  // Runs on the io thread. Close everything now; handlers still queued see closed
  // objects (TrainerConnection::close is idempotent, the accept handler checks for abort first).
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  accept_backoff_.cancel();
  auto open = connections_;
  for (const auto& c : open) c->close();
  if (listening_) ::unlink(socket_path_.c_str());
}

Status ClientService::listen() {
  if (socket_path_.size() >= sizeof(sockaddr_un::sun_path)) {
    return make_error(StatusCode::kInvalidArgument, "socket path {} is longer than {} bytes; use a shorter service.run_dir",
                      socket_path_, sizeof(sockaddr_un::sun_path) - 1);
  }
  struct stat st {};
  if (::lstat(socket_path_.c_str(), &st) == 0) {
    // A live daemon answers; a stale file from a crashed one refuses the connection.
    stream::socket probe(io_);
    boost::system::error_code ec;
    probe.connect(stream::endpoint(socket_path_), ec);
    if (!ec) {
      return make_error(StatusCode::kUnavailable, "{}: another daemon is serving on this socket", socket_path_);
    }
    log::get("service")->warn("removing stale socket {} left by an earlier run", socket_path_);
    ::unlink(socket_path_.c_str());
  }
  boost::system::error_code ec;
  const mode_t old_mask = ::umask(0177);  // the socket file is created 0600
  acceptor_.open(stream(), ec);
  if (!ec) acceptor_.bind(stream::endpoint(socket_path_), ec);
  ::umask(old_mask);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return make_error(StatusCode::kIoError, "{}: cannot listen: {}", socket_path_, ec.message());
  listening_ = true;
  accept_next();
  return Status::ok_status();
}

void ClientService::sample_metadata() {
  if (job_.telemetry == nullptr) return;
  std::uint64_t bytes = 0;
  for (const auto& weak : trainer_connection_) {
    if (auto connection = weak.lock()) bytes += connection->scheduler_metadata_bytes();
  }
  job_.telemetry->note_scheduler_metadata_bytes(bytes);
}

void ClientService::accept_next() {
  acceptor_.async_accept([this](boost::system::error_code ec, stream::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // the service is closing
    if (ec) {
      // E.g. out of file descriptors: retrying at once would spin; back off.
      log::get("service")->warn("accept failed: {}; retrying in 100 ms", ec.message());
      accept_backoff_.expires_after(std::chrono::milliseconds(100));
      accept_backoff_.async_wait([this](boost::system::error_code wait_ec) {
        if (!wait_ec && acceptor_.is_open()) accept_next();
      });
      return;
    }
    auto connection = std::make_shared<TrainerConnection>(*this, std::move(socket));
    connections_.insert(connection);
    connection->start();
    accept_next();
  });
}

bool ClientService::wait_all_closed(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::promise<bool> empty;
    asio::post(io_, [this, &empty] { empty.set_value(connections_.empty()); });
    if (empty.get_future().get()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void ClientService::peer_dead(std::uint32_t peer) {
  asio::post(io_, [this, peer] {
    if (std::find(dead_peers_.begin(), dead_peers_.end(), peer) != dead_peers_.end()) return;
    dead_peers_.push_back(peer);
    auto open = connections_;
    for (const auto& c : open) c->peer_dead(peer);
  });
}

void ClientService::forget(const std::shared_ptr<TrainerConnection>& connection) { connections_.erase(connection); }

void ClientService::stop(const Status& why) {
  asio::post(io_, [this, why] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    accept_backoff_.cancel();
    // The socket file goes now, not at destruction: a daemon killed later in its shutdown
    // (e.g. by mpirun while it waits for a dead peer) leaves nothing behind.
    if (listening_) {
      ::unlink(socket_path_.c_str());
      listening_ = false;
    }
    auto open = connections_;
    for (const auto& c : open) {
      if (why.ok()) {
        c->close();
      } else {
        c->shut_down(why);
      }
    }
  });
}

}  // namespace shardmix
