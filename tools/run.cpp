// kiln-run: starts the ranks of a data-parallel job on this node, like torchrun.
//
//   kiln-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P] PROGRAM ARGS...
//
// Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
// (what dist::init_process_group reads) and, unless set, OMP_NUM_THREADS = cores / N. Its
// stdout and stderr lines come out prefixed with "[rank R] ". Ctrl-C (SIGINT) and SIGTERM
// are passed on to every rank. When a rank fails (a nonzero status or a signal) the others
// get SIGTERM, then SIGKILL after --grace seconds, and kiln-run exits with the failed
// rank's status (128 + the signal's number for a signal).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tools/free_port.h"

namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

void on_signal(int signo) {
  const char byte = static_cast<char>(signo);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "kiln-run: %s (kiln-run --help prints the usage)\n", message.c_str());
  std::exit(2);
}

struct Options {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // torchrun's default; 0: a free port (one node only)
  double grace_s = 5;
  std::vector<std::string> command;
};

int parse_int(const std::string& option, const char* text, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
    usage_error(fmt::format("{} {}: expected an integer between {} and {}", option, text, lo, hi));
  return static_cast<int>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf(
          "usage: kiln-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P] "
          "[--grace S] PROGRAM ARGS...\n"
          "Starts N ranks of PROGRAM on this node (node R of M), with RANK, LOCAL_RANK, WORLD_SIZE,\n"
          "LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; prefixes their output with the rank;\n"
          "passes Ctrl-C on; when one rank fails, stops the others (SIGTERM, SIGKILL after S seconds,\n"
          "5 by default) and exits with its status. --master-port 0 picks a free port (one node).\n");
      std::exit(0);
    }
    if (a.rfind("--", 0) != 0) break;
    if (i + 1 >= argc) usage_error(a + " needs a value");
    const char* v = argv[++i];
    if (a == "--nproc-per-node" || a == "--nproc") o.nproc = parse_int(a, v, 1, 4096);
    else if (a == "--nnodes") o.nnodes = parse_int(a, v, 1, 1 << 20);
    else if (a == "--node-rank") o.node_rank = parse_int(a, v, 0, (1 << 20) - 1);
    else if (a == "--master-addr") o.master_addr = v;
    else if (a == "--master-port") o.master_port = parse_int(a, v, 0, 65535);
    else if (a == "--grace") o.grace_s = parse_int(a, v, 0, 3600);
    else usage_error("unknown option " + a);
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.command.empty()) usage_error("no program to run");
  if (o.node_rank >= o.nnodes) usage_error(fmt::format("--node-rank {} is not below --nnodes {}", o.node_rank, o.nnodes));
  if (o.master_port == 0 && o.nnodes > 1) usage_error("--master-port 0 (a free port) works on one node only");
  return o;
}

int free_port() {
  const int port = kiln::tools::free_loopback_port();
  if (port < 0) usage_error(fmt::format("cannot find a free port: {}", std::strerror(errno)));
  return port;
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;     // read ends of its stdout and stderr
  std::string out_buffer, err_buffer;  // an unfinished last line
  bool running = true;
  int status = 0;  // exit status, or 128 + signal
};

Rank start(const Options& o, int local_rank, int port, const std::string& threads) {
  int out[2], err[2];
  if (::pipe(out) != 0 || ::pipe(err) != 0) usage_error(fmt::format("pipe: {}", std::strerror(errno)));
  Rank r;
  r.rank = o.node_rank * o.nproc + local_rank;
  r.pid = ::fork();
  if (r.pid < 0) usage_error(fmt::format("fork: {}", std::strerror(errno)));
  if (r.pid == 0) {
    ::setpgid(0, 0);  // its own process group: a signal reaches what the rank started too
    ::setenv("RANK", std::to_string(r.rank).c_str(), 1);
    ::setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(o.nproc * o.nnodes).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
    ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    if (!threads.empty()) ::setenv("OMP_NUM_THREADS", threads.c_str(), 1);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::close(out[0]);
    ::close(out[1]);
    ::close(err[0]);
    ::close(err[1]);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    std::vector<char*> argv;
    for (const std::string& s : o.command) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "kiln-run: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(r.pid, r.pid);  // also here, so no signal can come before the child's own call
  ::close(out[1]);
  ::close(err[1]);
  r.out = out[0];
  r.err = err[0];
  return r;
}

// Writes the whole lines of `buffer` to `to` with the rank's prefix (and the rest, at the end).
void flush_lines(int rank, std::string& buffer, FILE* to, bool all) {
  size_t start = 0;
  for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1)
    std::fprintf(to, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start), buffer.data() + start);
  buffer.erase(0, start);
  if (all && !buffer.empty()) {
    std::fprintf(to, "[rank %d] %s\n", rank, buffer.c_str());
    buffer.clear();
  }
  std::fflush(to);
}

// Reads what is there; closes the pipe at its end.
void drain(Rank& r, int& fd, std::string& buffer, FILE* to) {
  char chunk[65536];
  const ssize_t n = ::read(fd, chunk, sizeof(chunk));
  if (n > 0) {
    buffer.append(chunk, static_cast<size_t>(n));
    flush_lines(r.rank, buffer, to, false);
  } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
    flush_lines(r.rank, buffer, to, true);
    ::close(fd);
    fd = -1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int port = o.master_port == 0 ? free_port() : o.master_port;
  std::string threads;
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    threads = std::to_string(std::max(1u, cores / static_cast<unsigned>(o.nproc)));
  }
  if (::pipe(g_signal_pipe) != 0) usage_error(fmt::format("pipe: {}", std::strerror(errno)));
  struct sigaction action {};
  action.sa_handler = on_signal;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::vector<Rank> ranks;
  for (int local = 0; local < o.nproc; ++local) ranks.push_back(start(o, local, port, threads));

  int failed_rank = -1, exit_status = 0, interrupted = 0;
  Clock::time_point kill_at = Clock::time_point::max(), last_exit = Clock::time_point::max();
  auto stop_others = [&](int signo) {
    for (Rank& r : ranks)
      if (r.running) ::kill(-r.pid, signo);
    kill_at = std::min(kill_at, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(o.grace_s)));
  };
  for (;;) {
    bool any_open = false, any_running = false;
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    for (Rank& r : ranks) {
      if (r.out >= 0) fds.push_back({r.out, POLLIN, 0});
      if (r.err >= 0) fds.push_back({r.err, POLLIN, 0});
      any_open |= r.out >= 0 || r.err >= 0;
      any_running |= r.running;
    }
    if (!any_open && !any_running) break;
    // Every rank is gone but something it started still holds its output open: a second
    // more for the last lines, then stop listening.
    if (!any_running) {
      if (last_exit == Clock::time_point::max()) last_exit = Clock::now();
      if (Clock::now() - last_exit > std::chrono::seconds(1)) {
        for (Rank& r : ranks) {
          if (r.out >= 0) flush_lines(r.rank, r.out_buffer, stdout, true), ::close(r.out), r.out = -1;
          if (r.err >= 0) flush_lines(r.rank, r.err_buffer, stderr, true), ::close(r.err), r.err = -1;
        }
        break;
      }
    }
    ::poll(fds.data(), fds.size(), 100);
    if (fds[0].revents & POLLIN) {
      char signo = 0;
      if (::read(g_signal_pipe[0], &signo, 1) == 1) {
        interrupted = signo;
        for (Rank& r : ranks)
          if (r.running) ::kill(-r.pid, signo);  // each rank decides how to stop (a checkpoint, say)
        kill_at = std::min(kill_at, Clock::now() + std::chrono::seconds(30));
      }
    }
    for (Rank& r : ranks) {
      for (const pollfd& p : fds) {
        if (p.revents == 0) continue;
        if (p.fd == r.out && r.out >= 0) drain(r, r.out, r.out_buffer, stdout);
        if (p.fd == r.err && r.err >= 0) drain(r, r.err, r.err_buffer, stderr);
      }
    }
    for (Rank& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (r.status != 0 && failed_rank < 0 && interrupted == 0) {
        failed_rank = r.rank;
        exit_status = r.status;
        int others = 0;
        for (const Rank& q : ranks) others += q.running ? 1 : 0;
        std::fprintf(stderr, "kiln-run: rank %d %s; stopping the other %d rank%s\n", r.rank,
                     WIFEXITED(status) ? fmt::format("exited with status {}", r.status).c_str()
                                       : fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                                                     ::strsignal(WTERMSIG(status))).c_str(),
                     others, others == 1 ? "" : "s");
        stop_others(SIGTERM);
      }
    }
    if (Clock::now() >= kill_at) {
      for (Rank& r : ranks)
        if (r.running) ::kill(-r.pid, SIGKILL);
      kill_at = Clock::time_point::max();
    }
  }
  if (failed_rank >= 0) return exit_status;
  if (interrupted != 0) return 128 + interrupted;
  for (const Rank& r : ranks)
    if (r.status != 0) return r.status;
  return 0;
}
