#pragma once
// What kiln-bench's subcommands share (tools/bench.cpp, tools/bench_convs.cpp).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <kiln.h>

#include "kernels/cpu/gemm.h"

namespace kiln::bench {

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The JSON field naming the GEMM that CPU products ran: figures from two machines
// compare only when they ran the same kernels (kernels/cpu/gemm.h).
inline std::string blas_field() {
  const cpu::GemmBackend backend = cpu::gemm_backend();
  if (backend == cpu::GemmBackend::eigen) return R"(,"gemm":"eigen")";
  return fmt::format(R"(,"gemm":"{}","blas_kernels":"{}")", cpu::gemm_backend_name(backend),
                     cpu::gemm_blas_kernels());
}

// The integer `value` of `option` on a kiln-bench subcommand's command line (`command`:
// "kiln-bench train"); anything else is a kiln::Error naming both.
inline int64_t parse_integer(const char* command, const std::string& option, const std::string& value) {
  try {
    size_t used = 0;
    const long long v = std::stoll(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  fail("{}: {} {}: expected an integer", command, option, value);
}

// Options are range-checked so that a typo is an error, not an allocation that fails.
inline void check_range(const char* option, int64_t v, int64_t least, int64_t most) {
  KILN_CHECK(v >= least && v <= most, "{} {} must be between {} and {}", option, v, least, most);
}

// How this run's bf16 GEMMs go (kernels/cpu/gemm.h): figures compare across machines only
// when they went the same way.
inline const char* bf16_gemm_name() {
  switch (cpu::bf16_gemm_path()) {
    case cpu::Bf16GemmPath::dnnl: return "onednn";
    case cpu::Bf16GemmPath::dot: return "avx512_bf16";
    default: return "convert_to_f32";
  }
}

// kiln-bench plan ARGS... (tools/bench_plan.cpp).
// A way of running a training step that `kiln-bench train` times (eager, compiled, ...).
struct StepMode {
  std::string name;
  std::function<void()> step;
  int64_t warmup = 0;
  std::vector<double> ms;             // the timed steps
  double peak = 0, first_call_s = 0;  // peak MiB over the rounds; the first warm-up call's time
  const compiler::CompiledFunction* compiled = nullptr;  // its graphs and profile, if compiled
};

// Warms every mode up (the first call of a compiled mode traces and compiles), then times
// `steps` steps of each in up to 5 rounds, a few steps of each mode per round, so that a
// shared machine's drift (+-20% from one minute to the next) hits every mode alike and the
// ratios hold. `step_ms` runs one step and returns its milliseconds (waiting for a GPU);
// `start_round` runs before each mode's block of steps, and `peak_mib` after it.
inline void time_in_rounds(std::vector<StepMode>& modes, int64_t steps,
                           const std::function<double(StepMode&)>& step_ms,
                           const std::function<void()>& start_round, const std::function<double()>& peak_mib) {
  for (StepMode& m : modes)
    for (int64_t i = 0; i < m.warmup; ++i) {
      const double ms = step_ms(m);
      if (i == 0) m.first_call_s = ms / 1000.0;
    }
  const int64_t rounds = std::min<int64_t>(steps, 5);
  for (int64_t r = 0; r < rounds; ++r)
    for (StepMode& m : modes) {
      start_round();
      const int64_t n = steps * (r + 1) / rounds - steps * r / rounds;
      for (int64_t i = 0; i < n; ++i) m.ms.push_back(step_ms(m));
      m.peak = std::max(m.peak, peak_mib());
    }
}

int bench_plan(int argc, char** argv);
// kiln-bench ops and ops --device cuda (tools/bench_ops.cpp).
int bench_ops();
int bench_ops_cuda();
// kiln-bench convs ARGS... (tools/bench_convs.cpp).
int bench_convs(int argc, char** argv);
// kiln-bench attention ARGS... (tools/bench_attention.cpp).
int bench_attention(int argc, char** argv);
// kiln-bench train --arch bert-*|gpt2-* ARGS... (tools/bench_text.cpp), and whether the
// command line names such an arch.
int bench_text_train(int argc, char** argv);
bool is_text_arch(int argc, char** argv);
// kiln-bench ddp ARGS... (tools/bench_ddp.cpp).
int bench_ddp(int argc, char** argv);

}  // namespace kiln::bench
