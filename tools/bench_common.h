#pragma once
// What kiln-bench's subcommands share (tools/bench.cpp, tools/bench_convs.cpp).
#include <algorithm>
#include <cstdint>
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
