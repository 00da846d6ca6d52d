// Attention benchmarks: flash prefill against standard (unfused) attention, bf16 against f32,
// decode against the measured DRAM read bandwidth, and the backward in bf16 against f32.
//
// Unfused twin ("standard attention", what a framework without a fused kernel runs): oneDNN
// batched matmul S = Q·Kᵀ over all heads, one fused scale + causal mask + softmax pass over S
// (our vectorized softmax on each row's visible prefix, zeros after it), oneDNN batched matmul
// S·V. It materializes S (H x T x T f32) and computes the masked half too, as oneDNN cannot
// skip it. GFLOP/s count only the unmasked work (4·D per visible (query, key) pair) for both.
//
// Decode rotates through enough separate caches (layers) that their total exceeds 1 GiB, so
// the K/V reads come from DRAM, as they do in a real model where each layer's cache is read
// once per token. The decode floor is a plain read of those same caches, timed in turn with
// the kernel (A, B, A, B ...), not only the read speed measured at the start of the run.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <dnnl.hpp>
#include <numeric>
#include <random>
#include <tuple>

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

// Standard attention, f32, what a framework without a fused kernel runs: for each of `batch`
// independent (kv head) problems, S = q·Kᵀ (M query rows: the g q heads of a GQA group times Tq
// tokens, stacked, so no K/V is repeated), one pass of scale + causal mask + softmax over each
// row's visible prefix (zeros after it), O = S·V. q, o: (batch, M, D); k, v: (batch, Tk, D).
struct UnfusedAttention {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::memory::desc dq, dkt, ds, dv;
  dnnl::matmul qk, pv;
  Tensor s;
  int64_t batch, M, Tq, Tk, D;
  bool causal;
  float scale;
  int threads;
  UnfusedAttention(int64_t batch_, int64_t M_, int64_t Tq_, int64_t Tk_, int64_t D_, bool causal_,
                   int nthreads)
      : batch(batch_), M(M_), Tq(Tq_), Tk(Tk_), D(D_), causal(causal_), threads(nthreads) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    s = Tensor::empty(DType::kF32, {batch, M, Tk});
    dq = dnnl::memory::desc({batch, M, D}, dt::f32, tag::abc);
    dkt = dnnl::memory::desc({batch, D, Tk}, dt::f32, tag::acb);  // K (batch, Tk, D) as Kᵀ
    ds = dnnl::memory::desc({batch, M, Tk}, dt::f32, tag::abc);
    dv = dnnl::memory::desc({batch, Tk, D}, dt::f32, tag::abc);
    qk = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(dq, dkt, ds), eng));
    pv = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ds, dv, dq), eng));
  }
  void operator()(const void* q, const void* k, const void* v, void* o) {
    auto mem = [&](const dnnl::memory::desc& d, const void* p) {
      return dnnl::memory(d, eng, const_cast<void*>(p));
    };
    const dnnl::memory ms = mem(ds, s.data());
    qk.execute(strm,
               {{DNNL_ARG_SRC, mem(dq, q)}, {DNNL_ARG_WEIGHTS, mem(dkt, k)}, {DNNL_ARG_DST, ms}});
    strm.wait();
    float* S = s.data_as<float>();
    const int64_t rows = batch * M;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = (r % M) % Tq;
      const int64_t visible = causal ? std::min(Tk, i + Tk - Tq + 1) : Tk;
      float* row = S + r * Tk;
      kernels::SoftmaxArgs a;
      a.x = row;
      a.y = row;
      a.x_rows = a.y_rows = kernels::RowView::contiguous(1, visible);
      a.scale = scale;
      a.threads = 1;
      kernels::softmax_forward(a);
      std::memset(row + visible, 0, static_cast<size_t>(Tk - visible) * sizeof(float));
    }
    pv.execute(strm,
               {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mem(dv, v)}, {DNNL_ARG_DST, mem(dq, o)}});
    strm.wait();
  }
  double working_bytes() const { return static_cast<double>(s.nbytes()); }
};

// The peak bf16 prefill is rated against: the AMX tile peak where it runs on AMX, vdpbf16ps's
// where it dots pairs with that, else the f32 FMA peak (it widens to f32).
double prefill_bf16_peak(const Runner& R) {
  if (kernels::attention_prefill_bf16_amx() && kernels::attention_amx_allowed() &&
      R.lim.amx_bf16_gflops > 0)
    return R.lim.amx_bf16_gflops;
  return kernels::attention_prefill_bf16_dot() ? R.lim.bf16_gflops : R.lim.fma_gflops;
}

// bf16_peak: the GFLOP/s bf16 rows are rated against (f32 rows: the FMA peak).
Result attention_row(Runner& R, const std::string& name, DType dt, const Timing& t, double flops,
                     double bytes, double work, double bf16_peak) {
  Result r;
  r.name = name;
  r.dtype = dtype_name(dt);
  r.seconds = t.median;
  r.spread = spread(t);
  r.flops = flops;
  r.bytes = bytes;
  r.gflops = flops / t.median / 1e9;
  const double peak = dt == DType::kBF16 ? bf16_peak : R.lim.fma_gflops;
  r.floor_fraction = std::max(flops / (peak * 1e9), bytes / (R.lim.copy_gbps * 1e9)) / t.median;
  r.working_bytes = work;
  return r;
}

void prefill_cases(Runner& R) {
  struct Shp {
    int64_t H, Hkv, D;
    bool long_too;  // also T = 512 and 8192 (the GQA shape runs at 2048 only)
  };
  const Shp shapes[] = {{12, 12, 64, true}, {32, 32, 128, true}, {32, 8, 128, false}};
  omp_set_num_threads(R.ctx.num_threads());
  for (const Shp& sh : shapes) {
    std::vector<int64_t> lengths = {512, 2048, 8192};
    if (!sh.long_too) lengths = {2048};
    if (R.opt.quick) lengths = {512};
    for (int64_t T : lengths) {
      // MHA shapes keep their earlier names; GQA ones add Hkv.
      const std::string tag =
          sh.Hkv == sh.H ? shape_tag({{"H", sh.H}, {"D", sh.D}, {"T", T}})
                         : shape_tag({{"H", sh.H}, {"Hkv", sh.Hkv}, {"D", sh.D}, {"T", T}});
      const std::string n32 = "attention_prefill_causal_f32" + tag,
                        n16 = "attention_prefill_causal_bf16" + tag,
                        nvs = "attention_prefill_causal_bf16_vs_f32" + tag;
      if (!R.want(n32) && !R.want(n16) && !R.want(nvs)) continue;
      const double pairs = static_cast<double>(T) * static_cast<double>(T + 1) / 2.0;
      const double flops = 4.0 * static_cast<double>(sh.D) * pairs * static_cast<double>(sh.H);
      auto make = [&](DType dt) {
        struct Side {
          Tensor q, k, v, o, lse;
          std::unique_ptr<Call> call;
        } s;
        s.q = filled(dt, {1, sh.H, T, sh.D}, 1);
        s.k = filled(dt, {1, sh.Hkv, T, sh.D}, 2);
        s.v = filled(dt, {1, sh.Hkv, T, sh.D}, 3);
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
      const double bytes32 = 4.0 * 2.0 * static_cast<double>((sh.H + sh.Hkv) * T * sh.D);
      // The unfused twin (f32: oneDNN 2.6 has no bf16 matmul without AVX512_BF16, so it is
      // also the standard path the bf16 rows are compared with). At T = 8192, H = 32 it needs
      // an 8 GiB score matrix and ~10 s a call: the full benchmark only.
      Tensor o2 = Tensor::empty(DType::kF32, {sh.H, T, sh.D});
      // GQA: the g q heads of a kv head are stacked as rows (M = g·T), so no K/V is repeated.
      UnfusedAttention un(sh.Hkv, sh.H / sh.Hkv * T, T, T, sh.D, true, R.ctx.num_threads());
      auto unfused = [&] { un(f32.q.data(), f32.k.data(), f32.v.data(), o2.data()); };
      const double sbytes = 4.0 * static_cast<double>(sh.H) * static_cast<double>(T * T);
      const double budget = T >= 8192 ? 0.1 : 2.0 * R.budget();
      const int runs = T >= 8192 ? 2 : 20;
      const char* bf16_path =
          kernels::attention_prefill_bf16_amx() && kernels::attention_amx_allowed()
              ? "AMX tiles (tdpbf16ps) for both products, f32 accumulation; rated against the "
                "AMX peak"
          : kernels::attention_prefill_bf16_dot() && sh.D % 2 == 0
              ? "bf16 pair products (vdpbf16ps), f32 accumulation"
          : cpu_features().avx512_bf16
              ? "bf16 widened to f32 FMAs (vdpbf16ps runs at half their rate on this CPU)"
              : "no bf16 dot instruction on this CPU: bf16 storage, f32 compute";
      auto vs_unfused = [&](const std::string& name, DType dt, Call& call, double bytes) {
        const auto [f, u] = time_pair([&] { call(R.ctx); }, unfused, budget, runs);
        const double work = static_cast<double>(call.ws_size);
        Result r = attention_row(R, name, dt, f, flops, bytes, work, prefill_bf16_peak(R));
        r.baseline = "unfused";
        r.speedup_vs_baseline = u.median / f.median;
        // Unfused traffic: q, k, v, o once (f32), plus S written and read back twice.
        r.bytes_ratio_vs_baseline = bytes / (bytes32 + 3.0 * sbytes);
        char note[320];
        std::snprintf(note, sizeof note,
                      "unfused (f32) %.1f ms, working memory flash %.2f MiB vs unfused %.1f MiB; "
                      "%s%s%s",
                      u.median * 1e3, work / 1048576.0, un.working_bytes() / 1048576.0,
                      call.op->impl_info().c_str(), dt == DType::kBF16 ? "; " : "",
                      dt == DType::kBF16 ? bf16_path : "");
        r.note = note;
        R.emit(r);
      };
      if (R.want(n32)) vs_unfused(n32, DType::kF32, *f32.call, bytes32);
      if (!R.want(n16) && !R.want(nvs)) continue;
      auto b16 = make(DType::kBF16);
      if (R.want(n16)) vs_unfused(n16, DType::kBF16, *b16.call, bytes32 / 2.0);
      if (R.want(nvs)) {
        const auto [b, f] =
            time_pair([&] { (*b16.call)(R.ctx); }, [&] { (*f32.call)(R.ctx); }, budget, runs);
        Result r = attention_row(R, nvs, DType::kBF16, b, flops, bytes32 / 2.0,
                                 static_cast<double>(b16.call->ws_size), prefill_bf16_peak(R));
        r.baseline = "f32";
        r.speedup_vs_baseline = f.median / b.median;
        r.bytes_ratio_vs_baseline = 0.5;
        r.note = bf16_path;
        R.emit(r);
      }
    }
  }
}

void decode_cases(Runner& R) {
  struct Shp {
    int64_t H, Hkv, D;
    bool all_lengths;  // 512, 4096 and 16384 tokens, or 4096 only
    int64_t page = 0;  // paged cache with pages of this many tokens (vLLM's 16), or contiguous
    int64_t sq = 1;    // query tokens per call, causal among themselves
    int64_t ctx = 0;   // > 0: this length only, in place of the lengths above
  };
  // MHA, GQA-4 (Llama-3-8B), GQA-8 (TinyLlama, Llama-3-70B) and MQA with 32 q heads. With g q
  // heads per kv head a decode does g / 2 FLOPs per byte of an f32 cache and g per byte of a
  // bf16 one, so for large g the products, not DRAM, set the floor on a few cores. Then MHA and
  // GQA-4 in a paged cache of 16-token pages, the pages in a shuffled order. Then head dim 64,
  // where each key's fixed costs (the score's lane sum, the softmax) weigh twice as much per
  // byte: GQA-4 (Llama-3.2-1B's 32 / 8 heads) and GQA-3 (SmolLM2-135M's 9 / 3). Then GQA-4
  // with 4 query tokens per call (a speculative decoder's check of 4 drafted tokens): 16 query
  // rows per kv head. Then Qwen2-0.5B's 14 / 2 heads of 64 in 16-token pages (7 rows per kv
  // head, small pages of 2 heads), and head dim 80 (Phi-2's 32 heads), which is no multiple of
  // 32. Last, llama-110m's 12 heads of 64 in 16-token pages at 1100 tokens: three chunks, the
  // last one short, where how many heads a task takes decides how the pages are read.
  const Shp shapes[] = {
      {32, 32, 128, true},    {32, 8, 128, true},       {32, 4, 128, false},
      {32, 1, 128, false},    {32, 32, 128, false, 16}, {32, 8, 128, false, 16},
      {32, 8, 64, false},     {9, 3, 64, false},        {32, 8, 128, false, 0, 4},
      {14, 2, 64, false, 16}, {32, 32, 80, false},      {12, 12, 64, false, 16, 1, 1100}};
  std::vector<int64_t> lengths = {512, 4096, 16384};
  if (R.opt.quick) lengths = {4096};
  const double total_target = R.opt.quick ? 256.0 * 1048576.0 : 1.25 * 1073741824.0;
  for (DType cdt : {DType::kF32, DType::kBF16}) {
    for (const Shp& sh : shapes) {
      for (int64_t L : sh.ctx ? std::vector<int64_t>{sh.ctx} : lengths) {
        if (!sh.all_lengths && !sh.ctx && L != 4096) continue;
        std::vector<std::pair<const char*, int64_t>> tag = {
            {"H", sh.H}, {"Hkv", sh.Hkv}, {"D", sh.D}, {"ctx", L}};
        if (sh.page) tag.push_back({"page", sh.page});
        if (sh.sq > 1) tag.push_back({"sq", sh.sq});
        const std::string name =
            std::string("decode_attention_") + dtype_name(cdt) + "cache" + shape_tag(tag);
        if (!R.want(name)) continue;
        const double es = static_cast<double>(dtype_size(cdt));
        const double kv_bytes = 2.0 * static_cast<double>(L * sh.Hkv * sh.D) * es;
        const int layers = static_cast<int>(std::ceil(total_target / kv_bytes));
        // Caches of L tokens, one per layer: contiguous (1, Hkv, L, D), or paged
        // (ceil(L / page), Hkv, page, D), the last page partly used, with a block table that
        // visits the pages shuffled.
        std::vector<std::unique_ptr<Call>> calls;
        std::vector<Tensor> keep;
        // q and o in the cache's dtype, as in a model of that dtype.
        Tensor q = filled(cdt, {1, sh.sq, sh.H, sh.D}, 7);
        Tensor lens = Tensor::empty(DType::kI32, {1});
        lens.data_as<int32_t>()[0] = static_cast<int32_t>(L);
        const int64_t pages = sh.page ? (L + sh.page - 1) / sh.page : 1,
                      rows = sh.page ? sh.page : L;
        Tensor table = Tensor::empty(DType::kI32, {1, pages});
        std::vector<int32_t> order(static_cast<size_t>(pages));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), std::mt19937(5));
        std::copy(order.begin(), order.end(), table.data_as<int32_t>());
        for (int l = 0; l < layers; ++l) {
          Tensor kc = filled(cdt, {pages, sh.Hkv, rows, sh.D}, 100 + static_cast<uint32_t>(l));
          Tensor vc = filled(cdt, {pages, sh.Hkv, rows, sh.D}, 200 + static_cast<uint32_t>(l));
          Tensor o = Tensor::empty(cdt, {1, sh.sq, sh.H, sh.D});
          Tensor lse = Tensor::empty(DType::kF32, {1, sh.H, sh.sq});
          PagedAttentionParam p;
          p.paged = sh.page > 0;
          calls.push_back(std::make_unique<Call>(p,
                                                 p.paged
                                                     ? std::vector<Tensor>{q, kc, vc, lens, table}
                                                     : std::vector<Tensor>{q, kc, vc, lens},
                                                 std::vector<Tensor>{o, lse}, R.ctx));
          keep.insert(keep.end(), {kc, vc, o, lse});
        }
        auto ours = [&] {
          for (auto& c : calls) (*c)(R.ctx);
        };
        // The floor, timed in turn with ours: a plain read of the same K and V buffers, so the
        // host's bandwidth drift (it changes by 2x within minutes on some hosts) hits both.
        const int64_t cache_bytes = static_cast<int64_t>(kv_bytes / 2);
        auto read_same = [&] {
          for (int l = 0; l < layers; ++l) {
            const auto& in = calls[static_cast<size_t>(l)]->pack.inputs;
            read_kernel(in[1].data(), cache_bytes, R.ctx.num_threads());
            read_kernel(in[2].data(), cache_bytes, R.ctx.num_threads());
          }
        };
        // Unfused twin (f32 caches only: oneDNN 2.6 has no bf16 matmul without AVX512_BF16):
        // per layer q·Kᵀ over the g q heads of each kv head, softmax, ·V, same caches.
        Timing t, tu, tr;
        std::unique_ptr<UnfusedAttention> un;
        Tensor ou = Tensor::empty(DType::kF32, {1, 1, sh.H, sh.D});
        if (cdt == DType::kF32 && !sh.page && sh.sq == 1) {
          un = std::make_unique<UnfusedAttention>(sh.Hkv, sh.H / sh.Hkv, 1, L, sh.D, true,
                                                  R.ctx.num_threads());
          auto unfused = [&] {
            for (int l = 0; l < layers; ++l) {
              const auto& in = calls[static_cast<size_t>(l)]->pack.inputs;
              (*un)(q.data(), in[1].data(), in[2].data(), ou.data());
            }
          };
          const auto ts = time_alternating({ours, unfused, read_same}, 3.0 * R.budget(), 20);
          t = ts[0], tu = ts[1], tr = ts[2];
        } else {
          std::tie(t, tr) = time_pair(ours, read_same, 2.0 * R.budget(), 20);
        }
        const double per_call = t.median / layers;
        Result r;
        r.name = name;
        r.dtype = dtype_name(cdt);
        r.seconds = per_call;
        r.spread = spread(t);
        r.bytes = kv_bytes;
        r.flops = 4.0 * static_cast<double>(sh.H * sh.sq * sh.D * L);
        r.gbps = kv_bytes / per_call / 1e9;
        r.gflops = r.flops / per_call / 1e9;
        const double read_gbps = kv_bytes * layers / tr.median / 1e9;
        // The floor is the slower of the read of the caches and their FLOPs at the peak of the
        // products' dtype (bf16 pair dots for a bf16 model where the CPU has them, AMX tiles
        // where the kernel runs them: bf16 q and cache, head dims multiples of 32, tasks of up
        // to 16 query rows per kv head).
        const bool amx = cdt == DType::kBF16 && R.lim.amx_bf16_gflops > 0 && sh.D % 32 == 0 &&
                         kernels::attention_amx_allowed() &&
                         kernels::attention_decode_bf16_amx(
                             std::min<int64_t>(16, sh.H / sh.Hkv * sh.sq), sh.page);
        const double peak = amx                   ? R.lim.amx_bf16_gflops
                            : cdt == DType::kBF16 ? R.lim.bf16_gflops
                                                  : R.lim.fma_gflops;
        const double compute_s = r.flops * layers / (peak * 1e9);
        r.floor_fraction = std::max(tr.median, compute_s) / t.median;
        r.working_bytes = static_cast<double>(calls[0]->ws_size);
        if (un) {
          r.baseline = "unfused";
          r.speedup_vs_baseline = tu.median / t.median;
          // Unfused: K and V once, plus the scores written, read back twice (small here).
          const double sb = 4.0 * static_cast<double>(sh.H * L);
          r.bytes_ratio_vs_baseline = kv_bytes / (kv_bytes + 3.0 * sb);
        }
        char note[400];
        std::snprintf(
            note, sizeof note,
            "%d caches of %.1f MiB rotated (%.2f GiB); a plain read of them, timed in "
            "turn: %.1f GB/s (limits: %.1f)%s%s",
            layers, kv_bytes / 1048576.0, layers * kv_bytes / 1073741824.0, read_gbps,
            R.lim.read_gbps,
            compute_s > tr.median ? "; floor: the FLOPs at the peak (slower than the read)" : "",
            un          ? ""
            : sh.page   ? "; no unfused twin (paged)"
            : sh.sq > 1 ? "; no unfused twin (several query tokens)"
                        : "; no unfused twin (oneDNN has no bf16 matmul on this CPU)");
        r.note = note;
        R.emit(r);
      }
    }
  }
}

// Backward (training): bf16 against f32 on the same data, the trainer's layout (q, k, v packed
// in one (B, T, (H + 2·Hkv)·D) tensor). GFLOP/s count the 4 products of the unmasked work
// (dV, dK, dQ and dP; S is recomputed on top: the count is the trainer's floor).
void backward_cases(Runner& R) {
  struct Shp {
    int64_t B, T, H, Hkv, D;
  };
  std::vector<Shp> shapes = {{4, 256, 12, 12, 64}, {1, 2048, 32, 8, 128}};
  if (R.opt.quick) shapes.resize(1);
  const int threads = R.ctx.num_threads();
  for (const Shp& sh : shapes) {
    const std::string tag =
        shape_tag({{"B", sh.B}, {"T", sh.T}, {"H", sh.H}, {"Hkv", sh.Hkv}, {"D", sh.D}});
    const std::string name = "attention_backward_causal_bf16_vs_f32" + tag;
    if (!R.want(name)) continue;
    const int64_t QW = (sh.H + 2 * sh.Hkv) * sh.D, M = sh.B * sh.T;
    struct Side {
      Tensor qkv, o, dout, dqkv, lse;
      std::vector<char> ws;
      kernels::AttentionBackwardArgs b;
    };
    auto make = [&](DType dt) {
      Side s;
      const int64_t e = static_cast<int64_t>(dtype_size(dt));
      s.qkv = filled(dt, {M, QW}, 1);
      s.o = Tensor::empty(dt, {M, sh.H * sh.D});
      s.dout = filled(dt, {M, sh.H * sh.D}, 2);
      s.dqkv = Tensor::empty(dt, {M, QW});
      s.lse = Tensor::empty(DType::kF32, {M * sh.H});
      kernels::AttentionArgs& a = s.b.f;
      char* qkv = static_cast<char*>(s.qkv.data());
      a.q = qkv, a.k = qkv + sh.H * sh.D * e, a.v = qkv + (sh.H + sh.Hkv) * sh.D * e;
      a.q_ss = a.k_ss = a.v_ss = QW, a.q_sh = a.k_sh = a.v_sh = sh.D;
      a.q_sb = a.k_sb = a.v_sb = sh.T * QW;
      a.o = s.o.data(), a.o_ss = sh.H * sh.D, a.o_sh = sh.D, a.o_sb = sh.T * sh.H * sh.D;
      a.lse = s.lse.data_as<float>(), a.lse_ss = 1, a.lse_sh = sh.T, a.lse_sb = sh.H * sh.T;
      a.dtype = a.kv_dtype = dt, a.batch = sh.B, a.heads = sh.H, a.kv_heads = sh.Hkv;
      a.head_dim = a.v_head_dim = sh.D, a.sq = a.sk = sh.T;
      a.scale = 1.0f / std::sqrt(static_cast<float>(sh.D)), a.causal = true, a.threads = threads;
      kernels::AttentionBackwardArgs& b = s.b;
      char* d = static_cast<char*>(s.dqkv.data());
      b.dout = s.dout.data(), b.do_sb = a.o_sb, b.do_sh = a.o_sh, b.do_ss = a.o_ss;
      b.dq = d, b.dq_sb = a.q_sb, b.dq_sh = a.q_sh, b.dq_ss = a.q_ss;
      b.dk = d + sh.H * sh.D * e, b.dk_sb = a.k_sb, b.dk_sh = a.k_sh, b.dk_ss = a.k_ss;
      b.dv = d + (sh.H + sh.Hkv) * sh.D * e, b.dv_sb = a.v_sb, b.dv_sh = a.v_sh, b.dv_ss = a.v_ss;
      s.ws.resize(
          std::max(kernels::attention_workspace(a), kernels::attention_backward_workspace(b)) + 64);
      kernels::attention_forward(a, s.ws.data());
      return s;
    };
    Side f32 = make(DType::kF32), b16 = make(DType::kBF16);
    const auto [tb, tf] =
        time_pair([&] { kernels::attention_backward(b16.b, b16.ws.data()); },
                  [&] { kernels::attention_backward(f32.b, f32.ws.data()); }, R.budget(), 10);
    const double pairs = static_cast<double>(sh.T) * static_cast<double>(sh.T + 1) / 2.0;
    const double flops = 8.0 * static_cast<double>(sh.D) * pairs * static_cast<double>(sh.H) *
                         static_cast<double>(sh.B);
    const double bytes = 2.0 * static_cast<double>(M) * (2.0 * QW + 2.0 * sh.H * sh.D);
    Result r = attention_row(R, name, DType::kBF16, tb, flops, bytes,
                             static_cast<double>(kernels::attention_backward_workspace(b16.b)),
                             cpu_features().avx512_bf16 ? R.lim.bf16_gflops : R.lim.fma_gflops);
    r.baseline = "f32";
    r.speedup_vs_baseline = tf.median / tb.median;
    r.bytes_ratio_vs_baseline = 0.5;
    char note[200];
    std::snprintf(note, sizeof note, "f32 %.2f ms (%.0f GFLOP/s); %s", tf.median * 1e3,
                  flops / tf.median / 1e9,
                  cpu_features().avx512_bf16 ? "bf16 pair path (vdpbf16ps)"
                                             : "no bf16 dot instruction: bf16 widened to f32");
    r.note = note;
    R.emit(r);
  }
}
}  // namespace

void attention_benchmarks(Runner& R) {
  prefill_cases(R);
  decode_cases(R);
  backward_cases(R);
}

}  // namespace tboost::bench
