// Sequential and ModuleList.
#include "models/containers.h"

#include "core/error.h"

namespace kiln::nn {

void detail::fail_module_cast(const Module& m, int64_t index, const std::type_info& wanted) {
  fail("at: child {} is a {}, not a {}", index, m.type_name(), type_name_of(wanted));
}

Module& IndexedModules::operator[](int64_t index) const {
  const int64_t n = size();
  KILN_CHECK(index >= -n && index < n, "{}: index {} is out of range for {} modules", type_name(),
             index, n);
  return *state().children[static_cast<size_t>(index < 0 ? index + n : index)].second;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor out = x;
  for (auto& [name, child] : state().children) out = child->forward(out);
  return out;
}

}  // namespace kiln::nn
