#pragma once
// Helpers of the split-run edge tests (test_split_edge.cpp, test_split_edge_results.cpp).
#include <fmt/format.h>

#include "compiler/compile.h"
#include "core/storage.h"
#include "models/module.h"
#include "testing.h"

namespace kiln::testing::split {

using namespace kiln;

using Args = std::vector<Tensor>;
inline const TensorOptions f64{.dtype = DType::f64};

// A split run must leave nothing pending: every tensor it handed out or updated is readable.
inline bool pending(const Tensor& t) { return t.defined() && is_pending(*t.storage()); }

// Tolerances: f64 pieces differ from eager only by fusion's reassociation; f32 by the same
// at single precision.
inline double rtol_for(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-5; }
inline double atol_for(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-6; }

// Parameters, their gradients and the buffers of two modules of one architecture agree
// (and none of them is pending).
inline void check_modules_close(const nn::Module& got, const nn::Module& want, double rtol, double atol) {
  const auto params = got.named_parameters(), ref_params = want.named_parameters();
  REQUIRE(params.size() == ref_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << params[i].first);
    CHECK_FALSE(pending(params[i].second));
    CHECK_FALSE(pending(params[i].second.grad()));
    KILN_CHECK_CLOSE(params[i].second, ref_params[i].second, rtol, atol);
    REQUIRE(params[i].second.grad().defined() == ref_params[i].second.grad().defined());
    if (params[i].second.grad().defined())
      KILN_CHECK_CLOSE(params[i].second.grad(), ref_params[i].second.grad(), rtol, atol);
  }
  const auto buffers = got.named_buffers(), ref_buffers = want.named_buffers();
  REQUIRE(buffers.size() == ref_buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    INFO("buffer " << buffers[i].first);
    CHECK_FALSE(pending(buffers[i].second));
    KILN_CHECK_CLOSE(buffers[i].second, ref_buffers[i].second, rtol, atol);
  }
}

inline Tensor leaf_copy(const Tensor& t) {
  Tensor c = t.detach().clone();
  c.requires_grad_();
  return c;
}

}  // namespace kiln::testing::split
