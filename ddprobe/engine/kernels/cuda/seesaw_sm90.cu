// The CUDA C++ kernels of the `split_ws` path, sm_90a only: the prefix kernel (FlashMLA's seesaw schedule written
// below Gluon) and the log-sum-exp merge of its partials (ddp_merge_*, or inside the prefix kernel's own launch after
// a grid barrier: seesaw(), at the end of this file). Built offline into seesaw_sm90.cubin (python -m
// ddprobe.engine.kernels._cu --build); loaded and launched by ddprobe/engine/kernels/_cu.py through the CUDA driver
// API. No CUTLASS: raw PTX for wgmma, TMA and mbarriers.
//
// Prefix kernel: one program (CTA, 256 threads = two warpgroups, no producer warp) = 64 folded query rows
// (row = r * H + h) x one chunk of KV tokens, in tiles of 64 tokens: on the row-block x split grid, the chunk is
// derived from the live prefix length read from device memory (every plan). The partial layout of `split`'s kernels:
// O_part[slot, row, 0:512] normalized (fp32, or the input's 16-bit type in the *_p16 kernels: half the bytes
// written by the prefix kernel and read by the merge; WsTuning.part_bits),
// LSE_part[slot, row] = m + log2(l) in base 2, the tree columns folded into the last split (fold) or the last
// split index being the tree part alone.
//
// Shared memory (1024-byte aligned): Q [64 x 576] and two KV stages [64 x 576], each as nine 64-column pieces of
// 8 KB in the 128-byte swizzle TMA writes and wgmma reads; P_A (8 KB); the row statistics; 19 mbarriers (Q, and
// one per stage and piece, so S starts on the pieces that landed first). Tiles alternate between the stages:
// tile 2j (A) in stage 0, tile 2j + 1 (B) in stage 1.
//
// Per pair of tiles j (the seesaw):
//   wg0: S_A = Q K_A^T (wgmma m64n64k16 x 36), the softmax of tile A against the running maximum m after the
//        previous pair (m_new0 = max(m, rowmax), sc0 = 2^(m - m_new0)) -> hands m_new0, sc0 over (BAR_SC0),
//        O_L = O_L sc0 + P_A V_A[:, 0:256] issued with P_A from registers, P_A (16-bit, the input's type) to
//        smem (BAR_PA); then
//        (BAR_SC1) O_L *= sc1 and (BAR_PB) O_L += P_B V_B[:, 0:256] with P_B from smem.
//   wg1: S_B issued first; (BAR_SC0, S_B done) O_R *= sc0; (BAR_PA) O_R += P_A V_A[:, 256:512] issued under its
//        own softmax of tile B (m_new1 = max(m_new0, rowmax), sc1) -> hands m_new1, sc1 over (BAR_SC1), P_B into the
//        dead rope piece of stage 1 (BAR_PB); then O_R *= sc1, O_R += P_B V_B[:, 256:512] from registers.
// Every hand-off between the warpgroups is a named barrier (bar.arrive on one side, bar.sync on the other), and
// the warpgroup that reads a piece last refills it by TMA once its wgmma completed (a warpgroup-local bar.sync
// first, so all four warps are done with it; lane 0 of each warp issues every fourth piece): stage 0 rope by wg0 after S_A, stage 0
// latent 0-255 by wg0 after P_A V_A_L, 256-511 by wg1 after P_A V_A_R; stage 1 latent 0-255 and rope (P_B) by
// wg0 after P_B V_B_L, 256-511 by wg1 after P_B V_B_R. l is kept per warpgroup (l0 over the A tiles, l1 over the
// B tiles, both relative to the same running maximum) and summed at the end. An odd last tile: wg1 skips S_B
// and P_B; the pair ends after P_A V_A.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// schedule variants (compile-time, for measurements; the shipped cubin is built with the defaults; H200, 64 heads,
// 2026-12-02, docs/perf.md):
//   DDP_PVFIRST    1 (default): warpgroup 0 issues P_A V_A_L before it stores P_A for warpgroup 1, so stage 0's
//                  columns 0-255 are refilled earlier (128k: 240.6 us against 257.3 with 0)
//   DDP_PVFIRST_B  1: warpgroup 1 likewise issues P_B V_B_R before it stores P_B for warpgroup 0
//   DDP_SB_FIRST   the piece warpgroup 1's S_B starts on (0 default; 4: the columns it refills itself first)
// (measured and removed: warpgroup 1 refilling stage 0's columns 256-511 before its exponentials, 10% slower)
//   DDP_SPREAD     1 (default): a refill's copies issued by lane 0 of each warp in turn; 0: by one thread
//                  (128k: 237.9 us against 242.7; 32k and 64k within 1%)
// (measured and not kept: TMA L2 promotion none or 256 B instead of 128 B, within 1%)
#ifndef DDP_SPREAD
#define DDP_SPREAD 1
#endif
#ifndef DDP_PVFIRST_B
#define DDP_PVFIRST_B 0
#endif
#ifndef DDP_SB_FIRST
#define DDP_SB_FIRST 0
#endif
#ifndef DDP_PVFIRST
#define DDP_PVFIRST 1
#endif

namespace {

constexpr int BM = 64;          // query rows per program
constexpr int BN = 64;          // KV tokens per tile
constexpr int NP = 9;           // 64-column pieces of a 576-wide row (8 latent + 1 rope)
constexpr int PIECE = 8192;     // bytes of a [64 x 64] 16-bit piece
constexpr int TILE = NP * PIECE;
constexpr int OFF_Q = 0, OFF_K0 = TILE, OFF_K1 = 2 * TILE, OFF_PA = 3 * TILE;
constexpr int OFF_M = OFF_PA + PIECE;   // float[64]: the running maximum handed between the warpgroups
constexpr int OFF_SC0 = OFF_M + 256;    // float[64]
constexpr int OFF_SC1 = OFF_SC0 + 256;  // float[64]
constexpr int OFF_L = OFF_SC1 + 256;    // float[2][64]: each warpgroup's row sums at the end
constexpr int OFF_BAR = OFF_L + 512;    // uint64: Q, then ready[stage][piece]
constexpr int SMEM_USED = OFF_BAR + 8 * (1 + 2 * NP);
constexpr int SMEM_BYTES = SMEM_USED + 1024;  // dynamic shared memory to request: slack to align the base
static_assert(SMEM_BYTES == 231832, "_cu.SMEM_BYTES must match");
enum { BAR_SC0 = 1, BAR_SC1, BAR_PA, BAR_PB, BAR_PAFREE, BAR_WG0, BAR_WG1, BAR_L };

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_init(uint32_t b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(b), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_expect(uint32_t b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t b, int phase) {
  asm volatile("{\n.reg .pred P1;\nLAB_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
               "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(b), "r"(phase) : "memory");
}
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
               ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// keeps the compiler from moving reads of wgmma accumulators above the wait that completes them
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x)); return y; }
// wgmma shared-memory descriptor, 128-byte swizzle (the layout's 1024-byte pattern must start 1024-aligned)
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}
template <bool BF16> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<true>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<false>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// four 16-bit values (one 8-byte load) to floats
template <bool BF16> __device__ __forceinline__ float4 unpack4(uint2 v);
template <> __device__ __forceinline__ float4 unpack4<true>(uint2 v) {
  return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                     __uint_as_float(v.y & 0xffff0000u));
}
template <> __device__ __forceinline__ float4 unpack4<false>(uint2 v) {
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&v.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&v.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
// partial i of 4 values at ``src`` (fp32, or 16-bit with P16), read once through L2 (ld.global.cg)
template <bool BF16, bool P16> __device__ __forceinline__ float4 load_part(const void* src, long long i) {
  if constexpr (P16) {
    return unpack4<BF16>(__ldcg(reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(src) + i)));
  } else {
    return __ldcg(reinterpret_cast<const float4*>(static_cast<const float*>(src) + i));
  }
}
// values i and i + 1 of the partials at ``dst`` (fp32, or 16-bit with P16)
template <bool BF16, bool P16> __device__ __forceinline__ void store_part2(void* dst, long long i, float a, float b) {
  if constexpr (P16) {
    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(dst) + i) = pack2<BF16>(a, b);
  } else {
    *reinterpret_cast<float2*>(static_cast<float*>(dst) + i) = make_float2(a, b);
  }
}

// wgmma wrappers (mechanical: one per shape and type). mma_s: S (m64n64k16), Q and K both K-major from smem;
// mma_pv_ss: P V (m64n256k16), P K-major and V MN-major (transposed) from smem; mma_pv_rs: the same with P's
// k-slice kk from registers (the accumulator layout of S is the A-fragment layout, packed to 16 bits).
template <bool BF16> __device__ __forceinline__ void mma_s(float (&d)[32], uint64_t a, uint64_t b, int acc);
template <bool BF16> __device__ __forceinline__ void mma_pv_ss(float (&d)[128], uint64_t a, uint64_t b);
template <bool BF16> __device__ __forceinline__ void mma_pv_rs(float (&d)[128], const uint32_t (&a)[16], int kk, uint64_t b);

#define DDP_WGMMA_WRAPPERS(IS_BF16, DT)                                                                              \
  template <> __device__ __forceinline__ void mma_s<IS_BF16>(float (&d)[32], uint64_t a, uint64_t b, int acc) {     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                        \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." DT "." DT " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                                                                 \
                 : "l"(a), "l"(b), "r"(acc));                                                                      \
  }                                                                                                                \
  template <> __device__ __forceinline__ void mma_pv_ss<IS_BF16>(float (&d)[128], uint64_t a, uint64_t b) {          \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                       \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." DT "." DT " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 1;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])                                                                                \
                 : "l"(a), "l"(b), "r"(1));                                                                        \
  }                                                                                                                \
  template <> __device__ __forceinline__ void mma_pv_rs<IS_BF16>(float (&d)[128], const uint32_t (&a)[16], int kk,    \
                                                                 uint64_t b) {                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                                       \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." DT "." DT " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])                                                                                \
                 : "r"(a[4 * kk]), "r"(a[4 * kk + 1]), "r"(a[4 * kk + 2]), "r"(a[4 * kk + 3]), "l"(b), "r"(1));       \
  }
DDP_WGMMA_WRAPPERS(true, "bf16")
DDP_WGMMA_WRAPPERS(false, "f16")
#undef DDP_WGMMA_WRAPPERS

// S = Q K^T of one tile into s: the nine pieces in the order FIRST, FIRST + 1, ... (mod 9), each waited on its
// own ready barrier just before its four k-steps are issued; committed, not waited.
// Descriptors are built once per base and advanced by constant byte offsets (the address field holds bytes / 16;
// every shared address here is below 2^18, so the field never carries into the next one): one add per wgmma
// operand instead of a mask, a shift and two ors (the kernel of 976b7d3 rebuilt them for every wgmma).
__device__ __forceinline__ uint64_t desc_at(uint64_t base, uint32_t bytes) { return base + (bytes >> 4); }

template <bool BF16, int FIRST>
__device__ __forceinline__ void issue_s(float (&s)[32], uint32_t q, uint32_t k, uint32_t ready, int phase) {
  const uint64_t dq = desc(q, 0, 1024), dk = desc(k, 0, 1024);
  wg_fence();
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int p = (i + FIRST) % NP;
    mbar_wait(ready + 8 * p, phase);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      mma_s<BF16>(s, desc_at(dq, p * PIECE + kk * 32), desc_at(dk, p * PIECE + kk * 32), (i | kk) != 0);
  }
  wg_commit();
}

// P V on 256 value columns starting at piece v0 of a stage: P from smem (p_smem) or registers (pf).
template <bool BF16>
__device__ __forceinline__ void issue_pv_ss(float (&o)[128], uint32_t p_smem, uint32_t v) {
  const uint64_t dp = desc(p_smem, 0, 1024), dv = desc(v, 8192, 1024);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) mma_pv_ss<BF16>(o, desc_at(dp, kk * 32), desc_at(dv, kk * 2048));
  wg_commit();
}
template <bool BF16>
__device__ __forceinline__ void issue_pv_rs(float (&o)[128], const uint32_t (&pf)[16], uint32_t v) {
  const uint64_t dv = desc(v, 8192, 1024);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) mma_pv_rs<BF16>(o, pf, kk, desc_at(dv, kk * 2048));
  wg_commit();
}

// Scores of a tile (raw dot products) masked to -inf outside [.., end) and, past prefix_len, where the row's
// ancestor bits do not have the tree column; only tiles that reach the tree or the chunk's end pay for it.
__device__ __forceinline__ void mask_s(float (&s)[32], int n0, int end, int prefix_len, long long b0, long long b1,
                                       int cq) {
  if (n0 + BN <= min(end, prefix_len)) return;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n0 + 8 * i + cq + e;
      const bool in = col < end, pre = col < prefix_len;
      const int sh = min(max(col - prefix_len, 0), 63);
      if (!(in && (pre || ((b0 >> sh) & 1)))) s[4 * i + e] = -INFINITY;
      if (!(in && (pre || ((b1 >> sh) & 1)))) s[4 * i + 2 + e] = -INFINITY;
    }
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Row maxima of the scores (raw; the thread's two rows, reduced over the quad that shares them).
__device__ __forceinline__ void row_max(const float (&s)[32], float& mx0, float& mx1) {
  mx0 = -INFINITY;
  mx1 = -INFINITY;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
    mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
  mx0 = quad_max(mx0);
  mx1 = quad_max(mx1);
}

// P = 2^(s c - m) (one FFMA and one EX2 per score; m = -inf stands for 0: nothing seen yet), its 16-bit
// A fragments in pf, the thread's part of the row sums added to l0 / l1.
template <bool BF16>
__device__ __forceinline__ void exp_pack(float (&s)[32], uint32_t (&pf)[16], float c, float m0, float m1, float& l0,
                                         float& l1) {
  const float n0 = m0 == -INFINITY ? 0.f : -m0, n1 = m1 == -INFINITY ? 0.f : -m1;
  float a0 = 0.f, a1 = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    s[4 * i] = ex2(fmaf(s[4 * i], c, n0));
    s[4 * i + 1] = ex2(fmaf(s[4 * i + 1], c, n0));
    s[4 * i + 2] = ex2(fmaf(s[4 * i + 2], c, n1));
    s[4 * i + 3] = ex2(fmaf(s[4 * i + 3], c, n1));
    a0 += s[4 * i] + s[4 * i + 1];
    a1 += s[4 * i + 2] + s[4 * i + 3];
  }
  l0 += a0;
  l1 += a1;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    pf[2 * i] = pack2<BF16>(s[4 * i], s[4 * i + 1]);      // row r0, columns 8i + cq, + 1
    pf[2 * i + 1] = pack2<BF16>(s[4 * i + 2], s[4 * i + 3]);  // row r0 + 8
  }
}

// P's fragments into a [64 x 64] 16-bit piece in the 128-byte swizzle (16-byte chunk i of row r at i ^ (r % 8)).
__device__ __forceinline__ void store_p(uint32_t base, const uint32_t (&pf)[16], int r0, int lane) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t off = ((i ^ (r0 & 7)) << 4) + ((lane & 3) << 2);
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(base + r0 * 128 + off), "r"(pf[2 * i]) : "memory");
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(base + (r0 + 8) * 128 + off), "r"(pf[2 * i + 1]) : "memory");
  }
}

__device__ __forceinline__ void scale_o(float (&o)[128], float a0, float a1) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    o[4 * i] *= a0;
    o[4 * i + 1] *= a0;
    o[4 * i + 2] *= a1;
    o[4 * i + 3] *= a1;
  }
}

// Refill pieces [p0, p1) (and the rope piece with ROPE) of a stage with tile t once the whole warpgroup is past
// the wgmma that read them last: from one thread (DDP_SPREAD 0), or with lane 0 of each of the four warps issuing
// every fourth piece (DDP_SPREAD 1), so no warp holds the warpgroup's next wgmma back by five copies.
__device__ __forceinline__ void refill(int wg_bar, int wt, uint32_t stage, uint32_t ready, const CUtensorMap* kv,
                                       int p0, int p1, bool rope, int row) {
  bar_sync(wg_bar, 128);
#if DDP_SPREAD
  if ((wt & 31) == 0) {
    const int w = wt >> 5;
    for (int p = p0 + w; p < p1; p += 4) {
      mbar_expect(ready + 8 * p, PIECE);
      tma_load(stage + p * PIECE, kv, ready + 8 * p, p * 64, row);
    }
    if (rope && w == ((p1 - p0) & 3)) {
#else
  if (wt == 0) {
    for (int p = p0; p < p1; ++p) {
      mbar_expect(ready + 8 * p, PIECE);
      tma_load(stage + p * PIECE, kv, ready + 8 * p, p * 64, row);
    }
    if (rope) {
#endif
      mbar_expect(ready + 8 * 8, PIECE);
      tma_load(stage + 8 * PIECE, kv, ready + 8 * 8, 8 * 64, row);
    }
  }
}

// Rows [from, 64) of a stage's eight latent pieces set to zero (128-byte rows, so the swizzle does not matter):
// a tile reaching past the last live row (prefix_len + R; any split's last tile can) of a device plan, whose kv map
// spans the plan's bound, so rows past the live end may hold anything (NaN included) and P = 0 there must not
// meet them in P V. The caller's
// warpgroup then fences for the async proxy and syncs its four warps; the other warpgroup sees the rows through the
// named barrier of the next hand-off.
__device__ __forceinline__ void zero_rows(uint32_t stage, int from, int wt) {
  for (int i = wt; i < (BN - from) * 64; i += 128) {
    const int rest = i >> 3;
    const uint32_t a = stage + (rest & 7) * PIECE + (from + (rest >> 3)) * 128 + ((i & 7) << 4);
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(a), "r"(0) : "memory");
  }
}

// A warpgroup's registers across the pairs.
struct State {
  float o[128];    // its 256 columns of O (unnormalized, relative to the running maximum)
  float s[32];     // S of its tile, then P
  uint32_t pf[16]; // P's 16-bit A fragments
  float l0, l1;    // its row sums (the thread's part) for rows r0, r0 + 8
  float m0, m1;    // the running maximum after the last pair handled
};

// The softmax of a warpgroup's tile (S in st.s, first column n0) against the running maximum (m0, m1): the new
// maximum (x0, x1) and the factors (sc0, sc1) that rescale what was relative to the old one, published for the
// other warpgroup in s_m / s_sc (bar.arrive on BAR); l rescaled; P's exponentials as 16-bit fragments in st.pf,
// their row sums added to l.
template <bool BF16>
__device__ __forceinline__ void softmax_tile(State& st, float m0, float m1, int n0, int end, int prefix_len,
                                             long long b0, long long b1, int cq, int r0, int lane, float c, float* s_m,
                                             float* s_sc, int bar, float& x0, float& x1, float& sc0, float& sc1) {
  mask_s(st.s, n0, end, prefix_len, b0, b1, cq);
  float mx0, mx1;
  row_max(st.s, mx0, mx1);
  x0 = fmaxf(m0, mx0 * c);
  x1 = fmaxf(m1, mx1 * c);
  sc0 = ex2(m0 - (x0 == -INFINITY ? 0.f : x0));
  sc1 = ex2(m1 - (x1 == -INFINITY ? 0.f : x1));
  if ((lane & 3) == 0) {
    s_m[r0] = x0;
    s_m[r0 + 8] = x1;
    s_sc[r0] = sc0;
    s_sc[r0 + 8] = sc1;
  }
  bar_arrive(bar, 256);
  st.l0 *= sc0;
  st.l1 *= sc1;
  exp_pack<BF16>(st.s, st.pf, c, x0, x1, st.l0, st.l1);
}

#define DDP_PAIR_ARGS                                                                                                \
  int j, int ph, int n_tiles, int start, int end, int prefix_len, int live_end, float c, long long b0, long long b1, int cq, int r0,\
      int lane, int wt, uint32_t sq, uint32_t k0, uint32_t k1, uint32_t pa, uint32_t ready0, uint32_t ready1,       \
      const CUtensorMap *tm_kv, float *s_m, float *s_sc0, float *s_sc1, State &st

// Warpgroup 0, pair j: S_A, its softmax, P_A V_A[:, 0:256]; with HAS_B also sc1 and P_B V_B[:, 0:256].
template <bool BF16, bool HAS_B>
__device__ __forceinline__ void wg0_pair(DDP_PAIR_ARGS) {
  const int ta = 2 * j;  // ph: the phase of stage 0's barriers for this pair
  issue_s<BF16, 8>(st.s, sq, k0, ready0, ph);
  wg_wait<0>();
  reg_fence(st.s);
  if (start + ta * BN + BN > live_end) {  // a tile reaching past the live rows: zero those (zero_rows)
    zero_rows(k0, live_end - start - ta * BN, wt);
    fence_async_smem();
    bar_sync(BAR_WG0, 128);
  }
  if (ta + 2 < n_tiles) refill(BAR_WG0, wt, k0, ready0, tm_kv, 0, 0, true, start + (ta + 2) * BN);
  float n0, n1, sc0, sc1;
  softmax_tile<BF16>(st, st.m0, st.m1, start + ta * BN, end, prefix_len, b0, b1, cq, r0, lane, c, s_m, s_sc0, BAR_SC0,
                     n0, n1, sc0, sc1);
#if DDP_PVFIRST
  scale_o(st.o, sc0, sc1);
  issue_pv_rs<BF16>(st.o, st.pf, k0);
#endif
  if (j > 0) bar_sync(BAR_PAFREE, 256);  // warpgroup 1 is done with the previous P_A
  store_p(pa, st.pf, r0, lane);
  fence_async_smem();
  bar_arrive(BAR_PA, 256);
#if !DDP_PVFIRST
  scale_o(st.o, sc0, sc1);
  issue_pv_rs<BF16>(st.o, st.pf, k0);
#endif
  wg_wait<0>();
  reg_fence(st.o);
  if (ta + 2 < n_tiles) refill(BAR_WG0, wt, k0, ready0, tm_kv, 0, 4, false, start + (ta + 2) * BN);
  if (HAS_B) {
    bar_sync(BAR_SC1, 256);
    st.m0 = s_m[r0];
    st.m1 = s_m[r0 + 8];
    const float a0 = s_sc1[r0], a1 = s_sc1[r0 + 8];
    st.l0 *= a0;
    st.l1 *= a1;
    scale_o(st.o, a0, a1);
    bar_sync(BAR_PB, 256);
    issue_pv_ss<BF16>(st.o, k1 + 8 * PIECE, k1);
    wg_wait<0>();
    reg_fence(st.o);
    if (ta + 3 < n_tiles) refill(BAR_WG0, wt, k1, ready1, tm_kv, 0, 4, true, start + (ta + 3) * BN);
  } else {
    st.m0 = n0;
    st.m1 = n1;
  }
}

// Warpgroup 1, pair j: (HAS_B: S_B issued first) sc0, P_A V_A[:, 256:512]; with HAS_B the softmax of tile B under
// it, P_B into stage 1's rope piece, P_B V_B[:, 256:512].
template <bool BF16, bool HAS_B>
__device__ __forceinline__ void wg1_pair(DDP_PAIR_ARGS) {
  const int tb = 2 * j + 1;  // ph: the phase of stage 1's barriers for this pair
  if (HAS_B) issue_s<BF16, DDP_SB_FIRST>(st.s, sq, k1, ready1, ph);
  bar_sync(BAR_SC0, 256);
  // S_B must be complete before O_R is rescaled: ptxas would otherwise inject this wait itself (it does not let
  // registers of an earlier wgmma be touched while any wgmma is in flight), so it is stated here
  if (HAS_B) {
    wg_wait<0>();
    reg_fence(st.s);
    if (start + tb * BN + BN > live_end) {  // as in wg0_pair, for tile B
      zero_rows(k1, live_end - start - tb * BN, wt);
      fence_async_smem();
      bar_sync(BAR_WG1, 128);
    }
  }
  const float n0 = s_m[r0], n1 = s_m[r0 + 8];
  {
    const float a0 = s_sc0[r0], a1 = s_sc0[r0 + 8];
    st.l0 *= a0;
    st.l1 *= a1;
    scale_o(st.o, a0, a1);
  }
  bar_sync(BAR_PA, 256);
  issue_pv_ss<BF16>(st.o, pa, k0 + 4 * PIECE);
  if (HAS_B) {
    float x0, x1, sc0, sc1;
    softmax_tile<BF16>(st, n0, n1, start + tb * BN, end, prefix_len, b0, b1, cq, r0, lane, c, s_m, s_sc1, BAR_SC1,
                       x0, x1, sc0, sc1);
#if DDP_PVFIRST_B
    wg_wait<0>();
    reg_fence(st.o);
    scale_o(st.o, sc0, sc1);
    issue_pv_rs<BF16>(st.o, st.pf, k1 + 4 * PIECE);
#endif
    bar_sync(BAR_WG1, 128);  // every warp's S_B is done with the rope piece P_B goes into
    store_p(k1 + 8 * PIECE, st.pf, r0, lane);
    fence_async_smem();
    bar_arrive(BAR_PB, 256);
#if !DDP_PVFIRST_B
    wg_wait<0>();
    reg_fence(st.o);
#endif
    if (tb + 1 < n_tiles) {  // another pair follows: warpgroup 0 may write its P_A, and tile 2j + 2 may come in
      bar_arrive(BAR_PAFREE, 256);
      refill(BAR_WG1, wt, k0, ready0, tm_kv, 4, 8, false, start + (tb + 1) * BN);
    }
#if !DDP_PVFIRST_B
    scale_o(st.o, sc0, sc1);
    issue_pv_rs<BF16>(st.o, st.pf, k1 + 4 * PIECE);
#endif
    wg_wait<0>();
    reg_fence(st.o);
    if (tb + 2 < n_tiles) refill(BAR_WG1, wt, k1, ready1, tm_kv, 4, 8, false, start + (tb + 2) * BN);
    st.m0 = x0;
    st.m1 = x1;
  } else {
    wg_wait<0>();
    reg_fence(st.o);
    st.m0 = n0;
    st.m1 = n1;
  }
}

template <bool BF16, bool P16>
__device__ __forceinline__ void seesaw_prefix(const CUtensorMap* tm_q, const CUtensorMap* tm_kv, const long long* bits,
                                       void* o_part, float* lse_part,
                                       long long stride_ps, long long stride_pq, const int* prefix_ptr, int hq,
                                       int H, float c, int r, int n_qb, int grid_splits, int fold) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  {
    uint32_t dyn;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dyn));
    if (dyn < SMEM_BYTES) __trap();
  }
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);  // stays a shared-space pointer
  const uint32_t sb = smem_u32(smem);
  float* s_m = reinterpret_cast<float*>(smem + OFF_M);
  float* s_sc0 = reinterpret_cast<float*>(smem + OFF_SC0);
  float* s_sc1 = reinterpret_cast<float*>(smem + OFF_SC1);
  float* s_l = reinterpret_cast<float*>(smem + OFF_L);
  const uint32_t q_bar = sb + OFF_BAR, ready0 = q_bar + 8, ready1 = ready0 + 8 * NP;
  const uint32_t sq = sb + OFF_Q, k0 = sb + OFF_K0, k1 = sb + OFF_K1, pa = sb + OFF_PA;

  const int tid = threadIdx.x, wt = tid & 127, lane = tid & 31;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform for the compiler
  const int r0 = ((wt >> 5) << 4) + (lane >> 2);  // the thread's rows: r0 and r0 + 8 of the block
  const int cq = (lane & 3) * 2;                  // its first column in each 8-column chunk

  // the live prefix length, from device memory (a CUDA graph replays one launch at any length up to the bound)
  const int prefix_len = *prefix_ptr;
  // the row-block x split grid, program = slot x n_qb + row block, its chunk derived from the live length (split's
  // rule: grid_splits - 1 + fold prefix splits of whole tiles); the tree columns on the last prefix split (fold) or
  // on slot grid_splits - 1 alone. A split past the live length marks its slot empty (lse -inf) and exits at once.
  const int rb = blockIdx.x % n_qb, slot = blockIdx.x / n_qb;
  const int ns = grid_splits - 1 + fold;
  int start, end;
  if (!fold && slot == ns) {
    start = prefix_len;
    end = prefix_len + r;
  } else {
    const int chunk = max(BN, ((prefix_len + ns - 1) / ns + BN - 1) / BN * BN);
    start = min(slot * chunk, prefix_len);
    end = (fold && slot == ns - 1) ? prefix_len + r : min(start + chunk, prefix_len);
  }
  if (start >= end) {
    for (int i = tid; i < BM; i += 256)
      if (rb * BM + i < hq) lse_part[static_cast<long long>(slot) * hq + rb * BM + i] = -INFINITY;
    return;
  }
  if (tid == 0) {
    mbar_init(q_bar, 1);
    for (int i = 0; i < 2 * NP; ++i) mbar_init(ready0 + 8 * i, 1);
    fence_barrier_init();
  }
  const int n_tiles = (end - start + BN - 1) / BN;
  __syncthreads();  // barriers initialized
  if (tid == 0) {
    mbar_expect(q_bar, TILE);
    for (int p = 0; p < NP; ++p) tma_load(sq + p * PIECE, tm_q, q_bar, p * 64, rb * BM);
    for (int t = 0; t < min(2, n_tiles); ++t)
      for (int p = 0; p < NP; ++p) {
        const uint32_t rd = (t ? ready1 : ready0) + 8 * p;
        mbar_expect(rd, PIECE);
        tma_load((t ? k1 : k0) + p * PIECE, tm_kv, rd, p * 64, start + t * BN);
      }
  }
  const int g0 = rb * BM + r0, g1 = g0 + 8;
  const long long b0 = g0 < hq ? bits[g0 / H] : -1ll;  // padded rows see every tree column (a finite lse)
  const long long b1 = g1 < hq ? bits[g1 / H] : -1ll;

  State st;
#pragma unroll
  for (int i = 0; i < 128; ++i) st.o[i] = 0.f;
  st.l0 = st.l1 = 0.f;
  st.m0 = st.m1 = -INFINITY;
  mbar_wait(q_bar, 0);

#define DDP_PAIRS(PAIR)                                                                                               \
  for (int j = 0; j < n_tiles / 2; ++j)                                                                              \
  PAIR<BF16, true>(j, j & 1, n_tiles, start, end, prefix_len, prefix_len + r, c, b0, b1, cq, r0, lane, wt, sq, k0, k1, pa,  \
                   ready0, ready1, tm_kv, s_m, s_sc0, s_sc1, st);                                                  \
  if (n_tiles & 1)                                                                                                   \
  PAIR<BF16, false>(n_tiles / 2, (n_tiles / 2) & 1, n_tiles, start, end, prefix_len, prefix_len + r, c, b0, b1, cq, r0, lane, \
                    wt, sq, k0, k1, pa, ready0, ready1, tm_kv, s_m, s_sc0, s_sc1, st);
  // each warpgroup runs the full pairs, then the odd last tile alone (HAS_B false), in its own role
  if (wg == 0) {
    DDP_PAIRS(wg0_pair)
  } else {
    DDP_PAIRS(wg1_pair)
  }
#undef DDP_PAIRS

  // epilogue: l = l0 + l1 over both warpgroups, O normalized, lse = m + log2(l) (base 2)
  const float l0 = quad_sum(st.l0), l1 = quad_sum(st.l1);
  if ((lane & 3) == 0) {
    s_l[wg * BM + r0] = l0;
    s_l[wg * BM + r0 + 8] = l1;
  }
  bar_sync(BAR_L, 256);
  const float lt0 = s_l[r0] + s_l[BM + r0], lt1 = s_l[r0 + 8] + s_l[BM + r0 + 8];
  const float i0 = 1.f / lt0, i1 = 1.f / lt1;
  if (wg == 0 && (lane & 3) == 0) {
    if (g0 < hq) lse_part[static_cast<long long>(slot) * hq + g0] = st.m0 + __log2f(lt0);
    if (g1 < hq) lse_part[static_cast<long long>(slot) * hq + g1] = st.m1 + __log2f(lt1);
  }
  const long long out = slot * stride_ps + wg * 256 + cq;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    if (g0 < hq) store_part2<BF16, P16>(o_part, out + g0 * stride_pq + 8 * i, st.o[4 * i] * i0, st.o[4 * i + 1] * i0);
    if (g1 < hq) store_part2<BF16, P16>(o_part, out + g1 * stride_pq + 8 * i, st.o[4 * i + 2] * i1, st.o[4 * i + 3] * i1);
  }

}

}  // namespace

// The merge (ddp_merge_*): out[r, h, :] = sum_s 2^(lse_s - M) O_part[s, row] / sum_s 2^(lse_s - M) over the
// n_parts partials of row = r * H + h (M their maximum; the tree part's lse is finite, every row sees itself).
// One program per (row, column slice of 512 / gridDim.y): its 256 threads first reduce the row's lse values to M
// and the weights' sum, the weights kept in shared memory; then groups of cols / 4 threads (a float4 each) take
// every G-th partial, so a thread's loads are independent of each other; the groups' sums meet in shared memory.
// A partial of weight 0 (an empty split, lse -inf) is never read: its O_part was never written.
namespace {
constexpr int MERGE_THREADS = 256;
constexpr int MERGE_MAX_PARTS = 1024;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <bool BF16, bool P16>
__device__ __forceinline__ void merge_item(const void* __restrict__ o_part, const float* __restrict__ lse_part,
                                           void* out, long long stride_or, long long stride_oh, long long stride_ps,
                                           long long stride_pq, int hq, int H, int n_parts, int row, int slice,
                                           int slices, float* s_w, float* s_red, float* s_acc) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float m = -INFINITY;
  for (int s = tid; s < n_parts; s += MERGE_THREADS) m = fmaxf(m, __ldcg(lse_part + static_cast<long long>(s) * hq + row));
  m = warp_max(m);
  if (lane == 0) s_red[warp] = m;
  __syncthreads();
  m = s_red[0];
#pragma unroll
  for (int i = 1; i < MERGE_THREADS / 32; ++i) m = fmaxf(m, s_red[i]);
  if (m == -INFINITY) m = 0.f;
  __syncthreads();
  float sum = 0.f;
  for (int s = tid; s < n_parts; s += MERGE_THREADS) {
    const float w = exp2f(__ldcg(lse_part + static_cast<long long>(s) * hq + row) - m);
    s_w[s] = w;
    sum += w;
  }
  sum = warp_sum(sum);
  if (lane == 0) s_red[warp] = sum;
  __syncthreads();
  sum = 0.f;
#pragma unroll
  for (int i = 0; i < MERGE_THREADS / 32; ++i) sum += s_red[i];

  const int cols = 512 / slices, tpg = cols / 4, groups = MERGE_THREADS / tpg;
  const int g = tid / tpg, c = (tid % tpg) * 4, col = slice * cols + c;
  const long long src = static_cast<long long>(row) * stride_pq + col;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int s = g; s < n_parts; s += groups) {
    const float w = s_w[s];
    if (w > 0.f) {
      const float4 o = load_part<BF16, P16>(o_part, src + s * stride_ps);
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
  }
  *reinterpret_cast<float4*>(s_acc + g * cols + c) = acc;
  __syncthreads();
  if (g == 0) {
    float4 t = acc;
    for (int i = 1; i < groups; ++i) {
      const float4 o = *reinterpret_cast<const float4*>(s_acc + i * cols + c);
      t.x += o.x;
      t.y += o.y;
      t.z += o.z;
      t.w += o.w;
    }
    const float inv = 1.f / sum;
    uint2 v;
    v.x = pack2<BF16>(t.x * inv, t.y * inv);
    v.y = pack2<BF16>(t.z * inv, t.w * inv);
    char* dst = static_cast<char*>(out) + 2 * ((row / H) * stride_or + (row % H) * stride_oh + col);
    *reinterpret_cast<uint2*>(dst) = v;
  }
}

// The grid barrier before the fused merge: every program of the launch arrives once on the plan's 64-bit counter
// (release), then waits (acquire) until the counter reaches the next multiple of the grid size. The counter only
// grows, so it needs no reset between launches or graph replays; a plan's launches are serialized on one stream
// (they share its partial buffers anyway). All programs must be resident at once: the grid is one wave (at most
// one program per SM, _cu.Launcher checks it), so a waiting program never holds an SM another one needs.
__device__ __forceinline__ void grid_barrier(unsigned long long* counter) {
  __syncthreads();  // the program's partials (every thread's stores) are written
  if (threadIdx.x == 0) {
    const unsigned long long n = gridDim.x;
    unsigned long long old;
    asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;\n" : "=l"(old) : "l"(counter) : "memory");
    const unsigned long long target = (old / n + 1) * n;
    unsigned long long now;
    do {
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(now) : "l"(counter) : "memory");
    } while (now < target);
  }
  __syncthreads();
}

// The merge inside the prefix kernel's launch, after the grid barrier: one warp per item (row, 128-column slice,
// a float4 per lane; item i on program i mod grid, so every SM takes a share), no block-wide synchronization. The
// launch has one program per SM, 8 warps, against the merge kernel's many small programs, so each warp keeps
// FUSED_BATCH partials' loads in flight: the row's weights 2^(lse_s - M) go to the warp's own MERGE_MAX_PARTS floats
// of the dynamic shared memory the prefix left (every TMA copy and wgmma of the prefix has completed), then the
// partials are read in batches of FUSED_BATCH independent loads (an empty split, weight 0, is never read).
constexpr int FUSED_BATCH = 16;
constexpr int FUSED_SLICES = 4;  // 512 / 128 columns
template <bool BF16, bool P16>
__device__ __forceinline__ void merge_fused(const void* __restrict__ o_part, const float* __restrict__ lse_part,
                                            void* out, long long stride_or, long long stride_oh,
                                            long long stride_ps, long long stride_pq, int hq, int H, int n_parts,
                                            float* s_w_all) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  float* s_w = s_w_all + warp * MERGE_MAX_PARTS;
  for (int it = blockIdx.x + gridDim.x * warp; it < hq * FUSED_SLICES; it += gridDim.x * nw) {
    const int row = it / FUSED_SLICES, col = (it % FUSED_SLICES) * 128 + lane * 4;
    const float* lse = lse_part + row;
    float m = -INFINITY;
    for (int s = lane; s < n_parts; s += 32) m = fmaxf(m, __ldcg(lse + static_cast<long long>(s) * hq));
    m = warp_max(m);
    if (m == -INFINITY) m = 0.f;
    float sum = 0.f;
    for (int s = lane; s < n_parts; s += 32) {
      const float w = exp2f(__ldcg(lse + static_cast<long long>(s) * hq) - m);
      s_w[s] = w;
      sum += w;
    }
    sum = warp_sum(sum);
    __syncwarp();
    const long long src = static_cast<long long>(row) * stride_pq + col;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < n_parts; s0 += FUSED_BATCH) {
      float w[FUSED_BATCH];
      float4 o[FUSED_BATCH];
#pragma unroll
      for (int j = 0; j < FUSED_BATCH; ++j) {
        w[j] = s0 + j < n_parts ? s_w[s0 + j] : 0.f;
        o[j] = w[j] > 0.f ? load_part<BF16, P16>(o_part, src + (s0 + j) * stride_ps) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < FUSED_BATCH; ++j) {
        acc.x += w[j] * o[j].x;
        acc.y += w[j] * o[j].y;
        acc.z += w[j] * o[j].z;
        acc.w += w[j] * o[j].w;
      }
    }
    const float inv = 1.f / sum;
    uint2 v;
    v.x = pack2<BF16>(acc.x * inv, acc.y * inv);
    v.y = pack2<BF16>(acc.z * inv, acc.w * inv);
    char* dst = static_cast<char*>(out) + 2 * ((row / H) * stride_or + (row % H) * stride_oh + col);
    *reinterpret_cast<uint2*>(dst) = v;
    __syncwarp();  // the warp's weights are free for its next item
  }
}

// The prefix kernel with its merge fused (one launch instead of two): with ``out`` set, the grid barrier, then
// merge_fused.
template <bool BF16, bool P16>
__device__ __forceinline__ void seesaw(const CUtensorMap* tm_q, const CUtensorMap* tm_kv, const long long* bits,
                                       void* o_part, float* lse_part,
                                       long long stride_ps, long long stride_pq, const int* prefix_ptr, int hq,
                                       int H, float c, int r, int n_qb, int grid_splits, int fold, void* out,
                                       long long stride_or, long long stride_oh, unsigned long long* counter,
                                       int n_parts) {
  seesaw_prefix<BF16, P16>(tm_q, tm_kv, bits, o_part, lse_part, stride_ps, stride_pq, prefix_ptr, hq,
                      H, c, r, n_qb, grid_splits, fold);
  if (out == nullptr) return;
  grid_barrier(counter);
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  merge_fused<BF16, P16>(o_part, lse_part, out, stride_or, stride_oh, stride_ps, stride_pq, hq, H, n_parts,
                    reinterpret_cast<float*>(smem_raw));
}
static_assert(4 * MERGE_MAX_PARTS * (256 / 32) <= SMEM_BYTES, "the fused merge's weights fit");
}  // namespace

#define DDP_MERGE_ARGS                                                                                                \
  const void* o_part, const float* lse_part, void* out, long long stride_or, long long stride_oh,                   \
      long long stride_ps, long long stride_pq, int hq, int H, int n_parts
#define DDP_MERGE_CALL o_part, lse_part, out, stride_or, stride_oh, stride_ps, stride_pq, hq, H, n_parts

namespace {
template <bool BF16, bool P16>
__device__ __forceinline__ void merge(DDP_MERGE_ARGS) {
  __shared__ float s_w[MERGE_MAX_PARTS];
  __shared__ float s_red[MERGE_THREADS / 32];
  __shared__ __align__(16) float s_acc[MERGE_THREADS * 4];
  merge_item<BF16, P16>(o_part, lse_part, out, stride_or, stride_oh, stride_ps, stride_pq, hq, H, n_parts, blockIdx.x,
                   blockIdx.y, gridDim.y, s_w, s_red, s_acc);
}
}  // namespace

// *_p16: the partials in the input's 16-bit type (WsTuning.part_bits 16)
extern "C" __global__ void __launch_bounds__(MERGE_THREADS) ddp_merge_bf16(DDP_MERGE_ARGS) { merge<true, false>(DDP_MERGE_CALL); }
extern "C" __global__ void __launch_bounds__(MERGE_THREADS) ddp_merge_f16(DDP_MERGE_ARGS) { merge<false, false>(DDP_MERGE_CALL); }
extern "C" __global__ void __launch_bounds__(MERGE_THREADS) ddp_merge_bf16_p16(DDP_MERGE_ARGS) { merge<true, true>(DDP_MERGE_CALL); }
extern "C" __global__ void __launch_bounds__(MERGE_THREADS) ddp_merge_f16_p16(DDP_MERGE_ARGS) { merge<false, true>(DDP_MERGE_CALL); }

// The prefix kernels; ``out`` null: the partials only (the merge is ddp_merge_*'s launch or Triton's), else the
// merge fused after a grid barrier into out [R, H, 512] (16-bit, unit column stride, 8-byte aligned).
#define DDP_ARGS                                                                                                     \
  const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv, const long long* bits,         \
      void* o_part, float* lse_part, long long stride_ps,                                                        \
      long long stride_pq, const int* prefix_ptr, int hq, int H, float c, int r, int n_qb, int grid_splits, int fold, \
      void* out, long long stride_or, long long stride_oh, unsigned long long* counter, int n_parts
#define DDP_CALL                                                                                                     \
  &tm_q, &tm_kv, bits, o_part, lse_part, stride_ps, stride_pq, prefix_ptr, hq, H, c, r, n_qb,     \
      grid_splits, fold, out, stride_or, stride_oh, counter, n_parts

extern "C" __global__ void __launch_bounds__(256, 1) ddp_seesaw_bf16(DDP_ARGS) { seesaw<true, false>(DDP_CALL); }
extern "C" __global__ void __launch_bounds__(256, 1) ddp_seesaw_f16(DDP_ARGS) { seesaw<false, false>(DDP_CALL); }
extern "C" __global__ void __launch_bounds__(256, 1) ddp_seesaw_bf16_p16(DDP_ARGS) { seesaw<true, true>(DDP_CALL); }
extern "C" __global__ void __launch_bounds__(256, 1) ddp_seesaw_f16_p16(DDP_ARGS) { seesaw<false, true>(DDP_CALL); }
