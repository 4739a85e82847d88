// compile's reduce-overhead mode (compiler/cuda_graph.h) on the CPU: programs on the CPU run
// as in the default mode and say why; GraphReplay's bookkeeping (warm-up, capture, inputs
// copied in and back, results copied out, captures again when an input moves, fallbacks)
// runs with a stand-in recorder that replays by running the program again into the
// captured outputs' memory. The CUDA graphs themselves are tested on a GPU
// (tests/cuda/test_compiled_cuda.cpp).
#include "compiler/compile.h"
#include "compiler/cuda_graph.h"
#include "compiler_testing.h"
#include "models/small_models.h"
#include "optim/sgd.h"
#include "testing.h"

using namespace kiln;
using namespace kiln::compiler;
using Catch::Matchers::Contains;

namespace {

using Args = std::vector<Tensor>;

double max_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  return amax(abs(a.to(DType::f64) - b.to(DType::f64))).item<double>();
}

// A CPU stand-in for a CUDA graph: capture() runs the program (a CUDA capture only records
// it; the first replay then does the work, so here the first replay does nothing); later
// replays run it again and copy its results into the captured results, as a graph writes
// the same memory at every replay.
class CpuRecorder final : public GraphRecorder {
 public:
  explicit CpuRecorder(int64_t* captures) : captures_(captures) {}
  std::vector<Tensor> capture(const std::function<std::vector<Tensor>()>& run) override {
    ++*captures_;
    run_ = run;
    outputs_ = run();
    first_ = true;
    return outputs_;
  }
  void replay() override {
    if (first_) {
      first_ = false;
      return;
    }
    const std::vector<Tensor> fresh = run_();
    for (size_t i = 0; i < fresh.size(); ++i)
      if (fresh[i].defined() && !fresh[i].same(outputs_[i])) outputs_[i].copy_(fresh[i]);
  }

 private:
  int64_t* captures_;
  std::function<std::vector<Tensor>()> run_;
  std::vector<Tensor> outputs_;
  bool first_ = false;
};

// A recorder whose capture fails, as CUDA's does when the program reads a value back.
class FailingRecorder final : public GraphRecorder {
 public:
  std::vector<Tensor> capture(const std::function<std::vector<Tensor>()>&) override {
    fail("cuda::CudaGraph::capture: the capture failed (stand-in)");
  }
  void replay() override { fail("never captured"); }
};

TracedFunction micro_step(nn::Module& model) {
  return [&model](const Args& a) -> Args {
    Tensor loss = cross_entropy(model(a[0]), a[1]);
    (loss * a[2]).backward();
    return {loss.detach()};
  };
}

std::shared_ptr<models::MLP> mlp() {
  manual_seed(11);
  return std::make_shared<models::MLP>(models::MLP({12, 8, 4}));
}

// Trains `model` for three optimizer steps of two micro-steps each through `step`, a new
// batch per micro-step and .grad freed between steps; the losses, in order.
std::vector<Tensor> train(nn::Module& model, const std::function<Args(const Args&)>& step) {
  optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
  manual_seed(5);
  std::vector<Tensor> losses;
  for (int s = 0; s < 3; ++s) {
    for (int m = 0; m < 2; ++m) {
      const Args batch{randn({6, 12}), randint(0, 4, {6}), scalar_tensor(m == 0 ? 0.25 : 0.75, DType::f32)};
      losses.push_back(step(batch).at(0));
    }
    sgd.step();
    sgd.zero_grad();
  }
  return losses;
}

void check_same(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("loss " << i);
    CHECK(max_diff(got[i], want[i]) == 0);  // the same program: bit for bit
  }
}

}  // namespace

TEST_CASE("reduce-overhead on CPU tensors runs as the default mode and says why nothing was captured", "[compile]") {
  auto a = mlp(), b = mlp();
  CompiledFunction graphed = compile(micro_step(*a), {.mode = "reduce-overhead"});
  CompiledFunction plain = compile(micro_step(*b));
  check_same(train(*a, [&](const Args& x) { return graphed(x); }), train(*b, [&](const Args& x) { return plain(x); }));
  const CudaGraphStats stats = graphed.cuda_graphs();
  CHECK(stats.captures == 0);
  CHECK(stats.replays == 0);
  CHECK(stats.uncaptured_runs == 4);  // six calls, two of which traced
  REQUIRE(stats.skipped.size() == 1);
  CHECK(stats.skipped[0] == "the graph runs on the CPU");
  CHECK(plain.cuda_graphs().uncaptured_runs == 0);  // the default mode has no graphs
}

TEST_CASE("compile's modes: unknown names are errors; max-autotune on the CPU tunes nothing", "[compile]") {
  auto fn = [](const Args& a) -> Args { return {a[0] * 2}; };
  CHECK_THROWS_WITH(compile(fn, {.mode = "fast"}), Contains("unknown mode \"fast\""));
  CHECK_THAT(explain(fn, {ones({1})}, {.mode = "reduce-overhead"}), Contains("1 graph, 0 graph breaks"));
  CompiledFunction tuned = compile(fn, {.mode = "max-autotune"});
  for (int call = 0; call < 3; ++call) CHECK(sum(tuned({ones({3})}).at(0)).item<double>() == 6.0);
  CHECK_THAT(tuned.autotune_report(), Contains("no kernel was tuned"));
  REQUIRE(tuned.cuda_graphs().skipped.size() == 1);
  CHECK(tuned.cuda_graphs().skipped[0] == "the graph runs on the CPU");
  CHECK(compile(fn).autotune_report().empty());
}

TEST_CASE("reduce-overhead replays a training step with accumulation as the default mode runs it", "[compile]") {
  // Each micro-step graph (.grad undefined, .grad defined) warms up once, is captured on its
  // second run and replayed after; the batch is copied in, the accumulated gradients in and
  // back out (zero_grad frees them, so they move every step), the loss out.
  auto a = mlp(), b = mlp();
  int64_t captures = 0;
  CompiledFunction graphed =
      compile(micro_step(*a), {.mode = "reduce-overhead",
                               .graph_recorder = [&captures] { return std::make_unique<CpuRecorder>(&captures); }});
  CompiledFunction plain = compile(micro_step(*b));
  const std::vector<Tensor> losses = train(*a, [&](const Args& x) { return graphed(x); });
  check_same(losses, train(*b, [&](const Args& x) { return plain(x); }));
  const CudaGraphStats stats = graphed.cuda_graphs();
  CHECK(stats.skipped.empty());
  CHECK(stats.captures == 2);
  CHECK(captures == 2);
  CHECK(stats.uncaptured_runs == 2);  // the warm-ups
  CHECK(stats.replays == 2);          // six calls: two traces, two warm-ups, two captured
  // A loss the caller kept is its own tensor, not the replayed graph's memory.
  for (size_t i = 0; i + 1 < losses.size(); ++i) CHECK(!losses[i].same(losses[i + 1]));
  for (size_t i = 0; i < 2; ++i)
    for (size_t j = i + 1; j < losses.size(); ++j) CHECK(losses[i].storage() != losses[j].storage());
  // The parameters trained the same.
  const auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(max_diff(pa[i], pb[i]) == 0);
}

TEST_CASE("GraphReplay copies arguments and written inputs, captures again when an input moves, falls back", "[compile]") {
  // f(x) = (s += x; x * 2 + s): x is an argument (staged), s a captured tensor written in
  // place (not staged), so a new s is memory the graph does not know.
  Tensor s = zeros({4});
  const TracedFunction fn = [&s](const Args& a) -> Args {
    s.add_(a[0]);
    return {a[0] * 2 + s};
  };
  const Tensor x0 = arange(0, 4, 1, {.dtype = DType::f32});
  Trace t = trace(fn, {x0});
  auto program = std::make_shared<Program>(run_pipeline(t.graph, default_compile_passes(), nullptr, false));
  std::vector<bool> staged = staged_inputs(t);
  REQUIRE(staged == std::vector<bool>{true, false});
  int64_t captures = 0;
  GraphReplay replay(program, staged, [&captures] { return std::make_unique<CpuRecorder>(&captures); });
  auto expect = [](const Tensor& got, std::vector<float> want) {
    CHECK(max_diff(got, from_vector<float>(want)) == 0);
  };
  // s = 0 + x0 after the trace.
  std::vector<Tensor> out = replay.run({x0 * 10, s});  // warm-up: s = 0 + 1 * x0 + 10 * x0
  expect(s, {0, 11, 22, 33});
  CHECK(replay.captures() == 0);
  out = replay.run({x0, s});  // captured: s += x0
  expect(s, {0, 12, 24, 36});
  expect(out.at(0), {0, 14, 28, 42});
  const Tensor kept = out.at(0);
  out = replay.run({x0 * 2, s});  // replayed: the new x is copied in; kept stays
  expect(s, {0, 14, 28, 42});
  expect(out.at(0), {0, 18, 36, 54});
  expect(kept, {0, 14, 28, 42});
  CHECK(replay.captures() == 1);
  CHECK(replay.replays() == 2);
  // A replay writes s in place as the program's run does: its version moves on.
  const uint64_t version = s.storage()->version.load();
  replay.run({x0, s});
  CHECK(s.storage()->version > version);
  expect(s, {0, 15, 30, 45});
  // A new s: captured again, for the new memory.
  Tensor s2 = ones({4});
  out = replay.run({x0, s2});
  expect(s2, {1, 2, 3, 4});
  CHECK(replay.captures() == 2);
  // An s that moves every call: past kMaxCaptures, runs uncaptured, still right.
  for (int64_t i = 0; i < GraphReplay::kMaxCaptures; ++i) {
    Tensor moving = full({4}, 1.0 * static_cast<double>(i));
    out = replay.run({x0, moving});
    expect(moving, {static_cast<float>(i), static_cast<float>(i) + 1, static_cast<float>(i) + 2, static_cast<float>(i) + 3});
  }
  CHECK(replay.captures() == GraphReplay::kMaxCaptures);
  CHECK_THAT(replay.skip_reason(), Contains("kept moving"));
  CHECK(replay.uncaptured_runs() >= 2);

  // Unstaged inputs may share memory (they are used where they are): two halves of one
  // buffer, captured, replayed.
  const Tensor halves = arange(0, 8, 1, {.dtype = DType::f32});
  const Tensor lo = halves.slice(0, 0, 4), hi = halves.slice(0, 4, 8);
  const TracedFunction two = [&lo, &hi](const Args& a) -> Args { return {a[0] + lo * hi}; };
  Trace t2 = trace(two, {x0});
  auto program2 = std::make_shared<Program>(run_pipeline(t2.graph, default_compile_passes(), nullptr, false));
  GraphReplay sharing(program2, staged_inputs(t2), [&captures] { return std::make_unique<CpuRecorder>(&captures); });
  for (int call = 0; call < 3; ++call) expect(sharing.run(t2.inputs_for({x0})).at(0), {0, 6, 14, 24});
  CHECK(sharing.captures() == 1);
  // A result that views an unstaged input is a view of the caller's memory, a new tensor
  // object each call.
  const TracedFunction view_out = [&hi](const Args& a) -> Args { return {a[0] * 3, hi.unsqueeze(0)}; };
  Trace t3 = trace(view_out, {x0});
  auto program3 = std::make_shared<Program>(run_pipeline(t3.graph, default_compile_passes(), nullptr, false));
  GraphReplay views(program3, staged_inputs(t3), [&captures] { return std::make_unique<CpuRecorder>(&captures); });
  std::vector<Tensor> seen;
  for (int call = 0; call < 3; ++call) {
    const std::vector<Tensor> r = views.run(t3.inputs_for({x0}));
    expect(r.at(1).reshape({4}), {4, 5, 6, 7});
    CHECK(r.at(1).storage() == halves.storage());
    for (const Tensor& earlier : seen) CHECK_FALSE(earlier.same(r.at(1)));
    seen.push_back(r.at(1));
  }
  CHECK(views.captures() == 1);
  CHECK(sharing.skip_reason().empty());

  // A staged input sharing memory with another: not captured (its copy would stop sharing it).
  GraphReplay shared(program, staged, [&captures] { return std::make_unique<CpuRecorder>(&captures); });
  Tensor both = zeros({4});
  shared.run({both, both});
  shared.run({both, both});
  CHECK_THAT(shared.skip_reason(), Contains("shares memory with another input"));
  CHECK(shared.captures() == 0);

  // A capture that fails: the run goes on uncaptured, with the reason kept.
  GraphReplay failing(program, staged, [] { return std::make_unique<FailingRecorder>(); });
  Tensor s3 = zeros({4});
  failing.run({x0, s3});
  out = failing.run({x0, s3});
  expect(s3, {0, 2, 4, 6});
  expect(out.at(0), {0, 4, 8, 12});
  CHECK_THAT(failing.skip_reason(), Contains("capture failed") && Contains("stand-in"));

  // The CUDA recorder refuses a CPU program, saying why.
  GraphReplay cpu(program, staged, std::shared_ptr<cuda::MemPool>());
  CHECK(cpu.skip_reason() == "the graph runs on the CPU");
  Tensor s4 = zeros({4});
  cpu.run({x0, s4});
  expect(s4, {0, 1, 2, 3});
}
