// Flash attention's forward block program with its state in registers: the tensor-core products
// are warp-wide mma.sync m16n8k16 instructions on fragments loaded by ldmatrix from swizzled
// shared memory, the next key/value tile is copied in (cp.async) while this one is computed, and
// the scores, probabilities and output accumulators never leave the registers. Written once, for
// the GPU (kernels/cuda/flash_attention.cu) and for the CPU executor that emulates each warp
// instruction lane by lane (tests/kernels/flash_harness.h), so that the fragments' layouts, the
// swizzle, the copy pipeline, the masks and tails are checked without a GPU.
//
// [Note: the register-resident forward]
// A block takes kTile = 64 queries of one (batch, query head); warp w owns queries 16 w .. 16 w +
// 15 and keeps them as mma.sync A fragments (`qf`) for the whole program. Per 64-key tile:
//   S = Q_w K^T      8 n-tiles of 8 keys (`s`, 4 floats a lane), B fragments from K by ldmatrix
//   mask, row max    a lane holds rows g = lane / 4 and g + 8, keys 2 (lane % 4) + {0, 1} of each
//                    n-tile; the row's four lanes (a quad) combine their maxima by two xor
//                    shuffles (QuadAllReduce), so every lane of the quad has the row's maximum
//   P = 2^(S scale log2 e - m scale log2 e)   one fma and one exp2 a score; the running max m is
//                    in dot-product units, its scaled copy is the exponent's base
//   rescale          alpha = 2^((m_old - m) scale log2 e) multiplies the lane's partial row sums
//                    and its part of the output accumulators
//   O += P V         P rounded to the element type becomes the A fragments directly: an
//                    m16n8 accumulator's registers for keys 16 k .. 16 k + 15 are the A fragment
//                    of k-step k; V's B fragments come from ldmatrix.trans
// After the last tile the quad sums its partial row sums, out = O / l, lse = m scale + ln l.
// Rows past the sequence see no key (their base is 0, their p 0, nothing is written).
// Shared memory: Q [64][D], and two buffers each of K and V [64][D]; 16-byte chunk c of row r is
// stored at chunk c ^ (r % 8) of its group of 8 chunks (`Swizzled`), so the 8 rows an ldmatrix
// phase reads, and the 8 chunks a cp.async phase writes, fall in 8 different bank groups.
// Copies: the program commits Q with the first K/V tile as one group, then each next tile as a
// group before computing the current one, and waits for all but the newest; a barrier after each
// tile keeps a buffer from being refilled while a warp still reads it.
#pragma once

#include <cmath>
#include <cstdint>

#include "zerort/kernels/flash_math.h"
#include "zerort/kernels/flash_tiles.h"

#if defined(__CUDACC__)
#define ZR_UNROLL _Pragma("unroll")
#else
#define ZR_UNROLL
#endif

namespace zerort::flash {

// An executor's per-lane registers of a block's warps ([Note: flash attention's block programs]).
template <typename X, typename T, int N>
using Regs = typename X::template Regs<T, N>;

// The forward's shared memory: Q, then K in buffers 0 and 1, then V in buffers 0 and 1.
template <int D>
struct ForwardSmem {
  static constexpr int tile = kTile * D * 2;
  static constexpr int bytes = 5 * tile;
  ZR_HOST_DEVICE static constexpr int K(int buf) { return tile * (1 + buf); }
  ZR_HOST_DEVICE static constexpr int V(int buf) { return tile * (3 + buf); }
};

// The element offset of (row, col) in a swizzled [64][D] tile ([Note: the register-resident
// forward]): col's 16-byte chunk moves to chunk ^ (row % 8), the element keeps its place in it.
template <int D>
ZR_HOST_DEVICE constexpr int Swizzled(int row, int col) {
  return row * D + (((col / 8) ^ (row & 7)) * 8) + col % 8;
}

// Copies `rows` x D elements of a head (row i at src + i * ld) into a swizzled [64][D] tile by
// asynchronous 16-byte copies, zeros past `rows` (those copies read nothing).
template <int D, typename X>
ZR_TILE_PROGRAM void LoadTileAsync(const X& x, typename X::Elem* tile, const typename X::Elem* src,
                                   int64_t ld, int rows) {
  constexpr int kChunks = D / 8;
  x.ForThreads([&](int t) {
    ZR_UNROLL
    for (int c = t; c < kTile * kChunks; c += kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      x.CpAsync16(tile + Swizzled<D>(r, col), src + (r < rows ? r : 0) * ld + col, r < rows);
    }
  });
}

template <int D, typename X>
ZR_TILE_PROGRAM void ForwardProgram(const X& x, unsigned char* smem, const typename X::Elem* qkv,
                                    typename X::Elem* out, float* lse, const Shape sh, int tile,
                                    int bh) {
  using E = typename X::Elem;
  using S = ForwardSmem<D>;
  constexpr int kNT = kTile / 8;  // n-tiles of S (8 keys each)
  constexpr int kDT = D / 8;      // n-tiles of O (8 columns each)
  const int b = bh / sh.heads, h = bh % sh.heads, q0 = tile * kTile, T = sh.seq;
  const math::QkvLayout L{sh.heads, sh.kv_heads, D};
  const int64_t ld = L.row();
  const E* base = qkv + static_cast<int64_t>(b) * T * ld;
  E* qs = reinterpret_cast<E*>(smem);
  const float scale_log2 = math::Mul(sh.scale, 1.44269504088896340736f);  // scale x log2(e)

  Regs<X, uint32_t, D / 16 * 4> qf;  // Q_w: A fragments, 4 registers a k-step of 16 columns
  Regs<X, float, kDT * 4> o;         // O_w accumulators: rows g and g + 8, 2 columns an n-tile
  Regs<X, float, 4> st;              // m (rows g, g + 8) in dot units, this lane's part of l
  Regs<X, float, kNT * 4> s;         // S, then P
  Regs<X, float, 2> tmax;            // the tile's row maxima
  Regs<X, uint32_t, kTile / 16 * 4> pf;  // P as A fragments
  Regs<X, uint32_t, 4> bf;               // two n-tiles' B fragments

  const int last = (q0 + kTile < T ? q0 + kTile : T) - 1;  // the tile's last query
  const int n_tiles = last / kTile + 1;                    // key tiles up to the diagonal
  LoadTileAsync<D>(x, qs, base + int64_t{q0} * ld + L.q(h), ld, T - q0);
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::K(0)), base + L.k(h), ld, T);
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::V(0)), base + L.v(h), ld, T);
  x.CpAsyncCommit();
  x.ForWarps([&](int w) {
    x.ForLanes([&](int lane) {
      float* ow = o.at(w, lane);
      ZR_UNROLL
      for (int i = 0; i < kDT * 4; ++i) ow[i] = 0.0f;
      float* sw = st.at(w, lane);
      sw[0] = sw[1] = -INFINITY;
      sw[2] = sw[3] = 0.0f;
    });
  });
  for (int j = 0; j < n_tiles; ++j) {
    const int k0 = j * kTile, kn = T - k0 < kTile ? T - k0 : kTile, buf = j % 2;
    if (j + 1 < n_tiles) {
      const int64_t next = int64_t{k0 + kTile} * ld;
      LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::K(1 - buf)), base + next + L.k(h), ld,
                       T - k0 - kTile);
      LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::V(1 - buf)), base + next + L.v(h), ld,
                       T - k0 - kTile);
      x.CpAsyncCommit();
      x.CpAsyncWait(1);
    } else {
      x.CpAsyncWait(0);
    }
    x.SyncBlock();  // tile j (and Q) arrived for every thread
    const E* ks = reinterpret_cast<const E*>(smem + S::K(buf));
    const E* vs = reinterpret_cast<const E*>(smem + S::V(buf));
    x.ForWarps([&](int w) {
      const int r0 = w * kWarpRows;
      if (j == 0) {  // the warp's queries as A fragments: matrix i of a k-step is rows 8 (i % 2),
        ZR_UNROLL    // columns 8 (i / 2)
        for (int kk = 0; kk < D / 16; ++kk) {
          x.LdMatrix(w, qf, kk * 4, [&](int lane) {
            return qs + Swizzled<D>(r0 + lane % 8 + 8 * (lane / 8 % 2), kk * 16 + 8 * (lane / 16));
          });
        }
      }
      x.ForLanes([&](int lane) {
        float* sw = s.at(w, lane);
        ZR_UNROLL
        for (int i = 0; i < kNT * 4; ++i) sw[i] = 0.0f;
      });
      ZR_UNROLL
      for (int kg = 0; kg < kTile / 16; ++kg) {  // S = Q_w K^T, 16 keys at a time: matrix i is
        ZR_UNROLL                                // keys 8 (i / 2), columns 8 (i % 2)
        for (int kk = 0; kk < D / 16; ++kk) {
          x.LdMatrix(w, bf, 0, [&](int lane) {
            return ks + Swizzled<D>(kg * 16 + lane % 8 + 8 * (lane / 16), kk * 16 + 8 * (lane / 8 % 2));
          });
          x.MmaSync(w, s, 2 * kg * 4, qf, kk * 4, bf, 0);
          x.MmaSync(w, s, (2 * kg + 1) * 4, qf, kk * 4, bf, 2);
        }
      }
      // Mask to what each row sees; the lane's maxima.
      x.ForLanes([&](int lane) {
        const int g = lane / 4, t = lane % 4;
        float* sw = s.at(w, lane);
        float* mx = tmax.at(w, lane);
        ZR_UNROLL
        for (int half = 0; half < 2; ++half) {
          const int q = q0 + r0 + g + 8 * half;
          const int seen = q < T ? math::CausalKeys(q, k0, kn) : 0;
          float m = -INFINITY;
          ZR_UNROLL
          for (int nt = 0; nt < kNT; ++nt) {
            ZR_UNROLL
            for (int e = 0; e < 2; ++e) {
              float& v = sw[nt * 4 + half * 2 + e];
              if (nt * 8 + 2 * t + e < seen) {
                m = math::Max(m, v);
              } else {
                v = -INFINITY;
              }
            }
          }
          mx[half] = m;
        }
      });
      x.QuadAllReduce(w, tmax, 0, [](float a, float c) { return math::Max(a, c); });
      x.QuadAllReduce(w, tmax, 1, [](float a, float c) { return math::Max(a, c); });
      // The running statistics, the rescaled accumulators, P and its fragments.
      x.ForLanes([&](int lane) {
        float* sw = s.at(w, lane);
        float* stw = st.at(w, lane);
        float* ow = o.at(w, lane);
        const float* mx = tmax.at(w, lane);
        ZR_UNROLL
        for (int half = 0; half < 2; ++half) {
          const float m_new = math::Max(stw[half], mx[half]);
          const float base2 = m_new == -INFINITY ? 0.0f : math::Mul(m_new, scale_log2);
          const float alpha = X::Exp2(math::Sub(math::Mul(stw[half], scale_log2), base2));
          stw[half] = m_new;
          float sum = math::Mul(stw[2 + half], alpha);
          ZR_UNROLL
          for (int nt = 0; nt < kNT; ++nt) {
            ZR_UNROLL
            for (int e = 0; e < 2; ++e) {
              float& v = sw[nt * 4 + half * 2 + e];
              v = X::Exp2(math::Fma(v, scale_log2, -base2));
              sum = math::Add(sum, v);
            }
          }
          stw[2 + half] = sum;
          ZR_UNROLL
          for (int dt = 0; dt < kDT; ++dt) {
            ow[dt * 4 + half * 2] = math::Mul(ow[dt * 4 + half * 2], alpha);
            ow[dt * 4 + half * 2 + 1] = math::Mul(ow[dt * 4 + half * 2 + 1], alpha);
          }
        }
        uint32_t* pw = pf.at(w, lane);
        ZR_UNROLL
        for (int kk = 0; kk < kTile / 16; ++kk) {  // n-tiles 2 kk and 2 kk + 1 make k-step kk
          pw[kk * 4 + 0] = X::Pack(sw[2 * kk * 4 + 0], sw[2 * kk * 4 + 1]);
          pw[kk * 4 + 1] = X::Pack(sw[2 * kk * 4 + 2], sw[2 * kk * 4 + 3]);
          pw[kk * 4 + 2] = X::Pack(sw[(2 * kk + 1) * 4 + 0], sw[(2 * kk + 1) * 4 + 1]);
          pw[kk * 4 + 3] = X::Pack(sw[(2 * kk + 1) * 4 + 2], sw[(2 * kk + 1) * 4 + 3]);
        }
      });
      ZR_UNROLL
      for (int kk = 0; kk < kTile / 16; ++kk) {  // O += P V: V's matrix i is keys 8 (i % 2),
        ZR_UNROLL                                // columns 8 (i / 2), transposed
        for (int dg = 0; dg < D / 16; ++dg) {
          x.LdMatrixTrans(w, bf, 0, [&](int lane) {
            return vs + Swizzled<D>(kk * 16 + lane % 8 + 8 * (lane / 8 % 2), dg * 16 + 8 * (lane / 16));
          });
          x.MmaSync(w, o, 2 * dg * 4, pf, kk * 4, bf, 0);
          x.MmaSync(w, o, (2 * dg + 1) * 4, pf, kk * 4, bf, 2);
        }
      }
    });
    x.SyncBlock();  // every warp is done with buffer `buf` before it is refilled
  }
  const int64_t ldo = int64_t{sh.heads} * D;
  x.ForWarps([&](int w) {
    x.QuadAllReduce(w, st, 2, [](float a, float c) { return math::Add(a, c); });
    x.QuadAllReduce(w, st, 3, [](float a, float c) { return math::Add(a, c); });
    x.ForLanes([&](int lane) {
      const int g = lane / 4, t = lane % 4;
      const float* stw = st.at(w, lane);
      const float* ow = o.at(w, lane);
      ZR_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int q = q0 + w * kWarpRows + g + 8 * half;
        if (q >= T) continue;
        const float inv = math::Div(1.0f, stw[2 + half]);
        E* dst = out + (static_cast<int64_t>(b) * T + q) * ldo + int64_t{h} * D + 2 * t;
        ZR_UNROLL
        for (int dt = 0; dt < kDT; ++dt) {
          X::Store2(dst + dt * 8, math::Mul(ow[dt * 4 + half * 2], inv),
                    math::Mul(ow[dt * 4 + half * 2 + 1], inv));
        }
        if (t == 0) {
          lse[(static_cast<int64_t>(b) * sh.heads + h) * T + q] =
              math::Add(math::Mul(stw[half], sh.scale), ::logf(stw[2 + half]));
        }
      }
    });
  });
}

}  // namespace zerort::flash
