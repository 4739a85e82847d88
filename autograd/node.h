#pragma once
// The backward graph. A Node turns the gradients of its forward op's outputs into the
// gradients of that op's inputs, and sends each along an Edge to the node that made the
// input (or to the AccumulateGrad node of a leaf).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/registry.h"

namespace kiln {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: the input needs no gradient
  uint32_t input_nr = 0;       // which of node's outputs-of-forward this gradient is for
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  virtual ~Node() = default;
  // grads[i] is the gradient of forward output i (undefined when nothing flowed to it);
  // returns one gradient per next edge (undefined for inputs that need none).
  virtual std::vector<Tensor> apply(std::vector<Tensor> grads) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors once the graph is not retained.
  virtual void release() {}

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  uint32_t num_outputs() const { return num_outputs_; }
  // Hooks on forward output k (register_hook on a non-leaf): run before apply.
  std::map<uint32_t, std::map<int, std::function<Tensor(const Tensor&)>>>& output_hooks() {
    return output_hooks_;
  }

 protected:
  std::vector<Edge> next_edges_;
  uint32_t num_outputs_ = 1;

 private:
  std::map<uint32_t, std::map<int, std::function<Tensor(const Tensor&)>>> output_hooks_;
};

}  // namespace kiln
