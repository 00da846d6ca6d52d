// ONNX import when the build has no libonnx (see include/tboost/graph/onnx.h).
#include "tboost/core/error.h"
#include "tboost/graph/onnx.h"

namespace tboost::graph {

bool onnx_import_available() { return false; }

Graph import_onnx(const std::string& path, const Bindings&, OnnxInfo*) {
  throw Error(ErrorCode::kUnsupported,
              "ONNX import: this build has no ONNX support (install libonnx-dev, libprotobuf-dev "
              "and protobuf-compiler, then reconfigure) so '" +
                  path + "' cannot be read");
}

}  // namespace tboost::graph
