// A float64 interpreter for unfused graphs: the reference the fusion tests measure both the
// unfused and the fused run against. Deliberately naive (contiguous double tensors, index
// loops); it knows the small ops an exporter emits (Elementwise, Reduce, MatMul, Transpose,
// Concat, Softmax, Rope, Activation) and the views.
#pragma once

#include <vector>

#include "tboost/graph/graph.h"

namespace tboost::testing {

struct T64 {
  Shape shape;
  std::vector<double> v;
};

T64 to_t64(const Tensor& t);
// Runs g on the given graph inputs; returns the graph outputs.
std::vector<T64> eval64(const graph::Graph& g, const std::vector<Tensor>& inputs);
// ||out - ref|| / ||ref||
double rel_error(const Tensor& out, const T64& ref);

}  // namespace tboost::testing
