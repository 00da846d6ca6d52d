// Memory planner, cost report and the graph executor (sync and two-stage).
#include "tboost/graph/executor.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "src/ops/op_base.h"
#include "tboost/core/error.h"

namespace tboost::graph {
namespace {

constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

size_t desc_bytes(const TensorDesc& d) {
  return static_cast<size_t>(d.numel()) * dtype_size(d.dtype);
}

// TBOOST_PROFILE=1: wall time per op kind (=2: per node name) over all graph runs of the process,
// printed to stderr at exit (sorted, with call counts). Users find where a step's time goes without
// a profiler.
class OpProfile {
 public:
  static OpProfile* get() {
    static OpProfile* p = [] {
      const char* v = std::getenv("TBOOST_PROFILE");
      if (!v || (v[0] != '1' && v[0] != '2')) return static_cast<OpProfile*>(nullptr);
      auto* prof = new OpProfile;
      prof->per_node = v[0] == '2';
      return prof;
    }();
    return p;
  }
  void add(const std::string& kind, double s) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& e = t_[kind];
    e.first += s;
    ++e.second;
  }
  ~OpProfile() = default;
  bool per_node = false;  // TBOOST_PROFILE=2: per graph node name instead of per op kind

 private:
  OpProfile() {
    std::atexit([] {
      OpProfile* p = get();
      std::vector<std::pair<std::string, std::pair<double, int64_t>>> v(p->t_.begin(), p->t_.end());
      std::sort(v.begin(), v.end(),
                [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
      double total = 0;
      for (const auto& e : v) total += e.second.first;
      std::fprintf(stderr, "tboost profile (TBOOST_PROFILE=1): %.3f s in graph nodes\n", total);
      for (const auto& e : v)
        std::fprintf(stderr, "  %-22s %9.3f ms %5.1f%% %9lld calls %8.2f us/call\n",
                     e.first.c_str(), e.second.first * 1e3, 100.0 * e.second.first / total,
                     static_cast<long long>(e.second.second),
                     e.second.first * 1e6 / static_cast<double>(e.second.second));
    });
  }
  std::mutex mu_;
  std::map<std::string, std::pair<double, int64_t>> t_;
};

int env_async() {
  const char* v = std::getenv("TUNE_OP_EXE_ASYNC");
  return v && v[0] == '1' && v[1] == '\0' ? 1 : 0;
}

// Matmul-class FLOPs of one node (2 per multiply-add); 0 for everything else.
int64_t node_flops(const Node& n, const std::vector<TensorDesc>& d) {
  const auto* p = std::get_if<AnyParam>(&n.op);
  if (!p) return 0;
  auto in = [&](size_t i) -> const TensorDesc& { return d[static_cast<size_t>(n.inputs[i])]; };
  auto out = [&](size_t i) -> const TensorDesc& { return d[static_cast<size_t>(n.outputs[i])]; };
  if (const auto* l = std::get_if<ops::LinearParam>(p)) {
    const TensorDesc& x = in(0);
    const int64_t k = l->transpose_a ? x.dim(0) : x.dim(-1);
    return 2 * out(0).numel() * k;
  }
  if (const auto* m = std::get_if<ops::MatMulParam>(p)) {
    const TensorDesc& a = in(0);
    const int64_t k = m->transpose_a ? a.dim(-2) : a.dim(-1);
    return 2 * out(0).numel() * k;
  }
  if (const auto* a = std::get_if<ops::AttentionParam>(p)) {
    // o (.., Sq, Hq, Dv) or BNSD: every query meets every key (an upper bound under masks;
    // causal halves it).
    const TensorDesc& q = in(0);
    const TensorDesc& k = in(1);
    const int sa = a->layout == ops::QkvLayout::kBSND ? (a->varlen ? 0 : 1) : 2;
    const int64_t sk = a->varlen ? k.dim(0) : k.dim(sa);
    const int64_t qd = q.dim(-1), vd = in(2).dim(-1);
    const int64_t rows = q.numel() / qd;  // query rows x heads
    int64_t f = 2 * rows * sk * (qd + vd);
    if (a->causal) f /= 2;
    return f;
  }
  return 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Memory planner

MemoryPlan plan_memory(const std::vector<Interval>& items) {
  MemoryPlan plan;
  plan.offset.assign(items.size(), 0);
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Largest first (ties: earlier first), so big buffers claim the bottom of the arena and the
  // small ones fill the gaps between them.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].bytes != items[b].bytes) return items[a].bytes > items[b].bytes;
    return items[a].first < items[b].first;
  });
  struct Placed {
    size_t off, size;
    int64_t first, last;
  };
  std::vector<Placed> placed;
  for (size_t idx : order) {
    const Interval& it = items[idx];
    const size_t size = align_up(it.bytes);
    plan.naive_bytes += size;
    if (size == 0) continue;
    // Blocks alive at the same time, by offset.
    std::vector<std::pair<size_t, size_t>> busy;
    for (const Placed& p : placed)
      if (p.first <= it.last && it.first <= p.last) busy.emplace_back(p.off, p.off + p.size);
    std::sort(busy.begin(), busy.end());
    size_t best = SIZE_MAX, best_gap = SIZE_MAX, cursor = 0;
    for (const auto& [b, e] : busy) {
      if (b > cursor && b - cursor >= size && b - cursor < best_gap) {
        best = cursor;
        best_gap = b - cursor;
      }
      cursor = std::max(cursor, e);
    }
    if (best == SIZE_MAX) best = cursor;  // after the last live block
    placed.push_back({best, size, it.first, it.last});
    plan.offset[idx] = best;
    plan.arena_bytes = std::max(plan.arena_bytes, best + size);
  }
  // Peak live bytes: sweep the steps.
  int64_t t_end = 0;
  for (const Interval& it : items) t_end = std::max(t_end, it.last + 1);
  std::vector<int64_t> delta(static_cast<size_t>(t_end) + 1, 0);
  for (const Interval& it : items) {
    delta[static_cast<size_t>(it.first)] += static_cast<int64_t>(align_up(it.bytes));
    delta[static_cast<size_t>(it.last) + 1] -= static_cast<int64_t>(align_up(it.bytes));
  }
  int64_t live = 0;
  for (int64_t dlt : delta) {
    live += dlt;
    plan.peak_live_bytes = std::max(plan.peak_live_bytes, static_cast<size_t>(live));
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Plan of one shape: where every tensor lives.

namespace {

enum class Where { kInput, kWeight, kOutput, kArena, kView };

struct Slot {
  Where where = Where::kArena;
  int index = 0;            // input / output index
  TensorId base = -1;       // kView: the viewed tensor
  int64_t elem_offset = 0;  // kView: offset from base's first element
  size_t arena_offset = 0;  // kArena
};

struct ShapePlan {
  std::vector<TensorDesc> input_descs;  // the key
  std::vector<TensorDesc> desc;         // every tensor
  std::vector<Slot> slot;
  std::vector<char> copy_reshape;  // per node: a reshape that needs a copy
  std::vector<TensorId> out_copy;  // graph outputs that are views: copied into the caller's
  GraphReport report;
  size_t arena_bytes = 0;
  uint64_t id = 0;
};

// A view's root (the tensor that owns the memory) and the total element offset.
TensorId root_of(const std::vector<Slot>& s, TensorId t, int64_t* off) {
  int64_t o = 0;
  while (s[static_cast<size_t>(t)].where == Where::kView) {
    o += s[static_cast<size_t>(t)].elem_offset;
    t = s[static_cast<size_t>(t)].base;
  }
  if (off) *off = o;
  return t;
}

// One Operation per node (a view node's: the identity Transpose that copies it when needed).
std::vector<std::unique_ptr<Operation>> node_ops(const Graph& g) {
  std::vector<std::unique_ptr<Operation>> ops;
  for (const Node& n : g.nodes()) {
    const auto* p = std::get_if<AnyParam>(&n.op);
    ops.push_back(create_operation(p ? *p : AnyParam(ops::TransposeParam{})));
  }
  return ops;
}

ShapePlan make_plan(const Graph& g, const std::vector<std::unique_ptr<Operation>>& ops,
                    const std::vector<TensorDesc>& input_descs, bool plan) {
  ShapePlan p;
  p.input_descs = input_descs;
  p.desc = g.infer(input_descs);
  const auto& ts = g.tensors();
  const auto& nodes = g.nodes();
  p.slot.resize(ts.size());
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    Slot& s = p.slot[static_cast<size_t>(g.inputs()[i])];
    s.where = Where::kInput, s.index = static_cast<int>(i);
  }
  for (size_t t = 0; t < ts.size(); ++t)
    if (ts[t].kind == TensorKind::kWeight) p.slot[t].where = Where::kWeight;
  std::vector<int> out_index(ts.size(), -1);
  for (size_t j = 0; j < g.outputs().size(); ++j)
    out_index[static_cast<size_t>(g.outputs()[j])] = static_cast<int>(j);
  p.copy_reshape.assign(nodes.size(), 0);
  // Ops that check input values (an id out of range, a bad slot or length) can fail at
  // execute. A graph output written before the last of them is staged in the arena and copied
  // at the end, so such an error leaves every output untouched (the op contract).
  int last_value_check = -1;
  for (size_t k = 0; k < nodes.size(); ++k)
    if (!is_view(nodes[k].op) && ops[k]->checks_input_values())
      last_value_check = static_cast<int>(k);
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (is_view(n.op)) {
      TensorDesc v;
      int64_t off = 0;
      const TensorId o = n.outputs[0];
      if (view_desc(n.op, p.desc[static_cast<size_t>(n.inputs[0])], &v, &off)) {
        Slot& s = p.slot[static_cast<size_t>(o)];
        s.where = Where::kView, s.base = n.inputs[0], s.elem_offset = off;
        p.desc[static_cast<size_t>(o)] = v;
        // A graph output that is a view: the view lives on, copied into the caller's buffer.
        if (out_index[static_cast<size_t>(o)] >= 0) p.out_copy.push_back(o);
        continue;
      }
      p.copy_reshape[k] = 1;  // materialized: a contiguous copy, then reinterpreted
    } else {
      // Outputs written in place (a cache write) are views of their input; one that is a
      // graph output gets a copy of the updated tensor at the end.
      bool inplace = false;
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        const int src = ops[k]->inplace_input(i);
        if (src < 0) continue;
        inplace = true;
        const TensorId o = n.outputs[i], c = n.inputs[static_cast<size_t>(src)];
        Slot& s = p.slot[static_cast<size_t>(o)];
        s.where = Where::kView, s.base = c, s.elem_offset = 0;
        p.desc[static_cast<size_t>(o)] = p.desc[static_cast<size_t>(c)];
        if (out_index[static_cast<size_t>(o)] >= 0) p.out_copy.push_back(o);
      }
      if (inplace) continue;
    }
    for (TensorId o : n.outputs) {
      Slot& s = p.slot[static_cast<size_t>(o)];
      const bool early = static_cast<int>(k) < last_value_check;
      if (out_index[static_cast<size_t>(o)] >= 0 && !early) {
        s.where = Where::kOutput, s.index = out_index[static_cast<size_t>(o)];
      } else {
        s.where = Where::kArena;
        if (out_index[static_cast<size_t>(o)] >= 0) p.out_copy.push_back(o);
      }
    }
  }
  // Lifetimes of arena tensors: from the producing node to the last node reading them
  // (through any view), or the end when a graph output views them.
  std::vector<int64_t> first(ts.size(), -1), last(ts.size(), -1);
  for (size_t k = 0; k < nodes.size(); ++k) {
    for (TensorId o : nodes[k].outputs) {
      const TensorId r = root_of(p.slot, o, nullptr);
      if (first[static_cast<size_t>(r)] < 0)
        first[static_cast<size_t>(r)] = static_cast<int64_t>(k);
      last[static_cast<size_t>(r)] =
          std::max(last[static_cast<size_t>(r)], static_cast<int64_t>(k));
    }
    for (TensorId i : nodes[k].inputs) {
      const TensorId r = root_of(p.slot, i, nullptr);
      last[static_cast<size_t>(r)] =
          std::max(last[static_cast<size_t>(r)], static_cast<int64_t>(k));
    }
  }
  for (TensorId o : p.out_copy)
    last[static_cast<size_t>(root_of(p.slot, o, nullptr))] = static_cast<int64_t>(nodes.size());
  std::vector<Interval> iv;
  std::vector<TensorId> who;
  for (size_t t = 0; t < ts.size(); ++t)
    if (p.slot[t].where == Where::kArena && first[t] >= 0) {
      iv.push_back({first[t], last[t], desc_bytes(p.desc[t])});
      who.push_back(static_cast<TensorId>(t));
    }
  MemoryPlan mp = plan_memory(iv);
  if (!plan) {  // every buffer its own place: the naive layout, for bitwise comparisons
    size_t off = 0;
    for (size_t i = 0; i < iv.size(); ++i) {
      mp.offset[i] = off;
      off += align_up(iv[i].bytes);
    }
    mp.arena_bytes = off;
  }
  for (size_t i = 0; i < who.size(); ++i)
    p.slot[static_cast<size_t>(who[i])].arena_offset = mp.offset[i];
  p.arena_bytes = mp.arena_bytes;
  // Cost.
  GraphReport& r = p.report;
  r.memory = mp;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node& n = nodes[k];
    if (is_view(n.op) && !p.copy_reshape[k]) {
      ++r.views;
      continue;
    }
    ++r.ops;
    // An op writing in place (a cache write) moves what it reads from its other inputs twice
    // (read, then written into the cache), not the whole cache.
    std::vector<char> inplace_src(n.inputs.size(), 0);
    bool inplace = false;
    for (size_t i = 0; i < n.outputs.size(); ++i)
      if (const int src = ops[k]->inplace_input(i); src >= 0) {
        inplace_src[static_cast<size_t>(src)] = 1;
        inplace = true;
      }
    if (inplace) {
      for (size_t i = 0; i < n.inputs.size(); ++i)
        if (!inplace_src[i])
          r.bytes_moved +=
              2 * static_cast<int64_t>(desc_bytes(p.desc[static_cast<size_t>(n.inputs[i])]));
      continue;
    }
    for (TensorId t : n.inputs)
      r.bytes_moved += static_cast<int64_t>(desc_bytes(p.desc[static_cast<size_t>(t)]));
    for (TensorId t : n.outputs)
      r.bytes_moved += static_cast<int64_t>(desc_bytes(p.desc[static_cast<size_t>(t)]));
    r.flops += node_flops(n, p.desc);
  }
  return p;
}

}  // namespace

GraphReport report(const Graph& g, const std::vector<TensorDesc>& input_descs) {
  return make_plan(g, node_ops(g), input_descs, true).report;
}

// ---------------------------------------------------------------------------------------------
// Executor

// The second stage's thread: one per executor, kept across calls (starting a thread per call
// costs about as much as a small node's setup).
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    busy_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || job_; });
      if (!job_) return;
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      job();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

struct GraphExecutor::Impl {
  std::shared_ptr<const Graph> graph;
  ExecOptions options;
  bool async = false;
  std::list<ShapePlan> plans;  // most recent first
  ShapePlan* current = nullptr;
  uint64_t next_plan_id = 1;
  std::vector<std::unique_ptr<Operation>> ops;  // per node (null for views)
  std::vector<uint64_t> setup_for;              // per node: plan id of its last setup
  std::vector<size_t> ws_bytes;                 // per node
  std::unique_ptr<Operation> copy_op;           // identity transpose: outputs that are views
  std::shared_ptr<void> arena;
  size_t arena_cap = 0;
  std::shared_ptr<void> ws;
  size_t ws_cap = 0;
  int64_t setups = 0;
  std::unique_ptr<Worker> worker;  // two-stage mode

  ShapePlan& plan_for(const std::vector<TensorDesc>& in) {
    for (auto it = plans.begin(); it != plans.end(); ++it) {
      bool same = it->input_descs.size() == in.size();
      for (size_t i = 0; same && i < in.size(); ++i)
        same = it->input_descs[i].same_shape(in[i]) && it->input_descs[i].dtype == in[i].dtype &&
               it->input_descs[i].strides == in[i].strides;
      if (same) {
        plans.splice(plans.begin(), plans, it);
        return plans.front();
      }
    }
    ShapePlan p = make_plan(*graph, ops, in, options.plan_memory);
    p.id = next_plan_id++;
    plans.push_front(std::move(p));
    while (plans.size() > std::max<size_t>(1, options.max_plans)) plans.pop_back();
    return plans.front();
  }

  void* ptr(const ShapePlan& p, TensorId t, const VariantPack& pack) const {
    int64_t off = 0;
    const TensorId r = root_of(p.slot, t, &off);
    const Slot& s = p.slot[static_cast<size_t>(r)];
    char* base = nullptr;
    switch (s.where) {
      case Where::kInput:
        base = static_cast<char*>(pack.inputs[static_cast<size_t>(s.index)].data());
        break;
      case Where::kOutput:
        base = static_cast<char*>(pack.outputs[static_cast<size_t>(s.index)].data());
        break;
      case Where::kWeight:
        base = static_cast<char*>(graph->tensors()[static_cast<size_t>(r)].value.data());
        break;
      case Where::kArena:
        base = static_cast<char*>(arena.get()) + s.arena_offset;
        break;
      case Where::kView:
        break;
    }
    if (base == nullptr) return nullptr;
    return base + off * static_cast<int64_t>(dtype_size(p.desc[static_cast<size_t>(t)].dtype));
  }

  // The pack node k runs with. A copied reshape runs the identity transpose on its input into
  // a contiguous buffer of the input's shape.
  VariantPack node_pack(const ShapePlan& p, size_t k, const VariantPack& pack) const {
    const Node& n = graph->nodes()[k];
    VariantPack v;
    for (TensorId t : n.inputs)
      v.inputs.emplace_back(p.desc[static_cast<size_t>(t)], ptr(p, t, pack));
    for (TensorId t : n.outputs)
      v.outputs.emplace_back(p.desc[static_cast<size_t>(t)], ptr(p, t, pack));
    if (p.copy_reshape[k]) {
      const TensorDesc& in = p.desc[static_cast<size_t>(n.inputs[0])];
      v.outputs[0] = Tensor(TensorDesc::contiguous(in.dtype, in.shape()), v.outputs[0].data());
    }
    return v;
  }

  Operation& op_of(size_t k) { return *ops[k]; }  // a view node's op: its copy, when needed

  void setup_node(const ShapePlan& p, size_t k, const VariantPack& pack, Context& ctx) {
    const Node& n = graph->nodes()[k];
    try {
      ws_bytes[k] = op_of(k).setup(node_pack(p, k, pack), ctx);
    } catch (const Error& e) {
      throw Error(e.code(), "Graph node '" + n.name + "': " + e.what());
    }
    setup_for[k] = p.id;
    ++setups;
  }

  // The caller's outputs: contiguous, of the planned shapes and dtypes, with data, not
  // overlapping each other or any input (nodes would overwrite what later nodes read).
  void check_pack(const ShapePlan& p, const VariantPack& pack) const {
    const auto& outs = graph->outputs();
    if (pack.outputs.size() != outs.size())
      throw Error(ErrorCode::kInvalidArgument, "Graph: expected " + std::to_string(outs.size()) +
                                                   " outputs, got " +
                                                   std::to_string(pack.outputs.size()));
    for (size_t j = 0; j < outs.size(); ++j) {
      const TensorDesc& d = p.desc[static_cast<size_t>(outs[j])];
      const TensorDesc want = TensorDesc::contiguous(d.dtype, d.shape());
      const Tensor& o = pack.outputs[j];
      const std::string who =
          "Graph: output " + std::to_string(j) + " ('" + graph->tensor(outs[j]).name + "')";
      if (!o.desc().same_shape(want) || o.dtype() != want.dtype || !o.is_contiguous())
        throw Error(
            o.dtype() != want.dtype ? ErrorCode::kDTypeMismatch : ErrorCode::kShapeMismatch,
            who + " expected contiguous " + want.to_string() + ", got " + o.desc().to_string());
      if (o.numel() > 0 && o.data() == nullptr)
        throw Error(ErrorCode::kNullData, who + " has no data pointer");
      for (size_t k = 0; k < j; ++k)
        if (ops_internal::overlaps(o, pack.outputs[k]))
          throw Error(ErrorCode::kInvalidArgument, who + " overlaps output " + std::to_string(k));
      for (size_t i = 0; i < pack.inputs.size(); ++i)
        if (ops_internal::overlaps(o, pack.inputs[i]))
          throw Error(ErrorCode::kInvalidArgument,
                      who + " overlaps input " + std::to_string(i) + " ('" +
                          graph->tensor(graph->inputs()[i]).name +
                          "'): a graph's outputs need their own memory");
    }
    for (size_t i = 0; i < pack.inputs.size(); ++i)
      if (pack.inputs[i].numel() > 0 && pack.inputs[i].data() == nullptr)
        throw Error(ErrorCode::kNullData, "Graph: input " + std::to_string(i) + " ('" +
                                              graph->tensor(graph->inputs()[i]).name +
                                              "') has no data pointer");
  }

  bool writes_output(const ShapePlan& p, size_t k) const {
    for (TensorId o : graph->nodes()[k].outputs)
      if (p.slot[static_cast<size_t>(root_of(p.slot, o, nullptr))].where == Where::kOutput)
        return true;
    return false;
  }

  bool needs_setup(const ShapePlan& p, size_t k) const {
    const Node& n = graph->nodes()[k];
    if (is_view(n.op) && !p.copy_reshape[k]) return false;
    return setup_for[k] != p.id;
  }

  void* workspace_for(size_t bytes) {
    if (bytes > ws_cap) {
      ws = aligned_buffer(bytes);
      ws_cap = bytes;
    }
    return ws.get();
  }

  void run_node(const ShapePlan& p, size_t k, const VariantPack& pack, Context& ctx) {
    const Node& n = graph->nodes()[k];
    if (is_view(n.op) && !p.copy_reshape[k]) return;
    try {
      OpProfile* prof = OpProfile::get();
      const auto t0 =
          prof ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      op_of(k).execute(node_pack(p, k, pack), workspace_for(ws_bytes[k]), ws_bytes[k], ctx);
      if (prof)
        prof->add(prof->per_node ? n.name : op_of(k).name(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    } catch (const Error& e) {
      throw Error(e.code(), "Graph node '" + n.name + "': " + e.what());
    }
  }

  void copy_outputs(const ShapePlan& p, const VariantPack& pack, Context& ctx) {
    for (TensorId o : p.out_copy) {
      int idx = -1;
      for (size_t j = 0; j < graph->outputs().size(); ++j)
        if (graph->outputs()[j] == o) idx = static_cast<int>(j);
      VariantPack v;
      v.inputs.emplace_back(p.desc[static_cast<size_t>(o)], ptr(p, o, pack));
      v.outputs.push_back(pack.outputs[static_cast<size_t>(idx)]);
      run_operation(*copy_op, v, ctx);
    }
  }

  void run_sync(const ShapePlan& p, const VariantPack& pack, Context& ctx) {
    const size_t nn = graph->nodes().size();
    for (size_t k = 0; k < nn; ++k) {
      if (needs_setup(p, k)) setup_node(p, k, pack, ctx);
      run_node(p, k, pack, ctx);
    }
    copy_outputs(p, pack, ctx);
  }

  // Two stages: a helper thread runs the setups in node order; the caller executes node k
  // once setup k is done. Nodes whose setup is current are skipped by the helper.
  void run_async(const ShapePlan& p, const VariantPack& pack, Context& ctx) {
    const size_t nn = graph->nodes().size();
    std::vector<size_t> todo;
    for (size_t k = 0; k < nn; ++k)
      if (needs_setup(p, k)) todo.push_back(k);
    if (todo.empty()) return run_sync(p, pack, ctx);
    std::mutex mu;
    std::condition_variable cv;
    size_t done = 0;  // setups finished, in todo order
    std::exception_ptr err;
    if (!worker) worker = std::make_unique<Worker>();
    worker->post([&] {
      for (size_t i = 0; i < todo.size(); ++i) {
        try {
          setup_node(p, todo[i], pack, ctx);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          err = std::current_exception();
          cv.notify_all();
          return;
        }
        std::lock_guard<std::mutex> lock(mu);
        done = i + 1;
        cv.notify_all();
      }
    });
    std::exception_ptr run_err;
    size_t next = 0;  // index into todo of the next setup the caller must wait for
    for (size_t k = 0; k < nn && !run_err; ++k) {
      // A node that writes a graph output waits for every setup: a setup error must come
      // before any output byte is written.
      const size_t need = writes_output(p, k)
                              ? todo.size()
                              : (next < todo.size() && todo[next] == k ? next + 1 : 0);
      if (need > 0) {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return done >= need || err; });
        if (done < need) break;  // the helper failed
        while (next < todo.size() && todo[next] <= k) ++next;
      }
      try {
        run_node(p, k, pack, ctx);
      } catch (...) {
        run_err = std::current_exception();
      }
    }
    worker->wait();
    if (err) std::rethrow_exception(err);
    if (run_err) std::rethrow_exception(run_err);
    copy_outputs(p, pack, ctx);
  }
};

GraphExecutor::GraphExecutor(std::shared_ptr<const Graph> graph, const ExecOptions& options)
    : impl_(std::make_unique<Impl>()) {
  TBOOST_CHECK_CODE(graph != nullptr, ErrorCode::kInvalidArgument, "Graph: null graph");
  impl_->graph = std::move(graph);
  impl_->options = options;
  impl_->async = options.async < 0 ? env_async() != 0 : options.async != 0;
  const auto& nodes = impl_->graph->nodes();
  impl_->setup_for.assign(nodes.size(), 0);
  impl_->ws_bytes.assign(nodes.size(), 0);
  // View nodes get their own identity Transpose for when their view needs a copy (one per node:
  // in two-stage mode one node's copy is set up while another's runs).
  impl_->ops = node_ops(*impl_->graph);
  impl_->copy_op = create_operation(ops::TransposeParam{});  // graph outputs that are views
}

GraphExecutor::~GraphExecutor() = default;

const Graph& GraphExecutor::graph() const { return *impl_->graph; }
bool GraphExecutor::async() const { return impl_->async; }
int64_t GraphExecutor::node_setups() const { return impl_->setups; }

GraphReport GraphExecutor::last_report() const {
  TBOOST_CHECK_CODE(impl_->current != nullptr, ErrorCode::kInvalidArgument,
                    "Graph: last_report() before setup()");
  return impl_->current->report;
}

std::vector<TensorDesc> GraphExecutor::infer_shape(const std::vector<TensorDesc>& inputs) const {
  const std::vector<TensorDesc> d = impl_->graph->infer(inputs);
  std::vector<TensorDesc> out;
  for (TensorId o : impl_->graph->outputs()) {
    const TensorDesc& t = d[static_cast<size_t>(o)];
    out.push_back(TensorDesc::contiguous(t.dtype, t.shape()));
  }
  return out;
}

size_t GraphExecutor::setup(const VariantPack& pack, Context& ctx) {
  Impl& m = *impl_;
  std::vector<TensorDesc> in;
  for (const Tensor& t : pack.inputs) in.push_back(t.desc());
  ShapePlan& p = m.plan_for(in);  // validates the inputs (shapes, dtypes, every node)
  m.check_pack(p, pack);
  m.current = &p;
  if (p.arena_bytes > m.arena_cap) {
    m.arena = aligned_buffer(p.arena_bytes);
    m.arena_cap = p.arena_bytes;
    std::fill(m.setup_for.begin(), m.setup_for.end(), 0);  // pointers moved: set up again
  }
  // Sync mode sets the nodes up here; two-stage mode overlaps them with execute.
  if (!m.async)
    for (size_t k = 0; k < m.graph->nodes().size(); ++k)
      if (m.needs_setup(p, k)) m.setup_node(p, k, pack, ctx);
  return 0;
}

void GraphExecutor::execute(const VariantPack& pack, void*, size_t, Context& ctx) {
  Impl& m = *impl_;
  bool same = m.current && m.current->input_descs.size() == pack.inputs.size();
  for (size_t i = 0; same && i < pack.inputs.size(); ++i) {
    const TensorDesc& a = m.current->input_descs[i];
    const TensorDesc& b = pack.inputs[i].desc();
    same = a.same_shape(b) && a.dtype == b.dtype && a.strides == b.strides;
  }
  if (same) {
    m.check_pack(*m.current, pack);  // outputs and pointers may change without the inputs
  } else {
    setup(pack, ctx);
  }
  if (m.async)
    m.run_async(*m.current, pack, ctx);
  else
    m.run_sync(*m.current, pack, ctx);
}

void GraphExecutor::update(const AnyParam& param) {
  const auto* g = std::get_if<ops::GraphParam>(&param);
  TBOOST_CHECK_CODE(g && g->graph, ErrorCode::kInvalidArgument,
                    "Graph: update() needs a GraphParam with a graph");
  impl_ = std::move(make_graph_executor(g->graph, impl_->options)->impl_);
}

AnyParam GraphExecutor::param() const { return ops::GraphParam{impl_->graph}; }

std::string GraphExecutor::impl_info() const {
  const Impl& m = *impl_;
  std::string s = std::to_string(m.graph->op_count()) + " ops, " +
                  (m.async ? "two-stage" : "sync") + " executor";
  if (m.current)
    s += ", arena " + std::to_string(m.current->arena_bytes) + " bytes" +
         (m.options.plan_memory ? " (planned)" : " (unplanned)");
  return s;
}

std::unique_ptr<GraphExecutor> make_graph_executor(std::shared_ptr<const Graph> graph,
                                                   const ExecOptions& options) {
  return std::make_unique<GraphExecutor>(std::move(graph), options);
}

}  // namespace tboost::graph
