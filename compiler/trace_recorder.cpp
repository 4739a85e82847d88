// The tracer's machinery (compiler/trace_recorder.h): each reported op call, host read and .grad
// change of a traced call, turned into graph nodes, inputs, write-backs and guards.
#include "compiler/trace_recorder.h"

#include <algorithm>
#include <optional>
#include <string>

#include "compiler/run_graph.h"
#include "core/error.h"
#include "core/generator.h"

namespace kiln::compiler::tracing {

Tracer::Tracer(Trace& trace, const TraceOptions& options)
    : trace_(trace),
      options_(options),
      random_seed_(default_generator().seed()),
      random_start_(default_generator().offset()),
      random_next_(random_start_) {}

void Tracer::add_argument(const Tensor& t, size_t index) {
  KILN_CHECK(t.defined(), "trace: argument {} is undefined", index);
  const std::string name = "arg" + std::to_string(index);
  const Value v = trace_.graph.add_input(name, TensorType::of(t), InputRole::data);
  note_input(t);
  if (find(t)) return;  // the same tensor passed twice: later reads use the first input
  remember(t, v, version_of(t), v);
  track_storage(t, version_of(t), name);
}

void Tracer::on_call(const OpCall& call) {
  // Ops the tracer itself might run are not the program's; after a break nothing is.
  if (busy_ || trace_.broken()) return;
  busy_ = true;
  try {
    record(call);
  } catch (const Error& e) {
    busy_ = false;
    if (!options_.allow_break) throw;
    stop(call.op.name, e.what());
  } catch (...) {
    busy_ = false;
    throw;
  }
  busy_ = false;
}

void Tracer::on_host_read(const Tensor& t, const char* reader) {
  if (busy_ || trace_.broken() || t.is_wrapped_number()) return;
  busy_ = true;
  try {
    record_host_read(t, reader);
  } catch (const Error& e) {
    busy_ = false;
    if (!options_.allow_break) throw;
    stop(reader, e.what());
    return;
  } catch (...) {
    busy_ = false;
    throw;
  }
  busy_ = false;
}

void Tracer::record_host_read(const Tensor& t, const char* reader) {
  const Value v = value_of(t, reader, {});
  const Known* k = find(t);
  const bool input = k && k->input.defined() && k->value == k->input;
  if (!input) {
    const StorageState* state = storage_state(t);
    fail("trace: {}() reads {} on the host inside the traced function, a value computed in the step "
         "({}): the graph cannot hold what the function makes of the number; read it after the step, "
         "or compile without fullgraph (the step then runs split, the read between compiled pieces)",
         reader, t.meta_str(), state ? state->what : "by an op");
  }
  // A guard holds one number; a whole input read on the host (printed) is a break too, so
  // that the read happens at every call.
  if (t.numel() != 1)
    fail("trace: {}() reads {} on the host inside the traced function: a graph holds no whole tensor read; "
         "compile without fullgraph (the function then runs split, the read at every call)",
         reader, t.meta_str());
  const std::vector<Value>& inputs = trace_.graph.inputs();
  const auto index = static_cast<int64_t>(std::find(inputs.begin(), inputs.end(), v) - inputs.begin());
  for (const Trace::HostRead& read : trace_.host_reads)
    if (read.input == index) return;
  trace_.host_reads.push_back({index, t.item()});  // busy_: not reported again
}

void Tracer::stop(std::string op, std::string reason) {
  trace_.break_op = std::move(op);
  trace_.break_reason = reason.empty() ? "refused" : std::move(reason);
}

void Tracer::find_gradients() {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    auto owner = grad_owner_.find(inputs_[i].impl());
    if (owner != grad_owner_.end() && owner->second != static_cast<int64_t>(i))
      trace_.grad_of[i] = owner->second;
  }
}

void Tracer::record_grad_effects() {
  const size_t seen = inputs_.size();  // a new gradient may be captured below
  for (size_t i = 0; i < seen; ++i) {
    if (!trace_.grad_defined[i].has_value()) continue;
    const Tensor after = inputs_[i].grad();
    if (after.impl() == grad_before_[i].impl()) continue;
    const std::string what = "the .grad of " + trace_.graph.node(trace_.graph.inputs()[i]).name;
    trace_.grad_effects.push_back(
        GradEffect{static_cast<int64_t>(i), after.defined() ? value_of(after, what, {}) : Value{}});
  }
}

Value Tracer::result_value(const Tensor& t, size_t index) {
  KILN_CHECK(t.defined(), "trace: result {} of the traced function is undefined", index);
  return value_of(t, "the traced function's results", {});
}

void Tracer::finish_random() {
  const Generator& gen = default_generator();
  KILN_CHECK(gen.seed() == random_seed_ && gen.offset() >= random_next_,
             "trace: the default generator was reseeded or moved back inside the traced function (seed {} "
             "offset {} before, seed {} offset {} after), which replay cannot repeat; seed it outside",
             random_seed_, random_start_, gen.seed(), gen.offset());
  KILN_CHECK(gen.offset() == random_next_,
             "trace: {} counters of the default generator were drawn after the last traced random op by "
             "something the trace did not see (another thread, or code outside the op registry); replay "
             "could not repeat it",
             gen.offset() - random_next_);
  trace_.random_count = gen.offset() - random_start_;
}

void Tracer::check_versions() const {
  for (const StorageImpl* ptr : storage_order_) {
    auto it = storages_.find(ptr);
    if (it == storages_.end()) continue;
    const StorageState& state = it->second;
    const std::shared_ptr<StorageImpl> storage = state.storage.lock();
    if (!storage || storage.get() != ptr) continue;
    KILN_CHECK(storage->version.load() == state.expected,
               "trace: {} was modified outside the op registry (a raw write through data_ptr?); "
               "its version is {}, the traced ops explain {}",
               state.what, storage->version.load(), state.expected);
  }
}

void Tracer::on_set_grad(const Tensor& t) {
  if (busy_ || trace_.broken()) return;
  for (const Tensor& input : inputs_)
    if (input.same(t)) return;
  grad_at_call_.emplace(t.impl(), t.grad().defined());
}

bool Tracer::has_work() const {
  if (!trace_.graph.write_backs().empty()) return true;
  for (const Node& n : trace_.graph.nodes())
    if (n.kind == NodeKind::op) return true;
  return false;
}

bool Tracer::reads_deferred(const Tensor& t) {
  if (is_pending(*t.storage())) return true;
  const StorageState* state = storage_state(t);
  return state && state->written;
}

std::vector<Tracer::LivePending> Tracer::live_pending() {
  std::vector<LivePending> live;
  std::set<const StorageImpl*> seen;
  for (const PendingOutput& p : pending_) {
    Storage storage = p.storage.lock();
    if (!storage || !is_pending(*storage) || !seen.insert(storage.get()).second) continue;
    auto it = known_.find(p.key);
    KILN_CHECK(it != known_.end() && it->second.storage.lock() == storage,
               "split run: the value of a deferred {}{} output is not known to the trace", p.key.dtype,
               shape_str(p.key.shape));
    live.push_back({std::move(storage), p.key, it->second.value});
  }
  return live;
}

void Tracer::accept_writes(const OpCall& call) {
  std::vector<const Tensor*> written;
  if (call.inplace) written.push_back(&call.outputs[0]);
  for (int i : call.op.mutated(call.attrs)) written.push_back(&call.inputs[static_cast<size_t>(i)]);
  for (const Tensor* t : written) {
    if (!t->defined()) continue;
    auto it = storages_.find(t->storage().get());
    if (it != storages_.end() && it->second.storage.lock() == t->storage())
      it->second.expected = version_of(*t);
  }
}

void Tracer::record(const OpCall& call) {
  const OpDef& op = call.op;
  if (updates_running_stats(call)) return record_batch_norm_training(call);
  if (!op.pure_twin.empty()) return record_update_in_place(call, op.pure_twin.c_str());
  refuse_mutation(call);
  const Tensor* target = call.inplace ? &call.outputs[0] : nullptr;
  if (target)
    KILN_CHECK(!target->impl()->view_base,
               "trace: in-place {} writes into a view ({}) of another tensor (not supported "
               "yet); clone() the view or build the result out of place",
               op.name, target->meta_str());

  Written written;
  if (target) written.insert(target->storage().get());
  for (int i : op.mutated(call.attrs))
    if (call.inputs[static_cast<size_t>(i)].defined())
      written.insert(call.inputs[static_cast<size_t>(i)].storage().get());

  std::vector<Value> inputs;
  inputs.reserve(call.inputs.size());
  for (const Tensor& t : call.inputs) inputs.push_back(value_of(t, op.name, written));
  // The target's value before the call (captured when the program never read it: copy_).
  Value target_input;
  if (target) {
    (void)value_of(*target, op.name, written);
    target_input = input_of(*target);
  }

  std::vector<Value> outs =
      trace_.graph.add_op(op.name, std::move(inputs), op.random ? random_attrs(call) : call.attrs, op.name);
  KILN_CHECK(outs.size() == call.outputs.size(),
             "trace: {} made {} outputs but its shape rule says {}", op.name, call.outputs.size(),
             outs.size());
  for (const StorageImpl* storage : written) {
    StorageState& state = storages_.at(storage);
    if (const std::shared_ptr<StorageImpl> alive = state.storage.lock())
      state.expected = alive->version.load();
    state.written = true;
  }

  if (target) {
    Value result = outs[0];
    // The pure op may promote (f32 += f64 tensor); the in-place form casts back.
    if (trace_.graph.type(result).dtype != target->dtype())
      result = trace_.graph.add_op1("cast", {result}, {{"dtype", target->dtype()}}, op.name);
    check_type(result, *target, op.name);
    remember(*target, result, version_of(*target), target_input);
    if (target_input.defined()) trace_.graph.add_write_back(target_input, result);
    return;
  }
  // Inputs a mutating op was allowed to receive (batch norm in eval) kept their content.
  for (int i : op.mutated(call.attrs)) {
    const Tensor& t = call.inputs[static_cast<size_t>(i)];
    if (!t.defined()) continue;
    Known* k = find(t);
    if (k) remember(t, k->value, version_of(t), k->input);
  }
  record_outputs(call, outs);
}

// A random op's attributes in the graph (graph.h): no seed, and its offset counted from
// the random input's, which replay fills from the default generator. Only counters that
// op reserved from the default generator since the previous random op can be replayed so;
// another generator's are refused.
Attrs Tracer::random_attrs(const OpCall& call) {
  const std::string& op = call.op.name;
  KILN_CHECK(call.attrs.has("seed") && call.attrs.has("offset"), "trace: random op {} has no seed and offset ({})",
             op, attrs_text(call.attrs));
  const auto seed = static_cast<uint64_t>(call.attrs.i("seed"));
  const auto offset = static_cast<uint64_t>(call.attrs.i("offset"));
  const Generator& gen = default_generator();
  const uint64_t now = gen.offset();
  KILN_CHECK(gen.seed() == random_seed_,
             "trace: the default generator was reseeded (manual_seed) inside the traced function before {}, "
             "which replay cannot repeat; seed it outside",
             op);
  // The op's counters must start where the last traced draw ended: a gap is a draw the
  // trace did not see (another thread's, or one outside the registry), which replay
  // would repeat for every call.
  KILN_CHECK(seed == random_seed_ && offset >= random_next_ && offset <= now,
             "trace: random op {} draws from a generator other than the default one (seed {}, offset {}; the "
             "default generator is at seed {}, offset {}): only the default generator can be traced; pass no "
             "generator, or run this op outside the compiled function",
             op, seed, offset, random_seed_, now);
  KILN_CHECK(offset == random_next_,
             "trace: random op {} drew counters {} to {} of the default generator, but {} counters were drawn "
             "since the last traced random op by something the trace did not see (another thread, or code "
             "outside the op registry); replay could not repeat it",
             op, offset, now, offset - random_next_);
  random_next_ = now;
  if (trace_.random_input < 0) {
    const Tensor base = random_base_tensor(random_seed_, random_start_);
    trace_.random_input = static_cast<int64_t>(inputs_.size());
    trace_.graph.add_input("random", random_base_type(), InputRole::random);
    trace_.captured.push_back(base);
    note_input(base);
  }
  Attrs attrs;
  for (const Attr& a : call.attrs.items()) {
    if (a.name == "seed") continue;
    attrs.set(a.name, a.name == "offset" ? AttrValue(static_cast<int64_t>(offset - random_start_)) : a.value);
  }
  return attrs;
}

// The values of a (not in-place) call's outputs.
void Tracer::record_outputs(const OpCall& call, const std::vector<Value>& outs) {
  KILN_CHECK(outs.size() == call.outputs.size(),
             "trace: {} made {} outputs but its shape rule says {}", call.op.name,
             call.outputs.size(), outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor& out = call.outputs[i];
    if (!out.defined()) continue;
    check_type(outs[i], out, call.op.name);
    remember(out, outs[i], version_of(out), {});
    track_storage(out, version_of(out), "an output of " + call.op.name, true);
  }
  for (const Tensor& out : call.outputs)
    if (out.defined() && is_pending(*out.storage())) pending_.push_back({out.storage(), ViewKey::of(out)});
}

// batch_norm in training with running statistics, which its kernel updated in place.
bool Tracer::updates_running_stats(const OpCall& call) {
  return call.op.name == "batch_norm" && call.attrs.has("training") && call.attrs.b("training") &&
         call.inputs.size() == 5 && call.inputs[3].defined() && call.inputs[4].defined();
}

// Recorded as one pure op, batch_norm_update: batch_norm's outputs, and the running
// statistics' new values computed from the same batch statistics (bit for bit the kernel's
// in-place update), which become the running statistics' new content (write-backs when
// they are graph inputs: module buffers, captured as state). The kernels compute the batch
// statistics once for both (before, a batch_norm without running statistics and a
// batch_norm_stats_update each computed them).
void Tracer::record_batch_norm_training(const OpCall& call) {
  const std::string& op = call.op.name;
  const Tensor& running_mean = call.inputs[3];
  const Tensor& running_var = call.inputs[4];
  for (const Tensor* stat : {&running_mean, &running_var})
    KILN_CHECK(!stat->impl()->view_base,
               "trace: {} updates a running statistic that is a view ({}) of another tensor "
               "(not supported yet)",
               op, stat->meta_str());
  KILN_CHECK(running_mean.storage() != running_var.storage(),
             "trace: {}'s running_mean and running_var share memory ({}, {})", op,
             running_mean.meta_str(), running_var.meta_str());
  const Written written{running_mean.storage().get(), running_var.storage().get()};

  std::vector<Value> inputs;
  for (size_t i = 0; i < 3; ++i) inputs.push_back(value_of(call.inputs[i], op, written));
  inputs.push_back(value_of(running_mean, op, written));
  inputs.push_back(value_of(running_var, op, written));
  Attrs attrs = call.attrs;
  if (!attrs.has("momentum")) attrs.set("momentum", 0.1);
  std::vector<Value> outs = trace_.graph.add_op("batch_norm_update", std::move(inputs), std::move(attrs), op);
  const std::vector<Value> updated(outs.begin() + 3, outs.end());
  outs.resize(3);
  for (const StorageImpl* storage : written) {
    StorageState& state = storages_.at(storage);
    if (const std::shared_ptr<StorageImpl> alive = state.storage.lock())
      state.expected = alive->version.load();
    state.written = true;
  }
  const Tensor* stats[] = {&running_mean, &running_var};
  for (size_t k = 0; k < 2; ++k) {
    const Tensor& stat = *stats[k];
    check_type(updated[k], stat, op);
    const Value stat_input = find(stat)->input;  // value_of above made it known
    remember(stat, updated[k], version_of(stat), stat_input);
    if (stat_input.defined()) trace_.graph.add_write_back(stat_input, updated[k]);
  }
  record_outputs(call, outs);
}

// Recorded as the pure twin over the same inputs, then its results as the new content of
// the tensors the kernel wrote: write-backs into the graph inputs they are (a parameter,
// its optimizer state). A written tensor the traced function made itself is refused: it
// escapes the function (optimizer state made by the optimizer's first step, say), so the
// graph could neither read it at replay nor write it back.
void Tracer::record_update_in_place(const OpCall& call, const char* pure) {
  const OpDef& op = call.op;
  std::vector<const Tensor*> targets;
  Written written;
  for (int i : op.mutated(call.attrs)) {
    const Tensor& t = call.inputs[static_cast<size_t>(i)];
    if (!t.defined()) continue;
    KILN_CHECK(!t.impl()->view_base,
               "trace: {} updates a tensor that is a view ({}) of another tensor (not "
               "supported yet)",
               op.name, t.meta_str());
    KILN_CHECK(written.insert(t.storage().get()).second,
               "trace: {} updates two tensors that share memory ({})", op.name, t.meta_str());
    targets.push_back(&t);
  }
  std::vector<Value> inputs;
  inputs.reserve(call.inputs.size());
  for (const Tensor& t : call.inputs) inputs.push_back(value_of(t, op.name, written));
  std::vector<Value> target_inputs;
  for (const Tensor* t : targets) {
    const Value input = input_of(*t);
    KILN_CHECK(input.defined(),
               "trace: {} updates a tensor ({}) that the traced function made itself, which "
               "outlives it (optimizer state made by a first step?): run the optimizer's first "
               "step eagerly before tracing or compiling the training step",
               op.name, t->meta_str());
    target_inputs.push_back(input);
  }
  const std::vector<Value> updated = trace_.graph.add_op(pure, std::move(inputs), call.attrs, op.name);
  KILN_CHECK(updated.size() == targets.size(),
             "trace: {} made {} results for the {} tensors {} writes", pure, updated.size(),
             targets.size(), op.name);
  for (const StorageImpl* storage : written) {
    StorageState& state = storages_.at(storage);
    if (const std::shared_ptr<StorageImpl> alive = state.storage.lock())
      state.expected = alive->version.load();
    state.written = true;
  }
  for (size_t k = 0; k < targets.size(); ++k) {
    const Tensor& t = *targets[k];
    check_type(updated[k], t, op.name);
    remember(t, updated[k], version_of(t), target_inputs[k]);
    trace_.graph.add_write_back(target_inputs[k], updated[k]);
  }
}

// The graph input whose tensor reads the same memory as t (which value_of made known);
// none for a tensor the traced function made. The known entry may say none for an input's
// memory when a view op's result lands on the same view (permute of a permute), or when
// the trace saw that memory only through another view (a transposed weight autograd
// saved, read by a split run's backward piece): then t itself becomes an input, so that
// a write into it is a write-back.
Value Tracer::input_of(const Tensor& t) {
  if (const Known* k = find(t); k && k->input.defined()) return k->input;
  const ViewKey key = ViewKey::of(t);
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i].storage() == t.storage() && ViewKey::of(inputs_[i]) == key)
      return trace_.graph.inputs()[i];
  const StorageState* state = storage_state(t);
  if (state && !state->made && !t.impl()->view_base) return capture(t, state->expected);
  return {};
}

// Ops that write inputs in place outside an in-place call: refused when they would write
// (a "training" attribute false says they do not). batch_norm's update of its running
// statistics is recorded (record_batch_norm_training) before this is asked.
void Tracer::refuse_mutation(const OpCall& call) {
  const OpDef& op = call.op;
  bool writes = false;
  for (int i : op.mutated(call.attrs)) writes |= call.inputs[static_cast<size_t>(i)].defined();
  if (!writes) return;
  const bool training = !call.attrs.has("training") || call.attrs.b("training");
  KILN_CHECK(!training,
             "trace: {} writes its inputs in place outside an in-place call (not supported "
             "yet)",
             op.name);
}

// The eager tensor and the graph's type for it must agree (layout aside: the graph's op
// values are contiguous, the eager ones may be views).
void Tracer::check_type(Value v, const Tensor& t, const std::string& op) const {
  const TensorType& type = trace_.graph.type(v);
  KILN_CHECK(type.dtype == t.dtype() && type.shape == t.shape() && type.device == t.device(),
             "trace: {} returned {} but its shape rule says {}", op, t.meta_str(), type.str());
}

// The graph value a tensor read by `op` has now: none, a constant, a known value, or a
// new captured input.
Value Tracer::value_of(const Tensor& t, const std::string& op, const Written& written) {
  if (!t.defined()) return {};
  if (t.is_wrapped_number()) return trace_.graph.add_constant(t.item(), TensorType::of(t));
  const StorageState* s = storage_state(t);
  uint64_t version = version_of(t);
  if (written.contains(t.storage().get())) version = s ? s->expected : version;
  if (s)
    KILN_CHECK(s->expected == version,
               "trace: {} was modified outside the op registry (a raw write through data_ptr?); "
               "{} read it at version {}, the traced ops explain {}",
               s->what, op, version, s->expected);
  if (Known* k = find(t)) {
    KILN_CHECK(k->version == version,
               "trace: {} reads a tensor ({}) whose memory was written in place through "
               "another view after the trace recorded it (not supported yet); clone() it first",
               op, t.meta_str());
    return k->value;
  }
  return capture(t, version);
}

Value Tracer::capture(const Tensor& t, uint64_t version) {
  auto named = options_.names.find(t.impl());
  const std::string name = named != options_.names.end()
                               ? named->second
                               : "captured" + std::to_string(trace_.captured.size());
  InputRole role = InputRole::state;
  if (t.is_leaf() && t.requires_grad())
    role = InputRole::param;
  else if (t.dim() == 0 && is_floating(t.dtype()) && t.device().is_cpu())
    role = InputRole::scalar;
  const Value v = trace_.graph.add_input(name, TensorType::of(t), role);
  trace_.captured.push_back(t);
  note_input(t);
  remember(t, v, version, v);
  track_storage(t, version, name);
  return v;
}

// What the trace needs of each graph input's gradient: whether a leaf's .grad was defined
// at first sight (and which tensor it was), and whether the input is another's .grad.
void Tracer::note_input(const Tensor& t) {
  const int64_t index = static_cast<int64_t>(inputs_.size());
  trace_.grad_of.push_back(-1);  // set by find_gradients() once every leaf has been seen
  inputs_.push_back(t);
  const bool leaf_with_grad = t.requires_grad() && t.is_leaf();
  const Tensor grad = leaf_with_grad ? t.grad() : Tensor();
  trace_.grad_defined.push_back(leaf_with_grad ? std::optional<bool>(grad.defined()) : std::nullopt);
  std::optional<bool> at_call = trace_.grad_defined.back();
  if (auto before = grad_at_call_.find(t.impl()); leaf_with_grad && before != grad_at_call_.end())
    at_call = before->second;
  trace_.grad_defined_at_call.push_back(at_call);
  grad_before_.push_back(grad);
  if (grad.defined()) grad_owner_.emplace(grad.impl(), index);
}

// The known entry for the memory t reads; null when unknown.
Known* Tracer::find(const Tensor& t) {
  auto it = known_.find(ViewKey::of(t));
  if (it == known_.end()) return nullptr;
  if (it->second.storage.lock() == t.storage()) return &it->second;
  known_.erase(it);  // a dead storage's address, reused
  return nullptr;
}

void Tracer::remember(const Tensor& t, Value value, uint64_t version, Value input) {
  known_[ViewKey::of(t)] = Known{t.storage(), value, version, input};
}

const StorageState* Tracer::storage_state(const Tensor& t) {
  auto it = storages_.find(t.storage().get());
  if (it == storages_.end()) return nullptr;
  if (it->second.storage.lock() == t.storage()) return &it->second;
  storages_.erase(it);
  return nullptr;
}

void Tracer::track_storage(const Tensor& t, uint64_t version, std::string what, bool made) {
  if (storage_state(t)) return;
  storages_[t.storage().get()] = StorageState{t.storage(), version, std::move(what), false, made};
  storage_order_.push_back(t.storage().get());
}

}  // namespace kiln::compiler::tracing
