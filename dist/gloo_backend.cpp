// The Gloo backend (built only when Gloo is found; dist/backend.h): the rendezvous goes
// through kiln's TcpStore, the collectives are Gloo's, over its TCP transport.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <fmt/format.h>

#include <sstream>
#include <vector>

#include "core/error.h"
#include "dist/backend.h"
#include "dist/tcp_store.h"

namespace kiln::dist {
namespace {

// Gloo's view of the store. Gloo calls wait(keys) and wait(keys, timeout) before get.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(TcpStore& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return store_.get(key); }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  TcpStore& store_;
};

template <class T>
gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  if (op == ReduceOp::max) return [](void* c, const void* a, const void* b, size_t n) { gloo::max<T>(c, a, b, n); };
  return [](void* c, const void* a, const void* b, size_t n) { gloo::sum<T>(c, a, b, n); };
}

class GlooBackend final : public Backend {
 public:
  GlooBackend(TcpStore& store, const std::string& prefix, int rank, int size, std::chrono::milliseconds timeout) {
    gloo::transport::tcp::attr attr;
    // The address this rank reaches rank 0's store from: reachable by the others too.
    attr.hostname = store.local_address();
    device_ = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    GlooStore adapter(store);
    gloo::rendezvous::PrefixStore prefixed(prefix, adapter);
    context->connectFullMesh(prefixed, device_);
    context_ = context;
    // Gloo's messages name a peer by its end's address ("[127.0.0.1]:40123"): each rank
    // publishes the address of its end towards every other rank, so a failure can name
    // the rank behind it.
    std::string mine;
    for (int j = 0; j < size; ++j) mine += (j == rank ? std::string() : context_->getPair(j)->address().str()) + "\n";
    store.set(fmt::format("{}/ends/{}", prefix, rank), mine);
    peers_.resize(static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      std::istringstream theirs(store.get_string(fmt::format("{}/ends/{}", prefix, i)));
      std::string line;
      for (int j = 0; j <= rank && std::getline(theirs, line); ++j)
        if (j == rank) peers_[static_cast<size_t>(i)] = line;
    }
  }

  ~GlooBackend() override {
    context_.reset();
    device_.reset();
  }

  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op, uint32_t tag) override {
    gloo::AllreduceOptions opts(context_);
    opts.setTag(tag);
    switch (dtype) {
      case DType::f32: set(opts, static_cast<float*>(data), count, reduce_function<float>(op)); break;
      case DType::f64: set(opts, static_cast<double*>(data), count, reduce_function<double>(op)); break;
      case DType::i64: set(opts, static_cast<int64_t*>(data), count, reduce_function<int64_t>(op)); break;
      case DType::i32: set(opts, static_cast<int32_t*>(data), count, reduce_function<int32_t>(op)); break;
      default: fail("all_reduce: the Gloo backend reduces f32, f64, i32 and i64, not {}", dtype);
    }
    gloo::allreduce(opts);
  }

  void broadcast(void* data, size_t bytes, int root, uint32_t tag) override {
    gloo::BroadcastOptions opts(context_);
    opts.setTag(tag);
    opts.setRoot(root);
    opts.setOutput(static_cast<char*>(data), bytes);
    gloo::broadcast(opts);
  }

  void all_gather(const void* in, void* out, size_t bytes, uint32_t tag) override {
    gloo::AllgatherOptions opts(context_);
    opts.setTag(tag);
    opts.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes);
    opts.setOutput(static_cast<char*>(out), bytes * static_cast<size_t>(context_->size));
    gloo::allgather(opts);
  }

  void barrier(uint32_t tag) override {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    gloo::barrier(opts);
  }

  int peer_named_in(const std::string& message) const override {
    for (size_t i = 0; i < peers_.size(); ++i)
      if (!peers_[i].empty() && message.find(peers_[i]) != std::string::npos) return static_cast<int>(i);
    return -1;
  }

 private:
  template <class T>
  static void set(gloo::AllreduceOptions& opts, T* data, size_t count, gloo::AllreduceOptions::Func fn) {
    opts.setOutput(data, count);
    opts.setReduceFunction(std::move(fn));
  }

  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::vector<std::string> peers_;  // each rank's address as Gloo's messages print it
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(TcpStore& store, const std::string& prefix, int rank, int size,
                                           std::chrono::milliseconds timeout) {
  return std::make_unique<GlooBackend>(store, prefix, rank, size, timeout);
}

}  // namespace kiln::dist
