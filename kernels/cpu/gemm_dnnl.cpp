// bf16 and f32 GEMMs through oneDNN's matmul (kernels/cpu/gemm_dnnl.h). A row-major operand stored
// with rows ld apart is a 2-d memory of strides {ld, 1}; its transpose is the same memory
// read with strides {1, ld}, so no operand is ever copied by kiln. alpha is the
// primitive's output scale and beta a sum post-op, both fixed when it is made: the GEMMs
// of a training step use a handful of (alpha, beta) pairs, mostly (1, 0) and (1, 1).
#include "kernels/cpu/gemm_dnnl.h"

#ifdef KILN_HAVE_DNNL
#include <bit>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "core/error.h"
#include "kernels/cpu/dnnl_runtime.h"
#endif

namespace kiln::cpu {

#ifndef KILN_HAVE_DNNL

const std::string& dnnl_bf16_gemm_implementation() {
  static const std::string none;
  return none;
}
const std::string& dnnl_f32_gemm_implementation() { return dnnl_bf16_gemm_implementation(); }

bool dnnl_gemm(bool, bool, int64_t, int64_t, int64_t, float, const BFloat16*, int64_t,
               const BFloat16*, int64_t, float, float*, int64_t) {
  return false;
}
bool dnnl_gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
               int64_t, float, float*, int64_t) {
  return false;
}

#else

namespace {

using dnnl::memory;
using dt = memory::data_type;

// One primitive for one shape; usable is false where oneDNN offers only its reference
// implementation, which is far slower than kiln's GEMM.
struct Entry {
  bool usable = false;
  std::string impl;
  dnnl::matmul primitive;
  memory::desc a, b, c, scratchpad;
};

// The operands' dtype (C is f32 either way), then the call's sizes, strides, alpha and beta.
using Key = std::tuple<dt, int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, uint32_t,
                       uint32_t>;

// op(X), r x s, of a matrix stored with rows ld apart (s x r stored when trans).
memory::desc operand(int64_t r, int64_t s, int64_t ld, bool trans, dt type) {
  return memory::desc({r, s}, type, trans ? memory::dims{1, ld} : memory::dims{ld, 1});
}

Entry make_entry(const Key& key) {
  const auto [type, m, n, k, trans_a, trans_b, lda, ldb, ldc, alpha_bits, beta_bits] = key;
  Entry e;
  e.a = operand(m, k, lda, trans_a, type);
  e.b = operand(k, n, ldb, trans_b, type);
  e.c = memory::desc({m, n}, dt::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const float alpha = std::bit_cast<float>(alpha_bits), beta = std::bit_cast<float>(beta_bits);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.c), attr, dnnl_engine());
    e.impl = pd.impl_info_str();
    if (e.impl.find("ref") != std::string::npos) return e;
    e.scratchpad = pd.scratchpad_desc();
    e.primitive = dnnl::matmul(pd);
    e.usable = true;
  } catch (const dnnl::error&) {
    e.usable = false;  // no implementation for these strides: kiln's GEMM runs
  }
  return e;
}

// Kept primitives, at most kMaxEntries (a model whose shapes keep changing starts over
// rather than growing without bound).
constexpr size_t kMaxEntries = 4096;

// Shared: a caller keeps its entry alive while it runs, even if the map starts over.
std::shared_ptr<const Entry> entry(const Key& key) {
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const Entry>> entries;
  std::lock_guard lock(mutex);
  if (entries.size() >= kMaxEntries) entries.clear();
  std::shared_ptr<const Entry>& e = entries[key];
  if (!e) e = std::make_shared<const Entry>(make_entry(key));
  return e;
}

std::string probe(dt type) {
  const Entry e = make_entry(Key{type, 256, 256, 256, false, false, 256, 256, 256, std::bit_cast<uint32_t>(1.0f), 0});
  return e.usable ? e.impl : std::string();
}

template <class T>
bool run_gemm(const std::string& implementation, dt type, bool trans_a, bool trans_b, int64_t m,
              int64_t n, int64_t k, float alpha, const T* a, int64_t lda, const T* b, int64_t ldb,
              float beta, float* c, int64_t ldc) {
  if (implementation.empty()) return false;
  const Key key{type, m, n, k, trans_a, trans_b, lda, ldb, ldc, std::bit_cast<uint32_t>(alpha),
                std::bit_cast<uint32_t>(beta)};
  const std::shared_ptr<const Entry> shared = entry(key);
  const Entry& e = *shared;
  if (!e.usable) return false;
  try {
    dnnl_run(e.primitive, e.scratchpad,
             {{DNNL_ARG_SRC, memory(e.a, dnnl_engine(), const_cast<T*>(a))},
              {DNNL_ARG_WEIGHTS, memory(e.b, dnnl_engine(), const_cast<T*>(b))},
              {DNNL_ARG_DST, memory(e.c, dnnl_engine(), c)}});
  } catch (const dnnl::error& err) {
    fail("gemm ({}): oneDNN ({}) failed on m={} n={} k={} (trans_a={}, trans_b={}): {}",
         type == dt::bf16 ? "bf16" : "f32", e.impl, m, n, k, trans_a, trans_b, err.what());
  }
  return true;
}

}  // namespace

const std::string& dnnl_bf16_gemm_implementation() {
  static const std::string impl = probe(dt::bf16);
  return impl;
}

const std::string& dnnl_f32_gemm_implementation() {
  static const std::string impl = probe(dt::f32);
  return impl;
}

bool dnnl_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  return run_gemm(dnnl_bf16_gemm_implementation(), dt::bf16, trans_a, trans_b, m, n, k, alpha, a,
                  lda, b, ldb, beta, c, ldc);
}

bool dnnl_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  return run_gemm(dnnl_f32_gemm_implementation(), dt::f32, trans_a, trans_b, m, n, k, alpha, a, lda,
                  b, ldb, beta, c, ldc);
}

#endif

}  // namespace kiln::cpu
