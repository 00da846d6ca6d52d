// CPU feature and cache detection through cpuid, clamped for VMs that report nonsense.
#include "tboost/core/cpu_features.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "tboost/core/context.h"

namespace tboost {
namespace {

#if defined(__x86_64__) || defined(__i386__)
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

// Deterministic cache parameters: leaf 4 (Intel) or 0x8000001D (AMD). Returns false when the
// leaf is absent or reports nothing.
bool read_cache_leaf(unsigned leaf, CpuFeatures& f) {
  bool found = false;
  for (unsigned sub = 0; sub < 16; ++sub) {
    const Regs r = cpuid(leaf, sub);
    const unsigned type = r.a & 0x1f;
    if (type == 0) break;
    const unsigned level = (r.a >> 5) & 0x7;
    const int64_t ways = ((r.b >> 22) & 0x3ff) + 1;
    const int64_t parts = ((r.b >> 12) & 0x3ff) + 1;
    const int64_t line = (r.b & 0xfff) + 1;
    const int64_t sets = static_cast<int64_t>(r.c) + 1;
    const int64_t bytes = ways * parts * line * sets;
    if (level == 1 && (type == 1 || type == 3)) f.l1d_bytes = bytes, found = true;
    if (level == 2) f.l2_bytes = bytes, found = true;
    if (level == 3) f.l3_bytes = bytes, found = true;
  }
  return found;
}
#endif

// Everything but the core count: cpuid alone (cpu_isa).
CpuFeatures detect_isa() {
  CpuFeatures f;
  f.cache_source = "default";
#if defined(__x86_64__) || defined(__i386__)
  const Regs v = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;
  const unsigned max_leaf = v.a;
  const Regs l1 = cpuid(1);
  const int base_family = static_cast<int>((l1.a >> 8) & 0xF);
  f.family = base_family == 0xF ? base_family + static_cast<int>((l1.a >> 20) & 0xFF) : base_family;
  f.model = static_cast<int>((l1.a >> 4) & 0xF);
  // The extended model counts from family 6 on, as Linux reads it (/proc/cpuinfo): Intel's rule
  // (families 6 and 15) and AMD's (15 and up) agree with it on their own CPUs.
  if (f.family >= 0x6) f.model |= static_cast<int>((l1.a >> 16) & 0xF) << 4;
  f.sse4_2 = l1.c & (1u << 20);
  f.fma = l1.c & (1u << 12);
  f.f16c = l1.c & (1u << 29);
  const bool osxsave = l1.c & (1u << 27);
  unsigned long long xcr0 = 0;
  if (osxsave) {
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  }
  const bool ymm_os = (xcr0 & 0x6) == 0x6;
  const bool zmm_os = (xcr0 & 0xe6) == 0xe6;
  f.avx = (l1.c & (1u << 28)) && ymm_os;
  if (!f.avx) f.fma = f.f16c = false;
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7, 0);
    const Regs l71 = cpuid(7, 1);
    f.avx2 = f.avx && (l7.b & (1u << 5));
    f.avx512f = zmm_os && (l7.b & (1u << 16));
    f.avx512dq = f.avx512f && (l7.b & (1u << 17));
    f.avx512bw = f.avx512f && (l7.b & (1u << 30));
    f.avx512vl = f.avx512f && (l7.b & (1u << 31));
    f.avx512_vnni = f.avx512f && (l7.c & (1u << 11));
    f.avx512_bf16 = f.avx512f && (l71.a & (1u << 5));
    f.avx_vnni = f.avx && (l71.a & (1u << 4));
    f.amx_bf16 = l7.d & (1u << 22);
    f.amx_tile = l7.d & (1u << 24);
  }
  const unsigned max_ext = cpuid(0x80000000u).a;
  bool ok = false;
  if (f.vendor == "AuthenticAMD" && max_ext >= 0x8000001Du) ok = read_cache_leaf(0x8000001Du, f);
  if (!ok && max_leaf >= 4) ok = read_cache_leaf(4, f);
  if (ok) f.cache_source = "cpuid";
#endif
  // Clamp: VMs report a 0 or a 508 MiB L3. Tiling only needs the right order of magnitude.
  f.l1d_bytes = std::clamp<int64_t>(f.l1d_bytes, 16 << 10, 128 << 10);
  f.l2_bytes = std::clamp<int64_t>(f.l2_bytes, 256 << 10, 4 << 20);
  f.l3_bytes = std::clamp<int64_t>(f.l3_bytes, 2 << 20, 64 << 20);
  return f;
}

std::string kib(int64_t b) {
  if (b >= (1 << 20) && b % (1 << 20) == 0) return std::to_string(b >> 20) + "M";
  return std::to_string(b >> 10) + "K";
}

}  // namespace

const CpuFeatures& cpu_isa() {
  static const CpuFeatures f = detect_isa();
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c = cpu_isa();
    c.logical_cores = available_cores();
    return c;
  }();
  return f;
}

std::string cpu_features_string() {
  const CpuFeatures& f = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += std::string(s.empty() ? "" : " ") + name;
  };
  add(f.sse4_2, "sse4.2");
  add(f.avx, "avx");
  add(f.avx2, "avx2");
  add(f.fma, "fma");
  add(f.f16c, "f16c");
  add(f.avx512f, "avx512f");
  add(f.avx512bw, "avx512bw");
  add(f.avx512vl, "avx512vl");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_bf16, "avx512_bf16");
  add(f.avx_vnni, "avx_vnni");
  add(f.amx_tile, "amx_tile");
  add(f.amx_bf16, "amx_bf16");
  char fm[32];
  std::snprintf(fm, sizeof fm, " family %d model %d", f.family, f.model);
  return f.vendor + fm + ": " + s + " | L1d " + kib(f.l1d_bytes) + " L2 " + kib(f.l2_bytes) +
         " L3 " + kib(f.l3_bytes) + " (" + f.cache_source + ")";
}

}  // namespace tboost
