#include "control/mpi_comm.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

// Only the C API: Open MPI's mpi.h otherwise drags in the removed C++ bindings, which
// need libmpi_cxx at link time.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <fmt/format.h>

#include "control/app_context.h"

namespace shardmix {
namespace {

// Sleep between MPI_Test calls in barrier(): short enough that shutdown is not slowed
// noticeably, long enough that a waiting rank does not steal a core from its peers
// (the development machines have 2 cores for 4 ranks).
constexpr auto kBarrierPollInterval = std::chrono::microseconds(100);

// MPI counts and displacements are int; a single call moves at most this many bytes.
constexpr std::uint64_t kMaxBytesPerCall = INT_MAX;

// MPI errors in a running job almost always mean a peer process is gone: kUnavailable.
Status mpi_error(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return make_error(StatusCode::kUnavailable, "{} failed with MPI error {}", call, code);
  }
  return make_error(StatusCode::kUnavailable, "{} failed: {}", call, std::string_view(text, length));
}

#define SHARDMIX_MPI_CHECK(call_name, expr)              \
  do {                                                   \
    const int shardmix_mpi_rc_ = (expr);                 \
    if (shardmix_mpi_rc_ != MPI_SUCCESS) return mpi_error(call_name, shardmix_mpi_rc_); \
  } while (0)

// The daemons' communicator: MPI_COMM_WORLD, or in an MPMD job (mpirun -np N shardmixd :
// -np M ./train) the ranks of our own app context only. One MpiSession per process.
MPI_Comm g_comm = MPI_COMM_WORLD;

// Open MPI lists each app context's size ("4 8") and tells each process its context.
// MPI_Comm_create_group is collective over the group only, so the other app's processes
// (trainers) take no part; they must still call MPI_Init and MPI_Finalize (Open MPI 4.1
// refuses a job where some processes initialise MPI and others do not).
int create_app_communicator() {
  int* appnum = nullptr;
  int flag = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag) != MPI_SUCCESS || !flag) return MPI_SUCCESS;
  int world = 0;
  if (int rc = MPI_Comm_size(MPI_COMM_WORLD, &world); rc != MPI_SUCCESS) return rc;
  const auto app = app_context_range(std::getenv("OMPI_APP_CTX_NUM_PROCS"), *appnum);
  if (!app || app->count == world) return MPI_SUCCESS;  // one app context: the world is ours
  MPI_Group world_group = MPI_GROUP_NULL, app_group = MPI_GROUP_NULL;
  int range[1][3] = {{app->first, app->first + app->count - 1, 1}};
  int rc = MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  if (rc == MPI_SUCCESS) rc = MPI_Group_range_incl(world_group, 1, range, &app_group);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(MPI_COMM_WORLD, app_group, 0, &g_comm);
  if (app_group != MPI_GROUP_NULL) MPI_Group_free(&app_group);
  if (world_group != MPI_GROUP_NULL) MPI_Group_free(&world_group);
  return rc;
}

[[noreturn]] void die(const char* what, int code) {
  std::fprintf(stderr, "shardmix: %s failed (MPI error %d); cannot continue\n", what, code);
  std::fflush(stderr);
  std::exit(EXIT_FAILURE);
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = MPI_THREAD_SINGLE;
  if (int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided); rc != MPI_SUCCESS) {
    die("MPI_Init_thread", rc);
  }
  if (provided < MPI_THREAD_FUNNELED) {
    std::fprintf(stderr, "shardmix: MPI_Init_thread provided thread level %d < MPI_THREAD_FUNNELED\n", provided);
    MPI_Abort(MPI_COMM_WORLD, EXIT_FAILURE);
  }
  if (int rc = create_app_communicator(); rc != MPI_SUCCESS) die("creating the daemons' communicator (MPMD)", rc);
  // Errors come back as codes and become Status values instead of aborting the job.
  MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g_comm, &rank_);
  MPI_Comm_size(g_comm, &size_);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // MPI_Finalize with sends still pending is erroneous; these are small (eager) messages.
  for (PendingSend& p : pending_sends_) {
    auto* request = static_cast<MPI_Request*>(p.request);
    if (!finalized) MPI_Wait(request, MPI_STATUS_IGNORE);
    delete request;
  }
  pending_sends_.clear();
  if (!finalized && g_comm != MPI_COMM_WORLD && g_comm != MPI_COMM_NULL) MPI_Comm_free(&g_comm);  // MPMD's own
  if (!finalized) MPI_Finalize();
}

std::string MpiSession::hostname() const {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

Result<std::vector<std::vector<std::uint8_t>>> MpiSession::allgather(std::span<const std::uint8_t> mine) const {
  const auto nranks = static_cast<std::size_t>(size_);
  std::vector<std::uint64_t> sizes(nranks);
  const std::uint64_t my_size = mine.size();
  SHARDMIX_MPI_CHECK("MPI_Allgather (allgather sizes)",
                     MPI_Allgather(&my_size, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, g_comm));

  std::vector<std::vector<std::uint8_t>> result(nranks);
  for (std::size_t r = 0; r < nranks; ++r) result[r].resize(sizes[r]);

  // Rounds of MPI_Allgatherv, each moving at most INT_MAX bytes in total so counts and
  // displacements fit in int. A catalog fits in one round for all but huge datasets.
  const std::uint64_t per_rank_per_round = std::max<std::uint64_t>(1, kMaxBytesPerCall / nranks);
  const std::uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int> counts(nranks);
  std::vector<int> displacements(nranks);
  std::vector<std::uint8_t> round_buffer;
  for (std::uint64_t done = 0; done < largest; done += per_rank_per_round) {
    std::size_t total = 0;
    for (std::size_t r = 0; r < nranks; ++r) {
      const std::uint64_t left = sizes[r] > done ? sizes[r] - done : 0;
      counts[r] = static_cast<int>(std::min(left, per_rank_per_round));
      displacements[r] = static_cast<int>(total);
      total += static_cast<std::size_t>(counts[r]);
    }
    round_buffer.resize(total);
    const int my_count = counts[static_cast<std::size_t>(rank_)];
    SHARDMIX_MPI_CHECK("MPI_Allgatherv (allgather bytes)",
                       MPI_Allgatherv(mine.data() + (my_count > 0 ? done : 0), my_count, MPI_BYTE,
                                      round_buffer.data(), counts.data(), displacements.data(), MPI_BYTE,
                                      g_comm));
    for (std::size_t r = 0; r < nranks; ++r) {
      std::copy_n(round_buffer.begin() + displacements[r], counts[r], result[r].begin() + static_cast<std::ptrdiff_t>(done));
    }
  }
  return result;
}

Result<std::vector<std::vector<std::uint8_t>>> MpiSession::alltoall(
    const std::vector<std::vector<std::uint8_t>>& outgoing) const {
  const auto nranks = static_cast<std::size_t>(size_);
  if (outgoing.size() != nranks) {
    return make_error(StatusCode::kInvalidArgument, "alltoall: {} messages for {} ranks", outgoing.size(), nranks);
  }
  std::vector<std::uint64_t> send_sizes(nranks), receive_sizes(nranks);
  for (std::size_t r = 0; r < nranks; ++r) send_sizes[r] = outgoing[r].size();
  SHARDMIX_MPI_CHECK("MPI_Alltoall (alltoall sizes)", MPI_Alltoall(send_sizes.data(), 1, MPI_UINT64_T,
                                                                   receive_sizes.data(), 1, MPI_UINT64_T, g_comm));
  // One MPI_Alltoallv: counts and displacements are int. The owner-side catalog moves about
  // N/P entries per rank, far below this; a job that does not fit says so on every rank.
  auto total = [](const std::vector<std::uint64_t>& sizes) {
    std::uint64_t sum = 0;
    for (std::uint64_t v : sizes) sum += v;
    return sum;
  };
  const std::uint64_t out_bytes = total(send_sizes), in_bytes = total(receive_sizes);
  const auto limit = static_cast<std::uint64_t>(std::numeric_limits<int>::max());
  const std::uint64_t too_big = out_bytes > limit || in_bytes > limit ? 1 : 0;
  SHARDMIX_ASSIGN_OR_RETURN(std::uint64_t ranks_too_big, allreduce_sum(too_big));
  if (ranks_too_big > 0) {
    return make_error(StatusCode::kResourceExhausted,
                      "alltoall: {} ranks would send or receive more than {} bytes in one call (this rank: {} out, "
                      "{} in)",
                      ranks_too_big, limit, out_bytes, in_bytes);
  }
  std::vector<int> send_counts(nranks), send_displacements(nranks), receive_counts(nranks), receive_displacements(nranks);
  std::vector<std::uint8_t> send_buffer;
  send_buffer.reserve(out_bytes);
  int at = 0, in_at = 0;
  for (std::size_t r = 0; r < nranks; ++r) {
    send_counts[r] = static_cast<int>(send_sizes[r]);
    send_displacements[r] = at;
    at += send_counts[r];
    send_buffer.insert(send_buffer.end(), outgoing[r].begin(), outgoing[r].end());
    receive_counts[r] = static_cast<int>(receive_sizes[r]);
    receive_displacements[r] = in_at;
    in_at += receive_counts[r];
  }
  std::vector<std::uint8_t> receive_buffer(in_bytes);
  SHARDMIX_MPI_CHECK("MPI_Alltoallv (alltoall bytes)",
                     MPI_Alltoallv(send_buffer.data(), send_counts.data(), send_displacements.data(), MPI_BYTE,
                                   receive_buffer.data(), receive_counts.data(), receive_displacements.data(), MPI_BYTE,
                                   g_comm));
  std::vector<std::vector<std::uint8_t>> result(nranks);
  for (std::size_t r = 0; r < nranks; ++r) {
    const auto begin = receive_buffer.begin() + receive_displacements[r];
    result[r].assign(begin, begin + receive_counts[r]);
  }
  return result;
}

Result<std::vector<std::uint8_t>> MpiSession::broadcast(std::span<const std::uint8_t> bytes, int root) const {
  if (root < 0 || root >= size_) {
    return make_error(StatusCode::kInvalidArgument, "broadcast: root rank {} outside 0..{}", root, size_ - 1);
  }
  std::uint64_t length = bytes.size();
  SHARDMIX_MPI_CHECK("MPI_Bcast (broadcast size)", MPI_Bcast(&length, 1, MPI_UINT64_T, root, g_comm));
  std::vector<std::uint8_t> result;
  if (rank_ == root) {
    result.assign(bytes.begin(), bytes.end());
  } else {
    result.resize(length);
  }
  for (std::uint64_t done = 0; done < length; done += kMaxBytesPerCall) {
    const int count = static_cast<int>(std::min(length - done, kMaxBytesPerCall));
    SHARDMIX_MPI_CHECK("MPI_Bcast (broadcast bytes)",
                       MPI_Bcast(result.data() + done, count, MPI_BYTE, root, g_comm));
  }
  return result;
}

Result<std::uint64_t> MpiSession::allreduce_sum(std::uint64_t value) const {
  std::uint64_t sum = 0;
  SHARDMIX_MPI_CHECK("MPI_Allreduce (sum)", MPI_Allreduce(&value, &sum, 1, MPI_UINT64_T, MPI_SUM, g_comm));
  return sum;
}

Status MpiSession::barrier(const std::function<void()>& progress) const {
  MPI_Request request = MPI_REQUEST_NULL;
  SHARDMIX_MPI_CHECK("MPI_Ibarrier", MPI_Ibarrier(g_comm, &request));
  for (;;) {
    int done = 0;
    SHARDMIX_MPI_CHECK("MPI_Test (barrier)", MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return Status::ok_status();
    if (progress) progress();
    std::this_thread::sleep_for(kBarrierPollInterval);
  }
}

Status MpiSession::barrier_unless(const std::function<Status()>& check) const {
  MPI_Request request = MPI_REQUEST_NULL;
  SHARDMIX_MPI_CHECK("MPI_Ibarrier", MPI_Ibarrier(g_comm, &request));
  for (;;) {
    int done = 0;
    SHARDMIX_MPI_CHECK("MPI_Test (barrier)", MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return Status::ok_status();
    if (check) {
      Status s = check();
      if (!s.ok()) return s;
    }
    std::this_thread::sleep_for(kBarrierPollInterval);
  }
}

Status MpiSession::send(int dest, int tag, std::span<const std::uint8_t> bytes) const {
  if (bytes.size() > kMaxBytesPerCall) {
    return make_error(StatusCode::kInvalidArgument, "send: {} bytes is more than one MPI message carries", bytes.size());
  }
  SHARDMIX_MPI_CHECK("MPI_Send", MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, dest, tag,
                                          g_comm));
  return Status::ok_status();
}

Status MpiSession::post_send(int dest, int tag, std::vector<std::uint8_t> bytes) const {
  if (bytes.size() > kMaxBytesPerCall) {
    return make_error(StatusCode::kInvalidArgument, "send to rank {}: {} bytes is more than one MPI message carries",
                      dest, bytes.size());
  }
  auto request = std::make_unique<MPI_Request>(MPI_REQUEST_NULL);
  const int rc = MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, dest, tag, g_comm, request.get());
  if (rc != MPI_SUCCESS) return mpi_error("MPI_Isend", rc).with_context(fmt::format("send to daemon rank {}", dest));
  pending_sends_.push_back({request.release(), dest, tag, std::move(bytes)});
  return Status::ok_status();
}

Status MpiSession::test_sends() const {
  Status first;
  for (std::size_t i = 0; i < pending_sends_.size();) {
    PendingSend& p = pending_sends_[i];
    auto* request = static_cast<MPI_Request*>(p.request);
    int done = 0;
    const int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS && first.ok()) {
      first = mpi_error("MPI_Test", rc).with_context(fmt::format("send (tag {}) to daemon rank {}", p.tag, p.dest));
    }
    if (done || rc != MPI_SUCCESS) {
      // A failed request is freed by MPI_Test only when it completed; free it either way.
      if (!done && *request != MPI_REQUEST_NULL) MPI_Request_free(request);
      delete request;
      pending_sends_.erase(pending_sends_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    ++i;
  }
  return first;
}

Result<std::optional<MpiSession::Message>> MpiSession::try_receive(std::optional<int> tag) const {
  int waiting = 0;
  MPI_Status status;
  SHARDMIX_MPI_CHECK("MPI_Iprobe",
                     MPI_Iprobe(MPI_ANY_SOURCE, tag ? *tag : MPI_ANY_TAG, g_comm, &waiting, &status));
  if (!waiting) return std::optional<Message>();
  int count = 0;
  SHARDMIX_MPI_CHECK("MPI_Get_count", MPI_Get_count(&status, MPI_BYTE, &count));
  Message m;
  m.source = status.MPI_SOURCE;
  m.tag = status.MPI_TAG;
  m.bytes.resize(static_cast<std::size_t>(count));
  SHARDMIX_MPI_CHECK("MPI_Recv", MPI_Recv(m.bytes.data(), count, MPI_BYTE, m.source, m.tag, g_comm,
                                          MPI_STATUS_IGNORE));
  return std::optional<Message>(std::move(m));
}

}  // namespace shardmix
