// Flash attention's CUDA block programs, written once for the GPU and for a CPU that runs them
// warp by warp (tests/kernels/flash_tiles_test.cc), so that the kernel's tiling, indexing, masks,
// tails and grouped-query reads are checked without a GPU. kernels/cuda/flash_attention.cu
// launches them; kernels/flash_math.h holds the element arithmetic they share with the CPU's own
// flash kernel.
//
// [Note: flash attention's block programs]
// A program is the code of one thread block, written against an executor `X` that says how a
// block's threads run:
//   X::Elem                        the 16-bit element (bf16 or fp16), X::ToF / X::FromF convert;
//   x.ForThreads(f)                f(t) for each of the block's kThreads threads;
//   x.ForWarps(f)                  f(w) for each of its kWarps warps; inside it,
//   x.ForLanes(f)                  f(lane) for each of the warp's 32 lanes;
//   x.SyncBlock(), x.SyncWarp()    barriers;
//   x.Mma(ColB/RowB, ...)          a warp's 16 x 16 fp32 tile C (+)= A B over k_steps 16 x 16
//                                  blocks of 16-bit A and B in shared memory (tensor cores);
// and for the forward, whose state lives in registers (kernels/flash_forward.h):
//   X::Regs<T, N>                  N registers of type T per lane of each warp; r.at(w, lane)
//                                  is lane's (on CUDA the thread's own, whatever w and lane);
//   x.LdMatrix(w, r, i, addr)      ldmatrix .x4 (and LdMatrixTrans: .trans) into registers
//                                  i .. i + 3, lane l giving addr(l), a row of matrix l / 8;
//   x.MmaSync(w, c, i, a, j, b, k) mma.sync m16n8k16: c[i .. i + 3] += A(a[j .. j + 3]) B(b[k],
//                                  b[k + 1]), fp32 accumulators, bf16/fp16 operands;
//   x.QuadAllReduce(w, r, i, op)   r[i] of the 4 lanes of each quad combined by two xor
//                                  shuffles (1, then 2): every lane gets the quad's value;
//   x.CpAsync16(dst, src, valid)   a 16-byte asynchronous copy into shared memory (zeros when
//                                  not valid), inside ForThreads; x.CpAsyncCommit() closes a
//                                  group, x.CpAsyncWait(n) waits until at most n are in flight;
//   X::Exp2, X::Pack, X::Store2    2^x; two floats as a register of two elements; a pair stored.
// On CUDA every thread runs each f for its own index, Mma is wmma and the warp instructions are
// the PTX ones; the CPU executor runs the indices one after another, Mma as loops, and emulates
// each warp instruction over the 32 lanes' registers (its copies land only when waited for).
// Code inside ForWarps but outside ForLanes is uniform (loop bounds, pointers, the warp
// instructions) and every write to shared or global memory is inside ForLanes, ForThreads, Mma
// or a copy, so running the lanes in turn computes what the warp computes, as long as a lane
// only reads in a phase (between barriers) what no other lane writes in it: the programs are
// split into phases so that this holds.
//
// Tiles: a block takes kTile = 64 queries (forward, dQ) or 64 keys (dK/dV); each of its 4 warps
// owns 16 of them, and the block meets 64 keys (or queries) at a time in shared memory. Head
// sizes 64 and 128 (D); any sequence length (rows past the end load zeros and write nothing);
// causal, the tiles wholly above the diagonal never visited; a query head reads its key/value
// head in place ([Note: the qkv layout]). The softmax statistics are fp32; P and dS are rounded to
// the element type for the tensor-core products, accumulators are fp32 until written.
// Backward: the dQ program also computes D = dout . out per query into `dvec`, which the dK/dV
// program (launched after it) reads; each program writes only its own tile of dq or of dk and
// dv (a dK/dV block sums its group's query heads itself), so no atomics, and the result does not
// depend on the order blocks run.
#pragma once

#include <cmath>
#include <cstdint>

#include "zerort/kernels/flash_math.h"
#include "zerort/kernels/model_math.h"

// Device code under nvcc (the CUDA executor's functions are device functions); plain C++ for
// the CPU executor, which compiles them with the host compiler.
#if defined(__CUDACC__)
#define ZR_TILE_PROGRAM __device__
#else
#define ZR_TILE_PROGRAM
#endif

namespace zerort::flash {

inline constexpr int kTile = 64;  // queries or keys a block owns, and per step
inline constexpr int kWarps = 4;  // 16 rows of the tile each
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kWarpRows = kTile / kWarps;

struct ColB {};  // B(k, n) = b[n * ldb + k]: K^T from K's rows
struct RowB {};  // B(k, n) = b[k * ldb + n]

struct Shape {
  int batch = 0, seq = 0, heads = 0, kv_heads = 0;
  float scale = 0;  // 1 / sqrt(head size)
  ZR_HOST_DEVICE int tiles() const { return (seq + kTile - 1) / kTile; }
};

// Shared memory of each program (bytes), in the order the programs carve it.
template <int D>
struct BackwardSmem {
  static constexpr int tile = kTile * D * 2;   // four tiles: the block's own two, the visited two
  static constexpr int rows = 4 * tile;        // lse and D of the visited queries (dK/dV) or of
  static constexpr int dv = rows + kTile * 4;  // the block's own (dQ): fp32 [64] each
  static constexpr int s = 0, pf = s + kWarpRows * kTile * 4;  // per warp: S or dP, P fp32,
  static constexpr int pe = pf + kWarpRows * kTile * 4;        // P and dS elements,
  static constexpr int dse = pe + kWarpRows * kTile * 2;
  static constexpr int acc = dse + kWarpRows * kTile * 2;  // dQ, or dK then dV: fp32 [16][D]
  static constexpr int red = acc + 2 * kWarpRows * D * 4;
  static constexpr int warp = (red + 32 * 4 + 127) / 128 * 128;
  static constexpr int bytes = dv + kTile * 4 + kWarps * warp;
  ZR_HOST_DEVICE static constexpr int Warp(int w) { return dv + kTile * 4 + w * warp; }
};
// Warp w's pieces of a backward block's shared memory, at BackwardSmem's per-warp offsets.
template <typename E>
struct BackwardWarp {
  float* s;    // S, then dP
  float* pf;   // P, fp32
  E* pe;       // P, elements
  E* dse;      // dS, elements
  float* acc;  // dQ, or dK then dV
  float* red;  // the D reduction's partial sums (dQ)
};
template <int D, typename E>
ZR_HOST_DEVICE BackwardWarp<E> BackwardWarpOf(unsigned char* smem, int w) {
  using S = BackwardSmem<D>;
  unsigned char* ws = smem + S::Warp(w);
  return {reinterpret_cast<float*>(ws + S::s),   reinterpret_cast<float*>(ws + S::pf),
          reinterpret_cast<E*>(ws + S::pe),      reinterpret_cast<E*>(ws + S::dse),
          reinterpret_cast<float*>(ws + S::acc), reinterpret_cast<float*>(ws + S::red)};
}

// Copies `rows` x D elements of a head (row i at src + i * ld) into a dense [64][D] tile, zeros
// past `rows`; 16 bytes per thread per step.
template <int D, typename X>
ZR_TILE_PROGRAM void LoadTile(const X& x, typename X::Elem* tile, const typename X::Elem* src,
                              int64_t ld, int rows) {
  constexpr int kChunks = D / 8;  // 16-byte pieces of a row
  x.ForThreads([&](int t) {
    for (int c = t; c < kTile * kChunks; c += kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      if (r < rows) {
        X::Copy16(tile + r * D + col, src + r * ld + col);
      } else {
        X::Zero16(tile + r * D + col);
      }
    }
  });
}

// dS and P of one warp's 16 rows against a 64-wide tile, from S (raw dot products) and dP, for
// rows r and columns c whose (query, key) pair is visible: `visible(r, c)`, `lse_of(r, c)` and
// `d_of(r, c)` say which and give the query's statistics. Phase 1 writes P (fp32 and elements).
template <typename X, typename Visible, typename Stat>
ZR_TILE_PROGRAM void RecomputeP(const X& x, const float* s, float* pf, typename X::Elem* pe,
                                float scale, Visible visible, Stat lse_of) {
  x.ForLanes([&](int lane) {
    const int r = lane / 2, c0 = (lane % 2) * (kTile / 2);
    for (int c = c0; c < c0 + kTile / 2; ++c) {
      const float pv =
          visible(r, c) ? math::RecomputedProb(s[r * kTile + c], scale, lse_of(r, c)) : 0.0f;
      pf[r * kTile + c] = pv;
      pe[r * kTile + c] = X::FromF(pv);
    }
  });
}
template <typename X, typename Visible, typename Stat>
ZR_TILE_PROGRAM void ScoreGrads(const X& x, const float* dp, const float* pf, typename X::Elem* dse,
                                float scale, Visible visible, Stat d_of) {
  x.ForLanes([&](int lane) {
    const int r = lane / 2, c0 = (lane % 2) * (kTile / 2);
    for (int c = c0; c < c0 + kTile / 2; ++c) {
      const float ds =
          visible(r, c) ? math::ScoreGrad(pf[r * kTile + c], dp[r * kTile + c], d_of(r, c), scale)
                        : 0.0f;
      dse[r * kTile + c] = X::FromF(ds);
    }
  });
}

// The backward's common steps for one warp's 16 rows against a 64-wide tile: S = A B^T
// (A: the warp's 16 rows of D, B: the tile's 64 rows, both in shared memory), P recomputed,
// `between` (dK/dV's dV += P^T dO, reading P), dP = dA dB^T over S, and dS. The dQ program takes
// A, B, dA, dB = Q_w, K, dO_w, V; the dK/dV program the transposes K_w, Q, V_w, dO.
template <int D, typename X, typename Visible, typename Lse, typename Dvec, typename Between>
ZR_TILE_PROGRAM void ProbsAndScoreGrads(const X& x, const BackwardWarp<typename X::Elem>& m,
                                        const typename X::Elem* a, const typename X::Elem* b,
                                        const typename X::Elem* da, const typename X::Elem* db,
                                        float scale, Visible visible, Lse lse_of, Dvec d_of,
                                        Between between) {
  for (int n = 0; n < kTile / 16; ++n) {
    x.Mma(ColB{}, m.s + n * 16, kTile, a, D, b + n * 16 * D, D, D / 16, false);
  }
  x.SyncWarp();
  RecomputeP(x, m.s, m.pf, m.pe, scale, visible, lse_of);
  x.SyncWarp();
  between();
  for (int n = 0; n < kTile / 16; ++n) {
    x.Mma(ColB{}, m.s + n * 16, kTile, da, D, db + n * 16 * D, D, D / 16, false);
  }
  x.SyncWarp();
  ScoreGrads(x, m.s, m.pf, m.dse, scale, visible, d_of);
  x.SyncWarp();
}

// Adds a warp's fp32 [16][D] accumulator into 16 rows of a head in global memory (row i at
// dst + i * ld), the rows before `rows`.
template <int D, typename X>
ZR_TILE_PROGRAM void AddRows(const X& x, typename X::Elem* dst, int64_t ld, const float* acc,
                             int rows) {
  x.ForLanes([&](int lane) {
    const int r = lane / 2, half = lane % 2;
    if (r >= rows) return;
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) {
      typename X::Elem& e = dst[r * ld + c];
      e = X::FromF(math::Add(X::ToF(e), acc[r * D + c]));
    }
  });
}

// The backward's first pass over one (query tile, batch x query head): D = dout . out of its
// queries into `dvec` ([batch, heads, seq], fp32), and dq += dS K over the key tiles it sees.
template <int D, typename X>
ZR_TILE_PROGRAM void BackwardDqProgram(const X& x, unsigned char* smem, typename X::Elem* dqkv,
                                       const typename X::Elem* dout, const typename X::Elem* qkv,
                                       const typename X::Elem* out, const float* lse, float* dvec,
                                       const Shape sh, int tile, int bh) {
  using E = typename X::Elem;
  using S = BackwardSmem<D>;
  const int b = bh / sh.heads, h = bh % sh.heads, q0 = tile * kTile, T = sh.seq;
  const math::QkvLayout L{sh.heads, sh.kv_heads, D};
  const int64_t ld = L.row(), ldo = int64_t{sh.heads} * D;
  const int64_t row0 = static_cast<int64_t>(b) * T, stat0 = (int64_t{b} * sh.heads + h) * T;
  E* qs = reinterpret_cast<E*>(smem);
  E* dos = reinterpret_cast<E*>(smem + S::tile);
  E* ks = reinterpret_cast<E*>(smem + 2 * S::tile);
  E* vs = reinterpret_cast<E*>(smem + 3 * S::tile);
  float* lse_s = reinterpret_cast<float*>(smem + S::rows);
  float* d_s = reinterpret_cast<float*>(smem + S::dv);
  LoadTile<D>(x, qs, qkv + (row0 + q0) * ld + L.q(h), ld, T - q0);
  LoadTile<D>(x, dos, dout + (row0 + q0) * ldo + int64_t{h} * D, ldo, T - q0);
  x.ForWarps([&](int w) {
    const BackwardWarp<E> m = BackwardWarpOf<D, E>(smem, w);
    float* red = m.red;
    float* acc = m.acc;
    x.ForLanes([&](int lane) {  // D: each lane of a pair half of the row's dout . out
      for (int i = lane; i < kWarpRows * D; i += 32) acc[i] = 0.0f;
      const int r = lane / 2, half = lane % 2, q = q0 + w * kWarpRows + r;
      float sum = 0.0f;
      if (q < T) {
        const E* dq_row = dout + (row0 + q) * ldo + int64_t{h} * D;
        const E* o_row = out + (row0 + q) * ldo + int64_t{h} * D;
        for (int c = half * (D / 2); c < (half + 1) * (D / 2); ++c) {
          sum = math::Add(sum, math::Mul(X::ToF(dq_row[c]), X::ToF(o_row[c])));
        }
      }
      red[lane] = sum;
    });
    x.SyncWarp();
    x.ForLanes([&](int lane) {
      if (lane % 2 != 0) return;
      const int r = lane / 2, q = q0 + w * kWarpRows + r;
      const float d = math::Add(red[lane], red[lane + 1]);
      d_s[w * kWarpRows + r] = d;
      lse_s[w * kWarpRows + r] = q < T ? lse[stat0 + q] : 0.0f;
      if (q < T) dvec[stat0 + q] = d;
    });
  });
  const int last = (q0 + kTile < T ? q0 + kTile : T) - 1;
  for (int k0 = 0; k0 <= last; k0 += kTile) {
    const int kn = T - k0 < kTile ? T - k0 : kTile;
    x.SyncBlock();
    LoadTile<D>(x, ks, qkv + (row0 + k0) * ld + L.k(h), ld, kn);
    LoadTile<D>(x, vs, qkv + (row0 + k0) * ld + L.v(h), ld, kn);
    x.SyncBlock();
    x.ForWarps([&](int w) {
      const BackwardWarp<E> m = BackwardWarpOf<D, E>(smem, w);
      const int r0 = w * kWarpRows;
      auto visible = [&](int r, int c) {
        const int q = q0 + r0 + r;
        return q < T && c < math::CausalKeys(q, k0, kn);
      };
      ProbsAndScoreGrads<D>(
          x, m, qs + r0 * D, ks, dos + r0 * D, vs, sh.scale, visible,
          [&](int r, int) { return lse_s[r0 + r]; }, [&](int r, int) { return d_s[r0 + r]; },
          [] {});
      for (int n = 0; n < D / 16; ++n) {  // dQ_w += dS K
        x.Mma(RowB{}, m.acc + n * 16, D, m.dse, kTile, ks + n * 16, D, kTile / 16, true);
      }
      x.SyncWarp();
    });
  }
  x.ForWarps([&](int w) {
    const float* acc = BackwardWarpOf<D, E>(smem, w).acc;
    const int r0 = w * kWarpRows;
    AddRows<D>(x, dqkv + (row0 + q0 + r0) * ld + L.q(h), ld, acc, T - q0 - r0);
  });
}

// The backward's second pass over one (key tile, batch x key/value head): dk += dS^T Q and
// dv += P^T dout over every query head of the group and every query tile that sees the keys.
template <int D, typename X>
ZR_TILE_PROGRAM void BackwardDkvProgram(const X& x, unsigned char* smem, typename X::Elem* dqkv,
                                        const typename X::Elem* dout, const typename X::Elem* qkv,
                                        const float* lse, const float* dvec, const Shape sh,
                                        int tile, int bkv) {
  using E = typename X::Elem;
  using S = BackwardSmem<D>;
  const int b = bkv / sh.kv_heads, g = bkv % sh.kv_heads, k0 = tile * kTile, T = sh.seq;
  const math::QkvLayout L{sh.heads, sh.kv_heads, D};
  const int group = L.group();
  const int64_t ld = L.row(), ldo = int64_t{sh.heads} * D;
  const int64_t row0 = static_cast<int64_t>(b) * T;
  E* ks = reinterpret_cast<E*>(smem);
  E* vs = reinterpret_cast<E*>(smem + S::tile);
  E* qs = reinterpret_cast<E*>(smem + 2 * S::tile);
  E* dos = reinterpret_cast<E*>(smem + 3 * S::tile);
  float* lse_s = reinterpret_cast<float*>(smem + S::rows);
  float* d_s = reinterpret_cast<float*>(smem + S::dv);
  const int first_h = g * group;  // the query heads reading key/value head g
  LoadTile<D>(x, ks, qkv + (row0 + k0) * ld + L.k(first_h), ld, T - k0);
  LoadTile<D>(x, vs, qkv + (row0 + k0) * ld + L.v(first_h), ld, T - k0);
  x.ForWarps([&](int w) {
    float* acc = BackwardWarpOf<D, E>(smem, w).acc;
    x.ForLanes([&](int lane) {
      for (int i = lane; i < 2 * kWarpRows * D; i += 32) acc[i] = 0.0f;
    });
  });
  for (int h = first_h; h < first_h + group; ++h) {
    const int64_t stat0 = (int64_t{b} * sh.heads + h) * T;
    for (int q0 = k0; q0 < T; q0 += kTile) {  // query tiles from the diagonal on
      const int qn = T - q0 < kTile ? T - q0 : kTile;
      x.SyncBlock();
      LoadTile<D>(x, qs, qkv + (row0 + q0) * ld + L.q(h), ld, qn);
      LoadTile<D>(x, dos, dout + (row0 + q0) * ldo + int64_t{h} * D, ldo, qn);
      x.ForThreads([&](int t) {
        if (t < kTile) {
          lse_s[t] = t < qn ? lse[stat0 + q0 + t] : 0.0f;
          d_s[t] = t < qn ? dvec[stat0 + q0 + t] : 0.0f;
        }
      });
      x.SyncBlock();
      x.ForWarps([&](int w) {
        const BackwardWarp<E> m = BackwardWarpOf<D, E>(smem, w);
        float* dk = m.acc;
        float* dv = dk + kWarpRows * D;
        const int r0 = w * kWarpRows;  // this warp's keys: k0 + r0 + r; columns are queries
        auto visible = [&](int r, int c) {
          const int k = k0 + r0 + r, q = q0 + c;
          return k < T && c < qn && q >= k;
        };
        ProbsAndScoreGrads<D>(
            x, m, ks + r0 * D, qs, vs + r0 * D, dos, sh.scale, visible,
            [&](int, int c) { return lse_s[c]; }, [&](int, int c) { return d_s[c]; },
            [&] {
              for (int n = 0; n < D / 16; ++n) {  // dV_w += P^T dO
                x.Mma(RowB{}, dv + n * 16, D, m.pe, kTile, dos + n * 16, D, kTile / 16, true);
              }
            });
        for (int n = 0; n < D / 16; ++n) {  // dK_w += dS^T Q
          x.Mma(RowB{}, dk + n * 16, D, m.dse, kTile, qs + n * 16, D, kTile / 16, true);
        }
        x.SyncWarp();
      });
    }
  }
  x.ForWarps([&](int w) {
    const float* dk = BackwardWarpOf<D, E>(smem, w).acc;
    const int r0 = w * kWarpRows;
    E* rows = dqkv + (row0 + k0 + r0) * ld;
    AddRows<D>(x, rows + L.k(first_h), ld, dk, T - k0 - r0);
    AddRows<D>(x, rows + L.v(first_h), ld, dk + kWarpRows * D, T - k0 - r0);
  });
}

}  // namespace zerort::flash
