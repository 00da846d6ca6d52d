// The Operation contract.
//
//   auto op = tboost::create_operation(tboost::ops::RmsNormParam{.epsilon = 1e-6f});
//   std::vector<TensorDesc> out = op->infer_shape(in_descs);   // pure; throws on bad input
//   size_t ws = op->setup(pack, ctx);     // validates every tensor and the params, plans
//   op->execute(pack, workspace, ws, ctx);  // computes; the caller owns outputs + workspace
//
// setup validates rank, shape, dtype, data pointers and params of every input and output
// before any output byte is written; an error (tboost::Error) names the op, the tensor index
// and role, what was expected and what came. execute re-validates when the pack's shapes
// differ from the last setup, so no output is written on bad input. update(param) swaps the
// params in place (the next execute re-plans). Ops are not thread-safe: one op, one caller.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "tboost/core/context.h"
#include "tboost/core/tensor.h"
#include "tboost/ops/activation.h"
#include "tboost/ops/attention.h"
#include "tboost/ops/elementwise.h"
#include "tboost/ops/embedding.h"
#include "tboost/ops/layout.h"
#include "tboost/ops/linear.h"
#include "tboost/ops/matmul.h"
#include "tboost/ops/norm.h"
#include "tboost/ops/reduce.h"
#include "tboost/ops/rope.h"
#include "tboost/ops/select.h"
#include "tboost/ops/softmax.h"

namespace tboost {
namespace graph {
class Graph;
}
namespace ops {
// A graph as an op (graphs nest): create_operation(GraphParam{g}) compiles it (graph/executor.h).
struct GraphParam {
  std::shared_ptr<const graph::Graph> graph;
  bool operator==(const GraphParam& o) const { return graph == o.graph; }
};
}  // namespace ops

// Every op's Param; create_operation dispatches on the alternative.
using AnyParam =
    std::variant<ops::LinearParam, ops::RmsNormParam, ops::LayerNormParam, ops::RopeParam,
                 ops::ActivationParam, ops::SoftmaxParam, ops::ElementwiseParam,
                 ops::EmbeddingParam, ops::AttentionParam, ops::PagedAttentionParam,
                 ops::ReshapeAndCacheParam, ops::MatMulParam, ops::ReduceParam, ops::TransposeParam,
                 ops::ConcatParam, ops::GatherParam, ops::WhereParam, ops::CompareParam,
                 ops::GraphParam>;

class Operation {
 public:
  virtual ~Operation() = default;
  virtual const char* name() const = 0;
  // Output descriptors (contiguous) for these inputs. Pure; throws tboost::Error.
  virtual std::vector<TensorDesc> infer_shape(const std::vector<TensorDesc>& inputs) const = 0;
  // Validates the pack (inputs and outputs) and returns the workspace bytes execute needs.
  virtual size_t setup(const VariantPack& pack, Context& ctx) = 0;
  // Computes. workspace must hold at least the bytes setup returned.
  virtual void execute(const VariantPack& pack, void* workspace, size_t workspace_size,
                       Context& ctx) = 0;
  // Replaces the params; throws if the alternative is another op's Param.
  virtual void update(const AnyParam& param) = 0;
  virtual AnyParam param() const = 0;
  // What the last setup chose (kernel, ISA, path), for reports.
  virtual std::string impl_info() const { return {}; }
  // The input whose memory output `output` is (written in place, the very same view), or -1.
  // A graph gives such an output no memory of its own.
  virtual int inplace_input(size_t output) const { return -1; }
  // Whether execute checks input values (ids, slots, lengths) and can fail after a setup that
  // succeeded. A graph writes its outputs only once such checks have passed.
  virtual bool checks_input_values() const { return false; }
};

std::unique_ptr<Operation> create_operation(const AnyParam& param);

// Convenience: setup, allocate workspace from the context, execute.
void run_operation(Operation& op, const VariantPack& pack, Context& ctx);

}  // namespace tboost
