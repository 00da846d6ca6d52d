// CPU feature and cache detection.
//
// Cache sizes come from cpuid (leaf 4 on Intel, 0x8000001D on AMD). VMs often hide them or
// report nonsense (a 508 MiB "L3"), so every value is clamped to a sane range and a default is
// used when detection fails; `cache_source` says which happened.
#pragma once

#include <cstdint>
#include <string>

namespace tboost {

struct CpuFeatures {
  std::string vendor;
  // cpuid leaf 1's display family and model (extended fields folded in): 0x19 is AMD's Zen 3 and
  // Zen 4, 0x1A Zen 5. Kernels that tune per core generation read these (attention_decode.cc).
  int family = 0, model = 0;
  bool sse4_2 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx_vnni = false, amx_bf16 = false,
       amx_tile = false;
  int64_t l1d_bytes = 32 << 10;  // per core
  int64_t l2_bytes = 1 << 20;    // per core
  int64_t l3_bytes = 32 << 20;   // shared
  std::string cache_source;      // "cpuid" or "default"
  int logical_cores = 1;
};

// Detected once, then cached.
const CpuFeatures& cpu_features();
// cpu_features() without the core count (logical_cores stays 1): cpuid alone, no thread affinity
// read, so that code run while the library loads may ask (attention_decode.cc), and a program
// that narrows its affinity later still gets its count from cpu_features().
const CpuFeatures& cpu_isa();
// One-line summary: "AuthenticAMD family 25 model 17: sse4.2 avx avx2 fma ... | L1d 32K L2 1M L3
// 32M (cpuid)".
std::string cpu_features_string();

}  // namespace tboost
