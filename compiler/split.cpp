// Split runs (compiler/trace.h): a function run with its op calls deferred, recorded into
// pieces, each piece computed when the function needs one of its values on the host, calls
// an op the tracer refuses, or returns.
#include <fmt/format.h>

#include "compiler/trace.h"
#include "compiler/trace_recorder.h"
#include "core/grad_mode.h"
#include "core/registry.h"

namespace kiln::compiler {
namespace {

// Sets a flag for a scope.
class FlagScope {
 public:
  explicit FlagScope(bool& flag) : flag_(flag) { flag_ = true; }
  ~FlagScope() { flag_ = false; }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;

 private:
  bool& flag_;
};

}  // namespace

namespace tracing {

class SplitRun;
// The innermost split run of this thread. A compiled function with a break called inside
// another's split run (its fn) runs split inside it, with the thread's hooks its own: a
// pending value of the enclosing run (an argument passed in) is computed by that run.
static thread_local SplitRun* t_innermost = nullptr;

// Without a runner, a record-only run (RestRecorder): nothing is deferred, a piece is only
// recorded (its graph printed), and a refused call has already run.
class SplitRun {
 public:
  SplitRun(const std::vector<Tensor>& args, const TraceOptions& options, const PieceRunner* run_piece,
           std::vector<SplitPiece>& pieces)
      : args_(args), options_(options), run_piece_(run_piece), pieces_(pieces),
        outer_(run_piece ? t_innermost : nullptr) {
    options_.allow_break = false;  // a refusal reaches on_call, which splits there
    options_.record_after_break = false;
    start();
    if (run_piece_) t_innermost = this;
  }
  ~SplitRun() {
    if (run_piece_) t_innermost = outer_;
  }
  SplitRun(const SplitRun&) = delete;
  SplitRun& operator=(const SplitRun&) = delete;

  // Calls are deferred except while a piece runs (its eager steps and copies compute) or
  // while the tracer itself is busy.
  bool defers() const { return run_piece_ && !computing_ && !tracer_->busy(); }

  void on_call(const OpCall& call) {
    if (computing_ || tracer_->busy()) return;
    try {
      tracer_->on_call(call);
    } catch (const Error& e) {
      refused(call, e.what());
    }
  }

  void on_host_read(const Tensor& t, const char* reader) {
    if (computing_ || tracer_->busy() || t.is_wrapped_number()) return;
    if (run_piece_) {
      if (tracer_->reads_deferred(t)) end_piece(reader, "");
      return;
    }
    // Recording only: the values are there; a read the tracer refuses (of a computed
    // value) is a break, as it was in the trace.
    try {
      tracer_->on_host_read(t, reader);
    } catch (const Error& e) {
      end_piece(reader, e.what());
    }
  }

  // data_ptr() of a pending storage: the piece that makes it runs now; a value still
  // pending then is an enclosing run's, which computes it (with this run's calls not
  // deferred meanwhile: they are that run's piece).
  void on_pending_read(StorageImpl& storage) {
    if (!computing_ && !tracer_->busy()) end_piece("data_ptr", "");
    if (!is_pending(storage)) return;
    KILN_CHECK(outer_ != nullptr,
               "split run: a value still pending was read while a piece ran (a deferred call's output that "
               "the piece does not make)");
    if (computing_) return outer_->on_pending_read(storage);
    FlagScope computing(computing_);
    outer_->on_pending_read(storage);
  }

  // Runs the recorded piece, if it computes anything, and starts the next.
  void end_piece(const std::string& end, const std::string& reason) {
    if (!tracer_->has_work()) {
      if (!reason.empty()) pieces_.push_back({0, 0, end, reason, ""});
      return;
    }
    if (!run_piece_) {
      const Graph& graph = trace_->graph;
      pieces_.push_back({op_count(graph), graph.structural_hash(), end, reason, print(graph)});
      start();
      return;
    }
    FlagScope computing(computing_);
    tracer_->check_versions();
    // No finish_random(): the piece's random ops hold the counters they drew (the piece's
    // random input is this call's seed and first offset), so draws or a reseed between them
    // and the read change nothing that runs.
    std::vector<tracing::Tracer::LivePending> live = tracer_->live_pending();
    std::vector<Value> outputs;
    for (const auto& p : live) outputs.push_back(p.value);
    Graph& graph = trace_->graph;
    graph.set_outputs(std::move(outputs));
    const std::vector<Tensor> inputs = tracer_->inputs();
    // The deferred calls moved the versions of what they write already; the piece's writes
    // are those calls, not new ones (autograd compares versions of saved tensors).
    std::vector<std::pair<Storage, uint64_t>> versions;
    for (const Tensor& t : inputs) versions.emplace_back(t.storage(), t.storage()->version.load());
    std::vector<Tensor> results;
    {
      NoGradGuard no_grad;
      results = (*run_piece_)(graph, inputs);
    }
    KILN_CHECK(results.size() == live.size(), "split run: a piece made {} values for {} pending tensors",
               results.size(), live.size());
    for (size_t i = 0; i < live.size(); ++i) fill(live[i], std::move(results[i]));
    for (const auto& [storage, version] : versions) storage->version.store(version);
    pieces_.push_back({op_count(graph), graph.structural_hash(), end, reason, ""});
    start();
  }

 private:
  static int64_t op_count(const Graph& graph) {
    int64_t ops = 0;
    for (const Node& n : graph.nodes()) ops += n.kind == NodeKind::op;
    return ops;
  }

  void start() {
    trace_ = std::make_unique<Trace>();
    trace_->num_args = static_cast<int64_t>(args_.size());
    tracer_ = std::make_unique<tracing::Tracer>(*trace_, options_);
    for (size_t i = 0; i < args_.size(); ++i) tracer_->add_argument(args_[i], i);
  }

  // The tracer refused the call, which ran no kernel: the piece before it runs (computing
  // the call's inputs), then the call itself, eagerly.
  void refused(const OpCall& call, const std::string& reason) {
    tracer_->accept_writes(call);
    end_piece(call.op.name, reason);
    if (!run_piece_) return;  // recording only: the call ran
    FlagScope computing(computing_);
    run_deferred(call);
  }

  // Gives a pending storage its value: the result's memory when the result is a fresh
  // buffer laid out as the pending view, else a copy.
  static void fill(const tracing::Tracer::LivePending& p, Tensor result) {
    StorageImpl& storage = *p.storage;
    const tracing::ViewKey& key = p.key;
    const bool same_view = result.offset() == key.offset && result.shape() == key.shape &&
                           result.strides() == key.strides && result.dtype() == key.dtype;
    if (same_view && result.impl_ptr().use_count() == 1 && result.storage().use_count() == 1 &&
        !is_pending(*result.storage()) && result.storage()->nbytes == storage.nbytes &&
        result.device() == storage.device) {
      take_memory(storage, *result.storage());
      return;
    }
    take_memory(storage, *allocate_storage(storage.nbytes, storage.device));
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = p.storage;
    impl->shape = key.shape;
    impl->strides = key.strides;
    impl->offset = key.offset;
    impl->dtype = key.dtype;
    impl->device = storage.device;
    const uint64_t version = storage.version.load();
    NoGradGuard no_grad;
    Tensor(std::move(impl)).copy_(result);
    storage.version.store(version);  // the value it was always to have, not a new write
  }

  const std::vector<Tensor>& args_;
  TraceOptions options_;
  const PieceRunner* run_piece_;  // null: record only
  std::vector<SplitPiece>& pieces_;
  std::unique_ptr<Trace> trace_;
  std::unique_ptr<tracing::Tracer> tracer_;
  bool computing_ = false;
  SplitRun* outer_;  // the enclosing split run, if any
};

RestRecorder::RestRecorder(const std::vector<Tensor>& args, const TraceOptions& options,
                           std::vector<SplitPiece>& pieces)
    : run_(std::make_unique<SplitRun>(args, options, nullptr, pieces)) {}
RestRecorder::~RestRecorder() = default;
void RestRecorder::on_call(const OpCall& call) { run_->on_call(call); }
void RestRecorder::on_host_read(const Tensor& t, const char* reader) { run_->on_host_read(t, reader); }
void RestRecorder::finish() { run_->end_piece("return", ""); }

}  // namespace tracing

std::vector<Tensor> run_split(const TracedFunction& fn, const std::vector<Tensor>& args, const TraceOptions& options,
                              const PieceRunner& run_piece, std::vector<SplitPiece>* pieces) {
  std::vector<SplitPiece> local;
  tracing::SplitRun run(args, options, &run_piece, pieces ? *pieces : local);
  std::vector<Tensor> results;
  {
    DeferHookGuard defer([&run](const OpDef&) { return run.defers(); });
    OpHookGuard hook([&run](const OpCall& call) { run.on_call(call); });
    HostReadHookGuard host_reads([&run](const Tensor& t, const char* reader, bool) { run.on_host_read(t, reader); });
    PendingHookGuard pending([&run](StorageImpl& storage) { run.on_pending_read(storage); });
    try {
      results = fn(args);
    } catch (...) {
      // What fn did before it threw happened, as in eager code: parameters it updated,
      // values it keeps. The original error wins over one from computing them.
      try {
        run.end_piece("exception", "");
      } catch (...) {
      }
      throw;
    }
    run.end_piece("return", "");
  }
  return results;
}

}  // namespace kiln::compiler
