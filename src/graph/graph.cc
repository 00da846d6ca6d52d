// Graph IR: builders, structure queries, editing helpers and shape inference.
#include "tboost/graph/graph.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "src/core/overload.h"
#include "tboost/core/error.h"

namespace tboost::graph {
namespace {

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, "Graph: " + msg);
}

int norm_axis(int64_t axis, int rank, const std::string& who) {
  if (axis < -rank || axis >= rank)
    fail(ErrorCode::kInvalidArgument,
         who + ": axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

}  // namespace

const char* tensor_kind_name(TensorKind k) {
  switch (k) {
    case TensorKind::kInput:
      return "input";
    case TensorKind::kWeight:
      return "weight";
    case TensorKind::kOutput:
      return "output";
    case TensorKind::kIntermediate:
      return "intermediate";
  }
  return "?";
}

std::string op_name(const NodeOp& op) {
  return std::visit(Overload{[](const AnyParam& p) -> std::string {
                               if (std::holds_alternative<ops::GraphParam>(p)) return "Graph";
                               return create_operation(p)->name();
                             },
                             [](const Reshape&) -> std::string { return "Reshape"; },
                             [](const Slice&) -> std::string { return "Slice"; },
                             [](const Expand&) -> std::string { return "Expand"; }},
                    op);
}

bool is_view(const NodeOp& op) { return !std::holds_alternative<AnyParam>(op); }

Shape reshape_shape(const Reshape& r, const Shape& in) {
  int64_t in_numel = 1;
  for (int64_t d : in) in_numel *= d;
  Shape out(r.shape.size());
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < r.shape.size(); ++i) {
    const int64_t s = r.shape[i];
    if (s == -1) {
      if (infer >= 0) fail(ErrorCode::kInvalidArgument, "Reshape: more than one -1 in the shape");
      infer = static_cast<int>(i);
      continue;
    }
    if (s < -1) fail(ErrorCode::kInvalidArgument, "Reshape: negative size " + std::to_string(s));
    if (s == 0) {
      if (i >= in.size())
        fail(ErrorCode::kShapeMismatch, "Reshape: 0 at index " + std::to_string(i) +
                                            " copies a dim the input " + shape_to_string(in) +
                                            " does not have");
      out[i] = in[i];
    } else {
      out[i] = s;
    }
    known *= out[i];
  }
  if (infer >= 0) {
    if (known == 0 || in_numel % known != 0)
      fail(ErrorCode::kShapeMismatch, "Reshape: cannot infer -1 reshaping " + shape_to_string(in) +
                                          " to " +
                                          shape_to_string(Shape(r.shape.begin(), r.shape.end())));
    out[static_cast<size_t>(infer)] = in_numel / known;
    known = in_numel;
  }
  if (known != in_numel)
    fail(ErrorCode::kShapeMismatch, "Reshape: " + shape_to_string(in) + " has " +
                                        std::to_string(in_numel) + " elements, target " +
                                        shape_to_string(out) + " has " + std::to_string(known));
  return out;
}

// Strides for a reshape without a copy: dims of the input that are contiguous among
// themselves may be split or merged (the rule numpy and torch use).
static bool reshape_strides(const TensorDesc& in, const Shape& out, TensorDesc* d) {
  d->dtype = in.dtype;
  d->ndim = static_cast<int>(out.size());
  if (d->ndim > kMaxDims) fail(ErrorCode::kShapeMismatch, "Reshape: more than 8 dims");
  for (int i = 0; i < d->ndim; ++i) d->dims[static_cast<size_t>(i)] = out[static_cast<size_t>(i)];
  if (in.numel() == 0 || in.is_contiguous()) {
    *d = TensorDesc::contiguous(in.dtype, out);
    return true;
  }
  // Walk input chunks (maximal runs of dims contiguous with each other) from the back.
  int64_t view_d = d->ndim - 1;
  int64_t chunk_base_stride = in.ndim ? in.stride(in.ndim - 1) : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = in.ndim - 1; td >= 0; --td) {
    tensor_numel *= in.dim(static_cast<int>(td));
    if (td == 0 || (in.dim(static_cast<int>(td - 1)) != 1 &&
                    in.stride(static_cast<int>(td - 1)) != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || out[static_cast<size_t>(view_d)] == 1)) {
        d->strides[static_cast<size_t>(view_d)] = view_numel * chunk_base_stride;
        view_numel *= out[static_cast<size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (td > 0) {
        chunk_base_stride = in.stride(static_cast<int>(td - 1));
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

bool view_desc(const NodeOp& op, const TensorDesc& in, TensorDesc* out, int64_t* offset) {
  *offset = 0;
  if (const auto* r = std::get_if<Reshape>(&op)) {
    const Shape s = reshape_shape(*r, in.shape());
    return reshape_strides(in, s, out);
  }
  if (const auto* sl = std::get_if<Slice>(&op)) {
    const int a = norm_axis(sl->axis, in.ndim, "Slice");
    const int64_t n = in.dim(a);
    auto clamp = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
    const int64_t s = clamp(sl->start), e = std::max(clamp(sl->end), clamp(sl->start));
    *out = in;
    out->dims[static_cast<size_t>(a)] = e - s;
    *offset = s * in.stride(a);
    return true;
  }
  if (const auto* ex = std::get_if<Expand>(&op)) {
    const size_t r = std::max(ex->shape.size(), static_cast<size_t>(in.ndim));
    if (r > static_cast<size_t>(kMaxDims))
      fail(ErrorCode::kShapeMismatch, "Expand: more than 8 dims");
    TensorDesc d;
    d.dtype = in.dtype;
    d.ndim = static_cast<int>(r);
    for (size_t i = 0; i < r; ++i) {
      const int ii = static_cast<int>(i) - static_cast<int>(r) + in.ndim;  // input dim or < 0
      const size_t si = i + ex->shape.size();                              // shape index + r
      const int64_t want = si >= r ? ex->shape[si - r] : 1;
      if (want < 0)
        fail(ErrorCode::kShapeMismatch,
             "Expand: negative size " + std::to_string(want) + " in " +
                 shape_to_string(Shape(ex->shape.begin(), ex->shape.end())));
      const int64_t have = ii >= 0 ? in.dim(ii) : 1;
      if (have != 1 && want != 1 && have != want)
        fail(ErrorCode::kShapeMismatch,
             "Expand: " + in.shape_string() + " does not broadcast to " +
                 shape_to_string(Shape(ex->shape.begin(), ex->shape.end())));
      d.dims[i] = have == 1 ? want : have;
      d.strides[i] = (ii < 0 || have == 1) ? 0 : in.stride(ii);
    }
    *out = d;
    return true;
  }
  fail(ErrorCode::kInternal, "view_desc on a compute node");
}

// ---------------------------------------------------------------------------------------------
// Builders

TensorId Graph::add_tensor(TensorInfo info) {
  if (info.name.empty()) info.name = "t" + std::to_string(tensors_.size());
  if (by_name_.count(info.name))
    fail(ErrorCode::kInvalidArgument, "tensor name '" + info.name + "' used twice");
  const auto id = static_cast<TensorId>(tensors_.size());
  by_name_[info.name] = id;
  tensors_.push_back(std::move(info));
  return id;
}

TensorId Graph::input(const std::string& name, DType dtype, const SymShape& shape) {
  if (shape.size() > static_cast<size_t>(kMaxDims))
    fail(ErrorCode::kShapeMismatch, "input '" + name + "' has more than 8 dims");
  for (const Dim& d : shape)
    if (d.symbol.empty() && d.size < 0)
      fail(ErrorCode::kShapeMismatch, "input '" + name + "' has a negative dim");
  TensorInfo t;
  t.name = name, t.kind = TensorKind::kInput, t.dtype = dtype, t.shape = shape;
  const TensorId id = add_tensor(std::move(t));
  inputs_.push_back(id);
  return id;
}

TensorId Graph::weight(const std::string& name, const Tensor& value) {
  if (value.numel() > 0 && value.data() == nullptr)
    fail(ErrorCode::kNullData, "weight '" + name + "' has no data");
  TensorInfo t;
  t.name = name, t.kind = TensorKind::kWeight, t.dtype = value.dtype(), t.value = value;
  for (int64_t d : value.shape()) t.shape.emplace_back(d);
  return add_tensor(std::move(t));
}

std::string Graph::unique_name(const std::string& name) const {
  std::string n = name;
  for (int k = 1; by_name_.count(n); ++k) n = name + "#" + std::to_string(k);
  return n;
}

TensorId Graph::new_tensor(const std::string& name) {
  TensorInfo t;
  t.name = unique_name(name);
  return add_tensor(std::move(t));
}

std::vector<TensorId> Graph::add(const std::string& name, const NodeOp& op,
                                 const std::vector<TensorId>& inputs, int n_outputs) {
  const std::string node = name.empty() ? op_name(op) + std::to_string(nodes_.size()) : name;
  for (TensorId t : inputs)
    if (t < 0 || static_cast<size_t>(t) >= tensors_.size())
      fail(ErrorCode::kInvalidArgument,
           "node '" + node + "' reads tensor id " + std::to_string(t) + ", which does not exist");
  if (n_outputs < 1) fail(ErrorCode::kInvalidArgument, "node '" + node + "' has no outputs");
  if (is_view(op) && (inputs.size() != 1 || n_outputs != 1))
    fail(ErrorCode::kInvalidArgument, "view node '" + node + "' takes one input, gives one output");
  Node n;
  n.name = node, n.op = op, n.inputs = inputs;
  for (int i = 0; i < n_outputs; ++i)
    n.outputs.push_back(new_tensor(n_outputs == 1 ? node : node + ":" + std::to_string(i)));
  nodes_.push_back(std::move(n));
  return nodes_.back().outputs;
}

void Graph::output(TensorId t, const std::string& name) {
  if (t < 0 || static_cast<size_t>(t) >= tensors_.size())
    fail(ErrorCode::kInvalidArgument, "output id " + std::to_string(t) + " does not exist");
  TensorInfo& info = tensors_[static_cast<size_t>(t)];
  if (info.kind != TensorKind::kIntermediate)
    fail(ErrorCode::kInvalidArgument, "tensor '" + info.name + "' is a graph " +
                                          tensor_kind_name(info.kind) +
                                          "; only a node's output can be a graph output");
  info.kind = TensorKind::kOutput;
  if (!name.empty() && name != info.name) {
    if (by_name_.count(name))
      fail(ErrorCode::kInvalidArgument, "tensor name '" + name + "' used twice");
    by_name_.erase(info.name);
    info.name = name;
    by_name_[name] = t;
  }
  outputs_.push_back(t);
}

void Graph::rename(TensorId t, const std::string& name) {
  TensorInfo& info = tensors_.at(static_cast<size_t>(t));
  if (name == info.name) return;
  if (by_name_.count(name))
    fail(ErrorCode::kInvalidArgument, "tensor name '" + name + "' used twice");
  by_name_.erase(info.name);
  info.name = name;
  by_name_[name] = t;
}

TensorId Graph::id(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) fail(ErrorCode::kInvalidArgument, "no tensor named '" + name + "'");
  return it->second;
}

Graph Graph::from_ids(const std::vector<InputSpec>& inputs, int num_outputs, int num_intermediates,
                      const std::vector<IdNode>& nodes) {
  if (num_outputs < 1 || num_intermediates < 0)
    fail(ErrorCode::kInvalidArgument, "from_ids: need at least one output and >= 0 intermediates");
  Graph g;
  for (const InputSpec& s : inputs) {
    if (s.value.data() != nullptr)
      g.weight(s.name.empty() ? "w" + std::to_string(g.tensors_.size()) : s.name, s.value);
    else
      g.input(s.name.empty() ? "in" + std::to_string(g.tensors_.size()) : s.name, s.dtype, s.shape);
  }
  const auto n_in = static_cast<TensorId>(inputs.size());
  for (int i = 0; i < num_outputs + num_intermediates; ++i) {
    TensorInfo t;
    t.name =
        (i < num_outputs ? "out" : "mid") + std::to_string(i < num_outputs ? i : i - num_outputs);
    g.add_tensor(std::move(t));
  }
  const TensorId total = n_in + num_outputs + num_intermediates;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const IdNode& in = nodes[k];
    Node n;
    n.name = in.name.empty() ? op_name(in.op) + std::to_string(k) : in.name;
    n.op = in.op, n.inputs = in.inputs, n.outputs = in.outputs;
    for (TensorId t : in.inputs)
      if (t < 0 || t >= total)
        fail(ErrorCode::kInvalidArgument, "from_ids: node " + std::to_string(k) + " ('" + n.name +
                                              "') reads id " + std::to_string(t) + ", ids are 0.." +
                                              std::to_string(total - 1));
    for (TensorId t : in.outputs)
      if (t < n_in || t >= total)
        fail(ErrorCode::kInvalidArgument,
             "from_ids: node " + std::to_string(k) + " ('" + n.name + "') writes id " +
                 std::to_string(t) + (t < n_in ? ", which is a graph input" : ", out of range"));
    if (in.outputs.empty())
      fail(ErrorCode::kInvalidArgument, "from_ids: node '" + n.name + "' has no outputs");
    if (is_view(in.op) && (in.inputs.size() != 1 || in.outputs.size() != 1))
      fail(ErrorCode::kInvalidArgument, "from_ids: view node '" + n.name + "' takes one input");
    g.nodes_.push_back(std::move(n));
  }
  for (int i = 0; i < num_outputs; ++i) {
    g.tensors_[static_cast<size_t>(n_in + i)].kind = TensorKind::kOutput;
    g.outputs_.push_back(n_in + i);
  }
  g.validate_and_sort();
  return g;
}

// ---------------------------------------------------------------------------------------------
// Structure

const TensorInfo& Graph::tensor(TensorId t) const {
  if (t < 0 || static_cast<size_t>(t) >= tensors_.size())
    fail(ErrorCode::kInvalidArgument, "tensor id " + std::to_string(t) + " does not exist");
  return tensors_[static_cast<size_t>(t)];
}

int Graph::producer(TensorId t) const {
  for (size_t i = 0; i < nodes_.size(); ++i)
    for (TensorId o : nodes_[i].outputs)
      if (o == t) return static_cast<int>(i);
  return -1;
}

std::vector<int> Graph::consumers(TensorId t) const {
  std::vector<int> c;
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (std::find(nodes_[i].inputs.begin(), nodes_[i].inputs.end(), t) != nodes_[i].inputs.end())
      c.push_back(static_cast<int>(i));
  return c;
}

int64_t Graph::op_count() const {
  return std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return !is_view(n.op); });
}

void Graph::replace_uses(TensorId from, TensorId to) {
  for (Node& n : nodes_)
    for (TensorId& t : n.inputs)
      if (t == from) t = to;
  for (TensorId& t : outputs_)
    if (t == from) t = to;
}

int Graph::prune() {
  validate_and_sort();  // the backward sweep below needs topological order
  // Live set from the outputs backwards.
  std::vector<char> live_t(tensors_.size(), 0);
  for (TensorId t : outputs_) live_t[static_cast<size_t>(t)] = 1;
  std::vector<char> live_n(nodes_.size(), 0);
  for (size_t k = nodes_.size(); k-- > 0;) {
    const Node& n = nodes_[k];
    bool used = false;
    for (TensorId o : n.outputs) used |= live_t[static_cast<size_t>(o)] != 0;
    if (!used) continue;
    live_n[k] = 1;
    for (TensorId i : n.inputs) live_t[static_cast<size_t>(i)] = 1;
  }
  std::vector<Node> kept;
  for (size_t k = 0; k < nodes_.size(); ++k)
    if (live_n[k]) kept.push_back(std::move(nodes_[k]));
  const int removed = static_cast<int>(nodes_.size() - kept.size());
  nodes_ = std::move(kept);
  // Keep every graph input (the Operation's signature), live weights, and node outputs.
  std::vector<char> keep(tensors_.size(), 0);
  for (TensorId t : inputs_) keep[static_cast<size_t>(t)] = 1;
  for (const Node& n : nodes_) {
    for (TensorId t : n.inputs) keep[static_cast<size_t>(t)] = 1;
    for (TensorId t : n.outputs) keep[static_cast<size_t>(t)] = 1;
  }
  for (TensorId t : outputs_) keep[static_cast<size_t>(t)] = 1;
  std::vector<TensorId> remap(tensors_.size(), -1);
  std::vector<TensorInfo> ts;
  by_name_.clear();
  for (size_t t = 0; t < tensors_.size(); ++t) {
    if (!keep[t]) continue;
    remap[t] = static_cast<TensorId>(ts.size());
    by_name_[tensors_[t].name] = remap[t];
    ts.push_back(std::move(tensors_[t]));
  }
  tensors_ = std::move(ts);
  auto re = [&](std::vector<TensorId>& v) {
    for (TensorId& t : v) t = remap[static_cast<size_t>(t)];
  };
  for (Node& n : nodes_) re(n.inputs), re(n.outputs);
  re(inputs_), re(outputs_);
  return removed;
}

void Graph::validate_and_sort() {
  const size_t nt = tensors_.size();
  std::vector<int> prod(nt, -1);
  for (size_t k = 0; k < nodes_.size(); ++k)
    for (TensorId o : nodes_[k].outputs) {
      const auto u = static_cast<size_t>(o);
      if (tensors_[u].kind == TensorKind::kInput || tensors_[u].kind == TensorKind::kWeight)
        fail(ErrorCode::kInvalidArgument, "node '" + nodes_[k].name + "' writes graph " +
                                              tensor_kind_name(tensors_[u].kind) + " '" +
                                              tensors_[u].name + "'");
      if (prod[u] >= 0)
        fail(ErrorCode::kInvalidArgument,
             "tensor '" + tensors_[u].name + "' is written by nodes '" +
                 nodes_[static_cast<size_t>(prod[u])].name + "' and '" + nodes_[k].name + "'");
      prod[u] = static_cast<int>(k);
    }
  for (TensorId o : outputs_)
    if (prod[static_cast<size_t>(o)] < 0)
      fail(ErrorCode::kInvalidArgument, "graph output '" + tensors_[static_cast<size_t>(o)].name +
                                            "' is not produced by any node");
  for (const Node& n : nodes_)
    for (TensorId i : n.inputs) {
      const TensorInfo& t = tensors_[static_cast<size_t>(i)];
      if ((t.kind == TensorKind::kIntermediate || t.kind == TensorKind::kOutput) &&
          prod[static_cast<size_t>(i)] < 0)
        fail(ErrorCode::kInvalidArgument,
             "node '" + n.name + "' reads '" + t.name + "', which no node produces");
    }
  // Kahn's algorithm, taking the lowest ready index first so a sorted graph keeps its order.
  std::vector<int> missing(nodes_.size(), 0);
  std::vector<std::vector<int>> users(nodes_.size());
  for (size_t k = 0; k < nodes_.size(); ++k) {
    std::set<int> deps;
    for (TensorId i : nodes_[k].inputs)
      if (prod[static_cast<size_t>(i)] >= 0) deps.insert(prod[static_cast<size_t>(i)]);
    missing[k] = static_cast<int>(deps.size());
    for (int d : deps) users[static_cast<size_t>(d)].push_back(static_cast<int>(k));
  }
  std::set<int> ready;
  for (size_t k = 0; k < nodes_.size(); ++k)
    if (missing[k] == 0) ready.insert(static_cast<int>(k));
  std::vector<Node> order;
  std::vector<char> done(nodes_.size(), 0);
  while (!ready.empty()) {
    const int k = *ready.begin();
    ready.erase(ready.begin());
    done[static_cast<size_t>(k)] = 1;
    order.push_back(nodes_[static_cast<size_t>(k)]);
    for (int u : users[static_cast<size_t>(k)])
      if (--missing[static_cast<size_t>(u)] == 0) ready.insert(u);
  }
  if (order.size() != nodes_.size()) {
    for (size_t k = 0; k < nodes_.size(); ++k)
      if (!done[k])
        fail(ErrorCode::kInvalidArgument, "node '" + nodes_[k].name + "' is in a cycle");
  }
  nodes_ = std::move(order);
}

// ---------------------------------------------------------------------------------------------
// Shapes

Bindings Graph::bind(const std::vector<TensorDesc>& in) const {
  if (in.size() != inputs_.size())
    fail(ErrorCode::kInvalidArgument, "expected " + std::to_string(inputs_.size()) +
                                          " graph inputs, got " + std::to_string(in.size()));
  Bindings b;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const TensorInfo& t = tensors_[static_cast<size_t>(inputs_[i])];
    const TensorDesc& d = in[i];
    const std::string who = "graph input " + std::to_string(i) + " ('" + t.name + "')";
    if (d.dtype != t.dtype)
      fail(ErrorCode::kDTypeMismatch,
           who + " expects " + dtype_name(t.dtype) + ", got " + dtype_name(d.dtype));
    if (d.ndim != static_cast<int>(t.shape.size()))
      fail(ErrorCode::kShapeMismatch,
           who + " expects rank " + std::to_string(t.shape.size()) + ", got " + d.shape_string());
    for (int k = 0; k < d.ndim; ++k) {
      const Dim& s = t.shape[static_cast<size_t>(k)];
      if (s.symbol.empty()) {
        if (s.size != d.dim(k))
          fail(ErrorCode::kShapeMismatch, who + " dim " + std::to_string(k) + " must be " +
                                              std::to_string(s.size) + ", got " + d.shape_string());
        continue;
      }
      auto [it, fresh] = b.emplace(s.symbol, d.dim(k));
      if (!fresh && it->second != d.dim(k))
        fail(ErrorCode::kShapeMismatch, who + " binds '" + s.symbol + "' to " +
                                            std::to_string(d.dim(k)) + ", already bound to " +
                                            std::to_string(it->second));
    }
  }
  return b;
}

std::vector<TensorDesc> Graph::input_descs(const Bindings& b) const {
  std::vector<TensorDesc> out;
  for (TensorId id : inputs_) {
    const TensorInfo& t = tensors_[static_cast<size_t>(id)];
    Shape s;
    for (const Dim& d : t.shape) {
      if (d.symbol.empty()) {
        s.push_back(d.size);
        continue;
      }
      auto it = b.find(d.symbol);
      if (it == b.end())
        fail(ErrorCode::kInvalidArgument,
             "symbol '" + d.symbol + "' of input '" + t.name + "' is not bound");
      s.push_back(it->second);
    }
    out.push_back(TensorDesc::contiguous(t.dtype, s));
  }
  return out;
}

std::vector<TensorDesc> Graph::infer(const std::vector<TensorDesc>& input_descs) const {
  bind(input_descs);  // checks ranks, fixed dims and symbol consistency
  std::vector<TensorDesc> d(tensors_.size());
  std::vector<char> known(tensors_.size(), 0);
  for (size_t i = 0; i < inputs_.size(); ++i) {
    d[static_cast<size_t>(inputs_[i])] = input_descs[i];
    known[static_cast<size_t>(inputs_[i])] = 1;
  }
  for (size_t t = 0; t < tensors_.size(); ++t)
    if (tensors_[t].kind == TensorKind::kWeight) {
      d[t] = tensors_[t].value.desc();
      known[t] = 1;
    }
  for (const Node& n : nodes_) {
    std::vector<TensorDesc> in;
    for (TensorId i : n.inputs) {
      if (!known[static_cast<size_t>(i)])
        fail(ErrorCode::kInternal, "node '" + n.name + "' runs before its input '" +
                                       tensors_[static_cast<size_t>(i)].name + "' exists");
      in.push_back(d[static_cast<size_t>(i)]);
    }
    std::vector<TensorDesc> out;
    try {
      if (is_view(n.op)) {
        TensorDesc v;
        int64_t off = 0;
        if (!view_desc(n.op, in[0], &v, &off))
          v = TensorDesc::contiguous(in[0].dtype,
                                     reshape_shape(std::get<Reshape>(n.op), in[0].shape()));
        out.push_back(v);
      } else {
        out = create_operation(std::get<AnyParam>(n.op))->infer_shape(in);
      }
    } catch (const Error& e) {
      throw Error(e.code(), "Graph node '" + n.name + "': " + e.what());
    }
    if (out.size() != n.outputs.size())
      fail(ErrorCode::kInvalidArgument,
           "node '" + n.name + "' (" + op_name(n.op) + ") gives " + std::to_string(out.size()) +
               " outputs, the graph wires " + std::to_string(n.outputs.size()));
    for (size_t k = 0; k < out.size(); ++k) {
      d[static_cast<size_t>(n.outputs[k])] = out[k];
      known[static_cast<size_t>(n.outputs[k])] = 1;
    }
  }
  return d;
}

}  // namespace tboost::graph
