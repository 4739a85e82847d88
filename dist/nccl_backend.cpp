// The NCCL backend (built only where nccl.h is found; dist/backend.h): collectives on CUDA
// tensors, queued on the group's own stream after the device's current (kiln) stream. NCCL's
// unique id passes through kiln's TcpStore. libnccl.so.2 is loaded at first use (dlopen), so
// libkiln loads on machines without NCCL and the group says what is missing there.
//
// Bounded waits: the communicator runs non-blocking (ncclConfig_t.blocking = 0), so neither
// its creation nor a collective's enqueue can hang the calling thread; Work::wait polls the
// collective's end event and ncclCommGetAsyncError, and past the group's timeout (or on an
// error NCCL reports) aborts the communicator (ncclCommAbort, which also ends the kernels
// that wait for a dead peer) and throws a kiln::Error naming the collective and the rank.
#include <dlfcn.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda.h"
#include "core/error.h"
#include "core/ops/factory.h"
#include "dist/backend.h"
#include "dist/tcp_store.h"
#include "kernels/cuda/runtime.h"

namespace kiln::dist {
namespace {

// The NCCL functions kiln calls, resolved from libnccl.so.2.
struct NcclApi {
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommFinalize) CommFinalize = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  std::string error;  // why it could not be loaded; empty when it was
};

template <class F>
void resolve(void* lib, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(::dlsym(lib, name));
  if (f == nullptr && error.empty()) error = fmt::format("libnccl has no symbol {}", name);
}

const NcclApi& api() {
  static const NcclApi loaded = [] {
    NcclApi a;
    void* lib = nullptr;
    std::string tried;
    std::vector<std::string> names = {"libnccl.so.2", "libnccl.so"};
#ifdef KILN_NCCL_LIBRARY_PATH
    names.push_back(
        KILN_NCCL_LIBRARY_PATH);  // where the build found it, when not on the loader's path
#endif
    for (const std::string& name : names) {
      lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      const char* why = ::dlerror();
      tried += fmt::format("{}{}", tried.empty() ? "" : "; ", why ? why : name.c_str());
    }
    if (lib == nullptr) {
      a.error = fmt::format(
          "libnccl.so.2 could not be loaded ({}); install NCCL (the CUDA toolkit's, or "
          "Debian's libnccl2) or add its folder to LD_LIBRARY_PATH",
          tried);
      return a;
    }
    resolve(lib, "ncclGetVersion", a.GetVersion, a.error);
    resolve(lib, "ncclGetUniqueId", a.GetUniqueId, a.error);
    resolve(lib, "ncclCommInitRankConfig", a.CommInitRankConfig, a.error);
    resolve(lib, "ncclCommGetAsyncError", a.CommGetAsyncError, a.error);
    resolve(lib, "ncclCommAbort", a.CommAbort, a.error);
    resolve(lib, "ncclCommFinalize", a.CommFinalize, a.error);
    resolve(lib, "ncclCommDestroy", a.CommDestroy, a.error);
    resolve(lib, "ncclGetErrorString", a.GetErrorString, a.error);
    resolve(lib, "ncclGetLastError", a.GetLastError, a.error);
    resolve(lib, "ncclAllReduce", a.AllReduce, a.error);
    resolve(lib, "ncclBroadcast", a.Broadcast, a.error);
    resolve(lib, "ncclAllGather", a.AllGather, a.error);
    resolve(lib, "ncclReduceScatter", a.ReduceScatter, a.error);
    return a;
  }();
  return loaded;
}

std::string in_seconds(std::chrono::milliseconds ms) {
  return fmt::format("{:g} s", ms.count() / 1000.0);
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
    default:
      fail("NCCL: no reduction of dtype {}", d);
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
  }
  return ncclSum;
}

// One rank's communicator, shared by the backend and its collectives' handles.
struct Comm {
  ncclComm_t comm = nullptr;
  int device = 0;
  int rank = 0, size = 1;
  cudaStream_t stream = nullptr;  // the group's own stream
  std::chrono::milliseconds timeout{};
  std::mutex mutex;
  std::string broken;  // the first failure; the communicator is aborted then
  bool aborted = false;

  std::string who() const {
    return fmt::format("rank {} of {} (NCCL on cuda:{})", rank, size, device);
  }

  // Aborts (once) and remembers why; the caller throws.
  void abort(const std::string& why) {
    std::lock_guard lock(mutex);
    if (broken.empty()) broken = why;
    if (!aborted && comm != nullptr) {
      aborted = true;
      api().CommAbort(comm);
    }
  }

  void throw_if_broken(const std::string& what) {
    std::lock_guard lock(mutex);
    if (!broken.empty())
      fail("{} on {}: the process group is broken since an earlier collective failed: {}", what,
           who(), broken);
  }

  std::string last_error(ncclResult_t r) const {
    const char* detail = comm != nullptr ? api().GetLastError(comm) : nullptr;
    return fmt::format("{}{}{}", api().GetErrorString(r), detail && *detail ? ": " : "",
                       detail ? detail : "");
  }

  // Waits until the communicator's last call is no longer in progress (non-blocking mode),
  // at most until `deadline`; aborts and throws on an error or at the deadline.
  void settle(const std::string& what, std::chrono::steady_clock::time_point deadline) {
    for (auto pause = std::chrono::microseconds(20);;
         pause = std::min(pause * 2, std::chrono::microseconds(2000))) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = api().CommGetAsyncError(comm, &state);
      if (r != ncclSuccess) state = r;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        const std::string why =
            fmt::format("{} on {} failed: NCCL: {}", what, who(), last_error(state));
        abort(why);
        fail("{}", why);
      }
      if (std::chrono::steady_clock::now() > deadline) {
        const std::string why = fmt::format(
            "{} on {}: NCCL did not finish within the group's timeout of {} (a rank "
            "stopped, died or calls collectives in another order)",
            what, who(), in_seconds(timeout));
        abort(why);
        fail("{}", why);
      }
      std::this_thread::sleep_for(pause);
    }
  }
};

class NcclWork final : public DeviceWork {
 public:
  NcclWork(std::shared_ptr<Comm> comm, std::string what, std::vector<Tensor> keep)
      : comm_(std::move(comm)), what_(std::move(what)), keep_(std::move(keep)) {
    cuda::DeviceGuard guard(comm_->device);
    KILN_CUDA_CHECK(cudaEventCreate(&start_), "NCCL collective: cudaEventCreate");
    KILN_CUDA_CHECK(cudaEventCreate(&end_), "NCCL collective: cudaEventCreate");
  }
  ~NcclWork() override {
    try {
      cuda::DeviceGuard guard(comm_->device);
      cudaEventDestroy(start_);
      cudaEventDestroy(end_);
    } catch (const std::exception&) {  // a destructor must not throw; the events leak then
    }
  }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t end() const { return end_; }
  const std::string& what() const { return what_; }

  bool query() override {
    std::lock_guard lock(mutex_);
    if (done_) return true;
    cuda::DeviceGuard guard(comm_->device);
    const cudaError_t e = cudaEventQuery(end_);
    if (e == cudaSuccess) {
      finish();
      return true;
    }
    if (e != cudaErrorNotReady) cuda::check(e, what_.c_str());
    comm_->throw_if_broken(what_);
    ncclResult_t state = ncclSuccess;
    api().CommGetAsyncError(comm_->comm, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      const std::string why =
          fmt::format("{} on {} failed: NCCL: {}", what_, comm_->who(), comm_->last_error(state));
      comm_->abort(why);
      fail("{}", why);
    }
    return false;
  }

  void wait() override {
    const auto deadline = std::chrono::steady_clock::now() + comm_->timeout;
    for (auto pause = std::chrono::microseconds(10); !query();
         pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
      if (std::chrono::steady_clock::now() > deadline) {
        const std::string why = fmt::format(
            "{} on {} did not complete within the group's timeout of {} (a rank "
            "stopped, died or calls collectives in another order); NCCL's "
            "communicator is aborted",
            what_, comm_->who(), in_seconds(comm_->timeout));
        comm_->abort(why);
        fail("{}", why);
      }
      std::this_thread::sleep_for(pause);
    }
    // Later work on the caller's stream comes after the collective (it has run already; this
    // keeps the order explicit should wait ever stop blocking the host).
    cuda::DeviceGuard guard(comm_->device);
    KILN_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream_of(comm_->device), end_, 0),
                    "NCCL collective: wait");
  }

  double seconds() override {
    std::lock_guard lock(mutex_);
    return done_ ? seconds_ : 0;
  }

 private:
  void finish() {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, start_, end_) == cudaSuccess) seconds_ = ms / 1000.0;
    done_ = true;
    keep_.clear();
  }

  std::shared_ptr<Comm> comm_;
  std::string what_;
  std::vector<Tensor> keep_;  // the tensors the device reads and writes, alive until it ran
  cudaEvent_t start_ = nullptr, end_ = nullptr;
  std::mutex mutex_;  // query runs on the issuing thread (reap) and on waiters
  bool done_ = false;
  double seconds_ = 0;
};

class NcclBackend final : public DeviceBackend {
 public:
  NcclBackend(TcpStore& store, const std::string& prefix, int rank, int size, int device,
              std::chrono::milliseconds timeout)
      : comm_(std::make_shared<Comm>()) {
    const NcclApi& nccl = api();
    comm_->device = device;
    comm_->rank = rank;
    comm_->size = size;
    comm_->timeout = timeout;
    cuda::DeviceGuard guard(device);
    // NCCL's unique id: made by rank 0, passed to the others through the store.
    ncclUniqueId id;
    const std::string key = prefix + "/unique_id";
    if (rank == 0) {
      const ncclResult_t r = nccl.GetUniqueId(&id);
      KILN_CHECK(r == ncclSuccess, "init_process_group: rank 0: ncclGetUniqueId failed: {}",
                 nccl.GetErrorString(r));
      std::vector<char> bytes(sizeof(id.internal));
      std::memcpy(bytes.data(), id.internal, bytes.size());
      store.set(key, bytes);
    } else {
      const std::vector<char> bytes = store.get(key);
      KILN_CHECK(bytes.size() == sizeof(id.internal),
                 "init_process_group: rank {}: NCCL's unique id from the store "
                 "has {} bytes, expected {}",
                 rank, bytes.size(), sizeof(id.internal));
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    comm_->stream = static_cast<cudaStream_t>(cuda::new_stream(device).handle);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once: waits are kiln's, and bounded
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const ncclResult_t r = nccl.CommInitRankConfig(&comm_->comm, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string why = comm_->last_error(r);
      if (comm_->comm != nullptr) nccl.CommAbort(comm_->comm);
      comm_->comm = nullptr;
      fail("init_process_group: {}: ncclCommInitRankConfig failed: {}", comm_->who(), why);
    }
    comm_->settle("init_process_group (connecting NCCL's communicator)", deadline);
  }

  ~NcclBackend() override {
    if (comm_->comm == nullptr) return;
    std::lock_guard lock(comm_->mutex);
    if (comm_->aborted) return;
    // Finalize flushes what is queued; a rank that left makes it wait, so it is bounded too.
    try {
      cuda::DeviceGuard guard(comm_->device);
      const auto deadline = std::chrono::steady_clock::now() + comm_->timeout;
      const ncclResult_t r = api().CommFinalize(comm_->comm);
      bool clean = r == ncclSuccess || r == ncclInProgress;
      for (auto state = ncclInProgress; clean && state == ncclInProgress;) {
        api().CommGetAsyncError(comm_->comm, &state);
        if (state != ncclSuccess && state != ncclInProgress) clean = false;
        if (state == ncclInProgress && std::chrono::steady_clock::now() > deadline) clean = false;
        if (state == ncclInProgress && clean)
          std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (clean)
        api().CommDestroy(comm_->comm);
      else
        api().CommAbort(comm_->comm);
    } catch (const std::exception&) {
      api().CommAbort(comm_->comm);
    }
    comm_->aborted = true;
  }

  int device() const override { return comm_->device; }

  std::shared_ptr<DeviceWork> all_reduce(const Tensor& t, ReduceOp op) override {
    void* data = t.data_ptr();
    const size_t count = static_cast<size_t>(t.numel());
    const ncclDataType_t type = nccl_type(t.dtype());
    return run(fmt::format("all_reduce({}, NCCL)", t.meta_str()), {t},
               [&](ncclComm_t c, cudaStream_t s) {
                 return api().AllReduce(data, data, count, type, nccl_op(op), c, s);
               });
  }

  std::shared_ptr<DeviceWork> broadcast(const Tensor& t, int root) override {
    void* data = t.data_ptr();
    const size_t bytes = static_cast<size_t>(t.numel()) * t.itemsize();
    return run(fmt::format("broadcast({}, root {}, NCCL)", t.meta_str(), root), {t},
               [&](ncclComm_t c, cudaStream_t s) {
                 return api().Broadcast(data, data, bytes, ncclUint8, root, c, s);
               });
  }

  std::shared_ptr<DeviceWork> all_gather(const Tensor& out, const Tensor& in) override {
    const void* src = in.data_ptr();
    void* dst = out.data_ptr();
    const size_t bytes = static_cast<size_t>(in.numel()) * in.itemsize();
    return run(fmt::format("all_gather({} -> {}, NCCL)", in.meta_str(), out.meta_str()), {in, out},
               [&](ncclComm_t c, cudaStream_t s) {
                 return api().AllGather(src, dst, bytes, ncclUint8, c, s);
               });
  }

  std::shared_ptr<DeviceWork> reduce_scatter(const Tensor& out, const Tensor& in,
                                             ReduceOp op) override {
    const void* src = in.data_ptr();
    void* dst = out.data_ptr();
    const size_t count = static_cast<size_t>(out.numel());
    const ncclDataType_t type = nccl_type(in.dtype());
    return run(fmt::format("reduce_scatter({} -> {}, NCCL)", in.meta_str(), out.meta_str()),
               {in, out}, [&](ncclComm_t c, cudaStream_t s) {
                 return api().ReduceScatter(src, dst, count, type, nccl_op(op), c, s);
               });
  }

  std::shared_ptr<DeviceWork> barrier() override {
    // An all-reduce of one number; wait() makes it a barrier of the host threads.
    const Tensor one = zeros({1}, {.dtype = DType::f32, .device = Device::cuda(comm_->device)});
    void* data = one.data_ptr();
    return run("barrier(NCCL)", {one}, [&](ncclComm_t c, cudaStream_t s) {
      return api().AllReduce(data, data, 1, ncclFloat32, ncclSum, c, s);
    });
  }

 private:
  template <class Call>
  std::shared_ptr<DeviceWork> run(const std::string& what, std::vector<Tensor> keep, Call&& call) {
    std::lock_guard lock(run_mutex_);  // one enqueue at a time (hooks may call from autograd's threads)
    comm_->throw_if_broken(what);
    cuda::DeviceGuard guard(comm_->device);
    reap();
    auto work = std::make_shared<NcclWork>(comm_, what, std::move(keep));
    // After what the device's current stream holds now (the ops that wrote the tensors).
    cudaEvent_t ready = nullptr;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming),
                    "NCCL collective: cudaEventCreate");
    cudaEventRecord(ready, cuda::stream_of(comm_->device));
    const cudaError_t waited = cudaStreamWaitEvent(comm_->stream, ready, 0);
    cudaEventDestroy(ready);
    cuda::check(waited, "NCCL collective: cudaStreamWaitEvent");
    KILN_CUDA_CHECK(cudaEventRecord(work->start(), comm_->stream),
                    "NCCL collective: cudaEventRecord");
    const ncclResult_t r = call(comm_->comm, comm_->stream);
    if (r == ncclInProgress) {
      comm_->settle(what, std::chrono::steady_clock::now() + comm_->timeout);
    } else if (r != ncclSuccess) {
      const std::string why =
          fmt::format("{} on {} failed: NCCL: {}", what, comm_->who(), comm_->last_error(r));
      comm_->abort(why);
      fail("{}", why);
    }
    KILN_CUDA_CHECK(cudaEventRecord(work->end(), comm_->stream),
                    "NCCL collective: cudaEventRecord");
    pending_.push_back(work);
    return work;
  }

  // Forgets the collectives the device has run. Until then the backend keeps each one (and
  // its tensors) alive, so that a Work dropped unwaited cannot free memory NCCL still uses.
  void reap() {
    while (!pending_.empty()) {
      bool done = false;
      try {
        done = pending_.front()->query();
      } catch (const Error&) {
        done = true;  // its own wait reports the failure
      }
      if (!done) break;
      pending_.pop_front();
    }
  }

  std::shared_ptr<Comm> comm_;
  std::mutex run_mutex_;
  std::deque<std::shared_ptr<NcclWork>> pending_;
};

}  // namespace

std::string nccl_unavailable_reason() {
  const NcclApi& nccl = api();
  if (!nccl.error.empty()) return nccl.error;
  if (!cuda::is_available()) return fmt::format("no CUDA GPU: {}", cuda::unavailable_reason());
  return {};
}

std::string nccl_version() {
  const NcclApi& nccl = api();
  if (!nccl.error.empty()) return {};
  int v = 0;
  if (nccl.GetVersion(&v) != ncclSuccess) return {};
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9.
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

std::unique_ptr<DeviceBackend> make_nccl_backend(TcpStore& store, const std::string& prefix,
                                                 int rank, int size, int device,
                                                 std::chrono::milliseconds timeout) {
  const std::string why = nccl_unavailable_reason();
  KILN_CHECK(why.empty(), "init_process_group: backend nccl cannot run here: {}", why);
  KILN_CHECK(
      device >= 0 && device < cuda::device_count(),
      "init_process_group: rank {}: NCCL device cuda:{} does not exist ({} CUDA devices visible)",
      rank, device, cuda::device_count());
  return std::make_unique<NcclBackend>(store, prefix, rank, size, device, timeout);
}

}  // namespace kiln::dist
