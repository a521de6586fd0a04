// Flash attention's forward block program ([Note: flash attention's block programs] in
// kernels/flash_tiles.h): its scores, probabilities and output accumulators stay in registers.
//
// [Note: the register-resident forward]
// A block of W warps takes 16 W G queries of one (batch, query head): G = 1 row group of 16
// queries a warp, 4 warps (64 a block) by default. 128 queries a block (FlashAttention-2's
// shape) halve the K and V tiles copied into shared memory per query: at head size 64 as G = 2,
// each warp's two groups sharing every K and V fragment it loads from shared memory (half the
// ldmatrix traffic per tensor-core product too), for 255 registers a thread against 138-144
// (sm_90; two blocks an SM instead of three); at head size 128, where two groups' accumulators
// would not fit in 255 registers, as W = 8 warps of one group (each warp's registers and
// products as the default's; one block of 8 warps an SM, as two of 4 were). Which is faster is
// the GPU's to say; at head size 64 one group on 8 warps is a third form (half the copies, two
// blocks of 8 warps an SM by registers where G = 2 has two of 4). `bench attention --device
// cuda` times them (`flash 128q`, and at 64 `flash 128q 8w`), a run chooses with
// model.flash_attention.forward_block_queries and forward_warps (ForwardBlockFor), and the
// default changes when a GPU has said.
// Whichever it takes, the outputs and log-sum-exps are bit for bit the default's: a row group's
// queries meet the same key tiles through the same instructions in the same order (the CPU
// executor's tests and flash_attention_cuda_test compare them).
// Warp w owns queries 16 G w .. 16 G (w + 1) - 1; a warp whose last query comes before a key
// tile skips it (causal: every score masked). Per 64-key tile, for each row group:
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
// Copies: Q (the block's 16 W G rows) with the first K/V tile as one group, then each next K/V
// tile as a group while the current one is computed ([Note: one barrier a forward step]).
//
// [Note: one barrier a forward step]
// A step waits for its own tile's copies, then meets the block's barrier, then issues the next
// tile's copies into the other buffer and computes. Past that barrier every thread's copies of
// the step's tile have landed and every warp has left the step before, the only one that read
// the other buffer, so the copies may overwrite it and no second barrier is needed. Until
// 2026-12-02 the copies were issued before the barrier, into a buffer a slower warp could still
// be reading, and a barrier at each step's end kept it from being refilled: two barriers a step
// where one does, the next tile in flight during the same computation.
#pragma once

#include <cmath>
#include <cstdint>

#include "zerort/kernels/flash_math.h"
#include "zerort/kernels/flash_tiles.h"

namespace zerort::flash {

// The forward's block for model.flash_attention's forward_block_queries and forward_warps (each
// 0 for its default) at head size `head_size`: row groups a warp and warps, or {0, 0} where no
// such block is built. 64 queries: 4 warps of one group (the default); 128: two groups on 4
// warps (head size 64, the default there) or one on 8 (the only form at head size 128).
struct ForwardBlock {
  int groups = 0, warps = 0;
};
ZR_HOST_DEVICE constexpr ForwardBlock ForwardBlockFor(int head_size, int queries, int warps) {
  if (queries == 0) queries = warps == 8 ? 128 : 64;
  if (warps == 0) warps = queries == 128 && head_size == 128 ? 8 : 4;
  if (queries == 64 && warps == 4) return {1, 4};
  if (queries == 128 && warps == 4 && head_size == 64) return {2, 4};
  if (queries == 128 && warps == 8) return {1, 8};
  return {};
}
// The default block: row groups of 16 queries a warp and warps (ForwardBlockFor's, so that the
// launch, the CPU executor's runs and CheckFlashTiles agree on it); a forward block of W warps
// owns 16 W G queries ([Note: the register-resident forward]).
template <int D>
inline constexpr int kForwardGroups = ForwardBlockFor(D, 0, 0).groups;
template <int D>
inline constexpr int kForwardWarps = ForwardBlockFor(D, 0, 0).warps;
template <int G, int W>
inline constexpr int kForwardQueries = kWarpRows* W* G;
// The forward's grid: query blocks per (batch, head).
template <int D, int G = kForwardGroups<D>, int W = kForwardWarps<D>>
ZR_HOST_DEVICE constexpr int ForwardTiles(const Shape& sh) {
  return (sh.seq + kForwardQueries<G, W> - 1) / kForwardQueries<G, W>;
}

// The forward's shared memory: Q (the block's queries), then K in buffers 0 and 1, then V in
// buffers 0 and 1 (64 keys each).
template <int D, int G = kForwardGroups<D>, int W = kForwardWarps<D>>
struct ForwardSmem {
  static constexpr int tile = kTile * D * 2;
  static constexpr int q = kForwardQueries<G, W> * D * 2;
  static constexpr int bytes = q + 4 * tile;
  ZR_HOST_DEVICE static constexpr int K(int buf) { return q + tile * buf; }
  ZR_HOST_DEVICE static constexpr int V(int buf) { return q + tile * (2 + buf); }
};

template <int D, int G = kForwardGroups<D>, typename X>
ZR_TILE_PROGRAM void ForwardProgram(const X& x, unsigned char* smem, const typename X::Elem* qkv,
                                    typename X::Elem* out, float* lse, const Shape sh, int tile,
                                    int bh) {
  static_assert((G == 1 && (X::kWarps == 4 || X::kWarps == 8)) || (G == 2 && X::kWarps == 4),
                "ForwardProgram: 4 warps of one or two row groups, or 8 of one");
  using E = typename X::Elem;
  using S = ForwardSmem<D, G, X::kWarps>;
  constexpr int kRows = kForwardQueries<G, X::kWarps>;
  const int b = bh / sh.heads, h = bh % sh.heads, q0 = tile * kRows, T = sh.seq;
  const math::QkvLayout L{sh.heads, sh.kv_heads, D};
  const int64_t ld = L.row();
  const E* base = qkv + static_cast<int64_t>(b) * T * ld;
  const E* qs = reinterpret_cast<const E*>(smem);
  const float c2 = math::Base2(sh.scale);  // scale x log2(e)

  Regs<X, float, G * D / 2> o;          // O_w accumulators, group g's at g D / 2
  Regs<X, float, 4 * G> st;             // per group: m (rows g, g + 8) in dot units; l parts
  Regs<X, float, G * kTile / 2> s;      // S, then P
  Regs<X, float, 2 * G> tmax;           // the tile's row maxima
  Regs<X, uint32_t, G * kTile / 4> pf;  // P as A fragments
  Regs<X, uint32_t, 4 * G + 4> frag;    // fragments loaded by ldmatrix

  const int last = (q0 + kRows < T ? q0 + kRows : T) - 1;  // the block's last query
  const int n_tiles = last / kTile + 1;                    // key tiles up to the diagonal
  // The block's queries (rows past the end load zeros), then the first K and V tiles.
  LoadTileAsync<D, kRows>(x, reinterpret_cast<E*>(smem), base + int64_t{q0} * ld + L.q(h), ld,
                          T - q0);
  LoadTileAsync<D, kTile>(x, reinterpret_cast<E*>(smem + S::K(0)), base + L.k(h), ld, T);
  LoadTileAsync<D, kTile>(x, reinterpret_cast<E*>(smem + S::V(0)), base + L.v(h), ld, T);
  x.CpAsyncCommit();
  x.ForWarps([&](int w) {
    x.ForLanes([&](int lane) {
      float* ow = o.at(w, lane);
      ZR_UNROLL
      for (int i = 0; i < G * D / 2; ++i) ow[i] = 0.0f;
      float* sw = st.at(w, lane);
      ZR_UNROLL
      for (int g = 0; g < G; ++g) {
        sw[4 * g] = sw[4 * g + 1] = -INFINITY;
        sw[4 * g + 2] = sw[4 * g + 3] = 0.0f;
      }
    });
  });
  for (int j = 0; j < n_tiles; ++j) {
    const int k0 = j * kTile, kn = T - k0 < kTile ? T - k0 : kTile, buf = j % 2;
    x.CpAsyncWait(0);  // [Note: one barrier a forward step]
    x.SyncBlock();     // tile j (and Q) arrived for every thread; every warp left tile j - 1
    if (j + 1 < n_tiles) {
      const int64_t next = int64_t{k0 + kTile} * ld;
      LoadTileAsync<D, kTile>(x, reinterpret_cast<E*>(smem + S::K(1 - buf)), base + next + L.k(h),
                              ld, T - k0 - kTile);
      LoadTileAsync<D, kTile>(x, reinterpret_cast<E*>(smem + S::V(1 - buf)), base + next + L.v(h),
                              ld, T - k0 - kTile);
      x.CpAsyncCommit();
    }
    const E* ks = reinterpret_cast<const E*>(smem + S::K(buf));
    const E* vs = reinterpret_cast<const E*>(smem + S::V(buf));
    x.ForWarps([&](int w) {
      const int r0 = w * G * kWarpRows;
      if (q0 + r0 + G * kWarpRows - 1 < k0) return;  // every query before every key: masked
      WarpScores<D, kTile, G>(x, w, s, frag, qs, r0, ks);
      // The mask to what each row sees (its scores -inf), then the lane's maxima. Only a tile on
      // the warp's diagonal, or with keys or queries past the end, needs the mask (as in the
      // backward: [Note: the backward's whole chunks], kernels/flash_backward.h). The mask
      // rewrites the scores in place before one maxima loop that both cases share: with the
      // maxima in two forms (masked, whole), sm_90 SASS moved all 32 of a lane's scores between
      // registers where the forms met: 32 instructions a whole tile.
      if (!math::WholeBlock(q0 + r0, G * kWarpRows, k0, kTile, T)) {
        x.ForLanes([&](int lane) {
          float* sw = s.at(w, lane);
          ZR_UNROLL
          for (int g = 0; g < G; ++g) {
            int seen[2];
            ZR_UNROLL
            for (int half = 0; half < 2; ++half) {
              const int q = q0 + r0 + g * kWarpRows + lane / 4 + 8 * half;
              seen[half] = q < T ? math::CausalKeys(q, k0, kn) : 0;
            }
            float* sg = sw + g * kTile / 2;
            ForTileElems(lane, [&](int i, int half, int col) {
              if (col >= seen[half]) sg[i] = -INFINITY;
            });
          }
        });
      }
      x.ForLanes([&](int lane) {
        const float* sw = s.at(w, lane);
        float* mx = tmax.at(w, lane);
        ZR_UNROLL
        for (int g = 0; g < G; ++g) {
          mx[2 * g] = mx[2 * g + 1] = -INFINITY;
          ForTileElems(lane, [&](int i, int half, int) {
            mx[2 * g + half] = math::MaxNum(mx[2 * g + half], sw[g * kTile / 2 + i]);
          });
        }
      });
      ZR_UNROLL
      for (int i = 0; i < 2 * G; ++i) {
        x.QuadAllReduce(w, tmax, i, [](float a, float c) { return math::MaxNum(a, c); });
      }
      x.ForLanes([&](int lane) {  // the running statistics, P, the rescaled accumulators
        const float* mx = tmax.at(w, lane);
        ZR_UNROLL
        for (int g = 0; g < G; ++g) {
          float* sw = s.at(w, lane) + g * kTile / 2;
          float* stw = st.at(w, lane) + 4 * g;
          float* ow = o.at(w, lane) + g * D / 2;
          float base2[2];
          ZR_UNROLL
          for (int half = 0; half < 2; ++half) {
            const float m_new = math::MaxNum(stw[half], mx[2 * g + half]);
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
        }
      });
      PackFrags<kTile, G>(x, w, s, pf);
      WarpAccumulate<D, kTile, D, G, 4 * G + 4>(x, w, o, pf, frag, vs);  // O += P V
    });
  }
  const int64_t ldo = int64_t{sh.heads} * D;
  x.ForWarps([&](int w) {
    ZR_UNROLL
    for (int g = 0; g < G; ++g) {
      x.QuadAllReduce(w, st, 4 * g + 2, [](float a, float c) { return math::Add(a, c); });
      x.QuadAllReduce(w, st, 4 * g + 3, [](float a, float c) { return math::Add(a, c); });
    }
    x.ForLanes([&](int lane) {
      ZR_UNROLL
      for (int g = 0; g < G; ++g) {
        const float* stw = st.at(w, lane) + 4 * g;
        const float* ow = o.at(w, lane) + g * D / 2;
        ZR_UNROLL
        for (int half = 0; half < 2; ++half) {
          const int q = q0 + (w * G + g) * kWarpRows + lane / 4 + 8 * half;
          if (q >= T) continue;
          const float inv = math::Div(1.0f, stw[2 + half]);
          E* dst = out + (static_cast<int64_t>(b) * T + q) * ldo + int64_t{h} * D + 2 * (lane % 4);
          ZR_UNROLL
          for (int dt = 0; dt < D / 8; ++dt) {  // a packed pair a 32-bit store
            x.Store32(dst + dt * 8, X::Pack(math::Mul(ow[dt * 4 + half * 2], inv),
                                            math::Mul(ow[dt * 4 + half * 2 + 1], inv)));
          }
          if (lane % 4 == 0) {
            lse[(static_cast<int64_t>(b) * sh.heads + h) * T + q] =
                math::Add(math::Mul(stw[half], sh.scale), ::logf(stw[2 + half]));
          }
        }
      }
    });
  });
}

}  // namespace zerort::flash
