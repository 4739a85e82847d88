// kiln-bench ddp: data parallelism on this machine. One process with N threads against N
// ranks with one thread each (Gloo over loopback), training a zoo model on the same
// synthetic global batch: img/s, and for the ranks the all-reduce time per step and how
// much of it overlapped backward. The two runs are child processes of this one (each its
// own `kiln-bench ddp --as-rank`), one after the other. --compile runs forward and backward
// compiled (kiln::compile; DDP then syncs after the compiled micro-step, nothing overlaps);
// --views makes the gradients views into DDP's buckets (gradient_as_bucket_view) and keeps
// them (zero_grad(set_to_none = false)).
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kiln.h>

#include "tools/bench_common.h"
#include "tools/free_port.h"
#include "tools/trainer.h"

extern char** environ;

namespace kiln::bench {
namespace {

struct DdpOptions {
  std::string arch = "resnet18";
  int64_t batch = 64;  // the global batch
  int64_t image_size = 32;
  int64_t classes = 10;
  int64_t steps = 5;
  int64_t warmup = 2;
  int64_t ranks = 2;
  bool compiled = false;  // forward and backward through kiln::compile
  bool views = false;     // gradient_as_bucket_view
  bool as_rank = false;   // measure in this process (what the driver starts)
};

DdpOptions parse(int argc, char** argv) {
  DdpOptions o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--as-rank" || a == "--compile" || a == "--views") {
      (a == "--as-rank" ? o.as_rank : a == "--compile" ? o.compiled : o.views) = true;
      continue;
    }
    KILN_CHECK(i + 1 < argc, "kiln-bench ddp: {} needs a value", a);
    const std::string v = argv[++i];
    auto number = [&] { return parse_integer("kiln-bench ddp", a, v); };
    if (a == "--arch") o.arch = v;
    else if (a == "--batch") o.batch = number();
    else if (a == "--image-size") o.image_size = number();
    else if (a == "--classes") o.classes = number();
    else if (a == "--steps") o.steps = number();
    else if (a == "--warmup") o.warmup = number();
    else if (a == "--ranks") o.ranks = number();
    else fail("kiln-bench ddp: unknown option {}", a);
  }
  check_range("kiln-bench ddp: --ranks", o.ranks, 1, 64);
  check_range("kiln-bench ddp: --batch", o.batch, o.ranks, 65536);
  check_range("kiln-bench ddp: --image-size", o.image_size, 1, 4096);
  check_range("kiln-bench ddp: --classes", o.classes, 1, 100000);
  check_range("kiln-bench ddp: --steps", o.steps, 1, 1'000'000);
  check_range("kiln-bench ddp: --warmup", o.warmup, 1, 1'000'000);
  return o;
}

// One measuring process: a rank of the job its environment describes, or the whole job.
int measure(const DdpOptions& o) {
  dist::init_process_group({.backend = "gloo"});
  const int rank = dist::get_rank(), world = dist::get_world_size();
  manual_seed(0);
  std::shared_ptr<nn::Module> model = train::make_model(o.arch, o.classes, 3, o.image_size);
  model->train();
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  if (world > 1)
    ddp = std::make_unique<dist::DistributedDataParallel>(*model,
                                                          dist::DataParallelOptions{.gradient_as_bucket_view = o.views});
  optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  Tensor x = randn({o.batch, 3, o.image_size, o.image_size});
  Tensor y = randint(0, o.classes, {o.batch});
  const auto [first, last] = data::shard_range(o.batch, rank, world);
  const Tensor xr = x.narrow(0, first, last - first).contiguous(), yr = y.narrow(0, first, last - first).contiguous();
  const double weight = static_cast<double>(world * (last - first)) / static_cast<double>(o.batch);
  const Tensor weight_t = full({}, weight);
  compiler::CompiledFunction compiled;
  if (o.compiled) compiled = compiler::compile(train::micro_step_function(*model, 0.0));
  std::vector<double> step_s;
  for (int64_t s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup && ddp) ddp->reset_sync_stats();
    if (world > 1) dist::barrier().wait();  // every rank starts the step together
    const auto start = std::chrono::steady_clock::now();
    opt.zero_grad(/*set_to_none=*/!o.views);  // zeroing in place keeps the views
    if (o.compiled) {
      compiled({xr, yr, weight_t});
      if (ddp) ddp->finish_sync();  // the replayed program ran no gradient hooks: the whole sync now
    } else {
      (nn::functional::cross_entropy((*model)(xr), yr) * weight).backward();
    }
    opt.step();
    if (s >= o.warmup) step_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double median = median_of(step_s);
  if (rank == 0) {
    std::string sync;
    if (ddp) {
      const dist::SyncStats st = ddp->sync_stats();
      const double per_step = st.all_reduce_s / static_cast<double>(st.steps) * 1e3;
      const double exposed = st.exposed_s / static_cast<double>(st.steps) * 1e3;
      const double steps = static_cast<double>(st.steps);
      sync = fmt::format(
          R"(,"buckets":{},"grads_copied_in_per_step":{:g},"grads_copied_out_per_step":{:g},"all_reduce_ms_per_step":{:.2f},"exposed_wait_ms_per_step":{:.2f},"overlapped":{:.3f})",
          ddp->bucket_count(), static_cast<double>(st.gradients_copied_in) / steps,
          static_cast<double>(st.gradients_copied_out) / steps, per_step, exposed,
          per_step > 0 ? std::max(0.0, 1 - exposed / per_step) : 0.0);
    }
    const char* threads = std::getenv("OMP_NUM_THREADS");
    std::cout << fmt::format(
                     R"({{"bench":"ddp","mode":"{}","ranks":{},"threads_per_rank":{},"arch":"{}","batch":{},"image_size":{},"compiled":{},"views":{},"median_step_ms":{:.2f},"img_per_s":{:.1f}{}}})",
                     world > 1 ? "ranks" : "one-process", world, threads ? threads : "default", o.arch, o.batch,
                     o.image_size, o.compiled, o.views, median * 1e3, static_cast<double>(o.batch) / median, sync)
              << std::endl;
  }
  dist::destroy_process_group();
  return 0;
}

int free_port() {
  const int port = tools::free_loopback_port();
  KILN_CHECK(port > 0, "kiln-bench ddp: cannot find a free port");
  return port;
}

// Starts `count` copies of this program measuring (ranks when count > 1, with `threads`
// OpenMP threads each), waits for them and returns rank 0's output.
std::string run_children(char** argv, const DdpOptions& o, int64_t count, int64_t threads) {
  const std::string exe = "/proc/self/exe";
  std::vector<std::string> args{argv[0], "ddp", "--as-rank", "--arch", o.arch, "--batch", std::to_string(o.batch),
                                "--image-size", std::to_string(o.image_size), "--classes", std::to_string(o.classes),
                                "--steps", std::to_string(o.steps), "--warmup", std::to_string(o.warmup)};
  if (o.compiled) args.push_back("--compile");
  if (o.views) args.push_back("--views");
  std::vector<char*> child_argv;
  for (std::string& a : args) child_argv.push_back(a.data());
  child_argv.push_back(nullptr);
  const int port = free_port();
  const std::string log = fmt::format("/tmp/kiln-bench-ddp-{}-{}.out", ::getpid(), port);
  std::vector<pid_t> pids;
  for (int64_t r = 0; r < count; ++r) {
    std::map<std::string, std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) vars[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "SLURM_PROCID", "SLURM_NTASKS"})
      vars.erase(k);
    if (count > 1) {
      vars["RANK"] = std::to_string(r);
      vars["LOCAL_RANK"] = std::to_string(r);
      vars["WORLD_SIZE"] = std::to_string(count);
      vars["MASTER_ADDR"] = "127.0.0.1";
      vars["MASTER_PORT"] = std::to_string(port);
    }
    vars["OMP_NUM_THREADS"] = std::to_string(threads);
    std::vector<std::string> env;
    for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (r == 0) posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, exe.c_str(), &actions, nullptr, child_argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    KILN_CHECK(rc == 0, "kiln-bench ddp: cannot start {}: {}", exe, std::strerror(rc));
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  ::unlink(log.c_str());
  KILN_CHECK(ok, "kiln-bench ddp: a measuring process failed (rank 0 said: {})", text.str());
  return text.str();
}

}  // namespace

int bench_ddp(int argc, char** argv) {
  const DdpOptions o = parse(argc, argv);
  if (o.as_rank) return measure(o);
  const std::string one = run_children(argv, o, 1, o.ranks);
  const std::string ranks = run_children(argv, o, o.ranks, 1);
  std::cout << one << ranks;
  return 0;
}

}  // namespace kiln::bench
