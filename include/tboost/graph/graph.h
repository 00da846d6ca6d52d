// Graph IR: ops wired by tensor ids, two builders, shape inference under symbol bindings.
//
// A Graph holds tensors and nodes. Tensors are graph inputs (activations given at run time,
// with dims that may be symbols such as "batch" and "seq"), weights (constant tensors the
// graph holds), graph outputs, and intermediates. A node is an op with input and output ids:
// either an Operation's Param (any ops::*Param, including ops::GraphParam, so graphs nest) or
// a view (Reshape, Slice, Expand) that re-describes its input's memory and costs no copy.
//
// Two builders:
//   by name:  Graph g; auto x = g.input("x", DType::kF32, {"batch", "seq", 768});
//             auto w = g.weight("wq", tensor); auto q = g.add("q_proj", MatMulParam{}, {x, w});
//             g.output(q);
//   by id:    Graph::from_ids(inputs, num_outputs, num_intermediates, nodes): ids [0, I) are the
//             inputs (weights when the spec carries a value), [I, I+O) the outputs, then the
//             intermediates; each node lists input and output ids (the ATB GraphParam layout).
// Both check that every tensor is produced once, nodes form no cycle, and every output is
// produced; errors name the node or tensor.
//
// Shapes: infer(descs of the graph inputs) runs every node's infer_shape in topological order
// and gives every tensor's descriptor (views carry their strides). A graph is compiled into an
// Operation by make_graph_operation (executor.h); passes rewrite it (passes.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "tboost/core/tensor.h"
#include "tboost/ops/operation.h"

namespace tboost::graph {

using TensorId = int32_t;
enum class TensorKind { kInput, kWeight, kOutput, kIntermediate };
const char* tensor_kind_name(TensorKind k);

// One dim of a graph input: a size, or a symbol bound at run time.
struct Dim {
  int64_t size = 0;
  std::string symbol;                // non-empty: symbolic
  Dim(int64_t s) : size(s) {}        // NOLINT(google-explicit-constructor): {"batch", 768} literals
  Dim(int s) : size(s) {}            // NOLINT(google-explicit-constructor)
  Dim(const char* s) : symbol(s) {}  // NOLINT(google-explicit-constructor)
  Dim(std::string s) : symbol(std::move(s)) {}  // NOLINT(google-explicit-constructor)
  bool operator==(const Dim&) const = default;
};
using SymShape = std::vector<Dim>;
using Bindings = std::map<std::string, int64_t>;

// Reshape view (ONNX semantics): each entry a size, 0 = keep the input's dim at that index,
// -1 = inferred (at most one). Needs the input's memory to be expressible with the new shape
// (contiguous, or split/merged dims that are contiguous among themselves); otherwise the
// executor copies first.
struct Reshape {
  std::vector<int64_t> shape;
  bool operator==(const Reshape&) const = default;
};
// Slice view along one axis, step 1: [start, end), clamped like numpy (negatives count from
// the end).
struct Slice {
  int64_t axis = 0;
  int64_t start = 0;
  int64_t end = INT64_MAX;
  bool operator==(const Slice&) const = default;
};

// Expand view (ONNX Expand): the input broadcast (numpy rules) to `shape`; broadcast dims get
// stride 0, so nothing is copied. Only inputs of later ops may be such views.
struct Expand {
  std::vector<int64_t> shape;
  bool operator==(const Expand&) const = default;
};

using NodeOp = std::variant<AnyParam, Reshape, Slice, Expand>;
// "Linear", "Reshape", ... (for GraphParam nodes: "Graph").
std::string op_name(const NodeOp& op);
bool is_view(const NodeOp& op);

struct TensorInfo {
  std::string name;
  TensorKind kind = TensorKind::kIntermediate;
  DType dtype = DType::kF32;  // inputs and weights; intermediates get theirs from infer()
  SymShape shape;             // inputs and weights
  Tensor value;               // weights
};

struct Node {
  std::string name;
  NodeOp op;
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;
};

struct InputSpec {
  std::string name;
  DType dtype = DType::kF32;
  SymShape shape;
  Tensor value;  // given: a weight (dtype and shape are taken from it)
};

class Graph {
 public:
  // ---- builder by name
  TensorId input(const std::string& name, DType dtype, const SymShape& shape);
  TensorId weight(const std::string& name, const Tensor& value);
  // Appends a node; returns its n_outputs new intermediate ids, named "<node>:<i>" (or
  // "<node>" when there is one).
  std::vector<TensorId> add(const std::string& name, const NodeOp& op,
                            const std::vector<TensorId>& inputs, int n_outputs = 1);
  TensorId add1(const std::string& name, const NodeOp& op, const std::vector<TensorId>& inputs) {
    return add(name, op, inputs, 1)[0];
  }
  // Marks a produced tensor as a graph output (renamed when name is given).
  void output(TensorId t, const std::string& name = "");
  TensorId id(const std::string& name) const;  // throws when unknown
  bool has(const std::string& name) const { return by_name_.count(name) != 0; }
  // `name`, or `name#k` with the smallest k >= 1 that no tensor uses yet.
  std::string unique_name(const std::string& name) const;
  // Gives t a new, unused name (throws when taken).
  void rename(TensorId t, const std::string& name);

  // ---- builder by id
  struct IdNode {
    NodeOp op;
    std::vector<TensorId> inputs;
    std::vector<TensorId> outputs;
    std::string name;
  };
  static Graph from_ids(const std::vector<InputSpec>& inputs, int num_outputs,
                        int num_intermediates, const std::vector<IdNode>& nodes);

  // ---- structure
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const TensorInfo& tensor(TensorId t) const;
  // Graph inputs (no weights) in declaration order: the Operation's inputs.
  const std::vector<TensorId>& inputs() const { return inputs_; }
  const std::vector<TensorId>& outputs() const { return outputs_; }
  // The node producing t, or -1 (inputs and weights).
  int producer(TensorId t) const;
  // The nodes reading t, in node order.
  std::vector<int> consumers(TensorId t) const;
  // Number of compute nodes (views not counted).
  int64_t op_count() const;

  // ---- editing (used by passes); validate() re-checks the invariants afterwards
  std::vector<TensorInfo>& mutable_tensors() { return tensors_; }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  std::vector<TensorId>& mutable_outputs() { return outputs_; }
  TensorId new_tensor(const std::string& name);
  // Every reader of `from` (nodes and graph outputs) reads `to` instead.
  void replace_uses(TensorId from, TensorId to);
  // Drops nodes whose outputs nobody reads (graph outputs count as read), tensors no node
  // or output mentions, and renumbers; returns the number of nodes removed.
  int prune();
  // Orders nodes topologically (stable); throws on a cycle or a tensor produced twice.
  void validate_and_sort();

  // ---- shapes
  // Binds symbols from concrete input descriptors (throws on a mismatch: wrong rank, a fixed
  // dim that differs, a symbol bound to two values).
  Bindings bind(const std::vector<TensorDesc>& input_descs) const;
  // Contiguous input descriptors for a binding (throws on an unbound symbol).
  std::vector<TensorDesc> input_descs(const Bindings& b) const;
  // Descriptor of every tensor, given the graph inputs' descriptors (views: their strides
  // relative to their base's memory; op outputs: contiguous).
  std::vector<TensorDesc> infer(const std::vector<TensorDesc>& input_descs) const;

 private:
  TensorId add_tensor(TensorInfo info);
  std::vector<TensorInfo> tensors_;
  std::vector<Node> nodes_;
  std::vector<TensorId> inputs_;
  std::vector<TensorId> outputs_;
  std::map<std::string, TensorId> by_name_;
};

// A view node's output: its descriptor and the element offset from the input's first element.
// Returns false when a reshape cannot be expressed on this memory (the executor then copies
// first); throws when the view itself is invalid (element count, slice axis).
bool view_desc(const NodeOp& op, const TensorDesc& in, TensorDesc* out, int64_t* offset);
// The shape a reshape gives (0 and -1 resolved); throws naming the problem.
Shape reshape_shape(const Reshape& r, const Shape& in);

}  // namespace tboost::graph
