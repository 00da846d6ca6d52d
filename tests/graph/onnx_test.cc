// ONNX import: tiny GPT-2 and BERT exported by scripts/make_onnx_models.py --tiny (random
// weights, committed with onnxruntime's outputs on their golden inputs) import, run before and
// after the passes, and match onnxruntime; bad files and unsupported ops are named errors.
#include "tboost/graph/onnx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tboost/graph/executor.h"
#include "tboost/graph/passes.h"
#include "tools/tboost/npy.h"

namespace tboost::testing {
namespace {

const std::string kData = std::string(TBOOST_SOURCE_DIR) + "/tests/data/onnx/";

std::vector<Tensor> run(const graph::Graph& g, const std::vector<Tensor>& in) {
  auto ex = graph::make_graph_executor(std::make_shared<graph::Graph>(g));
  std::vector<TensorDesc> d;
  for (const Tensor& t : in) d.push_back(t.desc());
  VariantPack pack{in, {}};
  for (const TensorDesc& o : ex->infer_shape(d))
    pack.outputs.push_back(Tensor::empty(o.dtype, o.shape()));
  Context ctx;
  run_operation(*ex, pack, ctx);
  return pack.outputs;
}

double rel_error(const Tensor& a, const Tensor& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double e = double(a.data_as<float>()[i]) - ref.data_as<float>()[i];
    num += e * e;
    den += double(ref.data_as<float>()[i]) * ref.data_as<float>()[i];
  }
  return std::isnan(num) ? INFINITY : std::sqrt(num / den);
}

struct Model {
  const char* dir;
  const char* reference;
  std::vector<std::string> fire;
};

TEST(OnnxImport, TinyModelsMatchOnnxRuntimeBeforeAndAfterThePasses) {
  if (!graph::onnx_import_available()) GTEST_SKIP() << "built without libonnx";
  const Model models[] = {
      {"gpt2_tiny",
       "ort_logits.npy",
       {"attention", "gelu", "linear_residual", "linear_activation"}},
      {"bert_tiny",
       "ort_last_hidden_state.npy",
       {"attention", "gelu", "merge_linears", "linear_bias", "linear_residual"}}};
  for (const Model& m : models) {
    SCOPED_TRACE(m.dir);
    const std::string dir = kData + m.dir + "/";
    const Tensor ids = npy::load(dir + "input_ids.npy");
    graph::OnnxInfo info;
    graph::Graph g =
        graph::import_onnx(dir + "model.onnx", {{"batch", ids.dim(0)}, {"seq", ids.dim(1)}}, &info);
    EXPECT_EQ(info.opset, 17);
    EXPECT_GT(info.nodes, g.op_count());  // shape arithmetic folded at import
    std::vector<Tensor> in;
    for (graph::TensorId id : g.inputs()) in.push_back(npy::load(dir + g.tensor(id).name + ".npy"));
    const Tensor ref = npy::load(dir + m.reference);
    const std::vector<Tensor> y0 = run(g, in);
    // onnxruntime computes in f32 too, in another order: both are within a few f32 ulps.
    EXPECT_LT(rel_error(y0[0], ref), 1e-5);
    std::vector<TensorDesc> d;
    for (const Tensor& t : in) d.push_back(t.desc());
    graph::Graph f = g;
    const graph::OptimizeResult r = graph::optimize(f, d);
    for (const std::string& p : m.fire) EXPECT_GT(r.fired.at(p), 0) << p;
    EXPECT_LE(f.op_count() * 2, g.op_count());
    const std::vector<Tensor> y1 = run(f, in);
    EXPECT_LT(rel_error(y1[0], ref), 1e-5);
    const graph::GraphReport before = graph::report(g, d), after = graph::report(f, d);
    EXPECT_LT(after.bytes_moved * 3, before.bytes_moved * 2);
    EXPECT_LT(after.memory.arena_bytes, before.memory.arena_bytes);
  }
}

TEST(OnnxImport, BadFilesAreNamedErrors) {
  if (!graph::onnx_import_available()) GTEST_SKIP() << "built without libonnx";
  auto expect = [](const std::string& path, ErrorCode code, const std::string& what) {
    try {
      graph::import_onnx(path, {{"batch", 1}, {"seq", 16}});
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect("/nonexistent/model.onnx", ErrorCode::kIo, "cannot open");
  // A truncated copy of a real model.
  const std::string trunc = ::testing::TempDir() + "truncated.onnx";
  {
    std::ifstream src(kData + "gpt2_tiny/model.onnx", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(src)), std::istreambuf_iterator<char>());
    std::ofstream(trunc, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 3));
  }
  expect(trunc, ErrorCode::kInvalidArgument, "not a valid ONNX model");
  std::remove(trunc.c_str());
  expect(kData + "unsupported_op.onnx", ErrorCode::kUnsupported,
         "node 'bad_node' (Hardmax): op type 'Hardmax' is not supported");
  // dims 0 and 1 bind to batch and seq by position; a third symbolic dim has no binding.
  expect(kData + "unbound_dim.onnx", ErrorCode::kInvalidArgument,
         "dim 2 ('extra') is symbolic and not bound");
  const std::string text = ::testing::TempDir() + "text.onnx";
  std::ofstream(text) << "this is not protobuf";
  expect(text, ErrorCode::kInvalidArgument, "not a valid ONNX model");
  std::remove(text.c_str());
}

// Hand-made malformed models (wrong input counts, repeated axes, out-of-range indices, sizes
// that overflow or would take terabytes, ...): each must be a tboost::Error, never a crash
// (the suite also runs under ASan + UBSan).
TEST(OnnxImport, MalformedModelsAreErrorsNotCrashes) {
  if (!graph::onnx_import_available()) GTEST_SKIP() << "built without libonnx";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(kData + "malformed")) {
    SCOPED_TRACE(e.path().filename().string());
    ++n;
    try {
      graph::Graph g = graph::import_onnx(e.path().string(), {{"batch", 1}, {"seq", 4}});
      ADD_FAILURE() << "imported without an error";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("ONNX import"), std::string::npos) << err.what();
    }
  }
  EXPECT_GE(n, 20);
}

// A Gemm whose B is computed at run time must not be packed once at setup; a nameless node
// whose output value shares its name with an intermediate still imports.
TEST(OnnxImport, RuntimeGemmWeightAndNamelessNodes) {
  if (!graph::onnx_import_available()) GTEST_SKIP() << "built without libonnx";
  const std::string dir = kData + "gemm_runtime_b/";
  const Tensor x = npy::load(dir + "x.npy"), w = npy::load(dir + "w.npy");
  graph::Graph g = graph::import_onnx(dir + "model.onnx", {});
  std::vector<Tensor> in;
  for (graph::TensorId id : g.inputs()) in.push_back(g.tensor(id).name == "x" ? x : w);
  const Tensor ref = npy::load(dir + "reference.npy");
  EXPECT_LT(rel_error(run(g, in)[0], ref), 1e-5);
  graph::Graph s =
      graph::import_onnx(kData + "nameless_slice_output.onnx", {{"batch", 2}, {"seq", 5}});
  EXPECT_EQ(s.tensor(s.outputs()[0]).name, "y");
}

}  // namespace
}  // namespace tboost::testing
