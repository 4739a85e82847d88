#pragma once
// The tracer's machinery (compiler/trace.h), shared by trace() and the split runs
// (compiler/split.cpp); not part of kiln's API.
//
// Tensors are matched to graph values by the view they read (storage, offset, dtype, shape,
// strides) rather than by handle: two handles on the same view hold the same content, and
// autograd saves outputs as detach()ed handles (new TensorImpls over the same memory) that
// a backward formula must find as the forward value. Storage version counters tell a value
// that is still current from one overwritten since: every write the trace recorded is
// accounted for, so any other movement is a write the trace did not see.
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "compiler/trace.h"
#include "core/error.h"  // (split.cpp's KILN_CHECK comes through here)
#include "core/registry.h"

namespace kiln::compiler::tracing {

// The memory a tensor reads, independent of which handle reads it.
struct ViewKey {
  const StorageImpl* storage = nullptr;
  int64_t offset = 0;
  DType dtype = DType::f32;
  Shape shape;
  Shape strides;
  auto operator<=>(const ViewKey&) const = default;
  static ViewKey of(const Tensor& t) {
    return {t.storage().get(), t.offset(), t.dtype(), t.shape(), t.strides()};
  }
};

// What the trace knows of one view of a storage (whichever handle reads it).
struct Known {
  std::weak_ptr<StorageImpl> storage;  // detects a dead storage's address reused
  Value value;                         // its current graph value
  uint64_t version = 0;                // its storage's version when `value` was recorded
  Value input;                         // the graph input whose tensor this is, if any
};

// What the trace expects of one storage.
struct StorageState {
  std::weak_ptr<StorageImpl> storage;
  uint64_t expected = 0;  // the version at first sight plus the writes the trace recorded
  std::string what;       // for messages: a graph input's name, or which op made it
  bool written = false;   // a recorded call wrote it
  bool made = false;      // a recorded call made it (an op's output)
};

// An op output the trace recorded over a pending storage (a deferred call's, in a split
// run): the graph value of its whole view is what the storage must get.
struct PendingOutput {
  std::weak_ptr<StorageImpl> storage;
  ViewKey key;
};

class Tracer {
 public:
  Tracer(Trace& trace, const TraceOptions& options);

  // The tensor fn gets as argument `index`: graph input "arg<index>".
  void add_argument(const Tensor& t, size_t index);
  // A reported op call: recorded (a refusal throws, or with allow_break stops the trace).
  void on_call(const OpCall& call);

  // A host read (item()) inside fn: a guard on an unwritten graph input's value, or a
  // refusal (trace.h).
  void on_host_read(const Tensor& t, const char* reader);
  void record_host_read(const Tensor& t, const char* reader);

  // Records a graph break: nothing more is recorded, the function runs on eagerly.
  void stop(std::string op, std::string reason);

  // Which captured tensors were some leaf's .grad at first sight: read at replay from the
  // leaf's .grad then. Done at the end, as fn may read a .grad before the leaf itself.
  void find_gradients();

  // The grad effects: every leaf seen whose .grad is now another tensor than at first sight.
  void record_grad_effects();

  // The graph value of a result of the traced function.
  Value result_value(const Tensor& t, size_t index);

  // How many counters fn drew from the default generator (replay draws as many). Reseeding
  // it inside fn, or moving it back, cannot be replayed: refused.
  void finish_random();

  // Every storage the trace saw must have moved only by the writes it recorded.
  void check_versions() const;

  // Before fn replaces a .grad (set_grad): for a tensor not seen yet, what its .grad was
  // when fn was called (its first replacement's old value).
  void on_set_grad(const Tensor& t);

  // ---- for split runs (compiler/split.cpp), where recorded calls were deferred ----

  bool busy() const { return busy_; }
  // The tensor behind each graph input, in graph order.
  const std::vector<Tensor>& inputs() const { return inputs_; }
  // Whether the graph computes anything: an op node or a write-back.
  bool has_work() const;
  // Whether reading t on the host needs the deferred calls computed first: its memory is
  // pending, or a recorded call wrote it.
  bool reads_deferred(const Tensor& t);
  // A pending output still alive (something may read it later): its storage, the view the
  // op made over all of it, and the graph value that view holds now.
  struct LivePending {
    Storage storage;
    ViewKey key;
    Value value;
  };
  std::vector<LivePending> live_pending();
  // A refused call ran no kernel yet its versions moved: the run computes it eagerly, so
  // its writes are accounted for.
  void accept_writes(const OpCall& call);

 private:
  // Storages a call wrote (its in-place target, inputs it mutates): kernels may bump their
  // versions more than once (internal copy_ calls), so what they were before the call is
  // taken to be what the trace expected.
  using Written = std::set<const StorageImpl*>;

  static uint64_t version_of(const Tensor& t) { return t.storage()->version.load(); }
  void record(const OpCall& call);
  Attrs random_attrs(const OpCall& call);
  void record_outputs(const OpCall& call, const std::vector<Value>& outs);
  static bool updates_running_stats(const OpCall& call);
  void record_batch_norm_training(const OpCall& call);
  void record_update_in_place(const OpCall& call, const char* pure);
  Value input_of(const Tensor& t);
  static void refuse_mutation(const OpCall& call);
  void check_type(Value v, const Tensor& t, const std::string& op) const;
  Value value_of(const Tensor& t, const std::string& op, const Written& written);
  Value capture(const Tensor& t, uint64_t version);
  void note_input(const Tensor& t);
  Known* find(const Tensor& t);
  void remember(const Tensor& t, Value value, uint64_t version, Value input);
  const StorageState* storage_state(const Tensor& t);
  void track_storage(const Tensor& t, uint64_t version, std::string what, bool made = false);

  Trace& trace_;
  const TraceOptions& options_;
  // The default generator when the trace started, and its offset after the last random op.
  uint64_t random_seed_, random_start_, random_next_;
  bool busy_ = false;
  std::map<ViewKey, Known> known_;
  std::unordered_map<const StorageImpl*, StorageState> storages_;
  std::vector<const StorageImpl*> storage_order_;  // first sight order, for stable messages
  std::vector<Tensor> inputs_;       // the tensor behind each graph input
  std::vector<Tensor> grad_before_;  // per graph input: its .grad at first sight
  std::unordered_map<const TensorImpl*, int64_t> grad_owner_;  // a .grad -> its leaf's input
  std::vector<PendingOutput> pending_;  // outputs of deferred calls, in call order
  // Per tensor fn set a .grad on before the trace saw it: whether that .grad was defined
  // when fn was called. Keyed by address: held only while the call runs, when fn's leaves live.
  std::unordered_map<const TensorImpl*, bool> grad_at_call_;
};

class SplitRun;  // compiler/split.cpp

// Records what follows a break in a traced call (TraceOptions::record_after_break), piece
// by piece, as a split run would split it, without deferring: fn runs eagerly.
class RestRecorder {
 public:
  RestRecorder(const std::vector<Tensor>& args, const TraceOptions& options, std::vector<SplitPiece>& pieces);
  ~RestRecorder();
  RestRecorder(const RestRecorder&) = delete;
  RestRecorder& operator=(const RestRecorder&) = delete;
  void on_call(const OpCall& call);
  void on_host_read(const Tensor& t, const char* reader);
  void finish();  // fn returned

 private:
  std::unique_ptr<SplitRun> run_;
};

}  // namespace kiln::compiler::tracing
