// The op benchmarks behind `tboost bench-ops`.
//
// Memory-bound ops are judged against the "copy" baseline: a streaming kernel with the same
// read and write volume, measured alternately in the same run. Fused chains are measured
// against their unfused twins built from our own single-purpose ops. Linear is compared with
// calling oneDNN directly (same pre-packed weights, same threads), and bf16 with f32.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <functional>
#include <regex>
#include <tuple>

#include "bench/bench.h"
#include "bench/ops/runner.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/tboost.h"

namespace tboost::bench {
namespace {

using namespace tboost::ops;

// ---- memory-bound ops against the copy baseline ------------------------------------------

// `reads` input arrays and `writes` output arrays of `array_bytes` each: the traffic of the op.
void memory_bound_case(Runner& R, const std::string& name, DType dt, int reads, int writes,
                       double array_bytes, const std::function<void()>& run,
                       const std::string& note = "") {
  const int64_t n = static_cast<int64_t>(array_bytes / 4) / 64 * 64;
  std::vector<Tensor> ins, outs;
  std::vector<const float*> ip;
  std::vector<float*> op;
  for (int k = 0; k < reads; ++k) {
    ins.push_back(filled(DType::kF32, {n}, 7 + static_cast<uint32_t>(k)));
    ip.push_back(ins.back().data_as<float>());
  }
  for (int k = 0; k < writes; ++k) {
    outs.push_back(Tensor::zeros(DType::kF32, {n}));
    op.push_back(outs.back().data_as<float>());
  }
  const int threads = R.ctx.num_threads();
  const auto [ours, copy] = time_pair(
      run, [&] { stream_kernel(op.data(), writes, ip.data(), reads, n, threads); }, R.budget());
  Result r;
  r.name = name;
  r.dtype = dtype_name(dt);
  r.seconds = ours.median;
  r.spread = spread(ours);
  r.bytes = array_bytes * (reads + writes);
  r.gbps = r.bytes / ours.median / 1e9;
  r.floor_fraction = (r.bytes / (R.lim.copy_gbps * 1e9)) / ours.median;
  r.baseline = "copy";
  r.speedup_vs_baseline = copy.median / ours.median;
  r.bytes_ratio_vs_baseline = 1.0;
  r.note = note;
  R.emit(r);
}

void memory_bound_ops(Runner& R) {
  // 64 MiB f32 activations (the 64-256 MB range), 16 MiB in quick mode.
  const int64_t C = 4096;
  const int64_t rows = (R.opt.quick ? 16ll << 20 : 64ll << 20) / (C * 4);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const double es = static_cast<double>(dtype_size(dt));
    const double arr = static_cast<double>(rows * C) * es;
    const std::string sfx = std::string("_") + dtype_name(dt);
    const std::string shape = "[" + std::to_string(rows) + "," + std::to_string(C) + "]";
    if (R.want("rmsnorm" + sfx)) {
      Tensor x = filled(dt, {rows, C}, 1), w = filled(dt, {C}, 2), y = Tensor::empty(dt, {rows, C});
      Call c(RmsNormParam{}, {x, w}, {y}, R.ctx);
      memory_bound_case(R, "rmsnorm" + sfx + shape, dt, 1, 1, arr, [&] { c(R.ctx); });
    }
    if (R.want("layernorm" + sfx)) {
      Tensor x = filled(dt, {rows, C}, 1), w = filled(dt, {C}, 2), b = filled(dt, {C}, 3);
      Tensor y = Tensor::empty(dt, {rows, C});
      Call c(LayerNormParam{}, {x, w, b}, {y}, R.ctx);
      memory_bound_case(R, "layernorm" + sfx + shape, dt, 1, 1, arr, [&] { c(R.ctx); });
    }
    if (R.want("rope" + sfx)) {
      const int64_t H = 32, D = 128, T = rows * C / (H * D);
      Tensor x = filled(dt, {T, H, D}, 1), y = Tensor::empty(dt, {T, H, D});
      Tensor pos = Tensor::empty(DType::kI32, {T});
      for (int64_t i = 0; i < T; ++i) pos.data_as<int32_t>()[i] = static_cast<int32_t>(i);
      Call c(RopeParam{}, {x, pos}, {y}, R.ctx);
      memory_bound_case(R, "rope" + sfx + "[" + std::to_string(T) + ",32,128]", dt, 1, 1, arr,
                        [&] { c(R.ctx); });
    }
    const std::pair<ActivationType, const char*> acts[] = {{ActivationType::kSilu, "silu"},
                                                           {ActivationType::kGeluTanh, "gelu_tanh"},
                                                           {ActivationType::kGeluErf, "gelu_erf"},
                                                           {ActivationType::kRelu, "relu"}};
    for (const auto& [t, nm] : acts) {
      if (!R.want(std::string(nm) + sfx)) continue;
      Tensor x = filled(dt, {rows, C}, 1, -4, 4), y = Tensor::empty(dt, {rows, C});
      Call c(ActivationParam{.type = t}, {x}, {y}, R.ctx);
      memory_bound_case(
          R, nm + sfx + shape, dt, 1, 1, arr, [&] { c(R.ctx); },
          t == ActivationType::kGeluErf || dt != DType::kF32
              ? "reported, not judged (may be compute-bound)"
              : "");
    }
    if (R.want("swiglu" + sfx)) {
      Tensor x = filled(dt, {rows, 2 * C}, 1, -4, 4), y = Tensor::empty(dt, {rows, C});
      Call c(ActivationParam{.type = ActivationType::kSwiGlu}, {x}, {y}, R.ctx);
      memory_bound_case(
          R, "swiglu" + sfx + "[" + std::to_string(rows) + "," + std::to_string(2 * C) + "]", dt, 2,
          1, arr, [&] { c(R.ctx); });
    }
    if (R.want("softmax" + sfx)) {
      Tensor x = filled(dt, {rows, C}, 1, -4, 4), y = Tensor::empty(dt, {rows, C});
      Call c(SoftmaxParam{}, {x}, {y}, R.ctx);
      memory_bound_case(
          R, "softmax" + sfx + shape, dt, 1, 1, arr, [&] { c(R.ctx); }, "reported, not judged");
    }
    if (R.want("add" + sfx)) {
      Tensor x = filled(dt, {rows, C}, 1), z = filled(dt, {rows, C}, 2);
      Tensor y = Tensor::empty(dt, {rows, C});
      Call c(ElementwiseParam{.type = ElementwiseType::kAdd}, {x, z}, {y}, R.ctx);
      memory_bound_case(R, "add" + sfx + shape, dt, 2, 1, arr, [&] { c(R.ctx); });
    }
    if (R.want("bias_add" + sfx)) {
      Tensor x = filled(dt, {rows, C}, 1), b = filled(dt, {C}, 2), y = Tensor::empty(dt, {rows, C});
      Call c(ElementwiseParam{.type = ElementwiseType::kAdd}, {x, b}, {y}, R.ctx);
      memory_bound_case(R, "bias_add" + sfx + shape + "+[4096]", dt, 1, 1, arr, [&] { c(R.ctx); });
    }
    if (R.want("scale" + sfx)) {
      Tensor x = filled(dt, {rows, C}, 1), y = Tensor::empty(dt, {rows, C});
      Call c(ElementwiseParam{.type = ElementwiseType::kScale, .alpha = 0.125f}, {x}, {y}, R.ctx);
      memory_bound_case(R, "scale" + sfx + shape, dt, 1, 1, arr, [&] { c(R.ctx); });
    }
  }
  // Casts move different byte counts in and out; the copy baseline moves the same total as
  // one read array and one write array of the mean size.
  const std::pair<DType, DType> casts[] = {
      {DType::kF32, DType::kBF16}, {DType::kBF16, DType::kF32}, {DType::kF32, DType::kF16}};
  for (const auto& [from, to] : casts) {
    const std::string name = std::string("cast_") + dtype_name(from) + "_to_" + dtype_name(to);
    if (!R.want(name)) continue;
    Tensor x = filled(from, {rows, C}, 1), y = Tensor::empty(to, {rows, C});
    Call c(ElementwiseParam{.type = ElementwiseType::kCast, .out_dtype = to}, {x}, {y}, R.ctx);
    const double in_b = static_cast<double>(rows * C * static_cast<int64_t>(dtype_size(from)));
    const double out_b = static_cast<double>(rows * C * static_cast<int64_t>(dtype_size(to)));
    memory_bound_case(R, name + "[" + std::to_string(rows) + ",4096]", from, 1, 1,
                      0.5 * (in_b + out_b), [&] { c(R.ctx); });
  }
  // Embedding: gather T rows of a 32000 x 768 table (98 MB f32, larger than any cache):
  // bytes = rows read + rows written.
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string name = std::string("embedding_") + dtype_name(dt);
    if (!R.want(name)) continue;
    const int64_t V = 32000, E = 768, T = R.opt.quick ? 4096 : 16384;
    Tensor table = filled(dt, {V, E}, 3), ids = Tensor::empty(DType::kI32, {T});
    Tensor y = Tensor::empty(dt, {T, E});
    uint32_t st = 12345u;
    for (int64_t i = 0; i < T; ++i) {
      st = st * 1664525u + 1013904223u;
      ids.data_as<int32_t>()[i] = static_cast<int32_t>((st >> 8) % static_cast<uint32_t>(V));
    }
    Call c(EmbeddingParam{}, {table, ids}, {y}, R.ctx);
    const double arr = static_cast<double>(T * E * static_cast<int64_t>(dtype_size(dt)));
    memory_bound_case(
        R, name + "[32000x768][" + std::to_string(T) + "]", dt, 1, 1, arr, [&] { c(R.ctx); },
        "random rows: each is a separate DRAM burst");
  }
}

// ---- fused vs unfused --------------------------------------------------------------------

void fused_pair(Runner& R, const std::string& name, DType dt, double fused_bytes,
                double unfused_bytes, double flops, const std::function<void()>& fused,
                const std::function<void()>& unfused) {
  // GEMM-bound pairs differ by a few percent: give them enough alternations for a stable median.
  const double budget = flops > 0 ? 3.0 * R.budget() : R.budget();
  const auto [f, u] = time_pair(fused, unfused, budget, flops > 0 ? 120 : 50);
  Result r;
  r.name = name;
  r.dtype = dtype_name(dt);
  r.seconds = f.median;
  r.spread = spread(f);
  r.bytes = fused_bytes;
  r.flops = flops;
  r.gbps = fused_bytes / f.median / 1e9;
  if (flops > 0) r.gflops = flops / f.median / 1e9;
  const double peak = dt == DType::kBF16 ? R.lim.bf16_gflops : R.lim.fma_gflops;
  const double floor_s = std::max(fused_bytes / (R.lim.copy_gbps * 1e9), flops / (peak * 1e9));
  r.floor_fraction = floor_s / f.median;
  r.baseline = "unfused";
  r.speedup_vs_baseline = u.median / f.median;
  r.bytes_ratio_vs_baseline = fused_bytes / unfused_bytes;
  r.note = "unfused " + std::to_string(u.median * 1e3) + " ms";
  R.emit(r);
}

void fused_chains(Runner& R) {
  const int64_t C = 4096;
  const int64_t rows = (R.opt.quick ? 16ll << 20 : 64ll << 20) / (C * 4);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string sfx = std::string("_") + dtype_name(dt);
    const double N = static_cast<double>(rows * C) * static_cast<double>(dtype_size(dt));
    if (R.want("fused_add_rmsnorm" + sfx)) {
      Tensor x = filled(dt, {rows, C}, 1), res = filled(dt, {rows, C}, 2), w = filled(dt, {C}, 3);
      Tensor y = Tensor::empty(dt, {rows, C}), sum = Tensor::empty(dt, {rows, C});
      Call fused(RmsNormParam{.layer = NormLayer::kPreNorm}, {x, res, w}, {y, sum}, R.ctx);
      Call add(ElementwiseParam{.type = ElementwiseType::kAdd}, {x, res}, {sum}, R.ctx);
      Call norm(RmsNormParam{}, {sum, w}, {y}, R.ctx);
      // fused: read x, res; write y, sum. unfused: add reads 2, writes 1; norm reads 1, writes 1.
      fused_pair(
          R, "fused_add_rmsnorm" + sfx + "[" + std::to_string(rows) + ",4096]", dt, 4 * N, 5 * N, 0,
          [&] { fused(R.ctx); },
          [&] {
            add(R.ctx);
            norm(R.ctx);
          });
    }
    if (R.want("fused_silu_mul" + sfx)) {
      Tensor x = filled(dt, {rows, 2 * C}, 1, -4, 4), y = Tensor::empty(dt, {rows, C});
      Tensor t = Tensor::empty(dt, {rows, C});
      Call fused(ActivationParam{.type = ActivationType::kSwiGlu}, {x}, {y}, R.ctx);
      Call silu(ActivationParam{.type = ActivationType::kSilu}, {x.slice(1, 0, C)}, {t}, R.ctx);
      Call mul(ElementwiseParam{.type = ElementwiseType::kMul}, {t, x.slice(1, C, C)}, {y}, R.ctx);
      // fused: read gate, up; write y. unfused: silu reads 1 writes 1; mul reads 2 writes 1.
      fused_pair(
          R, "fused_silu_mul_swiglu" + sfx + "[" + std::to_string(rows) + ",8192]", dt, 3 * N,
          5 * N, 0, [&] { fused(R.ctx); },
          [&] {
            silu(R.ctx);
            mul(R.ctx);
          });
    }
    const int64_t M = 512, K = 768, F = 3072;
    const double es = static_cast<double>(dtype_size(dt));
    if (R.want("fused_linear_bias_gelu" + sfx)) {
      Tensor x = filled(dt, {M, K}, 1), w = filled(dt, {F, K}, 2, -0.05f, 0.05f),
             b = filled(dt, {F}, 3);
      Tensor y = Tensor::empty(dt, {M, F}), t1 = Tensor::empty(dt, {M, F}),
             t2 = Tensor::empty(dt, {M, F});
      Call fused(LinearParam{.has_bias = true, .activation = Activation::kGeluTanh}, {x, w, b}, {y},
                 R.ctx);
      Call mm(LinearParam{}, {x, w}, {t1}, R.ctx);
      Call add(ElementwiseParam{.type = ElementwiseType::kAdd}, {t1, b}, {t2}, R.ctx);
      Call gelu(ActivationParam{.type = ActivationType::kGeluTanh}, {t2}, {y}, R.ctx);
      const double io = es * static_cast<double>(M * K + F * K + F);
      const double mf = es * static_cast<double>(M * F);
      fused_pair(
          R, "fused_linear_bias_gelu" + sfx + "[512x768x3072]", dt, io + mf,
          io + mf + 2 * mf + 2 * mf, 2.0 * M * K * F, [&] { fused(R.ctx); },
          [&] {
            mm(R.ctx);
            add(R.ctx);
            gelu(R.ctx);
          });
    }
    // Gated MLP, two fused forms against one unfused twin (gate linear, up linear, silu, mul):
    // one gate-up linear + SwiGLU (the form), and SwiGLU as the gate GEMM's epilogue
    // (up = x·W_upᵀ, then y = silu(x·W_gateᵀ) * up in oneDNN's post-ops, no SwiGLU pass).
    const bool gate_up = R.want("fused_gate_up_swiglu" + sfx);
    const bool epilogue = R.want("fused_gated_epilogue" + sfx);
    if (gate_up || epilogue) {
      const int64_t FF = 2048;
      Tensor x = filled(dt, {M, K}, 1), wgu = filled(dt, {2 * FF, K}, 2, -0.05f, 0.05f);
      Tensor wg = wgu.slice(0, 0, FF), wu = wgu.slice(0, FF, FF);
      Tensor gu = Tensor::empty(dt, {M, 2 * FF}), y = Tensor::empty(dt, {M, FF});
      Tensor g = Tensor::empty(dt, {M, FF}), u = Tensor::empty(dt, {M, FF}),
             s = Tensor::empty(dt, {M, FF});
      Call lg(LinearParam{}, {x, wg}, {g}, R.ctx);
      Call lu(LinearParam{}, {x, wu}, {u}, R.ctx);
      Call silu(ActivationParam{.type = ActivationType::kSilu}, {g}, {s}, R.ctx);
      Call mul(ElementwiseParam{.type = ElementwiseType::kMul}, {s, u}, {y}, R.ctx);
      auto unfused = [&] {
        lg(R.ctx);
        lu(R.ctx);
        silu(R.ctx);
        mul(R.ctx);
      };
      const double mf = es * static_cast<double>(M * FF);
      const double w_bytes = es * static_cast<double>(2 * FF * K), x_bytes = es * M * K;
      const double flops = 2.0 * M * K * 2 * FF;
      // unfused: x twice, weights, write g and u (2mf), silu 2mf, mul 3mf.
      const double unfused_bytes = 2 * x_bytes + w_bytes + 7 * mf;
      if (gate_up) {
        Call lin(LinearParam{}, {x, wgu}, {gu}, R.ctx);
        Call glu(ActivationParam{.type = ActivationType::kSwiGlu}, {gu}, {y}, R.ctx);
        // x once, weights, write gu (2mf); SwiGLU reads 2mf, writes mf.
        fused_pair(
            R, "fused_gate_up_swiglu" + sfx + "[512x768x2x2048]", dt, x_bytes + w_bytes + 5 * mf,
            unfused_bytes, flops,
            [&] {
              lin(R.ctx);
              glu(R.ctx);
            },
            unfused);
      }
      if (epilogue) {
        Call up(LinearParam{}, {x, wu}, {u}, R.ctx);
        Call gate(LinearParam{.activation = Activation::kSilu,
                              .has_residual = true,
                              .residual_is_multiplier = true},
                  {x, wg, u}, {y}, R.ctx);
        // x twice, weights, write u, read u in the epilogue, write y.
        fused_pair(
            R, "fused_gated_epilogue" + sfx + "[512x768x2x2048]", dt,
            2 * x_bytes + w_bytes + 3 * mf, unfused_bytes, flops,
            [&] {
              up(R.ctx);
              gate(R.ctx);
            },
            unfused);
      }
    }
  }
}

// ---- Linear vs oneDNN called directly, and bf16 vs f32 -----------------------------------

struct DirectMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory src, wts, dst;
  bool ok = false;
  DirectMatmul(const Tensor& x, const Tensor& w, Tensor& y) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dt t = x.dtype() == DType::kBF16 ? dt::bf16 : dt::f32;
    const dnnl::memory::dim M = x.dim(0), K = x.dim(1), N = w.dim(0);
    dnnl::memory::desc a({M, K}, t, tag::ab), b_any({K, N}, t, tag::any), c({M, N}, t, tag::ab);
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b_any, c), eng);
      prim = dnnl::matmul(pd);
      src = dnnl::memory(a, eng, x.data());
      dst = dnnl::memory(c, eng, y.data());
      // Weight (N, K) row-major is (K, N) with tag ba; pack once into the primitive's layout.
      dnnl::memory plain({{K, N}, t, tag::ba}, eng, w.data());
      wts = dnnl::memory(pd.weights_desc(), eng);
      dnnl::reorder(plain, wts).execute(strm, plain, wts);
      strm.wait();
      ok = true;
    } catch (const dnnl::error&) {
      ok = false;
    }
  }
  void operator()() {
    prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
    strm.wait();
  }
};

// Every Linear's weight (input 1) in `calls`, for read_tensors: the floor of a weight-streaming
// benchmark, timed in turn with it, since the host's memory speed drifts within a run (and
// differs between allocations), so the read measured at the run's start is not its floor.
std::vector<Tensor> weights_of(const std::vector<std::unique_ptr<Call>>& calls) {
  std::vector<Tensor> w;
  for (const auto& c : calls) w.push_back(c->pack.inputs[1]);
  return w;
}

// Decode GEMV: M = 1 (and a 4-sequence batch) against weights from DRAM: each timed call runs
// over several copies of the weight (distinct matrices, ~128 MB in all, four times a 32 MiB
// L3), as a model's layers do; one bf16 2048x5632 matrix alone (23 MB) stayed in Zen 5's L3
// and read "faster than DRAM". Ours (weight as stored), oneDNN called directly on its packed
// copies and a plain read of our copies (the floor), in turn.
void gemv_cases(Runner& R) {
  struct Shp {
    int64_t M, K, N;
  };
  const Shp shapes[] = {{1, 2048, 5632}, {1, 768, 32000}, {4, 2048, 5632}};
  omp_set_num_threads(R.ctx.num_threads());
  for (const Shp& s : shapes)
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const std::string name = std::string("linear_gemv_") + dtype_name(dt) + "[" +
                               std::to_string(s.M) + "x" + std::to_string(s.K) + "x" +
                               std::to_string(s.N) + "]";
      if (!R.want(name)) continue;
      Tensor x = filled(dt, {s.M, s.K}, 1);
      Tensor y = Tensor::empty(dt, {s.M, s.N}), y2 = Tensor::empty(dt, {s.M, s.N});
      const double wbytes = static_cast<double>(s.K * s.N) * static_cast<double>(dtype_size(dt));
      const int copies = std::max(1, static_cast<int>(std::ceil(128e6 / wbytes)));
      std::vector<std::unique_ptr<Call>> ours;
      std::vector<std::unique_ptr<DirectMatmul>> direct;
      bool direct_ok = true;
      for (int c = 0; c < copies; ++c) {
        Tensor w = filled(dt, {s.N, s.K}, 2 + static_cast<uint32_t>(c), -0.05f, 0.05f);
        ours.push_back(std::make_unique<Call>(LinearParam{}, std::vector<Tensor>{x, w},
                                              std::vector<Tensor>{y}, R.ctx));
        direct.push_back(std::make_unique<DirectMatmul>(x, w, y2));
        direct_ok = direct_ok && direct.back()->ok;
      }
      auto run_ours = [&] {
        for (auto& c : ours) (*c)(R.ctx);
      };
      Result r;
      r.name = name;
      r.dtype = dtype_name(dt);
      r.flops = 2.0 * static_cast<double>(s.M * s.K * s.N);
      r.bytes = wbytes;
      const std::vector<Tensor> wts = weights_of(ours);
      auto read = [&] { read_tensors(wts, R.ctx.num_threads()); };
      Timing o, tr;
      if (direct_ok) {
        const auto ts = time_alternating({run_ours,
                                          [&] {
                                            for (auto& d : direct) (*d)();
                                          },
                                          read},
                                         1.5 * R.budget());
        o = ts[0], tr = ts[2];
        r.baseline = "onednn";
        r.speedup_vs_baseline = ts[1].median / o.median;
        r.bytes_ratio_vs_baseline = 1.0;
      } else {
        std::tie(o, tr) = time_pair(run_ours, read, R.budget());
      }
      r.floor_fraction = tr.median / o.median;
      o.median /= copies, o.min /= copies, o.max /= copies;
      r.seconds = o.median;
      r.spread = spread(o);
      r.gflops = r.flops / r.seconds / 1e9;
      r.gbps = wbytes / r.seconds / 1e9;
      char rd[96];
      std::snprintf(rd, sizeof rd, "; a plain read of them, timed in turn: %.1f GB/s; ",
                    wbytes * copies / tr.median / 1e9);
      r.note = std::to_string(copies) + " copies of the weight in turn" + rd +
               ours[0]->op->impl_info() +
               (direct_ok ? "" : "; oneDNN has no " + std::string(dtype_name(dt)) + " matmul here");
      R.emit(r);
    }
}

// A decode step's GEMVs as the model runs them: llama-110m's 12 layers (q, k, v, o 768x768;
// gate, up 2048x768; down 768x2048) and the 32000-row lm_head, every matrix distinct, one
// after another at M = 1 (219 MB in bf16, beyond any cache). Against the DRAM floor, this shows
// what the per-call costs (fork/join, stream ramp-up, imbalance) take from the single-matrix
// figures above.
void gemv_layer_cases(Runner& R) {
  struct Mat {
    int64_t N, K;
  };
  std::vector<Mat> mats;
  for (int l = 0; l < 12; ++l)
    for (Mat m : {Mat{768, 768}, Mat{768, 768}, Mat{768, 768}, Mat{768, 768}, Mat{2048, 768},
                  Mat{2048, 768}, Mat{768, 2048}})
      mats.push_back(m);
  mats.push_back({32000, 768});
  omp_set_num_threads(R.ctx.num_threads());
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string name = std::string("linear_gemv_layers_") + dtype_name(dt) + "[llama-110m]";
    if (!R.want(name)) continue;
    std::vector<Tensor> xs, ys;
    std::vector<std::unique_ptr<Call>> calls;
    double wbytes = 0;
    uint32_t seed = 11;
    for (const Mat& m : mats) {
      xs.push_back(filled(dt, {1, m.K}, seed++));
      ys.push_back(Tensor::empty(dt, {1, m.N}));
      Tensor w = filled(dt, {m.N, m.K}, seed++, -0.05f, 0.05f);
      calls.push_back(std::make_unique<Call>(LinearParam{}, std::vector<Tensor>{xs.back(), w},
                                             std::vector<Tensor>{ys.back()}, R.ctx));
      wbytes += static_cast<double>(m.N * m.K) * static_cast<double>(dtype_size(dt));
    }
    const auto [o, tr] = time_pair(
        [&] {
          for (auto& c : calls) (*c)(R.ctx);
        },
        [&, wts = weights_of(calls)] { read_tensors(wts, R.ctx.num_threads()); }, R.budget());
    Result r;
    r.name = name;
    r.dtype = dtype_name(dt);
    r.seconds = o.median;
    r.spread = spread(o);
    r.bytes = wbytes;
    r.gbps = wbytes / o.median / 1e9;
    r.floor_fraction = tr.median / o.median;
    char note[160];
    std::snprintf(note, sizeof note,
                  "%zu GEMVs in sequence, %.1f MB of weights; a plain read of them, timed in "
                  "turn: %.1f GB/s",
                  mats.size(), wbytes / 1e6, wbytes / tr.median / 1e9);
    r.note = note;
    R.emit(r);
  }
}

// Fused linear + cross-entropy (the training LM head: logits, softmax, loss, dx, dW) at
// GPT-2's vocabulary, T = 1024 rows: row chunks of ~40 MiB of logits vs the same kernels with
// one chunk of all rows (the unfused memory shape: the whole (T, V) logits block exists, the
// gradient written over it; an autograd framework keeps more: logits, log-probabilities and
// their gradient). Time = all five steps; floor = the three GEMMs at the peak of their dtype.
void cross_entropy_cases(Runner& R) {
  const int64_t M = R.opt.quick ? 128 : 1024, K = 768, V = 50257;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string name = std::string("linear_cross_entropy_") + dtype_name(dt) + "[" +
                             std::to_string(M) + "x" + std::to_string(K) + "x" + std::to_string(V) +
                             "]";
    if (!R.want(name)) continue;
    Tensor x = filled(dt, {M, K}, 1, -1.0f, 1.0f);
    Tensor w = filled(dt, {V, K}, 2, -0.05f, 0.05f);
    Tensor dx = Tensor::empty(dt, {M, K});
    std::vector<float> dw(static_cast<size_t>(V * K), 0.0f);
    std::vector<int32_t> labels(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i)
      labels[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919) % V);
    auto run = [&](int64_t chunk) {
      kernels::LinearCrossEntropyArgs a;
      a.dx = dx.data(), a.dw = dw.data(), a.x = x.data(), a.w = w.data();
      a.labels = labels.data(), a.dtype = dt, a.M = M, a.K = K, a.V = V, a.chunk_rows = chunk;
      a.threads = R.ctx.num_threads();
      kernels::linear_cross_entropy(a);
    };
    const int64_t chunk = kernels::cross_entropy_chunk_rows(M, V);
    const auto [fused, unfused] = time_pair([&] { run(0); }, [&] { run(M); }, R.budget(), 5);
    Result r;
    r.name = name;
    r.dtype = dtype_name(dt);
    r.seconds = fused.median;
    r.spread = spread(fused);
    r.flops = 3.0 * 2.0 * static_cast<double>(M * K * V);
    r.gflops = r.flops / fused.median / 1e9;
    // The products run natively in bf16 where oneDNN has a bf16 matmul: that peak, else f32's.
    const double peak =
        dt == DType::kBF16 && kernels::gemm_has_native(dt) ? R.lim.bf16_gflops : R.lim.fma_gflops;
    r.floor_fraction = r.flops / (peak * 1e9) / fused.median;
    r.baseline = "unfused";
    r.speedup_vs_baseline = unfused.median / fused.median;
    r.working_bytes = static_cast<double>(chunk * V * 4);
    r.bytes_ratio_vs_baseline = static_cast<double>(chunk) / static_cast<double>(M);
    r.note = "logits block " + std::to_string(chunk * V * 4 >> 20) + " MiB (" +
             std::to_string(chunk) + " rows) vs " + std::to_string(M * V * 4 >> 20) +
             " MiB unfused" +
             (dt == DType::kBF16 && !kernels::gemm_has_native(dt)
                  ? "; bf16 head widened to f32 once per call (+" +
                        std::to_string(V * K * 4 >> 20) + " MiB)"
                  : "");
    R.emit(r);
  }
}

void linear_cases(Runner& R) {
  struct Shp {
    int64_t M, K, N;
  };
  const Shp shapes[] = {{512, 768, 3072}, {512, 4096, 4096}};
  omp_set_num_threads(R.ctx.num_threads());
  for (const Shp& s : shapes) {
    const std::string shape =
        "[" + std::to_string(s.M) + "x" + std::to_string(s.K) + "x" + std::to_string(s.N) + "]";
    const double flops = 2.0 * static_cast<double>(s.M * s.K * s.N);
    const std::string n32 = "linear_f32" + shape, n16 = "linear_bf16" + shape,
                      nvs = "linear_bf16_vs_f32" + shape;
    if (!R.want(n32) && !R.want(n16) && !R.want(nvs)) continue;
    struct Side {
      Tensor x, w, y, y2;
      std::unique_ptr<Call> ours;
      std::unique_ptr<DirectMatmul> direct;
    };
    auto make = [&](DType dt) {
      Side sd;
      sd.x = filled(dt, {s.M, s.K}, 1);
      sd.w = filled(dt, {s.N, s.K}, 2, -0.05f, 0.05f);
      sd.y = Tensor::empty(dt, {s.M, s.N});
      sd.y2 = Tensor::empty(dt, {s.M, s.N});
      sd.ours = std::make_unique<Call>(LinearParam{}, std::vector<Tensor>{sd.x, sd.w},
                                       std::vector<Tensor>{sd.y}, R.ctx);
      sd.direct = std::make_unique<DirectMatmul>(sd.x, sd.w, sd.y2);
      return sd;
    };
    Side f32 = make(DType::kF32), b16 = make(DType::kBF16);
    auto row = [&](const std::string& name, DType dt, const Timing& o) {
      const double peak = dt == DType::kBF16 ? R.lim.bf16_gflops : R.lim.fma_gflops;
      const double es = static_cast<double>(dtype_size(dt));
      Result r;
      r.name = name;
      r.dtype = dtype_name(dt);
      r.flops = flops;
      r.bytes = es * static_cast<double>(s.M * s.K + s.K * s.N + s.M * s.N);
      r.seconds = o.median;
      r.spread = spread(o);
      r.gflops = flops / r.seconds / 1e9;
      r.floor_fraction =
          std::max(flops / (peak * 1e9), r.bytes / (R.lim.copy_gbps * 1e9)) / r.seconds;
      return r;
    };
    // Ours vs oneDNN called directly (same packed weights, same threads), alternating.
    for (Side* sd : {&f32, &b16}) {
      const DType dt = sd->x.dtype();
      const std::string name = dt == DType::kF32 ? n32 : n16;
      if (!R.want(name)) continue;
      Result r;
      if (sd->direct->ok) {
        const auto [o, d] =
            time_pair([&] { (*sd->ours)(R.ctx); }, [&] { (*sd->direct)(); }, R.budget());
        r = row(name, dt, o);
        r.baseline = "onednn";
        r.speedup_vs_baseline = d.median / o.median;
        r.bytes_ratio_vs_baseline = 1.0;
        r.note = sd->ours->op->impl_info();
      } else {
        r = row(name, dt, time_fn([&] { (*sd->ours)(R.ctx); }, R.budget()));
        r.note = "oneDNN has no " + std::string(dtype_name(dt)) +
                 " matmul on this CPU; ours: " + sd->ours->op->impl_info();
      }
      R.emit(r);
    }
    // Ours bf16 vs ours f32, alternating.
    if (R.want(nvs)) {
      const auto [b, f] =
          time_pair([&] { (*b16.ours)(R.ctx); }, [&] { (*f32.ours)(R.ctx); }, R.budget());
      Result r = row(nvs, DType::kBF16, b);
      r.baseline = "f32";
      r.speedup_vs_baseline = f.median / b.median;
      r.bytes_ratio_vs_baseline = 0.5;
      r.note = "bf16: " + b16.ours->op->impl_info();
      R.emit(r);
    }
  }
}

}  // namespace

std::vector<Result> run_op_benchmarks(const Options& opt,
                                      const std::function<void(const Result&)>& progress) {
  ContextOptions co;
  co.num_threads = opt.threads;
  Context ctx(co);
  std::vector<Result> rows;
  Runner R{opt, ctx, {}, rows, progress, std::regex(opt.filter.empty() ? "." : opt.filter)};
  R.lim = measure_limits(ctx.num_threads(), opt.quick);
  if (R.want("limits")) {
    Result c;
    c.name = "limits_copy";
    c.dtype = "f32";
    c.gbps = R.lim.copy_gbps;
    c.floor_fraction = 1.0;
    c.note = std::string("read + write bytes per second, normal stores, ") +
             (R.opt.quick ? "64" : "256") + " MiB arrays, best of ~20";
    R.emit(c);
    Result cn;
    cn.name = "limits_copy_streaming";
    cn.dtype = "f32";
    cn.gbps = R.lim.copy_nt_gbps;
    cn.floor_fraction = 1.0;
    cn.note = std::string(
                  "the same copy with non-temporal stores (no read for ownership of "
                  "the destination), as our ops write outputs of 16 MiB or more; ") +
              (R.opt.quick ? "64" : "256") + " MiB arrays, best of ~20";
    R.emit(cn);
    Result rd;
    rd.name = "limits_dram_read";
    rd.dtype = "f32";
    rd.gbps = R.lim.read_gbps;
    rd.floor_fraction = 1.0;
    rd.note = std::string("read-only stream, ") + (R.opt.quick ? "64" : "256") +
              " MiB array, best of ~20";
    R.emit(rd);
    Result f;
    f.name = "limits_fma_peak";
    f.dtype = "f32";
    f.gflops = R.lim.fma_gflops;
    f.floor_fraction = 1.0;
    f.note = "isa " + Context::kernel_isa();
    R.emit(f);
    Result b;
    b.name = "limits_bf16_peak";
    b.dtype = "bf16";
    b.gflops = R.lim.bf16_gflops;
    b.floor_fraction = 1.0;
    b.note = cpu_features().avx512_bf16
                 ? "a vdpbf16ps loop"
                 : "= the f32 FMA peak (no bf16 dot instruction; bf16 computes in f32)";
    R.emit(b);
    if (R.lim.amx_bf16_gflops > 0) {
      Result x;
      x.name = "limits_amx_bf16_peak";
      x.dtype = "bf16";
      x.gflops = R.lim.amx_bf16_gflops;
      x.floor_fraction = 1.0;
      x.note = "AMX tdpbf16ps products of 32 x 32 x 256 on L1-resident tiles, loads included";
      R.emit(x);
    }
  }
  memory_bound_ops(R);
  fused_chains(R);
  linear_cases(R);
  gemv_cases(R);
  gemv_layer_cases(R);
  cross_entropy_cases(R);
  attention_benchmarks(R);
  graph_benchmarks(R);
  return rows;
}

}  // namespace tboost::bench
