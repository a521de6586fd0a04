// Flash attention's backward block programs ([Note: flash attention's block programs] in
// kernels/flash_tiles.h), their state in registers as the forward's (kernels/flash_forward.h).
//
// [Note: the backward's two programs]
// dQ (one block per query tile and (batch, query head)): first D = dout . out for its queries
// (each lane of a quad a quarter of the row, the quad's shuffles the sum) into `dvec`, and the
// queries' log-sum-exps; then per key tile up to the diagonal
//   S = Q_w K^T, dP = dO_w V^T      WarpScores
//   P = exp(S scale - lse), dS = P (dP - D) scale     RecomputedProb, ScoreGrad (flash_math.h)
//   dQ_w += dS K                    PackFrags, WarpAccumulate
// dK/dV (one block per key tile and (batch, key/value head)): its K and V rows stay in shared
// memory; per query head of the group and query tile from the diagonal on (one sequence of
// steps, each step's Q, dO and statistics copied in while the previous step is computed), in
// chunks of 64 queries (32 at head size 128, where 64 would not fit the registers)
//   S^T = K_w Q^T                   WarpScores; P^T from the queries' lse
//   dV_w += P^T dO                  PackFrags, WarpAccumulate
//   dP^T = V_w dO^T                 WarpScores; dS^T from the queries' D
//   dK_w += dS^T Q                  PackFrags, WarpAccumulate
// The dK/dV program runs after the dQ program (it reads dvec). Each writes only its own rows of
// dq, or of dk and dv (a dK/dV block sums its group's query heads itself), so no atomics, and the
// result does not depend on the order blocks run. Gradients are added to what dqkv holds.
#pragma once

#include <cmath>
#include <cstdint>

#include "zerort/kernels/flash_math.h"
#include "zerort/kernels/flash_tiles.h"

namespace zerort::flash {

// The backward's shared memory: the block's own two tiles, then the visited two in buffers 0 and
// 1 each, then (dK/dV) the visited queries' log-sum-exps and D, fp32 [64], in buffers 0 and 1.
template <int D>
struct BackwardSmem {
  static constexpr int tile = kTile * D * 2;
  static constexpr int stats = 6 * tile;
  static constexpr int bytes = stats + 4 * kTile * 4;
  ZR_HOST_DEVICE static constexpr int Own(int i) { return tile * i; }  // i: 0 or 1
  ZR_HOST_DEVICE static constexpr int Visited(int i, int buf) { return tile * (2 + 2 * i + buf); }
  ZR_HOST_DEVICE static constexpr int Lse(int buf) { return stats + buf * kTile * 4; }
  ZR_HOST_DEVICE static constexpr int Dvec(int buf) { return stats + (2 + buf) * kTile * 4; }
};

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
  const E* qs = reinterpret_cast<const E*>(smem + S::Own(0));
  const E* dos = reinterpret_cast<const E*>(smem + S::Own(1));

  Regs<X, float, kTile / 2> s, dp;  // S then dS; dP
  Regs<X, uint32_t, kTile / 4> pf;  // dS as A fragments
  Regs<X, uint32_t, 8> frag;
  Regs<X, float, D / 2> acc;  // dQ_w
  Regs<X, float, 4> st;       // lse (rows g, g + 8), then D (rows g, g + 8)

  const int last = (q0 + kTile < T ? q0 + kTile : T) - 1;
  const int n_tiles = last / kTile + 1;
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Own(0)), qkv + (row0 + q0) * ld + L.q(h), ld,
                   T - q0);
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Own(1)), dout + (row0 + q0) * ldo + h * D, ldo,
                   T - q0);
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Visited(0, 0)), qkv + row0 * ld + L.k(h), ld,
                   T);
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Visited(1, 0)), qkv + row0 * ld + L.v(h), ld,
                   T);
  x.CpAsyncCommit();
  x.ForWarps([&](int w) {  // D = dout . out (a quarter of the row a lane), the lse, zero dQ
    x.ForLanes([&](int lane) {
      float* sw = st.at(w, lane);
      ZR_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int q = q0 + w * kWarpRows + lane / 4 + 8 * half;
        float sum = 0.0f;
        if (q < T) {
          const E* d_row = dout + (row0 + q) * ldo + int64_t{h} * D;
          const E* o_row = out + (row0 + q) * ldo + int64_t{h} * D;
          for (int c = (lane % 4) * (D / 4); c < (lane % 4 + 1) * (D / 4); ++c) {
            sum = math::Add(sum, math::Mul(X::ToF(d_row[c]), X::ToF(o_row[c])));
          }
        }
        sw[half] = q < T ? lse[stat0 + q] : 0.0f;
        sw[2 + half] = sum;
      }
      float* aw = acc.at(w, lane);
      ZR_UNROLL
      for (int i = 0; i < D / 2; ++i) aw[i] = 0.0f;
    });
    x.QuadAllReduce(w, st, 2, [](float a, float c) { return math::Add(a, c); });
    x.QuadAllReduce(w, st, 3, [](float a, float c) { return math::Add(a, c); });
    x.ForLanes([&](int lane) {
      if (lane % 4 != 0) return;
      ZR_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int q = q0 + w * kWarpRows + lane / 4 + 8 * half;
        if (q < T) dvec[stat0 + q] = st.at(w, lane)[2 + half];
      }
    });
  });
  for (int j = 0; j < n_tiles; ++j) {
    const int k0 = j * kTile, kn = T - k0 < kTile ? T - k0 : kTile, buf = j % 2;
    if (j + 1 < n_tiles) {
      const int64_t next = (row0 + k0 + kTile) * ld;
      LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Visited(0, 1 - buf)), qkv + next + L.k(h),
                       ld, T - k0 - kTile);
      LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Visited(1, 1 - buf)), qkv + next + L.v(h),
                       ld, T - k0 - kTile);
      x.CpAsyncCommit();
      x.CpAsyncWait(1);
    } else {
      x.CpAsyncWait(0);
    }
    x.SyncBlock();
    const E* ks = reinterpret_cast<const E*>(smem + S::Visited(0, buf));
    const E* vs = reinterpret_cast<const E*>(smem + S::Visited(1, buf));
    x.ForWarps([&](int w) {
      const int r0 = w * kWarpRows;
      WarpScores<D>(x, w, s, frag, qs, r0, ks);
      WarpScores<D>(x, w, dp, frag, dos, r0, vs);
      x.ForLanes([&](int lane) {
        float* sw = s.at(w, lane);
        const float* dw = dp.at(w, lane);
        const float* stw = st.at(w, lane);
        int seen[2];
        ZR_UNROLL
        for (int half = 0; half < 2; ++half) {
          const int q = q0 + r0 + lane / 4 + 8 * half;
          seen[half] = q < T ? math::CausalKeys(q, k0, kn) : 0;
        }
        ForTileElems(lane, [&](int i, int half, int col) {
          if (col < seen[half]) {
            const float p = math::RecomputedProb(sw[i], sh.scale, stw[half]);
            sw[i] = math::ScoreGrad(p, dw[i], stw[2 + half], sh.scale);
          } else {
            sw[i] = 0.0f;
          }
        });
      });
      PackFrags(x, w, s, pf);
      WarpAccumulate<D>(x, w, acc, pf, frag, ks);  // dQ_w += dS K
    });
    x.SyncBlock();
  }
  x.ForWarps([&](int w) {
    const int r0 = w * kWarpRows;
    AddRows<D>(x, w, dqkv + (row0 + q0 + r0) * ld + L.q(h), ld, acc, T - q0 - r0);
  });
}

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
  const int first_h = g * group;  // the query heads reading key/value head g
  const E* ks = reinterpret_cast<const E*>(smem + S::Own(0));
  const E* vs = reinterpret_cast<const E*>(smem + S::Own(1));

  // The queries of a step in chunks of kCols: at head size 128 the accumulators dK_w and dV_w
  // take 128 registers a thread, and 64-wide S^T and dP^T would spill.
  constexpr int kCols = D == 128 ? 32 : 64;
  Regs<X, float, kCols / 2> s, dp;  // S^T then P^T then dS^T; dP^T
  Regs<X, uint32_t, kCols / 4> pf;  // P^T, then dS^T, as A fragments
  Regs<X, uint32_t, 8> frag;
  Regs<X, float, D / 2> dk, dv;

  // Step i: query head first_h + i / per_head, query tile tile + i % per_head.
  const int per_head = sh.tiles() - tile, steps = group * per_head;
  auto issue = [&](int i, int buf) {  // step i's Q and dO (copies) and statistics (loads)
    const int h = first_h + i / per_head, q0 = (tile + i % per_head) * kTile;
    const int64_t stat0 = (int64_t{b} * sh.heads + h) * T;
    LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Visited(0, buf)),
                     qkv + (row0 + q0) * ld + L.q(h), ld, T - q0);
    LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Visited(1, buf)),
                     dout + (row0 + q0) * ldo + int64_t{h} * D, ldo, T - q0);
    float* lse_s = reinterpret_cast<float*>(smem + S::Lse(buf));
    float* d_s = reinterpret_cast<float*>(smem + S::Dvec(buf));
    x.ForThreads([&](int t) {
      if (t < kTile) {
        lse_s[t] = q0 + t < T ? lse[stat0 + q0 + t] : 0.0f;
        d_s[t] = q0 + t < T ? dvec[stat0 + q0 + t] : 0.0f;
      }
    });
  };
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Own(0)), qkv + (row0 + k0) * ld + L.k(first_h),
                   ld, T - k0);
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Own(1)), qkv + (row0 + k0) * ld + L.v(first_h),
                   ld, T - k0);
  issue(0, 0);
  x.CpAsyncCommit();
  x.ForWarps([&](int w) {
    x.ForLanes([&](int lane) {
      float* kw = dk.at(w, lane);
      float* vw = dv.at(w, lane);
      ZR_UNROLL
      for (int i = 0; i < D / 2; ++i) kw[i] = vw[i] = 0.0f;
    });
  });
  for (int i = 0; i < steps; ++i) {
    const int q0 = (tile + i % per_head) * kTile, qn = T - q0 < kTile ? T - q0 : kTile;
    const int buf = i % 2;
    if (i + 1 < steps) {
      issue(i + 1, 1 - buf);
      x.CpAsyncCommit();
      x.CpAsyncWait(1);
    } else {
      x.CpAsyncWait(0);
    }
    x.SyncBlock();
    const E* qs = reinterpret_cast<const E*>(smem + S::Visited(0, buf));
    const E* dos = reinterpret_cast<const E*>(smem + S::Visited(1, buf));
    const float* lse_s = reinterpret_cast<const float*>(smem + S::Lse(buf));
    const float* d_s = reinterpret_cast<const float*>(smem + S::Dvec(buf));
    x.ForWarps([&](int w) {
      const int r0 = w * kWarpRows;  // this warp's keys: k0 + r0 + row; columns are queries
      for (int c0 = 0; c0 < kTile; c0 += kCols) {  // not unrolled: fewer live addresses
        auto visible = [&](int lane, int half, int col) {
          const int k = k0 + r0 + lane / 4 + 8 * half;
          return k < T && c0 + col < qn && q0 + c0 + col >= k;
        };
        WarpScores<D, kCols>(x, w, s, frag, ks, r0, qs, c0);  // S^T
        x.ForLanes([&](int lane) {
          float* sw = s.at(w, lane);
          ForTileElems<kCols>(lane, [&](int e, int half, int col) {
            sw[e] = visible(lane, half, col)
                        ? math::RecomputedProb(sw[e], sh.scale, lse_s[c0 + col])
                        : 0.0f;
          });
        });
        PackFrags<kCols>(x, w, s, pf);
        WarpAccumulate<D, kCols>(x, w, dv, pf, frag, dos, c0);  // dV_w += P^T dO
        WarpScores<D, kCols>(x, w, dp, frag, vs, r0, dos, c0);  // dP^T
        x.ForLanes([&](int lane) {
          float* sw = s.at(w, lane);
          const float* dw = dp.at(w, lane);
          ForTileElems<kCols>(lane, [&](int e, int half, int col) {
            sw[e] = visible(lane, half, col)
                        ? math::ScoreGrad(sw[e], dw[e], d_s[c0 + col], sh.scale)
                        : 0.0f;
          });
        });
        PackFrags<kCols>(x, w, s, pf);
        WarpAccumulate<D, kCols>(x, w, dk, pf, frag, qs, c0);  // dK_w += dS^T Q
      }
    });
    x.SyncBlock();
  }
  x.ForWarps([&](int w) {
    const int r0 = w * kWarpRows;
    E* rows = dqkv + (row0 + k0 + r0) * ld;
    AddRows<D>(x, w, rows + L.k(first_h), ld, dk, T - k0 - r0);
    AddRows<D>(x, w, rows + L.v(first_h), ld, dv, T - k0 - r0);
  });
}

}  // namespace zerort::flash
