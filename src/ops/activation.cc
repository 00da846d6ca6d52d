// STUB (to be replaced in this change).
#include "src/ops/ops.h"
#include "tboost/core/error.h"
namespace tboost::ops_internal {
std::unique_ptr<Operation> make_activation(const ops::ActivationParam&) { TBOOST_THROW(ErrorCode::kUnsupported, "activation not built"); }
}
