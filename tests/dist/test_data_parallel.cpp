// DistributedDataParallel on 2 and 3 processes against one process with the whole batch.
//
// Tolerances: every rank and the reference sum the same per-sample gradient terms, split
// over ranks and micro-batches and added in other orders (and the ranks' average divides by
// the world size and multiplies it back through the weights). A parameter's gradient sums
// at most 9 samples x 144 terms (the conv's 4 x 6 x 6 positions), so two orders differ by at
// most summation_bound(9 * 144) of the terms' magnitudes: ~1.5e-4 in f32, ~3e-13 in f64
// (tests/tolerance.h). Three SGD steps with momentum carry that into the weights, which are
// compared by norm per parameter at the figures, 1e-5 (f32) and 1e-10 (f64): both
// hold with a wide margin here, and a wrong weighting (local shares in the short last
// batch) misses them by orders of magnitude (3.6e-2).
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <thread>

#include "dist/data_parallel.h"
#include "dist/sync_batch_norm.h"
#include "rank_testing.h"
#include "testing.h"

using namespace kiln;

namespace {

struct Config {
  std::string model;     // "mlp", "cnn" or "cnnbn" (a batch norm, SyncBatchNorm on the ranks)
  DType dtype = DType::f64;
  int64_t micro_batch = 0;  // 0: one backward per step, no Accumulation (hooks sync it)
  bool compiled = false;
  double bucket_cap_mb = 25;
  bool views = false;  // gradient_as_bucket_view
};

Config parse(const std::string& text) {  // "mlp:f64:2:eager:0.0001", ":views" at the end for views
  std::vector<std::string> f;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ':');) f.push_back(part);
  REQUIRE((f.size() == 5 || (f.size() == 6 && f[5] == "views")));
  return {f[0], f[1] == "f32" ? DType::f32 : DType::f64, std::stoll(f[2]), f[3] == "compiled", std::stod(f[4]),
          f.size() == 6};
}

std::shared_ptr<nn::Module> make_model(const Config& c, uint64_t seed) {
  manual_seed(seed);
  std::shared_ptr<nn::Module> m;
  if (c.model == "mlp") {
    m = std::make_shared<models::MLP>(std::vector<int64_t>{6, 16, 3});
  } else if (c.model == "cnn") {
    m = std::make_shared<nn::Sequential>(nn::Conv2d(2, 4, 3, {.padding = 1}), nn::ReLU(), nn::MaxPool2d({2, 2}),
                                         nn::Flatten(), nn::Linear(4 * 3 * 3, 3));
  } else {
    m = std::make_shared<nn::Sequential>(nn::Conv2d(2, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU(),
                                         nn::MaxPool2d({2, 2}), nn::Flatten(), nn::Linear(4 * 3 * 3, 3));
  }
  m->to(c.dtype);
  return m;
}

Tensor inputs(const Config& c, int64_t n, uint64_t seed) {
  manual_seed(seed);
  return (c.model == "mlp" ? randn({n, 6}) : randn({n, 2, 6, 6})).to(c.dtype);
}

// The largest ||a - b|| / ||b|| over the parameters (or the floating buffers).
double worst_relative(nn::Module& a, nn::Module& b, bool buffers = false) {
  auto floating = [&](nn::Module& m) {
    if (!buffers) return m.named_parameters();
    std::vector<std::pair<std::string, Tensor>> all;
    for (auto& [name, t] : m.named_buffers())
      if (is_floating(t.dtype())) all.emplace_back(name, t);
    return all;
  };
  const auto pa = floating(a), pb = floating(b);
  REQUIRE(pa.size() == pb.size());
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::vector<double> x = testing::values(pa[i].second), y = testing::values(pb[i].second);
    double diff = 0, norm = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      diff += (x[k] - y[k]) * (x[k] - y[k]);
      norm += y[k] * y[k];
    }
    worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

void run_config(const Config& c, int rank, int world) {
  INFO("config " << c.model << " " << fmt::format("{}", c.dtype) << " micro-batch " << c.micro_batch
                 << (c.compiled ? " compiled" : " eager") << " bucket cap " << c.bucket_cap_mb << " MiB"
                 << (c.views ? ", gradients as bucket views" : ""));
  const double tol = c.dtype == DType::f64 ? 1e-10 : 1e-5;
  auto reference = make_model(c, 100);          // rank 0's initial weights
  auto local = make_model(c, 100 + static_cast<uint64_t>(rank));  // made different on purpose
  // Batch norm over the whole global batch, as the reference's: SyncBatchNorm.
  const int64_t synced = c.model == "cnnbn" ? dist::convert_sync_batchnorm(*local) : 0;
  dist::DistributedDataParallel ddp(*local, {.bucket_cap_mb = c.bucket_cap_mb, .gradient_as_bucket_view = c.views});
  REQUIRE(worst_relative(*local, *reference) == 0);  // the broadcast from rank 0
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD opt(local->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::Accumulation acc({.batch = 9, .micro_batch = c.micro_batch > 0 ? c.micro_batch : 9});
  if (c.micro_batch > 0) ddp.attach(acc);

  compiler::CompiledFunction compiled;
  if (c.compiled) {
    compiled = compiler::compile([&local](const std::vector<Tensor>& a) -> std::vector<Tensor> {
      Tensor loss = mse_loss((*local)(a[0]), a[1]) * a[2].to(a[0].dtype());
      loss.backward();
      return {loss};
    });
  }
  dist::ProcessGroup& group = ddp.group();
  const std::vector<int64_t> global_sizes = {9, 9, 5};  // the last global batch is short
  for (size_t step = 0; step < global_sizes.size(); ++step) {
    const int64_t n = global_sizes[step];
    Tensor x = inputs(c, n, 1000 + step);
    Tensor y = inputs(Config{"mlp", c.dtype}, n, 2000 + step).narrow(1, 0, 3).contiguous();
    // One process, the whole batch.
    Tensor loss = mse_loss((*reference)(x), y);
    loss.backward();
    ref_opt.step();
    ref_opt.zero_grad();
    // This rank's shard: balanced contiguous pieces (5 over 3 ranks: 2, 2, 1).
    const int64_t share = n / world + (rank < n % world ? 1 : 0);
    const int64_t start = rank * (n / world) + std::min<int64_t>(rank, n % world);
    REQUIRE(ddp.global_samples(share) == n);
    const Tensor xr = x.narrow(0, start, share), yr = y.narrow(0, start, share);
    const int64_t before = group.counts().all_reduce;
    for (const optim::MicroBatch& mb : acc.split_shard(xr, yr, {.samples = n, .world_size = world})) {
      auto sync = ddp.no_sync(!mb.is_last);
      if (c.compiled) compiled({mb.x, mb.y, mb.weight});
      else mb.scale(mse_loss((*local)(mb.x), mb.y)).backward();
      mb.finish();
      if (!mb.is_last) REQUIRE(group.counts().all_reduce == before);  // none on the other micro-steps
    }
    // Without the accumulation's hook: a no-op after an eager backward (its hooks synced
    // it), the whole sync after a compiled step (whose program runs no hooks).
    if (c.micro_batch == 0) ddp.finish_sync();
    // The buckets', and each synced batch norm's forward and backward all-reduce.
    REQUIRE(group.counts().all_reduce - before == ddp.bucket_count() + 2 * synced);
    opt.step();
    opt.zero_grad();
    INFO("step " << step);
    REQUIRE(worst_relative(*local, *reference) <= tol);
    if (synced) REQUIRE(worst_relative(*local, *reference, true) <= tol);
  }
}

}  // namespace

TEST_CASE("rank: data parallel steps", "[.rank]") {
  dist::init_process_group({.backend = "gloo", .timeout = std::chrono::seconds(30)});
  const int rank = dist::get_rank(), world = dist::get_world_size();
  std::stringstream configs(std::getenv("KILN_TEST_DDP"));
  for (std::string text; std::getline(configs, text, ',');) run_config(parse(text), rank, world);
  dist::destroy_process_group();
}

// The GradScaler needs nothing of its own under data parallelism: it unscales gradients
// that are already averaged over the ranks, and an infinity or NaN on one rank makes the
// average non-finite on every rank, so all of them skip the step and back off together.
TEST_CASE("rank: an overflow on one rank skips the step on all", "[.rank]") {
  dist::init_process_group({.backend = "gloo", .timeout = std::chrono::seconds(30)});
  const int rank = dist::get_rank();
  manual_seed(0);
  models::MLP model({6, 8, 3});
  dist::DistributedDataParallel ddp(model);
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  optim::GradScaler scaler;
  const std::vector<double> before = testing::values(model.parameters()[0]);
  Tensor x = randn({4, 6});
  if (rank == 1) x = x * std::numeric_limits<float>::infinity();  // only this rank overflows
  scaler.scale(mse_loss(model(x), zeros({4, 3}))).backward();
  scaler.step(opt);
  scaler.update();
  CHECK(testing::values(model.parameters()[0]) == before);  // skipped everywhere
  CHECK(scaler.get_scale() == 32768.0);                      // 2^16 backed off by half
  // The next, clean step goes through on every rank.
  opt.zero_grad();
  scaler.scale(mse_loss(model(randn({4, 6})), zeros({4, 3}))).backward();
  scaler.step(opt);
  CHECK(testing::values(model.parameters()[0]) != before);
  dist::destroy_process_group();
}

// A rank killed between two steps: the others' next backward (whose hooks all-reduce the
// buckets) throws an error naming the collective and the rank, within the timeout.
TEST_CASE("rank: a rank is killed between data-parallel steps", "[.rank]") {
  dist::init_process_group({.backend = "gloo", .timeout = std::chrono::seconds(10)});
  const int rank = dist::get_rank(), world = dist::get_world_size();
  manual_seed(0);
  models::MLP model({6, 8, 3});
  dist::DistributedDataParallel ddp(model);
  Tensor x = randn({4, 6});
  mse_loss(model(x), zeros({4, 3})).backward();
  if (rank == world - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the others read the last bytes
    std::raise(SIGKILL);
  }
  const auto start = std::chrono::steady_clock::now();
  model.zero_grad();
  REQUIRE_THROWS_WITH(mse_loss(model(x), zeros({4, 3})).backward(),
                      Catch::Contains("DistributedDataParallel: syncing the gradients failed: all_reduce(") &&
                          Catch::Contains("on rank " + std::to_string(rank) + " of " + std::to_string(world)));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("a rank killed between data-parallel steps makes the others' backward fail", "[dist]") {
  const std::vector<testing::RankExit> exits =
      testing::run_ranks({.test_case = "rank: a rank is killed between data-parallel steps", .world_size = 3, .limit_s = 30});
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << " said:\n" << exits[static_cast<size_t>(r)].output);
    CHECK(exits[static_cast<size_t>(r)].status == 0);
  }
  CHECK(exits[2].signal == SIGKILL);
}

TEST_CASE("an overflow on one rank makes every rank's GradScaler skip the step", "[dist]") {
  testing::require_ranks_pass({.test_case = "rank: an overflow on one rank skips the step on all", .world_size = 2});
}

TEST_CASE("data parallel on 2 and 3 ranks equals one process with the whole batch", "[dist]") {
  // MLP and CNN (no batch norm), f64 and f32, one backward per step (the hooks sync) and
  // micro-batches of 2 (attached to the accumulation), one bucket and one per parameter.
  const std::string eager =
      "mlp:f64:0:eager:25,mlp:f64:2:eager:0.0001,mlp:f32:2:eager:25,cnn:f64:2:eager:0.0001,cnn:f32:0:eager:25";
  for (int world : {2, 3}) {
    INFO(world << " ranks");
    testing::require_ranks_pass(
        {.test_case = "rank: data parallel steps", .world_size = world, .env = {{"KILN_TEST_DDP", eager}}});
  }
}

TEST_CASE("data parallel with SyncBatchNorm equals one process with BatchNorm over the whole batch", "[dist]") {
  // One backward per step (batch norm's statistics are the micro-batch's, so micro-batches
  // would not match the whole batch), the short last batch giving a rank a single sample.
  for (int world : {2, 3}) {
    INFO(world << " ranks");
    testing::require_ranks_pass({.test_case = "rank: data parallel steps", .world_size = world,
                                 .env = {{"KILN_TEST_DDP", "cnnbn:f64:0:eager:25,cnnbn:f32:0:eager:0.0001"}}});
  }
}

TEST_CASE("data parallel with a compiled micro-step syncs after it", "[dist]") {
  testing::require_ranks_pass({.test_case = "rank: data parallel steps", .world_size = 2,
                               .env = {{"KILN_TEST_DDP", "mlp:f32:2:compiled:0.0001,mlp:f64:0:compiled:25"}}});
}

// Gradients as views into the buckets against the copying path, on ranks with different
// data: two replicas from the same weights, each stepped by its own SGD with momentum, one
// synced by copies and one by views, must hold the same gradients and weights bit for bit
// (the all-reduce sums the same buckets; only where the gradients live differs). With
// zero_grad(set_to_none = false) the views stay and, after the first step, no gradient is
// copied either way; with set_to_none every step copies each gradient in once (backward
// makes a fresh .grad) and re-points it, and no average is ever copied out.
TEST_CASE("rank: gradients as bucket views", "[.rank]") {
  dist::init_process_group({.backend = "gloo", .timeout = std::chrono::seconds(30)});
  const int rank = dist::get_rank();
  for (bool set_to_none : {true, false}) {
    INFO("zero_grad(set_to_none = " << set_to_none << ")");
    manual_seed(7);
    models::MLP copied({6, 16, 3});
    manual_seed(7);
    models::MLP viewed({6, 16, 3});
    const int64_t params = static_cast<int64_t>(viewed.parameters().size());
    // Several buckets (each bias and weight apart), rebuilt after the first step.
    dist::DistributedDataParallel ddp_copied(copied, {.bucket_cap_mb = 0.0001});
    dist::DistributedDataParallel ddp_viewed(viewed, {.bucket_cap_mb = 0.0001, .gradient_as_bucket_view = true});
    optim::SGD opt_copied(copied.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt_viewed(viewed.parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step);
      manual_seed(static_cast<uint64_t>(100 * step + rank));  // each rank its own data
      const Tensor x = randn({4, 6}), y = randn({4, 3});
      ddp_viewed.reset_sync_stats();
      for (auto [model, ddp] : {std::pair<nn::Module*, dist::DistributedDataParallel*>{&copied, &ddp_copied},
                                {&viewed, &ddp_viewed}}) {
        {
          auto sync = ddp->no_sync();  // an accumulation micro-step: into .grad (the views), no all-reduce
          mse_loss(model->forward(x.narrow(0, 0, 2)), y.narrow(0, 0, 2)).backward();
        }
        mse_loss(model->forward(x.narrow(0, 2, 2)), y.narrow(0, 2, 2)).backward();
      }
      const dist::SyncStats stats = ddp_viewed.sync_stats();
      CHECK(stats.gradients_copied_out == 0);
      CHECK(stats.gradients_copied_in == (set_to_none || step == 0 ? params : 0));
      const auto pc = copied.parameters(), pv = viewed.parameters();
      for (size_t i = 0; i < pc.size(); ++i) REQUIRE(testing::same_bits(pv[i].grad(), pc[i].grad()));
      // The optimizer reads the averaged gradients through the views.
      opt_copied.step();
      opt_viewed.step();
      for (size_t i = 0; i < pc.size(); ++i) REQUIRE(testing::same_bits(pv[i], pc[i]));
      opt_copied.zero_grad(set_to_none);
      opt_viewed.zero_grad(set_to_none);
      for (const Tensor& p : pv) {
        if (set_to_none) CHECK_FALSE(p.grad().defined());
        else CHECK(testing::values(p.grad()) == std::vector<double>(static_cast<size_t>(p.numel()), 0.0));
      }
    }
  }
  dist::destroy_process_group();
}

TEST_CASE("gradients as bucket views equal the copying path and copy nothing with kept views", "[dist]") {
  testing::require_ranks_pass({.test_case = "rank: gradients as bucket views", .world_size = 2});
}

TEST_CASE("data parallel with gradients as bucket views equals one process with the whole batch", "[dist]") {
  // Micro-batches and the short last batch, several buckets, and a compiled micro-step.
  testing::require_ranks_pass(
      {.test_case = "rank: data parallel steps", .world_size = 2,
       .env = {{"KILN_TEST_DDP", "mlp:f64:2:eager:0.0001:views,cnn:f32:0:eager:25:views,mlp:f32:2:compiled:0.0001:views"}}});
}

TEST_CASE("DistributedDataParallel buckets parameters in reverse order under the cap", "[dist]") {
  dist::ProcessGroup group({.backend = "gloo", .timeout = std::chrono::seconds(10), .rank = 0, .world_size = 1});
  models::MLP model({6, 16, 3});  // 0.weight 96, 0.bias 16, 2.weight 48, 2.bias 3 elements of 4 bytes
  {
    dist::DistributedDataParallel ddp(model, {.group = &group});
    CHECK(ddp.bucket_names() == std::vector<std::vector<std::string>>{{"2.bias", "2.weight", "0.bias", "0.weight"}});
  }
  dist::DistributedDataParallel ddp(model, {.bucket_cap_mb = 256.0 / (1 << 20), .group = &group});
  CHECK(ddp.bucket_names() ==
        std::vector<std::vector<std::string>>{{"2.bias", "2.weight"}, {"0.bias"}, {"0.weight"}});
  REQUIRE_THROWS_WITH(dist::DistributedDataParallel(model, {.bucket_cap_mb = 0, .group = &group}),
                      Catch::Contains("bucket_cap_mb must be positive"));
}

namespace {
// Registered a then b, used b then a: backward makes a's gradients first.
struct Swapped : nn::Module {
  nn::Linear a = add("a", nn::Linear(4, 4));
  nn::Linear b = add("b", nn::Linear(4, 4));
  nn::Linear frozen = add("frozen", nn::Linear(4, 4));
  Tensor forward(const Tensor& x) override { return a(b(x)); }
};
}  // namespace

TEST_CASE("DistributedDataParallel rebuilds its buckets in the order gradients came", "[dist]") {
  dist::ProcessGroup group({.backend = "gloo", .timeout = std::chrono::seconds(10), .rank = 0, .world_size = 1});
  Swapped model;
  for (Tensor p : model.frozen.parameters()) p.requires_grad_(false);
  // 70 bytes: a weight (64 bytes) and a bias (16) do not fit together.
  dist::DistributedDataParallel ddp(model, {.bucket_cap_mb = 70.0 / (1 << 20), .group = &group});
  using Names = std::vector<std::vector<std::string>>;
  CHECK(ddp.bucket_names() == Names{{"b.bias"}, {"b.weight"}, {"a.bias"}, {"a.weight"}});
  Tensor x = randn({3, 4});
  sum(model(x)).backward();
  const Names after = ddp.bucket_names();
  REQUIRE(after.size() == 4);
  CHECK((after[0][0].starts_with("a.") && after[1][0].starts_with("a.")));
  CHECK((after[2][0].starts_with("b.") && after[3][0].starts_with("b.")));
  // Synced gradients stay the plain ones (one rank: the average is the gradient itself).
  const Tensor g = model.a.parameters()[0].grad().clone();
  model.zero_grad();
  sum(model(x)).backward();
  CHECK(testing::values(model.a.parameters()[0].grad()) == testing::values(g));
  CHECK(group.counts().all_reduce == 8);  // 4 buckets, 2 steps
  CHECK(group.counts().broadcast == 6 + 1);  // 6 tensors at construction, the agreed order once
}

TEST_CASE("DistributedDataParallel syncs unused parameters in finish_sync, and says when it was not called", "[dist]") {
  dist::ProcessGroup group({.backend = "gloo", .timeout = std::chrono::seconds(10), .rank = 0, .world_size = 1});
  Swapped model;  // `frozen` takes part here, but forward never uses it
  dist::DistributedDataParallel ddp(model, {.group = &group});
  Tensor x = randn({3, 4});
  sum(model(x)).backward();
  CHECK(group.counts().all_reduce == 0);  // the one bucket waits for frozen's gradients
  ddp.finish_sync();
  CHECK(group.counts().all_reduce == 1);
  CHECK(testing::values(model.frozen.parameters()[0].grad()) == std::vector<double>(16, 0.0));  // zeros: no gradient anywhere
  sum(model(x)).backward();  // without finish_sync, a second backward would mark a.weight twice
  REQUIRE_THROWS_WITH(sum(model(x)).backward(), Catch::Contains("got a second gradient") && Catch::Contains("finish_sync"));
}
