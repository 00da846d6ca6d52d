// Attention benchmarks: flash prefill against standard (unfused) attention, bf16 against f32,
// and decode against the measured DRAM read bandwidth.
//
// Unfused twin ("standard attention", what a framework without a fused kernel runs): oneDNN
// batched matmul S = Q·Kᵀ over all heads, one fused scale + causal mask + softmax pass over S
// (our vectorized softmax on each row's visible prefix, zeros after it), oneDNN batched matmul
// S·V. It materializes S (H x T x T f32) and computes the masked half too, as oneDNN cannot
// skip it. GFLOP/s count only the unmasked work (4·D per visible (query, key) pair) for both.
//
// Decode rotates through enough separate caches (layers) that their total exceeds 1 GiB, so
// the K/V reads come from DRAM, as they do in a real model where each layer's cache is read
// once per token.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <dnnl.hpp>

#include "bench/ops/runner.h"
#include "src/kernels/cpu/kernels.h"

namespace tboost::bench {
namespace {

using namespace tboost::ops;

std::string shape_tag(const std::vector<std::pair<const char*, int64_t>>& kv) {
  std::string s = "[";
  for (size_t i = 0; i < kv.size(); ++i)
    s += (i ? "," : "") + std::string(kv[i].first) + "=" + std::to_string(kv[i].second);
  return s + "]";
}

// Standard attention over (H, T, D) f32 q, k, v (B = 1, heads-major).
struct UnfusedAttention {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul qk, pv;
  dnnl::memory mq, mk, ms, mv, mo;
  Tensor s;
  int64_t H, T, D;
  float scale;
  int threads;
  UnfusedAttention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o, int nthreads)
      : H(q.dim(0)), T(q.dim(1)), D(q.dim(2)), threads(nthreads) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    s = Tensor::empty(DType::kF32, {H, T, T});
    dnnl::memory::desc dq({H, T, D}, dt::f32, tag::abc);
    dnnl::memory::desc dkt({H, D, T}, dt::f32, tag::acb);  // K (H, T, D) read as Kᵀ
    dnnl::memory::desc ds({H, T, T}, dt::f32, tag::abc);
    dnnl::memory::desc dv({H, T, D}, dt::f32, tag::abc);
    qk = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(dq, dkt, ds), eng));
    pv = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ds, dv, dq), eng));
    mq = dnnl::memory(dq, eng, q.data());
    mk = dnnl::memory(dkt, eng, k.data());
    ms = dnnl::memory(ds, eng, s.data());
    mv = dnnl::memory(dv, eng, v.data());
    mo = dnnl::memory(dq, eng, o.data());
  }
  void operator()() {
    qk.execute(strm, {{DNNL_ARG_SRC, mq}, {DNNL_ARG_WEIGHTS, mk}, {DNNL_ARG_DST, ms}});
    strm.wait();
    float* S = s.data_as<float>();
    const int64_t rows = H * T;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % T;
      float* row = S + r * T;
      kernels::SoftmaxArgs a;
      a.x = row;
      a.y = row;
      a.x_rows = a.y_rows = kernels::RowView::contiguous(1, i + 1);
      a.scale = scale;
      a.threads = 1;
      kernels::softmax_forward(a);
      std::memset(row + i + 1, 0, static_cast<size_t>(T - i - 1) * sizeof(float));
    }
    pv.execute(strm, {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mv}, {DNNL_ARG_DST, mo}});
    strm.wait();
  }
  double working_bytes() const { return static_cast<double>(s.nbytes()); }
};

Result attention_row(Runner& R, const std::string& name, DType dt, const Timing& t, double flops,
                     double bytes, double work) {
  Result r;
  r.name = name;
  r.dtype = dtype_name(dt);
  r.seconds = t.median;
  r.spread = spread(t);
  r.flops = flops;
  r.bytes = bytes;
  r.gflops = flops / t.median / 1e9;
  const double peak = dt == DType::kBF16 ? R.lim.bf16_gflops : R.lim.fma_gflops;
  r.floor_fraction = std::max(flops / (peak * 1e9), bytes / (R.lim.copy_gbps * 1e9)) / t.median;
  r.working_bytes = work;
  return r;
}

void prefill_cases(Runner& R) {
  struct Shp {
    int64_t H, D;
  };
  const Shp shapes[] = {{12, 64}, {32, 128}};
  std::vector<int64_t> lengths = {512, 2048, 8192};
  if (R.opt.quick) lengths = {512};
  omp_set_num_threads(R.ctx.num_threads());
  for (const Shp& sh : shapes) {
    for (int64_t T : lengths) {
      const std::string tag = shape_tag({{"H", sh.H}, {"D", sh.D}, {"T", T}});
      const std::string n32 = "attention_prefill_causal_f32" + tag,
                        n16 = "attention_prefill_causal_bf16" + tag;
      if (!R.want(n32) && !R.want(n16)) continue;
      const double pairs = static_cast<double>(T) * static_cast<double>(T + 1) / 2.0;
      const double flops = 4.0 * static_cast<double>(sh.D) * pairs * static_cast<double>(sh.H);
      auto make = [&](DType dt) {
        struct Side {
          Tensor q, k, v, o, lse;
          std::unique_ptr<Call> call;
        } s;
        s.q = filled(dt, {1, sh.H, T, sh.D}, 1);
        s.k = filled(dt, {1, sh.H, T, sh.D}, 2);
        s.v = filled(dt, {1, sh.H, T, sh.D}, 3);
        s.o = Tensor::empty(dt, {1, sh.H, T, sh.D});
        s.lse = Tensor::empty(DType::kF32, {1, sh.H, T});
        AttentionParam p;
        p.causal = true;
        p.layout = QkvLayout::kBNSD;
        s.call = std::make_unique<Call>(p, std::vector<Tensor>{s.q, s.k, s.v},
                                        std::vector<Tensor>{s.o, s.lse}, R.ctx);
        return s;
      };
      auto f32 = make(DType::kF32);
      const double bytes32 = 4.0 * 4.0 * static_cast<double>(sh.H * T * sh.D);
      const double work = static_cast<double>(f32.call->ws_size);
      if (R.want(n32)) {
        // The unfused twin at T = 8192 and H = 32 needs an 8 GiB score matrix and ~10 s a
        // call: it runs in the full benchmark only.
        Tensor q3 = Tensor(TensorDesc::contiguous(DType::kF32, {sh.H, T, sh.D}), f32.q.data());
        Tensor k3 = Tensor(TensorDesc::contiguous(DType::kF32, {sh.H, T, sh.D}), f32.k.data());
        Tensor v3 = Tensor(TensorDesc::contiguous(DType::kF32, {sh.H, T, sh.D}), f32.v.data());
        Tensor o2 = Tensor::empty(DType::kF32, {sh.H, T, sh.D});
        UnfusedAttention un(q3, k3, v3, o2, R.ctx.num_threads());
        const double budget = T >= 8192 ? 0.1 : 2.0 * R.budget();
        const auto [f, u] =
            time_pair([&] { (*f32.call)(R.ctx); }, [&] { un(); }, budget, T >= 8192 ? 2 : 20);
        Result r = attention_row(R, n32, DType::kF32, f, flops, bytes32, work);
        r.baseline = "unfused";
        r.speedup_vs_baseline = u.median / f.median;
        // Unfused traffic: q, k, v, o once, plus S written and read back twice (f32).
        const double sbytes = 4.0 * static_cast<double>(sh.H) * static_cast<double>(T * T);
        r.bytes_ratio_vs_baseline = bytes32 / (bytes32 + 3.0 * sbytes);
        char note[256];
        std::snprintf(note, sizeof note,
                      "unfused %.1f ms, working memory flash %.2f MiB vs unfused %.1f MiB; %s",
                      u.median * 1e3, work / 1048576.0, un.working_bytes() / 1048576.0,
                      f32.call->op->impl_info().c_str());
        r.note = note;
        R.emit(r);
      }
      if (R.want(n16)) {
        auto b16 = make(DType::kBF16);
        const auto [b, f] = time_pair([&] { (*b16.call)(R.ctx); }, [&] { (*f32.call)(R.ctx); },
                                      T >= 8192 ? 0.1 : 2.0 * R.budget(), T >= 8192 ? 2 : 20);
        Result r = attention_row(R, n16, DType::kBF16, b, flops, bytes32 / 2.0,
                                 static_cast<double>(b16.call->ws_size));
        r.baseline = "f32";
        r.speedup_vs_baseline = f.median / b.median;
        r.bytes_ratio_vs_baseline = 0.5;
        r.note = cpu_features().avx512_bf16
                     ? "bf16 storage, f32 compute"
                     : "no bf16 dot instruction on this CPU: bf16 storage, f32 compute";
        R.emit(r);
      }
    }
  }
}

void decode_cases(Runner& R) {
  struct Shp {
    int64_t H, Hkv, D;
  };
  const Shp shapes[] = {{32, 32, 128}, {32, 8, 128}};
  std::vector<int64_t> lengths = {512, 4096, 16384};
  if (R.opt.quick) lengths = {4096};
  const double total_target = R.opt.quick ? 256.0 * 1048576.0 : 1.25 * 1073741824.0;
  for (DType cdt : {DType::kF32, DType::kBF16}) {
    for (const Shp& sh : shapes) {
      for (int64_t L : lengths) {
        const std::string name = std::string("decode_attention_") + dtype_name(cdt) + "cache" +
                                 shape_tag({{"H", sh.H}, {"Hkv", sh.Hkv}, {"D", sh.D}, {"ctx", L}});
        if (!R.want(name)) continue;
        const double es = static_cast<double>(dtype_size(cdt));
        const double kv_bytes = 2.0 * static_cast<double>(L * sh.Hkv * sh.D) * es;
        const int layers = static_cast<int>(std::ceil(total_target / kv_bytes));
        // Contiguous caches of exactly L tokens: (1, Hkv, L, D) each, one per layer.
        std::vector<std::unique_ptr<Call>> calls;
        std::vector<Tensor> keep;
        Tensor q = filled(DType::kF32, {1, 1, sh.H, sh.D}, 7);
        Tensor lens = Tensor::empty(DType::kI32, {1});
        lens.data_as<int32_t>()[0] = static_cast<int32_t>(L);
        for (int l = 0; l < layers; ++l) {
          Tensor kc = filled(cdt, {1, sh.Hkv, L, sh.D}, 100 + static_cast<uint32_t>(l));
          Tensor vc = filled(cdt, {1, sh.Hkv, L, sh.D}, 200 + static_cast<uint32_t>(l));
          Tensor o = Tensor::empty(DType::kF32, {1, 1, sh.H, sh.D});
          Tensor lse = Tensor::empty(DType::kF32, {1, sh.H, 1});
          PagedAttentionParam p;
          p.paged = false;
          calls.push_back(std::make_unique<Call>(p, std::vector<Tensor>{q, kc, vc, lens},
                                                 std::vector<Tensor>{o, lse}, R.ctx));
          keep.insert(keep.end(), {kc, vc, o, lse});
        }
        const Timing t = time_fn(
            [&] {
              for (auto& c : calls) (*c)(R.ctx);
            },
            R.budget(), 20);
        const double per_call = t.median / layers;
        Result r;
        r.name = name;
        r.dtype = dtype_name(cdt);
        r.seconds = per_call;
        r.spread = spread(t);
        r.bytes = kv_bytes;
        r.flops = 4.0 * static_cast<double>(sh.H * sh.D * L);
        r.gbps = kv_bytes / per_call / 1e9;
        r.gflops = r.flops / per_call / 1e9;
        r.floor_fraction = *r.gbps / R.lim.read_gbps;
        r.working_bytes = static_cast<double>(calls[0]->ws_size);
        char note[200];
        std::snprintf(note, sizeof note,
                      "%d caches of %.1f MiB rotated (%.2f GiB); measured DRAM read %.1f GB/s",
                      layers, kv_bytes / 1048576.0, layers * kv_bytes / 1073741824.0,
                      R.lim.read_gbps);
        r.note = note;
        R.emit(r);
      }
    }
  }
}

}  // namespace

void attention_benchmarks(Runner& R) {
  prefill_cases(R);
  decode_cases(R);
}

}  // namespace tboost::bench
