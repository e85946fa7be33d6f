#include "common/mpi_comm.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

// Only the C API: Open MPI's mpi.h otherwise drags in the removed C++ bindings, which
// need libmpi_cxx at link time.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

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
  // Errors come back as codes and become Status values instead of aborting the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
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
                     MPI_Allgather(&my_size, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD));

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
                                      MPI_COMM_WORLD));
    for (std::size_t r = 0; r < nranks; ++r) {
      std::copy_n(round_buffer.begin() + displacements[r], counts[r], result[r].begin() + static_cast<std::ptrdiff_t>(done));
    }
  }
  return result;
}

Result<std::vector<std::uint8_t>> MpiSession::broadcast(std::span<const std::uint8_t> bytes, int root) const {
  if (root < 0 || root >= size_) {
    return make_error(StatusCode::kInvalidArgument, "broadcast: root rank {} outside 0..{}", root, size_ - 1);
  }
  std::uint64_t length = bytes.size();
  SHARDMIX_MPI_CHECK("MPI_Bcast (broadcast size)", MPI_Bcast(&length, 1, MPI_UINT64_T, root, MPI_COMM_WORLD));
  std::vector<std::uint8_t> result;
  if (rank_ == root) {
    result.assign(bytes.begin(), bytes.end());
  } else {
    result.resize(length);
  }
  for (std::uint64_t done = 0; done < length; done += kMaxBytesPerCall) {
    const int count = static_cast<int>(std::min(length - done, kMaxBytesPerCall));
    SHARDMIX_MPI_CHECK("MPI_Bcast (broadcast bytes)",
                       MPI_Bcast(result.data() + done, count, MPI_BYTE, root, MPI_COMM_WORLD));
  }
  return result;
}

Result<std::uint64_t> MpiSession::allreduce_sum(std::uint64_t value) const {
  std::uint64_t sum = 0;
  SHARDMIX_MPI_CHECK("MPI_Allreduce (sum)", MPI_Allreduce(&value, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
  return sum;
}

Status MpiSession::barrier(const std::function<void()>& progress) const {
  MPI_Request request = MPI_REQUEST_NULL;
  SHARDMIX_MPI_CHECK("MPI_Ibarrier", MPI_Ibarrier(MPI_COMM_WORLD, &request));
  for (;;) {
    int done = 0;
    SHARDMIX_MPI_CHECK("MPI_Test (barrier)", MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return Status::ok_status();
    if (progress) progress();
    std::this_thread::sleep_for(kBarrierPollInterval);
  }
}

}  // namespace shardmix
