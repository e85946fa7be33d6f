// shardmix-mpmd-trainer: runs a trainer that is not an MPI program as one app of an MPMD
// job next to the daemons, in one mpirun:
//
//   mpirun -np 2 shardmixd --config job.toml : -np 4 shardmix-mpmd-trainer -- ./train ARGS
//
// Open MPI 4.1 needs every process of a job to call MPI_Init and MPI_Finalize, so this
// wrapper does that for the trainer, runs it as a child process (the child finds its
// trainer rank from OMPI_* variables made relative to its app context: the daemon ranks
// are not counted), and when every trainer has exited (a barrier over the trainers' app
// only), the first trainer on each host stops the daemons of that host (SIGTERM to the
// pids listed in RUN_DIR/ready), so that the whole job ends. Exits with the trainer's status.
//
// A trainer that is itself an MPI program needs no wrapper, but must then stop the daemons
// itself and keep them out of its collectives (split MPI_COMM_WORLD by MPI_APPNUM).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <mpi.h>

#include "control/app_context.h"

namespace {

volatile std::sig_atomic_t g_child = 0;

void forward(int signo) {
  if (g_child > 0) ::kill(g_child, signo);
}

std::string run_dir() {
  const char* env = std::getenv("SHARDMIX_RUN_DIR");
  return env != nullptr && *env != '\0' ? env : "/tmp/shardmix-" + std::to_string(::geteuid());
}

// SIGTERM to the daemons of this host listed in RUN_DIR/ready.
void stop_local_daemons() {
  std::ifstream in(run_dir() + "/ready");
  if (!in) {
    std::fprintf(stderr, "shardmix-mpmd-trainer: %s/ready not found; daemons not stopped\n", run_dir().c_str());
    return;
  }
  std::map<std::string, std::string> kv;
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const int daemons = std::atoi(kv["daemons"].c_str());
  for (int r = 0; r < daemons; ++r) {
    const std::string h = kv["host." + std::to_string(r)];
    const long pid = std::atol(kv["pid." + std::to_string(r)].c_str());
    if (pid > 0 && (h.empty() || h == host)) ::kill(static_cast<pid_t>(pid), SIGTERM);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int first = 1;
  if (first < argc && std::strcmp(argv[first], "--") == 0) ++first;
  if (first >= argc) {
    std::fprintf(stderr, "usage: shardmix-mpmd-trainer [--] TRAINER [ARGS...]\n");
    return 2;
  }
  MPI_Init(&argc, &argv);
  // The trainers' own communicator: this app context only. MPI_Comm_create_group is
  // collective over the group alone, so the daemons take no part (they do the same).
  int* appnum = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const auto app = shardmix::app_context_range(std::getenv("OMPI_APP_CTX_NUM_PROCS"), flag ? *appnum : 0);
  const int begin = app ? app->first : 0;
  const int count = app ? app->count : world;
  MPI_Group world_group, app_group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  int range[1][3] = {{begin, begin + count - 1, 1}};
  MPI_Group_range_incl(world_group, 1, range, &app_group);
  MPI_Comm trainers = MPI_COMM_NULL;
  MPI_Comm_create_group(MPI_COMM_WORLD, app_group, 1, &trainers);
  MPI_Group_free(&app_group);
  MPI_Group_free(&world_group);

  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::execvp(argv[first], argv + first);
    std::fprintf(stderr, "shardmix-mpmd-trainer: cannot run %s: %s\n", argv[first], std::strerror(errno));
    std::_Exit(127);
  }
  int code = 1;
  if (child < 0) {
    std::fprintf(stderr, "shardmix-mpmd-trainer: fork: %s\n", std::strerror(errno));
  } else {
    g_child = child;
    std::signal(SIGTERM, forward);
    std::signal(SIGINT, forward);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  MPI_Barrier(trainers);  // every trainer is done
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(trainers, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int local_rank = 0;
  MPI_Comm_rank(local, &local_rank);
  if (local_rank == 0) stop_local_daemons();
  MPI_Comm_free(&local);
  MPI_Comm_free(&trainers);
  MPI_Finalize();
  return code;
}
