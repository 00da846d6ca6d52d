// AMX bf16 tile products (Intel Sapphire Rapids and later): the matrix products of the bf16
// attention kernels, run on the tile unit. Plain functions outside Highway's
// per-target objects: only this file's code is compiled for AMX, and callers check
// amx_bf16_usable() first.
#pragma once

#include <cstdint>

namespace tboost::kernels {

// Whether this process may run AMX bf16 instructions: the CPU has AMX-TILE and AMX-BF16 (and
// AVX512_BF16, used around them), the OS manages the tile state (XCR0 bits 17 and 18), and
// Linux granted the tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM, asked once here for
// the whole process). False on every other CPU and OS.
bool amx_bf16_usable();

// Loads, on the calling thread, the tile configuration amx_gemm uses (all 8 tiles 16 rows of
// 64 bytes); amx_end() releases the tiles. Call both on the thread that runs the products.
void amx_begin();
void amx_end();

// C (16·mt x 16·nt f32, ldc floats apart) = (accumulate ? C : 0) + A · B, where A is 16·mt rows
// of K bf16 values (lda bytes apart) and B holds K/2 rows of 16·nt bf16 pairs (ldb bytes apart;
// pair (B[2p][n], B[2p+1][n]) in one u32, the even element in the low half). K is a multiple of
// 32; products and sums in f32, in the tile unit's order. Between amx_begin() and amx_end().
void amx_gemm(const uint16_t* A, int64_t lda, int64_t mt, const uint32_t* B, int64_t ldb,
              int64_t nt, int64_t K, float* C, int64_t ldc, bool accumulate);

// C (16 x 16·nt f32, ldc floats apart) = A · B, with B's rows as they lie in memory: K-step s
// (of `steps`) multiplies A's 32 bf16 columns [32s, 32s + 32) (16 rows, lda bytes apart) by
// B's 16 rows [16s, 16s + 16) (ldb bytes apart, nt·64 bytes used of each); then, where tail is
// not null, one more step with A's next 32 columns and the 16 rows at tail (ldt bytes apart).
// Each product pairs two adjacent bf16 columns of one B row with A's elements 2k and 2k + 1, so
// a caller keeps each A value at an even or an odd position to reach B's even or odd columns
// (decode's P·V, attention_decode.cc). Up to 4 column tiles stay in tiles across all steps.
// pf != 0: each step first asks for its B rows' lines pf bytes away (a paged cache's next page
// may lie below). Between amx_begin() and amx_end().
void amx_gemm_rows(const uint16_t* A, int64_t lda, const char* B, int64_t ldb, int64_t steps,
                   const char* tail, int64_t ldt, int64_t nt, float* C, int64_t ldc, int64_t pf);

}  // namespace tboost::kernels
