#pragma once
// Multi-process tests: a test starts N copies of this test binary, each running one hidden
// test case (tagged [.rank]) as one rank of a job, with the environment kiln-run gives
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and OMP_NUM_THREADS=1, on a free
// loopback port, and checks how each exited. Output goes to a file per rank, shown on failure.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tools/free_port.h"

extern char** environ;

namespace kiln::testing {

// A port no one listens on now, for the store of one job.
inline int free_port() { return tools::free_loopback_port(); }

struct RankExit {
  int status = -1;   // exit status, or -1 when killed by a signal
  int signal = 0;    // the signal that ended it, or 0
  bool timed_out = false;
  std::string output;
};

struct RankJob {
  std::string test_case;  // the hidden test case each rank runs
  int world_size = 2;
  std::vector<int> ranks;  // the ranks to start; empty: all
  std::map<std::string, std::string> env;  // more variables for every rank
  double limit_s = 60;     // kill what still runs after this
  // Whose variables give each rank its place: "torchrun" (RANK, WORLD_SIZE, LOCAL_RANK, as
  // kiln-run sets them) or "slurm" (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and
  // SLURM_NNODES=1, as srun sets them for the tasks of one node).
  std::string launcher = "torchrun";
};

inline std::string self_exe() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  REQUIRE(n > 0);
  path[n] = '\0';
  return path;
}

// Starts the ranks, waits for all of them (up to limit_s) and returns how each ended.
inline std::vector<RankExit> run_ranks(const RankJob& job) {
  const std::string exe = self_exe();
  const int port = free_port();
  std::vector<int> ranks = job.ranks;
  if (ranks.empty())
    for (int r = 0; r < job.world_size; ++r) ranks.push_back(r);
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int rank : ranks) {
    std::map<std::string, std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
                             "SLURM_NNODES", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"})
      vars.erase(name);  // none of this process's own launcher
    if (job.launcher == "slurm") {
      vars["SLURM_PROCID"] = std::to_string(rank);
      vars["SLURM_LOCALID"] = std::to_string(rank);
      vars["SLURM_NTASKS"] = std::to_string(job.world_size);
      vars["SLURM_NNODES"] = "1";
    } else {
      vars["RANK"] = std::to_string(rank);
      vars["LOCAL_RANK"] = std::to_string(rank);
      vars["WORLD_SIZE"] = std::to_string(job.world_size);
    }
    vars["MASTER_ADDR"] = "127.0.0.1";
    vars["MASTER_PORT"] = std::to_string(port);
    vars["OMP_NUM_THREADS"] = "1";
    if (job.launcher == "slurm") vars.erase("MASTER_ADDR");  // one node: kiln takes 127.0.0.1
    for (const auto& [k, v] : job.env) vars[k] = v;
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string log = (std::filesystem::temp_directory_path() /
                       ("kiln-rank-" + std::to_string(::getpid()) + "-" + std::to_string(port) + "-" +
                        std::to_string(rank) + ".log"))
                          .string();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::string name = job.test_case;
    std::vector<char*> argv{const_cast<char*>(exe.c_str()), name.data(), nullptr};
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(rc == 0);
    pids.push_back(pid);
    logs.push_back(log);
  }
  std::vector<RankExit> exits(pids.size());
  std::vector<bool> done(pids.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(job.limit_s);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
        if (WIFEXITED(status)) exits[i].status = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) exits[i].signal = WTERMSIG(status);
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        ::kill(pids[i], SIGKILL);
        int status = 0;
        ::waitpid(pids[i], &status, 0);
        exits[i].timed_out = true;
        exits[i].signal = SIGKILL;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    std::ifstream in(logs[i]);
    std::stringstream text;
    text << in.rdbuf();
    exits[i].output = text.str();
    std::filesystem::remove(logs[i]);
  }
  return exits;
}

// Runs the job and requires every rank to exit with status 0.
inline void require_ranks_pass(const RankJob& job) {
  const std::vector<RankExit> exits = run_ranks(job);
  for (size_t i = 0; i < exits.size(); ++i) {
    INFO("rank " << (job.ranks.empty() ? static_cast<int>(i) : job.ranks[i]) << " of " << job.world_size
                 << (exits[i].timed_out ? " (killed after the time limit)" : "") << " said:\n"
                 << exits[i].output);
    CHECK(exits[i].status == 0);
  }
}

// This process's rank and world size, as run_ranks set them.
inline int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

}  // namespace kiln::testing
