// ONNX import: an .onnx model (opset 13-17, as torch.onnx.export writes it) onto our ops.
//
// The input dims that are symbolic in the file are bound at import: dim 0 to dims["batch"],
// dim 1 to dims["seq"] (or by the dim's own name when `dims` has it). With every shape known,
// the shape arithmetic exporters emit (Shape, Gather, Unsqueeze, Concat, Range, masks built
// from constants ...) is evaluated once, here, and becomes constants; what depends on input
// values maps onto ops: MatMul, Gemm (-> Linear), Add/Sub/Mul/Div/Pow, Sqrt/Tanh/Erf/Exp/...,
// LayerNormalization, ReduceMean/ReduceSum, Softmax (last axis), Transpose, Concat, Gather
// (Embedding for tables), Cast, Where, comparisons and logic, and views for Reshape, Flatten,
// Squeeze, Unsqueeze, Split, Slice and Expand. Anything else is an error naming the node and
// its op type. Initializers are read into memory (raw or typed fields).
#pragma once

#include <string>

#include "tboost/graph/graph.h"

namespace tboost::graph {

struct OnnxInfo {
  int64_t nodes = 0;      // nodes in the file
  int64_t constants = 0;  // of them Constant nodes
  int64_t opset = 0;
  std::string producer;
};

// Throws tboost::Error (kIo for unreadable files, kUnsupported for ops or features we do not
// map, kInvalidArgument for malformed models) naming the node.
Graph import_onnx(const std::string& path, const Bindings& dims, OnnxInfo* info = nullptr);

// Whether this build can import ONNX (libonnx found at configure time).
bool onnx_import_available();

}  // namespace tboost::graph
