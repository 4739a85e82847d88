#include "dist/process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/cuda.h"
#include "core/error.h"
#include "core/half.h"
#include "dist/launch_env.h"
#include "dist/tcp_store.h"

namespace kiln::dist {

struct Work::State {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::string error;  // empty: succeeded
  double seconds = 0;  // how long it ran on the worker
  std::shared_ptr<DeviceWork> device;  // a collective on CUDA tensors (the rest is unused then)
};

void Work::wait() const {
  KILN_CHECK(state_ != nullptr, "Work::wait: this Work belongs to no collective");
  if (state_->device) return state_->device->wait();
  std::unique_lock lock(state_->mutex);
  state_->done_cv.wait(lock, [this] { return state_->done; });
  if (!state_->error.empty()) throw Error(state_->error);
}

double Work::seconds() const {
  if (state_ == nullptr) return 0;
  if (state_->device) return state_->device->seconds();
  std::lock_guard lock(state_->mutex);
  return state_->seconds;
}

bool Work::is_completed() const {
  if (state_ == nullptr) return false;
  if (state_->device) return state_->device->query();
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

// The worker: runs the group's collectives one at a time, in the order they were queued.
struct ProcessGroup::Queue {
  struct Task {
    std::string what;
    std::function<void(Backend&, uint32_t)> run;
    std::shared_ptr<Work::State> state;
  };
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Task> tasks;
  bool stopping = false;
  std::string broken;  // the first failure; later tasks fail with it
  uint32_t sequence = 0;
  CollectiveCounts counts;
  std::thread thread;
};

namespace {

std::string seconds(std::chrono::milliseconds ms) { return fmt::format("{:g} s", ms.count() / 1000.0); }

struct Resolved {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  std::string addr;
  int port = 0;
};

Resolved resolve(const ProcessGroupOptions& options) {
  const std::optional<LaunchEnv> env = read_launch_env();
  Resolved r;
  if (options.rank >= 0 && options.world_size > 0) {
    r.rank = options.rank;
    r.size = options.world_size;
  } else if (env.has_value()) {
    r.rank = options.rank >= 0 ? options.rank : env->rank;
    r.size = options.world_size > 0 ? options.world_size : env->world_size;
    r.local_rank = env->local_rank;
  } else {
    // No launcher: the program runs alone, a job of one rank (so the same program runs
    // with and without kiln-run, mpirun or srun).
    KILN_CHECK(options.rank <= 0 && options.world_size <= 1,
               "init_process_group: world_size {} asked for without .rank, and no launcher set this process's "
               "rank (RANK and WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*): give both, or run under kiln-run",
               options.world_size);
    r.rank = 0;
    r.size = 1;
  }
  KILN_CHECK(r.rank >= 0 && r.rank < r.size, "init_process_group: rank {} is not in [0, world_size {})", r.rank,
             r.size);
  r.addr = !options.master_addr.empty() ? options.master_addr : env ? env->master_addr : "127.0.0.1";
  if (options.master_port >= 0) {
    r.port = options.master_port;
  } else if (env.has_value()) {
    r.port = env->master_port;
  } else {
    KILN_CHECK(r.size == 1, "init_process_group: {} ranks but no MASTER_PORT (set it, or .master_port)", r.size);
  }
  KILN_CHECK(r.port >= 0 && r.port <= 65535, "init_process_group: MASTER_PORT {} is not a port", r.port);
  KILN_CHECK(r.port > 0 || r.size == 1, "init_process_group: {} ranks need a MASTER_PORT above 0", r.size);
  return r;
}

#ifdef KILN_HAVE_GLOO
constexpr bool kHaveGloo = true;
#else
constexpr bool kHaveGloo = false;
#endif
#ifdef KILN_HAVE_NCCL
constexpr bool kHaveNccl = true;
#else
constexpr bool kHaveNccl = false;
#endif

struct BackendChoice {
  std::string name;
  bool cpu = false;   // Gloo for CPU tensors
  bool cuda = false;  // NCCL for CUDA tensors
};

BackendChoice choose_backend(const std::string& asked) {
  if (asked == "nccl") {
    const std::string why = nccl_unavailable_reason();
    KILN_CHECK(why.empty(), "init_process_group: backend nccl cannot run here: {} (backend gloo runs on CPU tensors)",
               why);
    return {"nccl", false, true};
  }
  if (asked == "gloo" || asked == "auto") {
    KILN_CHECK(kHaveGloo || (asked == "auto" && kHaveNccl),
               "init_process_group: backend {}: this kiln was built without Gloo (apt-get install libgloo-dev, "
               "then configure with -DKILN_GLOO=ON)",
               asked);
    if (asked == "gloo") return {"gloo", true, false};
    const bool nccl_runs = kHaveNccl && nccl_unavailable_reason().empty();
    return {!kHaveGloo ? "nccl" : nccl_runs ? "gloo+nccl" : "gloo", kHaveGloo, kHaveNccl};
  }
  fail("init_process_group: unknown backend '{}': expected gloo, nccl or auto", asked);
}

std::vector<std::string> rank_keys(const std::string& stage, int size) {
  std::vector<std::string> keys;
  for (int i = 0; i < size; ++i) keys.push_back(fmt::format("{}/{}", stage, i));
  return keys;
}

// Every rank sets stage/<rank> and waits for the others'; the error names who is missing.
void meet(TcpStore& store, const std::string& stage, const std::string& doing, int rank, int size,
          std::chrono::milliseconds timeout) {
  const std::vector<std::string> keys = rank_keys(stage, size);
  store.set(keys[static_cast<size_t>(rank)], std::string("1"));
  try {
    store.wait(keys, timeout);
  } catch (const Error& e) {
    std::vector<int> missing;
    try {
      const std::vector<bool> set = store.check(keys);
      for (int i = 0; i < size; ++i)
        if (!set[static_cast<size_t>(i)]) missing.push_back(i);
    } catch (const Error&) {
      fail("init_process_group: rank {} of {}: rank 0's store at {}:{} went away while waiting for the others "
           "to {} (rank 0 gave up waiting, or exited): {}",
           rank, size, store.host(), store.port(), doing, e.what());
    }
    if (missing.empty()) throw;
    fail("init_process_group: rank{} {} of {} did not {} within {} (this is rank {}; store at {}:{})",
         missing.size() > 1 ? "s" : "", fmt::join(missing, ", "), size, doing, seconds(timeout), rank,
         store.host(), store.port());
  }
}

// bf16 and f16 travel as f32 (rounded once at the end); everything else as it is.
bool reduced_in_f32(DType d) { return d == DType::bf16 || d == DType::f16; }

template <class T>
void widen(const void* in, float* out, size_t n) {
  const T* src = static_cast<const T*>(in);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(src[i]);
}
template <class T>
void narrow_to(const float* in, void* out, size_t n) {
  T* dst = static_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) dst[i] = T(in[i]);
}

template <class T>
void divide(void* data, size_t n, int by) {
  T* p = static_cast<T*>(data);
  const T d = static_cast<T>(by);
  for (size_t i = 0; i < n; ++i) p[i] /= d;
}

// Reduces `count` elements at `data` in place, whatever the dtype (bf16/f16 through f32).
void reduce_in_place(Backend& backend, void* data, size_t count, DType dtype, ReduceOp op, int size,
                     uint32_t tag) {
  const ReduceOp wire = op == ReduceOp::avg ? ReduceOp::sum : op;
  if (reduced_in_f32(dtype)) {
    std::vector<float> wide(count);
    if (dtype == DType::bf16) widen<BFloat16>(data, wide.data(), count);
    else widen<Half>(data, wide.data(), count);
    backend.all_reduce(wide.data(), count, DType::f32, wire, tag);
    if (op == ReduceOp::avg) divide<float>(wide.data(), count, size);
    if (dtype == DType::bf16) narrow_to<BFloat16>(wide.data(), data, count);
    else narrow_to<Half>(wide.data(), data, count);
    return;
  }
  backend.all_reduce(data, count, dtype, wire, tag);
  if (op == ReduceOp::avg) {
    if (dtype == DType::f32) divide<float>(data, count, size);
    else divide<double>(data, count, size);
  }
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

// The checks every collective makes of a tensor it reads or writes.
void check_tensor(const char* op, const char* role, const Tensor& t, bool reduces, ReduceOp reduce_op) {
  KILN_CHECK(t.defined(), "{}: the {} tensor is undefined", op, role);
  KILN_CHECK(t.is_contiguous(),
             "{}: {} {} (strides [{}]) is not contiguous; pass a contiguous tensor (t.contiguous(), then copy "
             "the result back)",
             op, role, t.meta_str(), fmt::join(t.strides(), ","));
  if (reduces) {
    const DType d = t.dtype();
    const bool ok = d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16 ||
                    ((d == DType::i32 || d == DType::i64) && reduce_op != ReduceOp::avg);
    KILN_CHECK(ok, "{}: cannot {} {} {} (f32, f64, bf16 and f16 reduce; i32 and i64 sum and max)", op,
               op_name(reduce_op), role, t.meta_str());
  }
}

std::string describe(const char* op, const Tensor& t, std::optional<ReduceOp> reduce_op = {}) {
  return reduce_op ? fmt::format("{}({}, {})", op, t.meta_str(), op_name(*reduce_op))
                   : fmt::format("{}({})", op, t.meta_str());
}

}  // namespace

// Gloo writes to its sockets with writev, which raises SIGPIPE when the peer is gone: a
// rank would die of its peer's death instead of reporting it. So a process with a group
// ignores SIGPIPE (as every Python program, PyTorch's included, does from the start);
// writes to a closed pipe or socket then fail with EPIPE. A handler the program installed
// stays.
static void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
}

ProcessGroup::ProcessGroup(const ProcessGroupOptions& options) : timeout_(options.timeout) {
  ignore_sigpipe();
  KILN_CHECK(options.timeout.count() > 0, "init_process_group: the timeout must be positive, got {} ms",
             options.timeout.count());
  const BackendChoice choice = choose_backend(options.backend);
  backend_name_ = choice.name;
  cuda_enabled_ = choice.cuda;
  nccl_device_ = options.device;
  const Resolved where = resolve(options);
  rank_ = where.rank;
  size_ = where.size;
  local_rank_ = where.local_rank;
  store_ = std::make_unique<TcpStore>(TcpStoreOptions{
      .host = where.addr, .port = where.port, .is_server = rank_ == 0, .timeout = timeout_});
  meet(*store_, "arrived", "arrive", rank_, size_, timeout_);
  if (choice.cpu) {
    try {
      backend_ = make_gloo_backend(*store_, "gloo", rank_, size_, timeout_);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail("init_process_group: rank {} of {} could not connect its Gloo transport: {}", rank_, size_, e.what());
    }
  }
  if (choice.name == "nccl") device_backend_ = make_nccl_backend(*store_, "nccl", rank_, size_, nccl_device(), timeout_);
  meet(*store_, "connected", "connect", rank_, size_, timeout_);
  queue_ = std::make_unique<Queue>();
  queue_->thread = std::thread([this] {
    Queue& q = *queue_;
    for (;;) {
      Queue::Task task;
      uint32_t tag = 0;
      std::string broken;
      {
        std::unique_lock lock(q.mutex);
        q.wake.wait(lock, [&q] { return q.stopping || !q.tasks.empty(); });
        if (q.tasks.empty()) return;
        task = std::move(q.tasks.front());
        q.tasks.pop_front();
        tag = q.sequence++;
        broken = q.broken;
      }
      std::string error;
      const auto started = std::chrono::steady_clock::now();
      if (!broken.empty()) {
        error = fmt::format("{} on rank {} of {}: the process group is broken since an earlier collective "
                            "failed: {}",
                            task.what, rank_, size_, broken);
      } else {
        try {
          task.run(*backend_, tag);
        } catch (const std::exception& e) {
          const std::string why = e.what();
          const int peer = backend_->peer_named_in(why);
          const bool timed_out = why.find("imed out") != std::string::npos;
          error = fmt::format("{} (collective #{}) on rank {} of {} failed{}{}: {}", task.what, tag, rank_, size_,
                              peer >= 0 ? fmt::format("; the connection to rank {} broke (did it exit?)", peer) : "",
                              timed_out ? fmt::format("; nothing came within the group's timeout of {} (a rank "
                                                      "stopped, or calls collectives in another order)",
                                                      seconds(timeout_))
                                        : "",
                              why);
          std::lock_guard lock(q.mutex);
          if (q.broken.empty()) q.broken = error;
        }
      }
      {
        std::lock_guard lock(task.state->mutex);
        task.state->done = true;
        task.state->error = error;
        task.state->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      }
      task.state->done_cv.notify_all();
    }
  });
}

ProcessGroup::~ProcessGroup() {
  if (queue_) {
    {
      std::lock_guard lock(queue_->mutex);
      queue_->stopping = true;
    }
    queue_->wake.notify_all();
    queue_->thread.join();
  }
  device_backend_.reset();
  backend_.reset();
  store_.reset();
}

Work ProcessGroup::enqueue(std::string what, std::function<void(Backend&, uint32_t)> run) {
  KILN_CHECK(backend_ != nullptr,
             "{}: a CPU tensor, but backend {} runs on CUDA tensors (move it with .to(Device::cuda()), or use "
             "backend gloo or auto for CPU tensors)",
             what, backend_name_);
  auto state = std::make_shared<Work::State>();
  {
    std::lock_guard lock(queue_->mutex);
    queue_->tasks.push_back({std::move(what), std::move(run), state});
  }
  queue_->wake.notify_one();
  return Work(state);
}

void ProcessGroup::count(int64_t CollectiveCounts::*kind) {
  std::lock_guard lock(queue_->mutex);
  ++(queue_->counts.*kind);
}

int ProcessGroup::nccl_device() const {
  return nccl_device_ >= 0 ? nccl_device_ : local_rank_ % std::max(cuda::device_count(), 1);
}

DeviceBackend& ProcessGroup::device_backend(const char* op, const Tensor& t) {
  KILN_CHECK(cuda_enabled_,
             "{}: {} is on {}; backend {} runs on CPU tensors (move it with .to(Device::cpu()), or use backend "
             "nccl or auto for CUDA tensors{})",
             op, t.meta_str(), t.device(), backend_name_, kHaveNccl ? "" : ", in a kiln built with NCCL");
  std::lock_guard lock(device_mutex_);
  if (device_backend_ == nullptr) {
    // "auto": every rank gets here at the same collective, the first on a CUDA tensor.
    const std::string why = nccl_unavailable_reason();
    KILN_CHECK(why.empty(), "{}: {} is on {}, but NCCL cannot run here: {}", op, t.meta_str(), t.device(), why);
    device_backend_ = make_nccl_backend(*store_, "nccl", rank_, size_, t.device().index, timeout_);
  }
  KILN_CHECK(t.device().index == device_backend_->device(),
             "{}: {} is on {}, but this rank's NCCL communicator is on cuda:{} (one device per rank)", op, t.meta_str(),
             t.device(), device_backend_->device());
  return *device_backend_;
}

namespace {
Work device_work(std::shared_ptr<DeviceWork> work) {
  auto state = std::make_shared<Work::State>();
  state->device = std::move(work);
  return Work(state);
}

// Every tensor of one collective on one device type; true for CUDA.
bool on_cuda(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.device() == b.device(), "{}: input {} is on {} and output {} on {}; both must be on one device", op,
             a.meta_str(), a.device(), b.meta_str(), b.device());
  return a.device().is_cuda();
}
}  // namespace

CollectiveCounts ProcessGroup::counts() const {
  std::lock_guard lock(queue_->mutex);
  return queue_->counts;
}

Work ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) {
  check_tensor("all_reduce", "the", t, true, op);
  if (t.device().is_cuda()) {
    DeviceBackend& nccl = device_backend("all_reduce", t);
    count(&CollectiveCounts::all_reduce);
    return device_work(nccl.all_reduce(t, op));
  }
  void* data = t.data_ptr();
  const size_t count = static_cast<size_t>(t.numel());
  const DType dtype = t.dtype();
  const int size = size_;
  {
    std::lock_guard lock(queue_->mutex);
    ++queue_->counts.all_reduce;
  }
  return enqueue(describe("all_reduce", t, op), [t, data, count, dtype, op, size](Backend& b, uint32_t tag) {
    if (count > 0) reduce_in_place(b, data, count, dtype, op, size, tag);
  });
}

Work ProcessGroup::broadcast(const Tensor& t, int root) {
  check_tensor("broadcast", "the", t, false, ReduceOp::sum);
  KILN_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group of {}", root, size_);
  if (t.device().is_cuda()) {
    DeviceBackend& nccl = device_backend("broadcast", t);
    count(&CollectiveCounts::broadcast);
    return device_work(nccl.broadcast(t, root));
  }
  void* data = t.data_ptr();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.itemsize();
  {
    std::lock_guard lock(queue_->mutex);
    ++queue_->counts.broadcast;
  }
  return enqueue(fmt::format("broadcast({}, root {})", t.meta_str(), root),
                 [t, data, bytes, root](Backend& b, uint32_t tag) {
                   if (bytes > 0) b.broadcast(data, bytes, root, tag);
                 });
}

Work ProcessGroup::all_gather(const Tensor& out, const Tensor& in) {
  check_tensor("all_gather", "input", in, false, ReduceOp::sum);
  check_tensor("all_gather", "output", out, false, ReduceOp::sum);
  KILN_CHECK(in.dim() >= 1 && out.dim() == in.dim() && out.dtype() == in.dtype() &&
                 out.size(0) == in.size(0) * size_ && out.numel() == in.numel() * size_,
             "all_gather: output {} must be input {} with dim 0 times the group's {} ranks, same dtype", out.meta_str(),
             in.meta_str(), size_);
  if (on_cuda("all_gather", in, out)) {
    DeviceBackend& nccl = device_backend("all_gather", in);
    count(&CollectiveCounts::all_gather);
    return device_work(nccl.all_gather(out, in));
  }
  const void* src = in.data_ptr();
  void* dst = out.data_ptr();
  const size_t bytes = static_cast<size_t>(in.numel()) * in.itemsize();
  {
    std::lock_guard lock(queue_->mutex);
    ++queue_->counts.all_gather;
  }
  return enqueue(fmt::format("all_gather({} -> {})", in.meta_str(), out.meta_str()),
                 [in, out, src, dst, bytes](Backend& b, uint32_t tag) {
                   if (bytes > 0) b.all_gather(src, dst, bytes, tag);
                 });
}

Work ProcessGroup::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  check_tensor("reduce_scatter", "input", in, true, op);
  check_tensor("reduce_scatter", "output", out, true, op);
  KILN_CHECK(out.dim() >= 1 && in.dim() == out.dim() && out.dtype() == in.dtype() &&
                 in.size(0) == out.size(0) * size_ && in.numel() == out.numel() * size_,
             "reduce_scatter: input {} must be output {} with dim 0 times the group's {} ranks, same dtype",
             in.meta_str(), out.meta_str(), size_);
  if (on_cuda("reduce_scatter", in, out)) {
    DeviceBackend& nccl = device_backend("reduce_scatter", in);
    count(&CollectiveCounts::reduce_scatter);
    return device_work(nccl.reduce_scatter(out, in, op));
  }
  const char* src = static_cast<const char*>(in.data_ptr());
  void* dst = out.data_ptr();
  const size_t count = static_cast<size_t>(in.numel());
  const size_t item = in.itemsize();
  const DType dtype = in.dtype();
  const int size = size_, rank = rank_;
  {
    std::lock_guard lock(queue_->mutex);
    ++queue_->counts.reduce_scatter;
  }
  return enqueue(describe("reduce_scatter", in, op), [in, out, src, dst, count, item, dtype, op, size, rank](
                                                          Backend& b, uint32_t tag) {
    if (count == 0) return;
    std::vector<char> scratch(src, src + count * item);
    reduce_in_place(b, scratch.data(), count, dtype, op, size, tag);
    const size_t slice = count / static_cast<size_t>(size) * item;
    std::memcpy(dst, scratch.data() + static_cast<size_t>(rank) * slice, slice);
  });
}

Work ProcessGroup::barrier() {
  if (backend_ == nullptr) {  // NCCL alone ("nccl", or "auto" in a build without Gloo)
    DeviceBackend* nccl = nullptr;
    {
      std::lock_guard lock(device_mutex_);
      if (device_backend_ == nullptr) {
        const std::string why = nccl_unavailable_reason();
        KILN_CHECK(why.empty(), "barrier: backend {} has no CPU transport, and NCCL cannot run here: {}",
                   backend_name_, why);
        device_backend_ = make_nccl_backend(*store_, "nccl", rank_, size_, nccl_device(), timeout_);
      }
      nccl = device_backend_.get();
    }
    count(&CollectiveCounts::barrier);
    return device_work(nccl->barrier());
  }
  {
    std::lock_guard lock(queue_->mutex);
    ++queue_->counts.barrier;
  }
  return enqueue("barrier", [](Backend& b, uint32_t tag) { b.barrier(tag); });
}

#ifndef KILN_HAVE_NCCL
std::string nccl_unavailable_reason() {
  return "this kiln was built without NCCL (configure it with a CUDA toolkit that has nccl.h, or NCCL_ROOT)";
}
std::string nccl_version() { return {}; }
std::unique_ptr<DeviceBackend> make_nccl_backend(TcpStore&, const std::string&, int, int, int,
                                                 std::chrono::milliseconds) {
  fail("init_process_group: backend nccl cannot run here: {}", nccl_unavailable_reason());
}
#endif

#ifndef KILN_HAVE_GLOO
std::unique_ptr<Backend> make_gloo_backend(TcpStore&, const std::string&, int, int, std::chrono::milliseconds) {
  fail("init_process_group: this kiln was built without Gloo (apt-get install libgloo-dev, then configure "
       "with -DKILN_GLOO=ON)");
}
#endif

// ---- the default group ----

namespace {
std::mutex g_default_mutex;
std::unique_ptr<ProcessGroup> g_default;
}  // namespace

ProcessGroup& init_process_group(const ProcessGroupOptions& options) {
  std::lock_guard lock(g_default_mutex);
  KILN_CHECK(g_default == nullptr,
             "init_process_group: already initialized (rank {} of {}); call destroy_process_group first",
             g_default ? g_default->rank() : 0, g_default ? g_default->size() : 0);
  g_default = std::make_unique<ProcessGroup>(options);
  return *g_default;
}

bool is_initialized() {
  std::lock_guard lock(g_default_mutex);
  return g_default != nullptr;
}

ProcessGroup& default_group() {
  std::lock_guard lock(g_default_mutex);
  KILN_CHECK(g_default != nullptr, "kiln::dist: no process group; call dist::init_process_group() first");
  return *g_default;
}

void destroy_process_group() {
  std::unique_ptr<ProcessGroup> group;
  {
    std::lock_guard lock(g_default_mutex);
    group = std::move(g_default);
  }
}

Work all_reduce(const Tensor& t, ReduceOp op) { return default_group().all_reduce(t, op); }
Work broadcast(const Tensor& t, int root) { return default_group().broadcast(t, root); }
Work all_gather(const Tensor& out, const Tensor& in) { return default_group().all_gather(out, in); }
Work reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  return default_group().reduce_scatter(out, in, op);
}
Work barrier() { return default_group().barrier(); }
int get_rank() { return default_group().rank(); }
int get_world_size() { return default_group().size(); }

}  // namespace kiln::dist
