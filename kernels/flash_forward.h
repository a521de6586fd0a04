// Flash attention's forward block program ([Note: flash attention's block programs] in
// kernels/flash_tiles.h): its scores, probabilities and output accumulators stay in registers.
//
// [Note: the register-resident forward]
// A block takes kTile = 64 queries of one (batch, query head); warp w owns queries 16 w .. 16 w +
// 15. Per 64-key tile:
//   S = Q_w K^T      WarpScores: lane holds rows g = lane / 4 and g + 8 of S
//   mask, row max    keys a query does not see become -inf; the row's four lanes (a quad)
//                    combine their maxima by two xor shuffles (QuadAllReduce)
//   P = 2^(S c - m c)  with c = scale log2(e): one fma and one exp2 a score; the running max m
//                    is in dot-product units, m c is the exponent's base (0 for a row that has
//                    seen no key: a row past the sequence, whose p are then 0)
//   rescale          alpha = 2^(m_old c - m c) multiplies the lane's partial row sums and its
//                    part of the output accumulators
//   O += P V         PackFrags, WarpAccumulate
// After the last tile the quad sums its partial row sums l, out = O / l, lse = m scale + ln l.
// Copies: Q with the first K/V tile as one group, then each next K/V tile as a group before the
// current one is computed, waiting for all but the newest; a barrier after each tile keeps a
// buffer from being refilled while a warp still reads it.
#pragma once

#include <cmath>
#include <cstdint>

#include "zerort/kernels/flash_math.h"
#include "zerort/kernels/flash_tiles.h"

namespace zerort::flash {

// The forward's shared memory: Q, then K in buffers 0 and 1, then V in buffers 0 and 1.
template <int D>
struct ForwardSmem {
  static constexpr int tile = kTile * D * 2;
  static constexpr int bytes = 5 * tile;
  ZR_HOST_DEVICE static constexpr int K(int buf) { return tile * (1 + buf); }
  ZR_HOST_DEVICE static constexpr int V(int buf) { return tile * (3 + buf); }
};

template <int D, typename X>
ZR_TILE_PROGRAM void ForwardProgram(const X& x, unsigned char* smem, const typename X::Elem* qkv,
                                    typename X::Elem* out, float* lse, const Shape sh, int tile,
                                    int bh) {
  using E = typename X::Elem;
  using S = ForwardSmem<D>;
  const int b = bh / sh.heads, h = bh % sh.heads, q0 = tile * kTile, T = sh.seq;
  const math::QkvLayout L{sh.heads, sh.kv_heads, D};
  const int64_t ld = L.row();
  const E* base = qkv + static_cast<int64_t>(b) * T * ld;
  const E* qs = reinterpret_cast<const E*>(smem);
  const float c2 = math::Mul(sh.scale, 1.44269504088896340736f);  // scale x log2(e)

  Regs<X, float, D / 2> o;          // O_w accumulators
  Regs<X, float, 4> st;             // m (rows g, g + 8) in dot units; this lane's l parts
  Regs<X, float, kTile / 2> s;      // S, then P
  Regs<X, float, 2> tmax;           // the tile's row maxima
  Regs<X, uint32_t, kTile / 4> pf;  // P as A fragments
  Regs<X, uint32_t, 8> frag;        // fragments loaded by ldmatrix

  const int last = (q0 + kTile < T ? q0 + kTile : T) - 1;  // the tile's last query
  const int n_tiles = last / kTile + 1;                    // key tiles up to the diagonal
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem), base + int64_t{q0} * ld + L.q(h), ld, T - q0);
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::K(0)), base + L.k(h), ld, T);
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::V(0)), base + L.v(h), ld, T);
  x.CpAsyncCommit();
  x.ForWarps([&](int w) {
    x.ForLanes([&](int lane) {
      float* ow = o.at(w, lane);
      ZR_UNROLL
      for (int i = 0; i < D / 2; ++i) ow[i] = 0.0f;
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
      WarpScores<D>(x, w, s, frag, qs, r0, ks);
      x.ForLanes([&](int lane) {  // mask to what each row sees; the lane's maxima
        float* sw = s.at(w, lane);
        float* mx = tmax.at(w, lane);
        int seen[2];
        ZR_UNROLL
        for (int half = 0; half < 2; ++half) {
          const int q = q0 + r0 + lane / 4 + 8 * half;
          seen[half] = q < T ? math::CausalKeys(q, k0, kn) : 0;
          mx[half] = -INFINITY;
        }
        ForTileElems(lane, [&](int i, int half, int col) {
          if (col < seen[half]) {
            mx[half] = math::Max(mx[half], sw[i]);
          } else {
            sw[i] = -INFINITY;
          }
        });
      });
      x.QuadAllReduce(w, tmax, 0, [](float a, float c) { return math::Max(a, c); });
      x.QuadAllReduce(w, tmax, 1, [](float a, float c) { return math::Max(a, c); });
      x.ForLanes([&](int lane) {  // the running statistics, P, the rescaled accumulators
        float* sw = s.at(w, lane);
        float* stw = st.at(w, lane);
        float* ow = o.at(w, lane);
        const float* mx = tmax.at(w, lane);
        float base2[2];
        ZR_UNROLL
        for (int half = 0; half < 2; ++half) {
          const float m_new = math::Max(stw[half], mx[half]);
          base2[half] = m_new == -INFINITY ? 0.0f : math::Mul(m_new, c2);
          const float alpha = X::Exp2(math::Sub(math::Mul(stw[half], c2), base2[half]));
          stw[half] = m_new;
          stw[2 + half] = math::Mul(stw[2 + half], alpha);
          ZR_UNROLL
          for (int dt = 0; dt < D / 8; ++dt) {
            ow[dt * 4 + half * 2] = math::Mul(ow[dt * 4 + half * 2], alpha);
            ow[dt * 4 + half * 2 + 1] = math::Mul(ow[dt * 4 + half * 2 + 1], alpha);
          }
        }
        ForTileElems(lane, [&](int i, int half, int) {
          sw[i] = X::Exp2(math::Fma(sw[i], c2, -base2[half]));
          stw[2 + half] = math::Add(stw[2 + half], sw[i]);
        });
      });
      PackFrags(x, w, s, pf);
      WarpAccumulate<D>(x, w, o, pf, frag, vs);  // O += P V
    });
    x.SyncBlock();  // every warp is done with buffer `buf` before it is refilled
  }
  const int64_t ldo = int64_t{sh.heads} * D;
  x.ForWarps([&](int w) {
    x.QuadAllReduce(w, st, 2, [](float a, float c) { return math::Add(a, c); });
    x.QuadAllReduce(w, st, 3, [](float a, float c) { return math::Add(a, c); });
    x.ForLanes([&](int lane) {
      const float* stw = st.at(w, lane);
      const float* ow = o.at(w, lane);
      ZR_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int q = q0 + w * kWarpRows + lane / 4 + 8 * half;
        if (q >= T) continue;
        const float inv = math::Div(1.0f, stw[2 + half]);
        E* dst = out + (static_cast<int64_t>(b) * T + q) * ldo + int64_t{h} * D + 2 * (lane % 4);
        ZR_UNROLL
        for (int dt = 0; dt < D / 8; ++dt) {
          dst[dt * 8] = X::FromF(math::Mul(ow[dt * 4 + half * 2], inv));
          dst[dt * 8 + 1] = X::FromF(math::Mul(ow[dt * 4 + half * 2 + 1], inv));
        }
        if (lane % 4 == 0) {
          lse[(static_cast<int64_t>(b) * sh.heads + h) * T + q] =
              math::Add(math::Mul(stw[half], sh.scale), ::logf(stw[2 + half]));
        }
      }
    });
  });
}

}  // namespace zerort::flash
