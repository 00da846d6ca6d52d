// create_operation: Param alternative -> op factory; run_operation convenience.
#include "tboost/ops/operation.h"

#include "src/core/overload.h"
#include "src/ops/ops.h"
#include "tboost/graph/executor.h"

namespace tboost {

std::unique_ptr<Operation> create_operation(const AnyParam& param) {
  using namespace ops_internal;
  return std::visit(
      Overload{[](const ops::LinearParam& p) { return make_linear(p); },
               [](const ops::RmsNormParam& p) { return make_rms_norm(p); },
               [](const ops::LayerNormParam& p) { return make_layer_norm(p); },
               [](const ops::RopeParam& p) { return make_rope(p); },
               [](const ops::ActivationParam& p) { return make_activation(p); },
               [](const ops::SoftmaxParam& p) { return make_softmax(p); },
               [](const ops::ElementwiseParam& p) { return make_elementwise(p); },
               [](const ops::EmbeddingParam& p) { return make_embedding(p); },
               [](const ops::AttentionParam& p) { return make_self_attention(p); },
               [](const ops::PagedAttentionParam& p) { return make_paged_attention(p); },
               [](const ops::ReshapeAndCacheParam& p) { return make_reshape_and_cache(p); },
               [](const ops::MatMulParam& p) { return make_matmul(p); },
               [](const ops::ReduceParam& p) { return make_reduce(p); },
               [](const ops::TransposeParam& p) { return make_transpose(p); },
               [](const ops::ConcatParam& p) { return make_concat(p); },
               [](const ops::GatherParam& p) { return make_gather(p); },
               [](const ops::WhereParam& p) { return make_where(p); },
               [](const ops::CompareParam& p) { return make_compare(p); },
               [](const ops::GraphParam& p) -> std::unique_ptr<Operation> {
                 return graph::make_graph_executor(p.graph);
               }},
      param);
}

void run_operation(Operation& op, const VariantPack& pack, Context& ctx) {
  const size_t ws = op.setup(pack, ctx);
  op.execute(pack, ws ? ctx.workspace(ws) : nullptr, ws, ctx);
}

}  // namespace tboost
