// STUB (to be replaced in this change).
#include "src/ops/ops.h"
#include "tboost/core/error.h"
namespace tboost::ops_internal {
std::unique_ptr<Operation> make_softmax(const ops::SoftmaxParam&) { TBOOST_THROW(ErrorCode::kUnsupported, "softmax not built"); }
}
