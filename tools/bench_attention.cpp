// kiln-bench attention: the memory and time of scaled_dot_product_attention's forward and
// backward (the tiled op) against the math path (matmul, softmax, matmul, which holds the
// [L, S] scores), for sequence lengths N = L = S doubling up to --max-n, one JSON line each,
// then one line with the growth of the extra peak memory from the shortest to the longest N:
// the op's is linear in N (its logsumexp and one row vector per head), the math path's
// quadratic.
#include <fmt/format.h>
#include <kiln.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tools/bench_common.h"

namespace kiln::bench {
namespace {

struct AttentionBenchOptions {
  int64_t max_n = 4096, min_n = 512, heads = 2, dim = 64;
  int64_t math_max_n =
      4096;  // the longest N the math path runs (it needs ~6 * heads * N^2 * 4 bytes)
};

AttentionBenchOptions parse_options(int argc, char** argv) {
  AttentionBenchOptions o;
  for (int i = 2; i < argc; ++i) {
    const std::string option = argv[i];
    KILN_CHECK(i + 1 < argc, "kiln-bench attention: {} needs a value", option);
    const int64_t v = parse_integer("kiln-bench attention", option, argv[++i]);
    if (option == "--max-n")
      o.max_n = v;
    else if (option == "--min-n")
      o.min_n = v;
    else if (option == "--heads")
      o.heads = v;
    else if (option == "--dim")
      o.dim = v;
    else if (option == "--math-max-n")
      o.math_max_n = v;
    else
      fail("kiln-bench attention: unknown option {}", option);
  }
  check_range("kiln-bench attention: --max-n", o.max_n, 1, 1 << 17);
  check_range("kiln-bench attention: --min-n", o.min_n, 1, o.max_n);
  check_range("kiln-bench attention: --heads", o.heads, 1, 1024);
  check_range("kiln-bench attention: --dim", o.dim, 1, 4096);
  check_range("kiln-bench attention: --math-max-n", o.math_max_n, 0, 1 << 17);
  return o;
}

struct Measure {
  double ms = 0, extra_peak_mib = 0;
};

// One forward and backward after a warm-up one: its time, and the peak of live tensor bytes
// above what was live before (the inputs and the output gradient).
Measure measure(const std::function<void()>& f) {
  f();
  empty_cpu_cache();
  const int64_t before = memory_stats().allocated;
  reset_peak_memory();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const auto t1 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double, std::milli>(t1 - t0).count(),
          static_cast<double>(memory_stats().peak - before) / 1048576.0};
}

}  // namespace

int bench_attention(int argc, char** argv) {
  const AttentionBenchOptions o = parse_options(argc, argv);
  manual_seed(0);
  std::vector<std::pair<int64_t, Measure>> fused, math;
  for (int64_t n = o.min_n; n <= o.max_n; n *= 2) {
    Tensor q = randn({1, o.heads, n, o.dim}), k = randn({1, o.heads, n, o.dim}),
           v = randn({1, o.heads, n, o.dim});
    const Tensor g = randn({1, o.heads, n, o.dim});
    for (Tensor* t : {&q, &k, &v}) t->requires_grad_();
    auto run = [&](bool use_math) {
      return measure([&] {
        const AttentionOptions opts{.is_causal = true};
        const Tensor out = use_math ? scaled_dot_product_attention_math(q, k, v, opts)
                                    : scaled_dot_product_attention(q, k, v, opts);
        out.backward(g);
      });
    };
    const Measure f = run(false);
    fused.emplace_back(n, f);
    std::string math_fields;
    if (n <= o.math_max_n) {
      const Measure m = run(true);
      math.emplace_back(n, m);
      math_fields =
          fmt::format(R"(,"math_ms":{:.1f},"math_extra_peak_mib":{:.2f})", m.ms, m.extra_peak_mib);
    }
    fmt::print(
        R"({{"bench":"attention","n":{},"heads":{},"dim":{},"dtype":"f32","causal":true,"ms":{:.1f},"extra_peak_mib":{:.2f}{}{}}})"
        "\n",
        n, o.heads, o.dim, f.ms, f.extra_peak_mib, math_fields, blas_field());
  }
  auto growth = [](const std::vector<std::pair<int64_t, Measure>>& runs) {
    return runs.size() < 2 ? 0.0
                           : runs.back().second.extra_peak_mib / runs.front().second.extra_peak_mib;
  };
  if (fused.size() >= 2) {
    const double n_ratio =
        static_cast<double>(fused.back().first) / static_cast<double>(fused.front().first);
    std::string math_growth;
    if (math.size() >= 2)
      math_growth = fmt::format(
          R"(,"math_n_ratio":{:.0f},"math_extra_peak_growth":{:.2f})",
          static_cast<double>(math.back().first) / static_cast<double>(math.front().first),
          growth(math));
    fmt::print(
        R"({{"bench":"attention_memory_growth","n_ratio":{:.0f},"extra_peak_growth":{:.2f}{},"note":"linear in N: growth ~ n_ratio; quadratic: ~ n_ratio^2"}})"
        "\n",
        n_ratio, growth(fused), math_growth);
  }
  return 0;
}

}  // namespace kiln::bench
