// Memory planning ("tensor coloring") and the executor that turns a Graph into an Operation.
//
// plan_memory packs lifetime intervals into one arena: intervals are placed largest first,
// each into the best-fitting gap among the blocks whose lifetimes overlap its own (the
// smallest gap that holds it, else the end). Offsets are 64-byte aligned.
//
// GraphExecutor is the Operation a graph compiles to (create_operation(GraphParam{g}) or
// make_graph_executor). Per set of input shapes it keeps a plan: every tensor's descriptor,
// where it lives (caller's input or output, weight, arena offset, or a view of another
// tensor), and the arena layout. Plans are cached per shape (a handful, least recently used
// dropped), so a repeated shape costs a lookup; each node's Operation is set up only when its
// shapes differ from its last setup. The executor owns its arena and the nodes' workspace, so
// its own setup() returns 0 workspace bytes.
//
// Two-stage mode (ExecOptions::async, or TUNE_OP_EXE_ASYNC=1 in the environment): while node
// i executes on the calling thread (and its OpenMP team), a second thread runs the setup of
// nodes i+1, i+2, ...; node i+1 starts when its setup is done. It only pays when setups are
// frequent relative to execution (shapes that change every call: decode), see
// bench/RESULTS.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tboost/graph/graph.h"
#include "tboost/ops/operation.h"

namespace tboost::graph {

struct Interval {
  int64_t first = 0;  // first step the buffer is live (written)
  int64_t last = 0;   // last step it is read (inclusive)
  size_t bytes = 0;
};

struct MemoryPlan {
  std::vector<size_t> offset;  // per interval, bytes into the arena
  size_t arena_bytes = 0;
  size_t naive_bytes = 0;      // every interval its own (64-byte aligned) buffer
  size_t peak_live_bytes = 0;  // max over steps of the (aligned) bytes live at once
  // (arena - peak live) / arena: 0 when the arena is exactly the peak.
  double fragmentation() const {
    return arena_bytes ? static_cast<double>(arena_bytes - peak_live_bytes) /
                             static_cast<double>(arena_bytes)
                       : 0.0;
  }
};
MemoryPlan plan_memory(const std::vector<Interval>& intervals);

struct ExecOptions {
  bool plan_memory = true;  // false: every intermediate gets its own buffer (for comparison)
  int async = -1;           // -1: from TUNE_OP_EXE_ASYNC; 0 sync; 1 two-stage
  size_t max_plans = 8;     // shape plans kept
};

// Cost report of a graph at one set of input shapes (no execution).
struct GraphReport {
  int64_t ops = 0;  // compute nodes (views are free)
  int64_t views = 0;
  int64_t bytes_moved = 0;  // Σ over compute nodes of the bytes each reads and writes
  int64_t flops = 0;        // matmul-class FLOPs (Linear, MatMul, attention), 2 per FMA
  MemoryPlan memory;        // intermediates (graph inputs, outputs and weights excluded)
};
GraphReport report(const Graph& g, const std::vector<TensorDesc>& input_descs);

class GraphExecutor : public Operation {
 public:
  GraphExecutor(std::shared_ptr<const Graph> graph, const ExecOptions& options);
  ~GraphExecutor() override;
  const char* name() const override { return "Graph"; }
  std::vector<TensorDesc> infer_shape(const std::vector<TensorDesc>& inputs) const override;
  size_t setup(const VariantPack& pack, Context& ctx) override;
  void execute(const VariantPack& pack, void* workspace, size_t workspace_size,
               Context& ctx) override;
  void update(const AnyParam& param) override;
  AnyParam param() const override;
  std::string impl_info() const override;
  bool checks_input_values() const override { return true; }  // whatever its nodes check

  const Graph& graph() const;
  // The plan of the last setup: memory layout and cost.
  GraphReport last_report() const;
  // Setups the nodes ran in total (tests check that repeated shapes skip them).
  int64_t node_setups() const;
  bool async() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::unique_ptr<GraphExecutor> make_graph_executor(std::shared_ptr<const Graph> graph,
                                                   const ExecOptions& options = {});

}  // namespace tboost::graph
