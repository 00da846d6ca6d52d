// Factories of the built-in operations (one per op file), used by create_operation.
#pragma once

#include <memory>

#include "tboost/ops/operation.h"

namespace tboost::ops_internal {
std::unique_ptr<Operation> make_linear(const ops::LinearParam& p);
std::unique_ptr<Operation> make_rms_norm(const ops::RmsNormParam& p);
std::unique_ptr<Operation> make_layer_norm(const ops::LayerNormParam& p);
std::unique_ptr<Operation> make_rope(const ops::RopeParam& p);
std::unique_ptr<Operation> make_activation(const ops::ActivationParam& p);
std::unique_ptr<Operation> make_softmax(const ops::SoftmaxParam& p);
std::unique_ptr<Operation> make_elementwise(const ops::ElementwiseParam& p);
std::unique_ptr<Operation> make_embedding(const ops::EmbeddingParam& p);
std::unique_ptr<Operation> make_self_attention(const ops::AttentionParam& p);
std::unique_ptr<Operation> make_paged_attention(const ops::PagedAttentionParam& p);
std::unique_ptr<Operation> make_reshape_and_cache(const ops::ReshapeAndCacheParam& p);
std::unique_ptr<Operation> make_matmul(const ops::MatMulParam& p);
std::unique_ptr<Operation> make_reduce(const ops::ReduceParam& p);
std::unique_ptr<Operation> make_transpose(const ops::TransposeParam& p);
std::unique_ptr<Operation> make_concat(const ops::ConcatParam& p);
std::unique_ptr<Operation> make_gather(const ops::GatherParam& p);
std::unique_ptr<Operation> make_where(const ops::WhereParam& p);
std::unique_ptr<Operation> make_compare(const ops::CompareParam& p);
}  // namespace tboost::ops_internal
