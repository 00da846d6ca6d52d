// Graph rewrites: named fusion patterns, all listed in src/graph/passes.cc (kPatterns).
//
// optimize() runs the patterns in their listed order, round after round, until none fires,
// then removes dead nodes. Each rewrite keeps the ids of the tensors other nodes read, so a
// graph's inputs and outputs are unchanged. Shapes are checked under the example input
// descriptors (weights and ranks decide; a rewrite never bakes in a symbolic size).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "tboost/graph/graph.h"

namespace tboost::graph {

struct OptimizeOptions {
  std::set<std::string> disabled;  // pattern names to skip
};

struct OptimizeResult {
  std::map<std::string, int> fired;  // pattern name -> rewrites (every pattern listed)
  int64_t ops_before = 0;
  int64_t ops_after = 0;
};

// The patterns, in the order they run.
std::vector<std::string> pattern_names();

OptimizeResult optimize(Graph& g, const std::vector<TensorDesc>& example_inputs,
                        const OptimizeOptions& options = {});

}  // namespace tboost::graph
