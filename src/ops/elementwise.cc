// STUB (to be replaced in this change).
#include "src/ops/ops.h"
#include "tboost/core/error.h"
namespace tboost::ops_internal {
std::unique_ptr<Operation> make_elementwise(const ops::ElementwiseParam&) { TBOOST_THROW(ErrorCode::kUnsupported, "elementwise not built"); }
}
