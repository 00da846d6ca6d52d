// Tensor views, Context, errors and the Operation contract's generic behaviour.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tboost/tboost.h"

namespace tboost {
namespace {

TEST(Tensor, ViewsShareStorageAndKeepStrides) {
  Tensor t = Tensor::zeros(DType::kF32, {4, 6});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  Tensor s = t.slice(1, 2, 3);
  EXPECT_EQ(s.shape(), (Shape{4, 3}));
  EXPECT_EQ(s.stride(0), 6);
  EXPECT_FALSE(s.is_contiguous());
  s.set({1, 0}, 7.0);
  EXPECT_EQ(t.get({1, 2}), 7.0);
  Tensor tr = t.transpose(0, 1);
  EXPECT_EQ(tr.get({2, 1}), 7.0);
  Tensor c = s.contiguous_copy();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.get({1, 0}), 7.0);
  EXPECT_EQ(t.reshape({24}).get({8}), 7.0);
}

TEST(Tensor, BadViewsThrowClearErrors) {
  Tensor t = Tensor::zeros(DType::kF32, {4, 6});
  EXPECT_THROW(t.slice(1, 4, 3), Error);
  EXPECT_THROW(t.slice(2, 0, 1), Error);
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(t.slice(1, 0, 3).reshape({12}), Error);
  EXPECT_THROW(TensorDesc::contiguous(DType::kF32, Shape(9, 1)), Error);
  try {
    t.get({4, 0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index [4,0] out of range for [4,6]"), std::string::npos);
  }
}

TEST(Context, ThreadsWorkspaceAndReport) {
  Context ctx;
  EXPECT_GE(ctx.num_threads(), 1);
  EXPECT_EQ(ctx.num_threads(), available_cores());
  ctx.set_num_threads(1);
  EXPECT_EQ(ctx.num_threads(), 1);
  EXPECT_THROW(ctx.set_num_threads(-1), Error);
  void* w = ctx.workspace(1000);
  EXPECT_NE(w, nullptr);
  EXPECT_GE(ctx.workspace_capacity(), 1000u);
  const std::string r = ctx.report();
  EXPECT_NE(r.find("highway target"), std::string::npos);
  EXPECT_NE(r.find("onednn"), std::string::npos);
  const CpuFeatures& f = cpu_features();
  EXPECT_GE(f.l1d_bytes, 16 << 10);
  EXPECT_LE(f.l3_bytes, 64 << 20);  // clamped even where a VM reports 508 MiB
  ContextOptions pinned;
  pinned.pin_threads = true;
  Context pc(pinned);
  EXPECT_NE(pc.report().find("pinned"), std::string::npos);
  ContextOptions cuda;
  cuda.device = Device::kCUDA;
  EXPECT_THROW(Context bad(cuda), Error);
}

// The family and model that kernels tune by (attention_decode.cc: Zen 4 is AMD family 0x19 with
// AVX-512) decode cpuid as the kernel does: /proc/cpuinfo's "cpu family" and "model".
TEST(Context, CpuFamilyAndModelAsTheKernelReadsThem) {
#if defined(__x86_64__) || defined(__i386__)
  std::ifstream in("/proc/cpuinfo");
  if (!in) GTEST_SKIP() << "no /proc/cpuinfo";
  int family = -1, model = -1;
  std::string line;
  while ((family < 0 || model < 0) && std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const char* value = line.c_str() + colon + 1;
    char* end = nullptr;
    const long v = std::strtol(value, &end, 10);
    if (end == value) continue;  // not a number: leave the field unread
    if (key == "cpu family") family = static_cast<int>(v);
    if (key == "model") model = static_cast<int>(v);
  }
  if (family < 0 || model < 0) GTEST_SKIP() << "/proc/cpuinfo names no family or model";
  EXPECT_EQ(cpu_features().family, family);
  EXPECT_EQ(cpu_features().model, model);
  // cpu_isa (what the kernels read while the library loads): the same cpuid, no core count.
  EXPECT_EQ(cpu_isa().family, family);
  EXPECT_EQ(cpu_isa().logical_cores, 1);
  EXPECT_NE(cpu_features_string().find("family " + std::to_string(family)), std::string::npos);
#else
  GTEST_SKIP() << "cpuid families are an x86 notion";
#endif
}

TEST(Context, DenormalGuardFlushes) {
  volatile float tiny = 1e-39f;  // denormal
  {
    DenormalGuard g(true);
    volatile float r = tiny * 1.0f;
    EXPECT_EQ(r, 0.0f);
  }
  volatile float r = tiny * 1.0f;
  EXPECT_NE(r, 0.0f);
}

TEST(Operation, WorkspaceTooSmallAndUnknownKernelAreErrors) {
  Context ctx;
  auto op = create_operation(ops::RmsNormParam{});
  Tensor x = Tensor::zeros(DType::kF32, {2, 8});
  Tensor w = Tensor::zeros(DType::kF32, {8});
  Tensor y = Tensor::zeros(DType::kF32, {2, 8});
  VariantPack pack{{x, w}, {y}};
  EXPECT_EQ(op->setup(pack, ctx), 0u);
  // Executing with a different pack re-validates: a bad shape is caught at execute too.
  Tensor y_bad = Tensor::zeros(DType::kF32, {2, 9});
  EXPECT_THROW(op->execute({{x, w}, {y_bad}}, nullptr, 0, ctx), Error);
  EXPECT_NO_THROW(op->execute(pack, nullptr, 0, ctx));
}

TEST(Error, CarriesCodeAndLocation) {
  try {
    TBOOST_CHECK_EQ(1 + 1, 3, "arithmetic");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string m = e.what();
    EXPECT_NE(m.find("(2 vs 3)"), std::string::npos) << m;
    EXPECT_NE(m.find("tensor_test.cc"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace tboost

namespace tboost {
namespace {
TEST(Tensor, SizesThatOverflowAndEmptyDims) {
  EXPECT_THROW(Tensor::empty(DType::kF32, {int64_t{1} << 62, 8}), Error);
  EXPECT_THROW(Tensor::empty(DType::kF32, {(int64_t{1} << 62) + 1}), Error);
  Tensor e = Tensor::empty(DType::kF32, {2, 0, 3});
  EXPECT_TRUE(e.is_contiguous());
  EXPECT_EQ(e.reshape({0, 6}).numel(), 0);
}
}  // namespace
}  // namespace tboost

namespace tboost {
namespace {
// Resident bytes of this process (/proc/self/statm, second field, in pages).
int64_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long long size = 0, res = 0;
  const int got = std::fscanf(f, "%lld %lld", &size, &res);
  std::fclose(f);
  return got == 2 ? res * static_cast<long long>(sysconf(_SC_PAGESIZE)) : -1;
}

TEST(Tensor, LargeZerosTakeMemoryOnlyWhereWritten) {
  EXPECT_THROW(Tensor::zeros(DType::kF32, {int64_t{1} << 62, 8}), Error);
  // Small and large, odd sizes: every element reads zero, and is 64-byte aligned.
  for (int64_t n : {int64_t{1}, int64_t{1000003}, int64_t{(6 << 20) + 17}}) {
    Tensor z = Tensor::zeros(DType::kBF16, {n});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(z.data()) % 64, 0u);
    const auto* p = static_cast<const uint16_t*>(z.data());
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; ++i) nonzero += p[i] != 0;
    EXPECT_EQ(nonzero, 0) << n;
  }
  const int64_t before = resident_bytes();
  if (before < 0) GTEST_SKIP() << "no /proc/self/statm";
  // 256 MiB of zeros: resident only where written (a KV cache sized for a whole context).
  Tensor big = Tensor::zeros(DType::kF32, {64, 1 << 20});
  const int64_t made = resident_bytes();
  EXPECT_LT(made - before, int64_t{16} << 20);
  float* f = static_cast<float*>(big.data());
  for (int64_t i = 0; i < (1 << 20); ++i) f[i] = 1.0f;  // the first 4 MiB
  f[int64_t{64} * (1 << 20) - 1] = 2.0f;                // and the last element
  const int64_t written = resident_bytes();
  EXPECT_LT(written - before, int64_t{24} << 20);
  EXPECT_EQ(f[(1 << 20) - 1], 1.0f);
  EXPECT_EQ(f[1 << 20], 0.0f);
  EXPECT_EQ(f[int64_t{64} * (1 << 20) - 1], 2.0f);
}

// ZeroPages::kAsWritten (KV caches): a write commits a small page, not a 2 MiB one, whatever the
// system's transparent huge pages. 16 writes 4 MiB apart into 64 MiB: 16 x 4 KiB where small
// pages are 4 KiB (with huge pages where the system gives them: 32 MiB).
TEST(Tensor, ZerosAsWrittenCommitSmallPages) {
  const int64_t before = resident_bytes();
  if (before < 0) GTEST_SKIP() << "no /proc/self/statm";
  Tensor t = Tensor::zeros(DType::kF32, {16, 1 << 20}, ZeroPages::kAsWritten);
  float* f = static_cast<float*>(t.data());
  for (int64_t i = 0; i < 16; ++i) f[i << 20] = static_cast<float>(i + 1);
  const int64_t written = resident_bytes();
  EXPECT_LT(written - before, int64_t{4} << 20);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(f[i << 20], static_cast<float>(i + 1));
  EXPECT_EQ(f[(int64_t{16} << 20) - 1], 0.0f);
}
}  // namespace
}  // namespace tboost
