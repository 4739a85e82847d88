// kiln::compile (compiler/compile.h): guards, the cache of traced graphs, replay through
// the generated program (or the reference interpreter), graph breaks, dumps and explain().
#include "compiler/compile.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>

#include "compiler/cuda_graph.h"
#include "compiler/passes/passes.h"
#include "compiler/program.h"
#include "core/error.h"
#include "core/autocast.h"
#include "core/grad_mode.h"

namespace kiln::compiler {

namespace {

// The strides the generated code is specialised on: a dense memory format, or none (any
// other strides).
using StridesClass = std::optional<MemoryFormat>;

const char* strides_class_name(StridesClass c) {
  if (!c) return "non-contiguous";
  return *c == MemoryFormat::channels_last ? "channels-last" : "contiguous";
}

// What a call's guards check of one tensor.
struct TensorGuard {
  bool defined = false;
  DType dtype = DType::f32;
  Shape shape;
  Device device;
  StridesClass strides = MemoryFormat::contiguous;
  bool requires_grad = false;
  std::optional<bool> grad_defined;  // for leaves that require grad

  static TensorGuard of(const Tensor& t) {
    TensorGuard g;
    if (!t.defined()) return g;
    g.defined = true;
    g.dtype = t.dtype();
    g.shape = t.shape();
    g.device = t.device();
    g.strides = t.is_contiguous() ? StridesClass(MemoryFormat::contiguous)
                : TensorType::of(t).layout == MemoryFormat::channels_last ? StridesClass(MemoryFormat::channels_last)
                                                                          : std::nullopt;
    g.requires_grad = t.requires_grad();
    if (t.requires_grad() && t.is_leaf()) g.grad_defined = t.grad().defined();
    return g;
  }
  bool operator==(const TensorGuard&) const = default;
};

std::string grad_state(std::optional<bool> defined) {
  if (!defined) return "not a leaf that requires grad";
  return *defined ? "defined" : "undefined";
}

// The first difference between two guards of the tensor `name`, as a phrase.
std::string describe_change(const std::string& name, const TensorGuard& was, const TensorGuard& now) {
  if (was.defined != now.defined)
    return fmt::format("{} changed from {} to {}", name, was.defined ? "defined" : "undefined",
                       now.defined ? "defined" : "undefined");
  if (was.dtype != now.dtype)
    return fmt::format("{}'s dtype changed from {} to {}", name, was.dtype, now.dtype);
  if (was.shape != now.shape)
    return fmt::format("{}'s shape changed from {} to {}", name, shape_str(was.shape),
                       shape_str(now.shape));
  if (was.device != now.device)
    return fmt::format("{}'s device changed from {} to {}", name, was.device, now.device);
  if (was.strides != now.strides)
    return fmt::format("{}'s layout changed from {} to {}", name, strides_class_name(was.strides),
                       strides_class_name(now.strides));
  if (was.requires_grad != now.requires_grad)
    return fmt::format("{}'s requires_grad changed from {} to {}", name, was.requires_grad,
                       now.requires_grad);
  return fmt::format("{}'s .grad changed from {} to {}", name, grad_state(was.grad_defined),
                     grad_state(now.grad_defined));
}

// The guards that do not depend on what the trace captured.
struct Signature {
  bool grad_mode = true;
  // Autocast's dtype per device type (core/autocast.h): it decides which casts the graph has.
  std::array<std::optional<DType>, kNumDeviceTypes> autocast;
  std::vector<TensorGuard> args;

  static Signature of(const std::vector<Tensor>& args) {
    Signature s;
    s.grad_mode = GradMode::is_enabled();
    for (int d = 0; d < kNumDeviceTypes; ++d) s.autocast[static_cast<size_t>(d)] = autocast_dtype(static_cast<DeviceType>(d));
    s.args.reserve(args.size());
    for (const Tensor& a : args) s.args.push_back(TensorGuard::of(a));
    return s;
  }
  bool operator==(const Signature&) const = default;
};

// Per tensor: the index of the first earlier tensor over the same storage, -1 if none. The
// tracer matches tensors by the memory they read, so the graph assumes this pattern.
std::vector<int64_t> alias_pattern(const std::vector<Tensor>& tensors) {
  std::vector<int64_t> pattern(tensors.size(), -1);
  std::unordered_map<const StorageImpl*, int64_t> first;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;
    auto [it, inserted] = first.emplace(tensors[i].storage().get(), static_cast<int64_t>(i));
    if (!inserted) pattern[i] = it->second;
  }
  return pattern;
}

// Host-read guards compare exactly, in the category the value was read as (NaN never
// matches: such a step traces again each call, up to the cache limit).
bool same_value(const Scalar& a, const Scalar& b) {
  if (a.kind() != b.kind()) return false;
  return a.is_floating() ? a.to_double() == b.to_double() : a.to_int() == b.to_int();
}
std::string scalar_text(const Scalar& s) {
  if (s.kind() == DType::boolean) return s.to_int() ? "true" : "false";
  return s.is_floating() ? fmt::format("{}", s.to_double()) : fmt::format("{}", s.to_int());
}

std::string input_name(const Trace& t, size_t input) {
  return t.graph.node(t.graph.inputs().at(input)).name;
}

// One cached entry: a graph with its guards, or a graph break that runs fn eagerly.
struct Entry {
  Signature signature;
  Trace trace;
  std::vector<TensorGuard> captured;  // guards of the captured tensors
  std::vector<int64_t> aliases;       // alias_pattern over the graph inputs' tensors
  bool eager() const { return trace.broken(); }
  std::shared_ptr<Program> program;  // the generated backend's program, when used
  std::shared_ptr<GraphReplay> replay;  // mode reduce-overhead: the program's CUDA graph
  std::vector<bool> copy;  // per graph output: the program returns a copy (outputs_to_copy)

  // A call whose guards hold: the trace replayed through the backend (the program, its
  // CUDA graph, or with the interpreter backend the traced graph through interpret()).
  std::vector<Tensor> run(const std::vector<Tensor>& args) const {
    const std::vector<Tensor> inputs = trace.replay_inputs(args);
    std::vector<Tensor> outputs = replay    ? replay->run(inputs)
                                  : program ? program->run(inputs)
                                            : interpret(trace.graph, inputs);
    for (size_t i = 0; i < outputs.size() && i < copy.size(); ++i)
      if (copy[i] && outputs[i].defined()) outputs[i] = outputs[i].clone();
    return trace.replay_results(inputs, std::move(outputs));
  }

  // Empty when the captured tensors pass the guards, else what changed.
  std::string captured_change(const std::vector<Tensor>& args) const {
    if (eager()) return {};
    const std::vector<Tensor> inputs = trace.inputs_for(args);
    const size_t num_args = args.size();
    for (size_t j = 0; j < captured.size(); ++j) {
      const TensorGuard now = TensorGuard::of(inputs[num_args + j]);
      if (!(now == captured[j])) return describe_change(input_name(trace, num_args + j), captured[j], now);
    }
    if (alias_pattern(inputs) != aliases) return "which inputs share memory changed";
    for (const Trace::HostRead& read : trace.host_reads) {
      const Scalar now = inputs.at(static_cast<size_t>(read.input)).item();
      if (!same_value(now, read.value))
        return fmt::format("the value of {} (read on the host by item()) changed from {} to {}",
                           input_name(trace, static_cast<size_t>(read.input)), scalar_text(read.value),
                           scalar_text(now));
    }
    return {};
  }
};

std::string signature_change(const Signature& was, const Signature& now) {
  if (was.grad_mode != now.grad_mode)
    return fmt::format("grad mode changed from {} to {}", was.grad_mode ? "enabled" : "disabled",
                       now.grad_mode ? "enabled" : "disabled");
  if (was.autocast != now.autocast) {
    auto text = [](const std::array<std::optional<DType>, kNumDeviceTypes>& a) {
      std::string s;
      for (int d = 0; d < kNumDeviceTypes; ++d)
        if (a[static_cast<size_t>(d)])
          s += fmt::format("{}{} on {}", s.empty() ? "" : ", ", *a[static_cast<size_t>(d)],
                           static_cast<DeviceType>(d) == DeviceType::cpu ? "cpu" : "cuda");
      return s.empty() ? std::string("off") : s;
    };
    return fmt::format("autocast changed from {} to {}", text(was.autocast), text(now.autocast));
  }
  if (was.args.size() != now.args.size())
    return fmt::format("the number of arguments changed from {} to {}", was.args.size(),
                       now.args.size());
  for (size_t i = 0; i < was.args.size(); ++i)
    if (!(was.args[i] == now.args[i]))
      return describe_change("arg" + std::to_string(i), was.args[i], now.args[i]);
  return {};
}

// How many guarded properties differ (a different argument count: more than any other).
size_t differences(const Signature& was, const Signature& now) {
  if (was.args.size() != now.args.size()) return 7 * (1 + std::max(was.args.size(), now.args.size()));
  size_t n = (was.grad_mode != now.grad_mode) + (was.autocast != now.autocast);
  for (size_t i = 0; i < was.args.size(); ++i) {
    const TensorGuard &a = was.args[i], &b = now.args[i];
    n += (a.defined != b.defined) + (a.dtype != b.dtype) + (a.shape != b.shape) +
         (a.device != b.device) + (a.strides != b.strides) + (a.requires_grad != b.requires_grad) +
         (a.grad_defined != b.grad_defined);
  }
  return n;
}

std::atomic<int64_t> dumped_graphs{0};  // numbers the dump files of this process

// Writes one dump file `dir`/NNN-`stage`.
void dump_file(const std::filesystem::path& dir, int64_t number, const std::string& stage, const std::string& text) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  KILN_CHECK(!error, "kiln::compile: cannot create the dump folder {}: {}", dir.string(),
             error.message());
  const std::filesystem::path file = dir / fmt::format("{:03}-{}", number, stage);
  std::ofstream out(file);
  out << text;
  KILN_CHECK(out.good(), "kiln::compile: cannot write the dump file {}", file.string());
}

// Per output: whether the program must return a copy. simplify drops clone(x) (in a pure
// graph the copy is the value), so an output the traced program made fresh (an op's result,
// a gradient's clone) may come out of the optimized graph as a view or an input; the caller
// must still get a tensor of its own, contiguous as the eager clone was.
std::vector<bool> outputs_to_copy(const Graph& traced, const Graph& optimized) {
  std::vector<bool> copy(traced.outputs().size(), false);
  for (size_t i = 0; i < copy.size(); ++i) {
    const Value was = traced.outputs()[i], now = optimized.outputs().at(i);
    bool written_back = false;
    for (const auto& wb : traced.write_backs()) written_back |= wb.second == was;
    const Node& before = traced.node(was);
    const Node& after = optimized.node(now);
    const bool fresh_before = before.kind == NodeKind::op && before.def->kind == OpKind::compute;
    const bool fresh_after = after.kind == NodeKind::op && after.def->kind == OpKind::compute;
    copy[i] = !written_back && fresh_before && !fresh_after;
  }
  return copy;
}

// The generated program of a traced graph (null with the interpreter backend), writing the
// dumps of each stage when `dump_dir` is set; `copy` gets outputs_to_copy.
// Where a CUDA-target rewrite applies (BatchNormSplit, GemmActivations: cuda, always or
// never), as the environment's variable `name` overrides `where`.
template <class Where>
Where where_from_env(const char* name, Where where) {
  const char* env = std::getenv(name);
  if (!env || !*env) return where;
  const std::string v = env;
  KILN_CHECK(v == "cuda" || v == "always" || v == "never", "kiln::compile: {} must be cuda, always or never, got '{}'",
             name, v);
  return v == "always" ? Where::always : v == "never" ? Where::never : Where::cuda;
}

// Whether the mode replays CUDA graphs (reduce-overhead and max-autotune).
bool graphs_mode(const CompileOptions& options) {
  return options.mode == "reduce-overhead" || options.mode == "max-autotune";
}

std::shared_ptr<Program> build_program(const Graph& traced, const CompileOptions& options, std::vector<bool>* copy) {
  const bool dump = !options.dump_dir.empty();
  const int64_t number = dump ? dumped_graphs++ : 0;
  if (dump) dump_file(options.dump_dir, number, "trace.ir", print(traced));
  if (options.backend == "interpreter") return nullptr;
  std::vector<PassRecord> records;
  const BatchNormSplit split = where_from_env("KILN_BATCH_NORM_SPLIT", options.batch_norm_split);
  bool linear_cross_entropy = options.linear_cross_entropy;
  if (const char* env = std::getenv("KILN_LINEAR_CROSS_ENTROPY"); env && *env) {
    const std::string v = env;
    KILN_CHECK(v == "0" || v == "1", "kiln::compile: KILN_LINEAR_CROSS_ENTROPY must be 0 or 1, got '{}'", v);
    linear_cross_entropy = v == "1";
  }
  const GemmActivations activations = where_from_env("KILN_GEMM_ACTIVATIONS", options.gemm_activations);
  Graph optimized = run_pipeline(
      traced,
      // On CUDA the head's op reads the target back, which a captured CUDA graph cannot hold.
      default_compile_passes(options.layout, split, linear_cross_entropy, activations, !graphs_mode(options)),
      &records, false);
  if (dump) {
    dump_file(options.dump_dir, number, "simplified.ir", print(optimized));
    dump_file(options.dump_dir, number, "passes.txt", timing_table(records));
  }
  if (copy) *copy = outputs_to_copy(traced, optimized);
  auto program = std::make_shared<Program>(std::move(optimized));
  const char* env = std::getenv("KILN_PROFILE");
  if (options.profile || (env && std::string(env) == "1")) program->set_profiling(true);
  if (dump) {
    dump_file(options.dump_dir, number, "fused.txt", program->describe());
    dump_file(options.dump_dir, number, "kernels.txt", program->kernels_text());
    dump_file(options.dump_dir, number, "source.cpp", program->sources_text());
  }
  return program;
}

// The CUDA graph pool of each GPU, shared by the graphs of one compiled function.
using PoolOf = std::function<std::shared_ptr<cuda::MemPool>(int device)>;

// Builds the backend of a traced entry (nothing for the interpreter): the program, and with
// modes reduce-overhead and max-autotune the program replayed as a CUDA graph.
void install_backend(Entry& entry, const CompileOptions& options, const PoolOf& pool_of) {
  std::shared_ptr<Program> program = build_program(entry.trace.graph, options, &entry.copy);
  if (!program) return;
  entry.program = program;
  if (!graphs_mode(options)) return;
  // max-autotune: the CUDA kernels' launches timed at their first run, and cuDNN's
  // algorithms timed (benchmark mode) for every run of the program.
  const bool autotune = options.mode == "max-autotune";
  if (autotune && program->gpu() >= 0) program->set_autotune(true);
  std::shared_ptr<GraphReplay> r;
  if (options.graph_recorder) {
    r = std::make_shared<GraphReplay>(program, staged_inputs(entry.trace), options.graph_recorder);
  } else {
    const bool capturable = program->cuda_graph_blocker().empty();
    r = std::make_shared<GraphReplay>(program, staged_inputs(entry.trace), capturable ? pool_of(program->gpu()) : nullptr);
  }
  r->set_time_library_algorithms(autotune);
  // (A replayed result that must be a copy of its own is copied twice: rare, and the
  // uncaptured runs need the copy as the default mode does.)
  entry.replay = std::move(r);
}

// "1 result", "2 results".
std::string count(size_t n, const char* noun) {
  return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

std::string value_text(const Graph& graph, Value v) {
  return fmt::format("%{} {}", graph.value_number(v), graph.type(v).str());
}

void check_mode(const CompileOptions& options) {
  KILN_CHECK(options.mode == "default" || graphs_mode(options),
             "kiln::compile: unknown mode \"{}\" (\"default\", \"reduce-overhead\" or \"max-autotune\")",
             options.mode);
  KILN_CHECK(options.backend == "generated" || options.backend == "interpreter",
             "kiln::compile: unknown backend \"{}\" (\"generated\" or \"interpreter\")", options.backend);
}

TraceOptions trace_options(const CompileOptions& options, bool allow_break) {
  TraceOptions t = options.trace;
  t.allow_break = allow_break;
  return t;
}

}  // namespace

struct CompiledFunction::State {
  TracedFunction fn;
  CompileOptions options;
  std::vector<Entry> entries;
  int64_t calls = 0;
  int64_t recompiles = 0;
  std::string last_reason;
  std::string warning;
  int64_t eager_fallbacks = 0;
  std::string cache_full_warning;
  // Split runs (entries with a graph break): the pieces' programs by structural hash.
  std::unordered_map<uint64_t, std::shared_ptr<Program>> pieces;
  // reduce-overhead: one CUDA graph pool per GPU for the entries' graphs.
  std::map<int, std::shared_ptr<cuda::MemPool>> pools;
  std::shared_ptr<cuda::MemPool> pool_of(int device) {
    std::shared_ptr<cuda::MemPool>& p = pools[device];
    if (!p) p = std::make_shared<cuda::MemPool>(device);
    return p;
  }
  int64_t split_calls = 0;
  std::vector<SplitPiece> last_split;
  std::string pieces_full_warning;

  // fn run split (trace.h): the pieces between the breaks run compiled.
  std::vector<Tensor> run_split_call(const std::vector<Tensor>& args) {
    ++split_calls;
    last_split.clear();
    const PieceRunner run_piece = [this](const Graph& graph, const std::vector<Tensor>& inputs) {
      if (options.backend == "interpreter") return interpret(graph, inputs);
      const uint64_t hash = graph.structural_hash();
      auto it = pieces.find(hash);
      if (it == pieces.end()) {
        if (static_cast<int64_t>(pieces.size()) >= options.cache_limit) {
          // Pieces that change every call (numbers read on the host shaping the graph)
          // would compile every call: past the limit new ones run through the interpreter.
          if (pieces_full_warning.empty()) {
            pieces_full_warning = fmt::format(
                "kiln::compile: {} compiled pieces of split runs (the cache limit); new pieces run uncompiled",
                pieces.size());
            std::cerr << pieces_full_warning << '\n';
          }
          return interpret(graph, inputs);
        }
        it = pieces.emplace(hash, build_program(graph, options, nullptr)).first;
      }
      return it->second->run(inputs);
    };
    return run_split(fn, args, options.trace, run_piece, &last_split);
  }
};

CompiledFunction compile(TracedFunction fn, CompileOptions options) {
  KILN_CHECK(fn != nullptr, "kiln::compile: the function is empty");
  check_mode(options);
  if (options.dump_dir.empty())
    if (const char* env = std::getenv("KILN_DUMP"); env && *env) options.dump_dir = env;
  CompiledFunction compiled;
  compiled.state_ = std::make_shared<CompiledFunction::State>();
  compiled.state_->fn = std::move(fn);
  compiled.state_->options = std::move(options);
  return compiled;
}

std::vector<Tensor> CompiledFunction::operator()(const std::vector<Tensor>& args) {
  KILN_CHECK(state_, "kiln::CompiledFunction: not made by kiln::compile");
  State& s = *state_;
  ++s.calls;
  const Signature signature = Signature::of(args);
  for (const Entry& entry : s.entries) {
    if (!(entry.signature == signature) || !entry.captured_change(args).empty()) continue;
    return entry.eager() ? s.run_split_call(args) : entry.run(args);
  }

  // A miss: what changed since the closest entry (fewest differing guards, the newest on
  // a tie), for the recompile warning.
  std::string reason;
  if (!s.entries.empty()) {
    const Entry* closest = nullptr;
    size_t fewest = 0;
    for (const Entry& entry : s.entries) {
      const size_t n = differences(entry.signature, signature);
      if (!closest || n <= fewest) closest = &entry, fewest = n;
    }
    reason = signature_change(closest->signature, signature);
    if (reason.empty()) reason = closest->captured_change(args);
  }
  if (static_cast<int64_t>(s.entries.size()) >= s.options.cache_limit) {
    // Past the cache limit a miss runs fn eagerly, uncompiled: a function whose guards fail
    // on every call (a value read on the host that keeps changing, shapes that never
    // repeat) would otherwise trace and compile on every call.
    ++s.eager_fallbacks;
    if (s.cache_full_warning.empty()) {
      s.cache_full_warning = fmt::format("kiln::compile: {} cached graphs (the cache limit); calls that match "
                                         "none run eagerly; the first because {}",
                                         s.entries.size(), reason);
      std::cerr << s.cache_full_warning << '\n';
    }
    return s.fn(args);
  }
  Entry entry;
  entry.signature = signature;
  entry.trace = trace(s.fn, args, trace_options(s.options, !s.options.fullgraph));
  const Trace& t = entry.trace;
  if (!t.broken()) {
    const std::vector<Tensor> inputs = t.inputs_for(args);
    for (size_t j = 0; j < t.captured.size(); ++j) {
      TensorGuard g = TensorGuard::of(inputs[args.size() + j]);
      // The graph was made for the gradients as they were when fn was called (as the trace
      // first saw them, unless fn cleared them before).
      g.grad_defined = t.grad_defined_at_call.at(args.size() + j);
      entry.captured.push_back(std::move(g));
    }
    entry.aliases = alias_pattern(inputs);
    install_backend(entry, s.options, [&s](int device) { return s.pool_of(device); });
  }
  std::vector<Tensor> results = t.results;
  const bool first = s.entries.empty();
  s.entries.push_back(std::move(entry));
  if (!first) {
    ++s.recompiles;
    s.last_reason = reason;
    if (s.recompiles > s.options.recompile_limit && s.warning.empty()) {
      s.warning = fmt::format("kiln::compile: recompiled {} times; last because {}",
                              s.recompiles, reason);
      std::cerr << s.warning << '\n';
    }
  }
  return results;
}

int64_t CompiledFunction::recompiles() const { return state_ ? state_->recompiles : 0; }
int64_t CompiledFunction::cache_size() const {
  return state_ ? static_cast<int64_t>(state_->entries.size()) : 0;
}
int64_t CompiledFunction::calls() const { return state_ ? state_->calls : 0; }
int64_t CompiledFunction::eager_fallbacks() const { return state_ ? state_->eager_fallbacks : 0; }
int64_t CompiledFunction::split_calls() const { return state_ ? state_->split_calls : 0; }
int64_t CompiledFunction::piece_programs() const {
  return state_ ? static_cast<int64_t>(state_->pieces.size()) : 0;
}
std::vector<SplitPiece> CompiledFunction::last_split() const {
  return state_ ? state_->last_split : std::vector<SplitPiece>();
}
int64_t CompiledFunction::graph_breaks() const {
  int64_t n = 0;
  if (state_)
    for (const Entry& e : state_->entries) n += e.eager();
  return n;
}
std::string CompiledFunction::last_recompile_reason() const {
  return state_ ? state_->last_reason : std::string();
}
std::string CompiledFunction::warning() const { return state_ ? state_->warning : std::string(); }
std::vector<const Trace*> CompiledFunction::traces() const {
  std::vector<const Trace*> out;
  if (state_)
    for (const Entry& e : state_->entries) out.push_back(&e.trace);
  return out;
}

CudaGraphStats CompiledFunction::cuda_graphs() const {
  CudaGraphStats stats;
  if (!state_ || !graphs_mode(state_->options)) return stats;
  auto skip = [&](const std::string& why) {
    if (std::find(stats.skipped.begin(), stats.skipped.end(), why) == stats.skipped.end()) stats.skipped.push_back(why);
  };
  if (state_->options.backend == "interpreter") skip("the interpreter backend runs graphs uncaptured");
  if (state_->eager_fallbacks > 0) skip("calls past the cache limit run eagerly");
  for (const Entry& e : state_->entries) {
    if (e.eager()) skip("a graph break: split runs are not captured");
    if (!e.replay) continue;
    stats.captures += e.replay->captures();
    stats.replays += e.replay->replays();
    stats.uncaptured_runs += e.replay->uncaptured_runs();
    if (!e.replay->skip_reason().empty()) skip(e.replay->skip_reason());
  }
  for (const auto& [device, pool] : state_->pools) stats.pool_bytes += pool->reserved_bytes();
  return stats;
}

std::string CompiledFunction::autotune_report() const {
  std::string out;
  if (!state_ || state_->options.mode != "max-autotune") return out;
  for (size_t i = 0; i < state_->entries.size(); ++i)
    if (const Entry& e = state_->entries[i]; e.program)
      out += fmt::format("graph {} ({} kernels):\n{}", i, e.program->num_kernels(), e.program->autotune_report());
  return out;
}

std::string CompiledFunction::profile() const {
  std::string out;
  if (!state_) return out;
  for (size_t i = 0; i < state_->entries.size(); ++i) {
    const Entry& e = state_->entries[i];
    if (!e.program) continue;
    out += fmt::format("graph {} ({} steps, {} kernels):\n{}", i, e.program->num_steps(), e.program->num_kernels(),
                       e.program->profile());
  }
  for (const auto& [hash, program] : state_->pieces)
    if (program)
      out += fmt::format("split piece {:016x} ({} steps, {} kernels):\n{}", hash, program->num_steps(),
                         program->num_kernels(), program->profile());
  return out;
}

std::string explain(TracedFunction fn, const std::vector<Tensor>& args, CompileOptions options) {
  KILN_CHECK(fn != nullptr, "kiln::explain: the function is empty");
  check_mode(options);
  TraceOptions record = trace_options(options, true);
  record.record_after_break = true;
  const Trace t = trace(fn, args, record);
  std::string out;
  if (t.broken()) {
    // The graph before the first break, then what followed it, as split runs split it.
    const auto ops_of = [](const Graph& g) {
      int64_t n = 0;
      for (const Node& node : g.nodes()) n += node.kind == NodeKind::op;
      return n;
    };
    const int64_t first_ops = ops_of(t.graph);
    size_t graphs = first_ops > 0, breaks = 1;
    for (const SplitPiece& p : t.after_break) {
      graphs += p.ops > 0;
      breaks += !p.reason.empty();
    }
    out += fmt::format("kiln::explain: {}, {}\n", count(graphs, "graph"), count(breaks, "graph break"));
    out += "later calls with these guards run the function split: the ops between breaks are recorded as "
           "they are called and run as compiled pieces, a refused op runs eagerly (CompiledFunction::last_split)\n";
    size_t number = 0;
    if (first_ops > 0) out += fmt::format("graph {} ({} ops):\n{}", number++, first_ops, print(t.graph));
    out += fmt::format("graph break at {}: {}\n", t.break_op.empty() ? "a write outside the op registry" : t.break_op,
                       t.break_reason);
    for (const SplitPiece& p : t.after_break) {
      if (p.ops > 0) out += fmt::format("graph {} ({} ops):\n{}", number++, p.ops, p.graph);
      if (!p.reason.empty()) out += fmt::format("graph break at {}: {}\n", p.end, p.reason);
    }
    return out;
  }
  const Graph& g = t.graph;
  int64_t ops = 0, constants = 0;
  for (const Node& n : g.nodes()) {
    ops += n.kind == NodeKind::op;
    constants += n.kind == NodeKind::constant;
  }
  out += "kiln::explain: 1 graph, 0 graph breaks\n";
  out += fmt::format("nodes: {} ({}, {}, {})\n", g.nodes().size(), count(g.inputs().size(), "input"),
                     count(static_cast<size_t>(constants), "constant"), count(static_cast<size_t>(ops), "op"));
  out += fmt::format("inputs: {}\n", g.inputs().size());
  for (InputRole role : {InputRole::data, InputRole::param, InputRole::state, InputRole::scalar, InputRole::random})
    for (Value v : g.inputs())
      if (g.node(v).role == role)
        out += fmt::format("  {} \"{}\" {}\n", role_name(role), g.node(v).name, g.type(v).str());
  out += fmt::format("outputs: {} ({}, {})\n", g.outputs().size(),
                     count(static_cast<size_t>(t.num_results), "result"),
                     count(g.outputs().size() - static_cast<size_t>(t.num_results), "grad effect"));
  for (int64_t i = 0; i < t.num_results; ++i)
    out += fmt::format("  result {}: {}\n", i, value_text(g, g.outputs().at(static_cast<size_t>(i))));
  out += fmt::format("write-backs: {}\n", g.write_backs().size());
  for (const auto& [input, value] : g.write_backs())
    out += fmt::format("  \"{}\" <- {}\n", g.node(input).name, value_text(g, value));
  out += fmt::format("grad effects: {}\n", t.grad_effects.size());
  for (const GradEffect& e : t.grad_effects)
    out += fmt::format("  \"{}\".grad <- {}\n", input_name(t, static_cast<size_t>(e.input)),
                       e.value.defined() ? value_text(g, e.value) : std::string("none"));
  out += "graph:\n";
  out += print(g);
  return out;
}

}  // namespace kiln::compiler
