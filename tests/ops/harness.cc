// Op test harness implementation (see harness.h).
#include "tests/ops/harness.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "hwy/targets.h"

namespace tboost::testing {

namespace {
// TBOOST_TEST_HWY_TARGET=emu128 makes every Highway kernel dispatch to the portable fallback
// target instead of the machine's best, so CI also runs the op suite at another vector width
// on the same machine. EMU128 is not among our compiled targets, so the dispatcher falls back
// to Highway's SCALAR target: one lane (other tails, other remainders, other tile shapes).
// TBOOST_TEST_HWY_TARGET=avx2 caps an AVX-512 machine at the AVX2 object (no effect where the
// CPU lacks AVX2).
struct ForcedTarget {
  ForcedTarget() {
    const char* t = std::getenv("TBOOST_TEST_HWY_TARGET");
    if (!t || !*t) return;
    const std::string want(t);
    if (want == "emu128") hwy::SetSupportedTargetsForTest(HWY_EMU128);
    if (want == "avx2" && (hwy::SupportedTargets() & HWY_AVX2))
      hwy::SetSupportedTargetsForTest(HWY_AVX2 | HWY_SCALAR | HWY_EMU128);
    if (want != "emu128" && want != "avx2") {
      std::fprintf(stderr, "TBOOST_TEST_HWY_TARGET=%s: expected emu128 or avx2\n", t);
      std::abort();
    }
    // The cap took: nothing above AVX2 is left to dispatch to.
    if ((hwy::SupportedTargets() & ~(HWY_AVX2 | HWY_SCALAR | HWY_EMU128)) != 0) {
      std::fprintf(stderr, "TBOOST_TEST_HWY_TARGET=%s did not cap the Highway targets\n", t);
      std::abort();
    }
  }
} forced_target;
}  // namespace

bool streamed_outputs_possible() {
  // Read from what the dispatcher may pick (after ForcedTarget), not from the variable again.
  return (hwy::SupportedTargets() & ~(HWY_SCALAR | HWY_EMU128)) != 0;
}

Rng::Rng() {
  static uint64_t base = [] {
    const char* env = std::getenv("TBOOST_TEST_SEED");
    return env ? std::strtoull(env, nullptr, 0) : std::random_device{}();
  }();
  static uint64_t counter = 0;
  seed_ = base + 0x9e3779b97f4a7c15ull * counter++;
  gen_.seed(seed_);
}

double Rng::nonzero(double lo, double hi) {
  for (;;) {
    const double v = uniform(lo, hi);
    if (std::abs(v) >= 1e-3) return v;
  }
}

static Shape padded(const Shape& shape, bool strided, int64_t* pl, int64_t* ps) {
  Shape s = shape;
  *pl = *ps = 0;
  if (strided && !s.empty()) {
    *pl = 3;
    s.back() += 3;
    if (s.size() >= 3) {
      *ps = 1;
      s[s.size() - 2] += 1;
    }
  }
  return s;
}

static Tensor view_of(const Tensor& storage, const Shape& shape, int64_t pl, int64_t ps) {
  Tensor v = storage;
  if (pl) v = v.slice(-1, 0, shape.back());
  if (ps) v = v.slice(-2, 0, shape[shape.size() - 2]);
  return v;
}

Buffer random_tensor(Rng& rng, DType dtype, const Shape& shape, bool strided, double lo,
                     double hi) {
  Buffer b;
  const Shape s = padded(shape, strided, &b.pad_last, &b.pad_second);
  b.storage = Tensor::empty(dtype, s);
  for (int64_t i = 0; i < b.storage.numel(); ++i)
    store_from_f64(b.storage.data(), dtype, i, rng.nonzero(lo, hi));
  b.view = view_of(b.storage, shape, b.pad_last, b.pad_second);
  return b;
}

Tensor random_ints(Rng& rng, DType dtype, const Shape& shape, int64_t lo, int64_t hi) {
  Tensor t = Tensor::empty(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    store_from_f64(t.data(), dtype, i, static_cast<double>(rng.integer(lo, hi)));
  return t;
}

static void fill_poison(Tensor& view) {
  // Every logical element of the view becomes NaN (floats) or a recognisable integer.
  const int64_t n = view.numel();
  Shape idx(static_cast<size_t>(view.ndim()), 0);
  for (int64_t i = 0; i < n; ++i) {
    view.set(idx, is_floating(view.dtype()) ? std::nan("") : -77.0);
    for (int d = view.ndim() - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < view.dim(d)) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
}

Buffer poisoned_output(const TensorDesc& desc, bool strided) {
  Buffer b;
  const Shape s = padded(desc.shape(), strided, &b.pad_last, &b.pad_second);
  b.storage = Tensor::empty(desc.dtype, s);
  if (b.storage.nbytes()) std::memset(b.storage.data(), 0xA5, b.storage.nbytes());
  b.view = view_of(b.storage, desc.shape(), b.pad_last, b.pad_second);
  fill_poison(b.view);
  return b;
}

Vec to_f64(const Tensor& t) {
  Vec out(static_cast<size_t>(t.numel()));
  Shape idx(static_cast<size_t>(t.ndim()), 0);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = t.get(idx);
    for (int d = t.ndim() - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < t.dim(d)) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  return out;
}

double tolerance(DType dtype, int64_t reduction_len) {
  const bool long_red = reduction_len >= 2048;
  switch (dtype) {
    case DType::kF32:
      return std::ldexp(1.0, -11);
    case DType::kBF16:
      return std::ldexp(1.0, long_red ? -6 : -7);
    case DType::kF16:
      return std::ldexp(1.0, long_red ? -7 : -8);
    default:
      return 0.0;  // integers: exact
  }
}

void expect_close(const Tensor& got, const Vec& want, double tol) {
  const Vec g = to_f64(got);
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want[i], tol * (1.0 + std::abs(want[i]))) << "element " << i;
}

std::string test_name(const std::string& name) {
  std::string s;
  for (char c : name) s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}

// Bytes of the padding (not the view) must still be 0xA5.
static bool sentinel_intact(const Buffer& b, std::string* where) {
  if (!b.pad_last && !b.pad_second) return true;
  const Tensor& s = b.storage;
  const size_t es = dtype_size(s.dtype());
  const int64_t n = s.numel();
  const int nd = s.ndim();
  const auto* bytes = static_cast<const unsigned char*>(s.data());
  Shape idx(static_cast<size_t>(nd), 0);
  for (int64_t i = 0; i < n; ++i) {
    const bool in_pad =
        idx[static_cast<size_t>(nd - 1)] >= s.dim(-1) - b.pad_last ||
        (b.pad_second && idx[static_cast<size_t>(nd - 2)] >= s.dim(-2) - b.pad_second);
    if (in_pad)
      for (size_t k = 0; k < es; ++k)
        if (bytes[static_cast<size_t>(i) * es + k] != 0xA5) {
          *where = "padding element " + shape_to_string(idx) + " was overwritten";
          return false;
        }
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < s.dim(d)) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  return true;
}

void run_case(const CaseSpec& spec) {
  Rng rng;
  SCOPED_TRACE("case " + spec.name + " seed " + std::to_string(rng.seed()) +
               " (rerun with TBOOST_TEST_SEED)");
  OpCase c = spec.build(rng);
  ContextOptions opt;
  opt.num_threads = c.threads;
  Context ctx(opt);
  auto op = create_operation(c.param);
  VariantPack pack;
  std::vector<TensorDesc> in_descs;
  for (const Buffer& b : c.inputs) {
    pack.inputs.push_back(b.view);
    in_descs.push_back(b.view.desc());
  }
  const std::vector<TensorDesc> out_descs = op->infer_shape(in_descs);
  std::vector<Buffer> outs;
  for (const TensorDesc& d : out_descs) {
    outs.push_back(poisoned_output(d, c.strided_outputs));
    pack.outputs.push_back(outs.back().view);
  }
  // The workspace poisoned (all bits set: NaN as f32, bf16 and f16): a kernel that reads scratch
  // it did not write first shows it in its outputs.
  auto run = [&] {
    const size_t ws = op->setup(pack, ctx);
    void* w = ws ? ctx.workspace(ws) : nullptr;
    if (w) std::memset(w, 0xFF, ws);
    op->execute(pack, w, ws, ctx);
  };
  ASSERT_NO_THROW(run());
  const std::vector<Expected> expected = c.reference(pack.inputs);
  ASSERT_EQ(expected.size(), outs.size());
  for (size_t o = 0; o < outs.size(); ++o) {
    SCOPED_TRACE("output " + std::to_string(o) + " " + outs[o].view.desc().to_string());
    std::string where;
    EXPECT_TRUE(sentinel_intact(outs[o], &where)) << where;
    const Vec got = to_f64(outs[o].view);
    const RefOut& ref = expected[o].ref;
    ASSERT_EQ(got.size(), ref.value.size());
    const double tol = expected[o].tol;
    // Smallest representable step near zero of the output type: f16 subnormals are spaced
    // 2^-24 apart and kernels flush f32/bf16 denormals (FTZ), so tiny results carry that much
    // absolute error whatever the relative tolerance says.
    const DType odt = outs[o].view.dtype();
    const double abs_floor = odt == DType::kF16 ? std::ldexp(1.0, -24)
                             : is_floating(odt) ? std::ldexp(1.0, -126)
                                                : 0.0;
    double err2 = 0.0, ref2 = 0.0, slack2 = 0.0;
    int64_t bad = 0;
    double worst = 0.0;  // largest |err| / bound, at element `wi`
    size_t wi = 0;
    std::ostringstream first;
    for (size_t i = 0; i < got.size(); ++i) {
      // An infinite reference (attention's lse of a row that sees no key is -inf) is met only
      // by the same infinity; it adds nothing to the norms.
      const double e = got[i] == ref.value[i] ? 0.0 : std::abs(got[i] - ref.value[i]);
      err2 += e * e;
      if (std::isfinite(ref.value[i])) ref2 += ref.value[i] * ref.value[i];
      if (!ref.scale.empty()) {
        const double sl = std::max(0.0, ref.scale[i] - std::abs(ref.value[i]));
        slack2 += sl * sl;
      }
      const double bound =
          tol * (ref.scale.empty() ? std::abs(ref.value[i]) : ref.scale[i]) + abs_floor;
      if (bound > 0 && e / bound > worst) {
        worst = e / bound;
        wi = i;
      }
      if (!(e <= bound)) {  // NaN fails here
        if (bad++ == 0)
          first << "element " << i << ": got " << got[i] << ", expected " << ref.value[i]
                << " (|err| " << e << " > bound " << bound << ")";
      }
    }
    // TBOOST_TEST_MARGINS=1 prints how close each output came to its bound (1 = at it): run
    // the suite a few times and sort, to find the cases a rare seed can fail.
    if (std::getenv("TBOOST_TEST_MARGINS") && !got.empty())
      std::fprintf(stderr,
                   "MARGIN %s output %zu: %.4f of the bound (seed %llu): got %.9g, want %.9g\n",
                   spec.name.c_str(), o, worst, static_cast<unsigned long long>(rng.seed()),
                   got[wi], ref.value[wi]);
    EXPECT_EQ(bad, 0) << bad << " of " << got.size() << " elements out of bounds; first "
                      << first.str();
    // Normwise: ||out - ref|| <= tol·||ref||, plus tol·||scale - |ref|||, the room the
    // reference grants for cancellation (zero where the terms do not cancel).
    if (ref2 > 0) {
      EXPECT_LE(std::sqrt(err2), tol * (std::sqrt(ref2) + std::sqrt(slack2)) + abs_floor)
          << "normwise error; relative " << std::sqrt(err2 / ref2);
    }
  }
}

void run_bad_case(const BadSpec& spec) {
  Rng rng;
  SCOPED_TRACE("case " + spec.name + " seed " + std::to_string(rng.seed()));
  BadCase c = spec.build(rng);
  Context ctx;
  VariantPack pack;
  for (const Buffer& b : c.inputs) pack.inputs.push_back(b.view);
  std::vector<Buffer> outs;
  for (const TensorDesc& d : c.outputs) {
    outs.push_back(poisoned_output(d, false));
    pack.outputs.push_back(outs.back().view);
  }
  std::vector<std::vector<unsigned char>> before;
  for (const Buffer& b : outs) {
    const auto* p = static_cast<const unsigned char*>(b.storage.data());
    before.emplace_back(p, p + b.storage.nbytes());
  }
  std::string message;
  bool thrown = false;
  try {
    std::unique_ptr<Operation> op = create_operation(c.param);
    if (c.error_at_execute_only) {
      const size_t ws = op->setup(pack, ctx);
      op->execute(pack, ws ? ctx.workspace(ws) : nullptr, ws, ctx);
    } else {
      op->setup(pack, ctx);
    }
  } catch (const Error& e) {
    thrown = true;
    message = e.what();
    if (c.check_code) {
      EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(c.expect_code));
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-tboost exception: " << e.what();
    return;
  }
  ASSERT_TRUE(thrown) << "expected a tboost::Error containing '" << c.expect_substring << "'";
  EXPECT_NE(message.find(c.expect_substring), std::string::npos)
      << "message '" << message << "' does not mention '" << c.expect_substring << "'";
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto* p = static_cast<const unsigned char*>(outs[i].storage.data());
    EXPECT_TRUE(std::equal(before[i].begin(), before[i].end(), p))
        << "output " << i << " was written although the op failed";
  }
}

}  // namespace tboost::testing
