// Flash attention's backward block programs ([Note: flash attention's block programs] in
// kernels/flash_tiles.h), their state in registers as the forward's (kernels/flash_forward.h).
//
// [Note: the backward's programs]
// Three programs, in FlashAttention-2's order; the fp32 workspace holds D ([batch, heads, seq])
// and the dQ accumulator `dq` ([batch, seq, heads x D], out's layout).
// 1. Dot (one block per query tile and (batch, query head)): D = dout . out for its queries
//    (each lane of a quad a quarter of the row, the quad's shuffles the sum) into `dvec`, and
//    the block's rows of `dq` set to zero.
// 2. The main program (one block per key tile and (batch, key/value head)): its K and V rows
//    stay in shared memory; per query head of the group and query tile from the diagonal on (one
//    sequence of steps, each step's Q, dO and statistics copied in while the previous step is
//    computed, the statistics read a step earlier still: [Note: the statistics a step ahead]), in
//    chunks of kBackwardChunk queries (64, or 32 at head size 128, where 64
//    would not fit the registers); a block owns 16 keys a warp (kBackwardWarps: 64 keys with 4
//    warps, or 128 with 8), and a step is as many queries
//      S^T = K_w Q^T                   WarpScores; P^T = 2^(S^T c - lse c'), c = scale log2(e),
//                                      c' = log2(e): one fma and one exp2 a score, as in the
//                                      forward (math::ProbExponent2; the mask only where a
//                                      chunk is not whole: [Note: the backward's whole chunks])
//      dV_w += P^T dO                  PackFrags, WarpAccumulate
//      dP^T = V_w dO^T                 WarpScores; dS^T from the queries' D
//      dK_w += dS^T Q                  PackFrags, WarpAccumulate
//    and dS^T, rounded as the products take it, into shared memory; then, the step's whole dS^T
//    there, each warp takes 16 of the step's queries
//      dQ_w = dS K                     A fragments by ldmatrix.trans of dS^T, WarpAccumulate
//    (64 columns at a time) and adds it into `dq` by fp32 atomics, a lane's two adjacent
//    columns in one (`AtomicAdd2`: sm_90's 8-byte vector atomic, two elsewhere): a query's key
//    tiles add in any order, so on a GPU dQ's last bits vary from run to run, as
//    FlashAttention-2's do. dS^T goes to shared memory as the packed pairs dK's product took,
//    32 bits a store.
// 3. StoreDq (Dot's blocks): dqkv's Q rows = dq, rounded once.
// dqkv is written, not added to (ModelKernels::AttentionBackward): no fill before, no read.
// S, P, dP and dS are computed once per pair of tiles: 5 tile products, where the two programs
// before 2026-11-30 (a dQ program and a dK/dV program, each recomputing them) took 7. dK and dV
// are written by their key tile's block alone (it sums its group's query heads itself).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "zerort/kernels/flash_math.h"
#include "zerort/kernels/flash_tiles.h"

namespace zerort::flash {

// The main program's shared memory: the block's own two tiles (K, V), then the visited two (Q,
// dO) in buffers 0 and 1 each, then the visited queries' log-sum-exps and D, fp32 [kTile] each,
// buffer 0's two then buffer 1's (so thread t of the block's 2 kTile stores its one statistic at
// Lse(buf) + t: [Note: the statistics a step ahead]), then the step's dS^T, a swizzled [kTile
// keys][kTile queries] tile. kTile: the program's tile (64, or 128 with 8 warps).
template <int D, int kTile = flash::kTile>
struct BackwardSmem {
  static constexpr int tile = kTile * D * 2;
  static constexpr int stats = 6 * tile;
  static constexpr int ds = stats + 4 * kTile * 4;
  static constexpr int bytes = ds + kTile * kTile * 2;
  ZR_HOST_DEVICE static constexpr int Own(int i) { return tile * i; }  // i: 0 or 1
  ZR_HOST_DEVICE static constexpr int Visited(int i, int buf) { return tile * (2 + 2 * i + buf); }
  ZR_HOST_DEVICE static constexpr int Lse(int buf) { return stats + buf * 2 * kTile * 4; }
  ZR_HOST_DEVICE static constexpr int Dvec(int buf) { return Lse(buf) + kTile * 4; }
  ZR_HOST_DEVICE static constexpr int DsT() { return ds; }
};

// Program 1: D = dout . out for a query tile of (batch, query head) `bh`, and its rows of dq
// zeroed.
template <int D, typename X>
ZR_TILE_PROGRAM void BackwardDotProgram(const X& x, const typename X::Elem* dout,
                                        const typename X::Elem* out, float* dvec, float* dq,
                                        const Shape sh, int tile, int bh) {
  using E = typename X::Elem;
  const int b = bh / sh.heads, h = bh % sh.heads, q0 = tile * kTile, T = sh.seq;
  const int64_t ldo = int64_t{sh.heads} * D;
  const int64_t row0 = static_cast<int64_t>(b) * T, stat0 = (int64_t{b} * sh.heads + h) * T;
  Regs<X, float, 2> st;    // D of rows g and g + 8
  x.ForWarps([&](int w) {  // a quarter of the row a lane, then the quad's sum
    x.ForLanes([&](int lane) {
      float* sw = st.at(w, lane);
      ZR_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int q = q0 + w * kWarpRows + lane / 4 + 8 * half;
        float sum = 0.0f;
        if (q < T) {  // the lane's quarter in 16-byte loads, its elements in order
          const E* d_row = dout + (row0 + q) * ldo + int64_t{h} * D + (lane % 4) * (D / 4);
          const E* o_row = out + (row0 + q) * ldo + int64_t{h} * D + (lane % 4) * (D / 4);
          ZR_UNROLL
          for (int c = 0; c < D / 4; c += Vec16<E>::kCount) {
            const Vec16<E> dv = x.LoadGlobal16(d_row + c), ov = x.LoadGlobal16(o_row + c);
            ZR_UNROLL
            for (int e = 0; e < Vec16<E>::kCount; ++e) {
              sum = math::Add(sum, math::Mul(X::ToF(dv.v[e]), X::ToF(ov.v[e])));
            }
          }
        }
        sw[half] = sum;
      }
    });
    x.QuadAllReduce(w, st, 0, [](float a, float c) { return math::Add(a, c); });
    x.QuadAllReduce(w, st, 1, [](float a, float c) { return math::Add(a, c); });
    x.ForLanes([&](int lane) {
      if (lane % 4 != 0) return;
      ZR_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int q = q0 + w * kWarpRows + lane / 4 + 8 * half;
        if (q < T) dvec[stat0 + q] = st.at(w, lane)[half];
      }
    });
  });
  x.ForThreads([&](int t) {  // 4 floats a store
    constexpr int kVec = Vec16<float>::kCount;
    static_assert(kTile * D % (kVec * kThreads) == 0, "BackwardDotProgram: whole passes");
    ZR_UNROLL
    for (int i = 0; i < kTile * D / (kVec * kThreads); ++i) {
      const int c = kVec * (t + i * kThreads), r = c / D;
      if (q0 + r < T) {
        x.StoreGlobal16(dq + (row0 + q0 + r) * ldo + int64_t{h} * D + c % D, Vec16<float>{});
      }
    }
  });
}

// Program 3: a query tile of (batch, query head) `bh`: dqkv's Q rows = dq.
template <int D, typename X>
ZR_TILE_PROGRAM void BackwardStoreDqProgram(const X& x, typename X::Elem* dqkv, const float* dq,
                                            const Shape sh, int tile, int bh) {
  const int b = bh / sh.heads, h = bh % sh.heads, q0 = tile * kTile, T = sh.seq;
  const math::QkvLayout L{sh.heads, sh.kv_heads, D};
  const int64_t ld = L.row(), ldo = int64_t{sh.heads} * D;
  const int64_t row0 = static_cast<int64_t>(b) * T;
  x.ForThreads([&](int t) {  // 8 elements a thread at a time: two 16-byte loads, one store
    constexpr int kVec = Vec16<uint32_t>::kCount * 2;
    static_assert(kTile * D % (kVec * kThreads) == 0, "BackwardStoreDqProgram: whole passes");
    ZR_UNROLL
    for (int i = 0; i < kTile * D / (kVec * kThreads); ++i) {
      const int c = kVec * (t + i * kThreads), r = c / D, col = c % D;
      if (q0 + r >= T) continue;
      const float* from = dq + (row0 + q0 + r) * ldo + int64_t{h} * D + col;
      const Vec16<float> lo = x.LoadGlobal16(from), hi = x.LoadGlobal16(from + 4);
      Vec16<uint32_t> pairs;
      ZR_UNROLL
      for (int p = 0; p < 2; ++p) {
        pairs.v[p] = X::Pack(lo.v[2 * p], lo.v[2 * p + 1]);
        pairs.v[2 + p] = X::Pack(hi.v[2 * p], hi.v[2 * p + 1]);
      }
      x.StoreGlobal16(reinterpret_cast<uint32_t*>(dqkv + (row0 + q0 + r) * ld + L.q(h) + col),
                      pairs);
    }
  });
}

// The main program's query chunk: the queries a warp's S^T and dP^T take at a time. At head
// size 128 the accumulators dK_w and dV_w take 128 registers a thread, and 64-wide S^T and dP^T
// would spill. At head size 64 both fit, and 32 is the other choice there: S^T, dP^T and their
// fragments take fewer registers (sm_90 ptxas: 180-183 a thread against 249-253), so the CUDA
// kernel bounds it to 168 and three blocks (12 warps) share an SM where 64's take two (8 warps),
// at 36-56 bytes spilled. `bench attention --device cuda` times it beside the default (`flash
// bwd c32`), a run chooses with model.flash_attention.backward_query_chunk; the default changes
// when a GPU has said which is faster.
template <int D>
inline constexpr int kBackwardChunk = D == 128 ? 32 : 64;

// The main program's warps: a block owns 16 keys a warp and takes as many queries a step
// (kTileOf). 4 (64 keys) is the default; at head size 64, 8 (128 keys: FlashAttention-2's
// backward block there) halves the Q and dO tile loads and the dQ atomics per FLOP, at one block
// of 8 warps an SM (130 KiB of shared memory; sm_90 ptxas 245-247 registers with 64-query chunks,
// 200-207 with 32, no spill). `bench attention --device cuda` times it (`flash bwd 128k`, and
// with 32-query chunks `bwd 128k c32`), a run chooses with
// model.flash_attention.backward_block_keys; the default changes when a GPU has said which is
// faster.
template <int D>
inline constexpr int kBackwardWarps = 4;
// The main program's keys a block for model.flash_attention.backward_block_keys (0: the
// default's): what the launch builds and what FlashSharedBytesOf sizes.
template <int D>
ZR_HOST_DEVICE constexpr int BackwardBlockKeys(int block_keys) {
  return block_keys == 0 ? kWarpRows * kBackwardWarps<D> : block_keys;
}

// Program 2: a key tile of (batch, key/value head) `bkv`: dK and dV written into dqkv, dQ's part
// into dq. C: the query chunk (kBackwardChunk).
template <int D, int C = kBackwardChunk<D>, typename X>
ZR_TILE_PROGRAM void BackwardProgram(const X& x, unsigned char* smem, typename X::Elem* dqkv,
                                     float* dq, const typename X::Elem* dout,
                                     const typename X::Elem* qkv, const float* lse,
                                     const float* dvec, const Shape sh, int tile, int bkv) {
  using E = typename X::Elem;
  // The block's keys, and the queries of a step: 16 a warp (64 with 4 warps, 128 with 8).
  constexpr int kTile = kTileOf<X>;
  using S = BackwardSmem<D, kTile>;
  const int b = bkv / sh.kv_heads, g = bkv % sh.kv_heads, k0 = tile * kTile, T = sh.seq;
  const math::QkvLayout L{sh.heads, sh.kv_heads, D};
  const int group = L.group();
  const int64_t ld = L.row(), ldo = int64_t{sh.heads} * D;
  const int64_t row0 = static_cast<int64_t>(b) * T;
  const int first_h = g * group;  // the query heads reading key/value head g
  const float c2 = math::Base2(sh.scale);
  const E* ks = reinterpret_cast<const E*>(smem + S::Own(0));
  const E* vs = reinterpret_cast<const E*>(smem + S::Own(1));
  E* dst = reinterpret_cast<E*>(smem + S::DsT());

  // The queries of a step in chunks of C (kBackwardChunk); dQ_w 64 of its columns at a time.
  static_assert(C == 32 || C == 64, "BackwardProgram: a query chunk of 32 or 64");
  constexpr int kCols = C;
  constexpr int kDqCols = 64;
  Regs<X, float, kCols / 2> s, dp;  // S^T then P^T then dS^T; dP^T
  Regs<X, uint32_t, kCols / 4> pf;  // P^T, then dS^T, as A fragments
  Regs<X, uint32_t, kTile / 4> qf;  // dS (queries x the tile's keys) as A fragments
  Regs<X, uint32_t, 8> frag;
  Regs<X, float, D / 2> dk, dv;
  Regs<X, float, kDqCols / 2> dqa;

  // Step i: query head first_h + i / per_head, query tile tile + i % per_head, counted as the
  // steps go (a division by per_head was about 20 instructions of sm_90 SASS, twice a step).
  const int per_head = sh.tiles(kTile) - tile, steps = group * per_head;
  struct Step {
    int head, q_tile;
  };
  auto after = [&](Step st) {
    return st.q_tile + 1 == tile + per_head ? Step{st.head + 1, tile}
                                            : Step{st.head, st.q_tile + 1};
  };
  auto issue = [&](Step st, int buf) {  // a step's Q and dO (copies)
    const int q0 = st.q_tile * kTile;
    LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Visited(0, buf)),
                     qkv + (row0 + q0) * ld + L.q(st.head), ld, T - q0);
    LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Visited(1, buf)),
                     dout + (row0 + q0) * ldo + int64_t{st.head} * D, ldo, T - q0);
  };
  // [Note: the statistics a step ahead]
  // A step's statistics (each query's log-sum-exp in base 2 for math::ProbExponent2, and D scale
  // for math::ScoreGradScaled) are read from global memory into registers two steps before the
  // step and stored into its shared buffer one step before it, with its copies, converted (base
  // 2, times scale) only as they are stored: computed as they are read, the conversion would wait
  // for the loads. Read and stored together, the store waited for the read (a global load's
  // latency, hundreds of cycles) right before the barrier that starts the step, so every warp of
  // the block waited for it, every step. Each of the block's 2 kTile threads holds one: thread t
  // query t's log-sum-exp, thread kTile + t its D, so every warp does the same work (threads 0 ..
  // kTile - 1 read and stored both before 2026-12-02, about 30 instructions a step more for half
  // of the warps, which the others then waited for at the barrier).
  static_assert(32 * X::kWarps == 2 * kTile, "BackwardProgram: a statistic a thread");
  Regs<X, float, 1> stat;
  auto read_stats = [&](Step st) {
    const int q0 = st.q_tile * kTile;
    const int64_t stat0 = (int64_t{b} * sh.heads + st.head) * T;
    x.ForThreads([&](int t) {
      const int q = q0 + t % kTile;
      const float* from = t < kTile ? lse : dvec;
      // Nothing computed of it here: it would wait for the load.
      stat.at(t / 32, t % 32)[0] = q < T ? from[stat0 + q] : 0.0f;
    });
  };
  auto store_stats = [&](int buf) {
    float* stats = reinterpret_cast<float*>(smem + S::Lse(buf));  // then Dvec(buf)
    x.ForThreads([&](int t) {
      const float r = stat.at(t / 32, t % 32)[0];
      x.StoreShared(stats + t, t < kTile ? math::Base2(r) : math::Mul(r, sh.scale));
    });
  };
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Own(0)), qkv + (row0 + k0) * ld + L.k(first_h),
                   ld, T - k0);
  LoadTileAsync<D>(x, reinterpret_cast<E*>(smem + S::Own(1)), qkv + (row0 + k0) * ld + L.v(first_h),
                   ld, T - k0);
  Step cur{first_h, tile};  // step i's
  issue(cur, 0);
  x.CpAsyncCommit();
  read_stats(cur);
  store_stats(0);
  if (steps > 1) read_stats(after(cur));
  x.ForWarps([&](int w) {
    x.ForLanes([&](int lane) {
      float* kw = dk.at(w, lane);
      float* vw = dv.at(w, lane);
      ZR_UNROLL
      for (int i = 0; i < D / 2; ++i) kw[i] = vw[i] = 0.0f;
    });
  });
  for (int i = 0; i < steps; ++i) {
    const int h = cur.head, q0 = cur.q_tile * kTile, qn = T - q0 < kTile ? T - q0 : kTile;
    const int buf = i % 2;
    const Step next = after(cur);
    if (i + 1 < steps) {
      issue(next, 1 - buf);
      x.CpAsyncCommit();
      store_stats(1 - buf);  // read a step ago
      if (i + 2 < steps) read_stats(after(next));
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
        // [Note: the backward's whole chunks] Every score of the chunk is seen (its first query
        // is at or after the warp's last key, and no key or query is past the end): true for all
        // but the diagonal's and the tails' steps, so those alone pay for the mask.
        const bool whole = math::WholeBlock(q0 + c0, kCols, k0 + r0, kWarpRows, T);
        // P^T then dS^T, for `masked` a std::bool_constant: the same scores either way. Each
        // form is a whole step, products included, as FlashAttention-2 runs its masked
        // iterations apart: with the products shared between two forms of the element loops,
        // sm_90 ptxas took 254-255 registers against 247-248 and spilled more (32-query chunks:
        // 56 bytes against 24-36).
        auto probs_and_grads = [&](auto masked) {
          x.ForLanes([&](int lane) {
            float* sw = s.at(w, lane);
            ForTileElems<kCols>(lane, [&](int e, int half, int col) {
              const float p =
                  X::Exp2(math::ProbExponent2(sw[e], c2, x.LoadShared(lse_s + c0 + col)));
              sw[e] = !masked || visible(lane, half, col) ? p : 0.0f;
            });
          });
          PackFrags<kCols>(x, w, s, pf);
          WarpAccumulate<D, kCols>(x, w, dv, pf, frag, dos, c0);  // dV_w += P^T dO
          WarpScores<D, kCols>(x, w, dp, frag, vs, r0, dos, c0);  // dP^T
          x.ForLanes([&](int lane) {
            float* sw = s.at(w, lane);
            const float* dw = dp.at(w, lane);
            ForTileElems<kCols>(lane, [&](int e, int half, int col) {
              const float ds = math::ScoreGradScaled(sw[e], dw[e], x.LoadShared(d_s + c0 + col),
                                                     sh.scale);  // d_s holds D scale
              sw[e] = !masked || visible(lane, half, col) ? ds : 0.0f;
            });
          });
        };
        WarpScores<D, kCols>(x, w, s, frag, ks, r0, qs, c0);  // S^T
        if (whole) {
          probs_and_grads(std::false_type{});
        } else {
          probs_and_grads(std::true_type{});
        }
        PackFrags<kCols>(x, w, s, pf);
        WarpAccumulate<D, kCols>(x, w, dk, pf, frag, qs, c0);  // dK_w += dS^T Q
        // dS^T for the dQ phase: the packed pairs dK's product took, 32 bits a store (pair
        // 2 nt + half: n-tile nt's row lane / 4 + 8 half, columns 2 (lane % 4) and the next).
        x.ForLanes([&](int lane) {
          const uint32_t* pw = pf.at(w, lane);
          ZR_UNROLL
          for (int nt = 0; nt < kCols / 8; ++nt) {
            ZR_UNROLL
            for (int half = 0; half < 2; ++half) {
              x.Store32(
                  dst + Swizzled<kTile>(r0 + lane / 4 + 8 * half, c0 + nt * 8 + 2 * (lane % 4)),
                  pw[2 * nt + half]);
            }
          }
        });
      }
    });
    x.SyncBlock();  // the step's dS^T is whole
    x.ForWarps([&](int w) {
      const int r0 = w * kWarpRows;  // this warp's queries: q0 + r0 + row
      ZR_UNROLL
      for (int kk = 0; kk < kTile / 16; ++kk) {  // dS rows r0 .. r0 + 15, keys 16 kk ..
        x.LdMatrixTrans(w, qf, kk * 4,
                        [&](int lane) { return FragColsFirst<kTile>(dst, kk * 16, r0, lane); });
      }
      ZR_UNROLL
      for (int d0 = 0; d0 < D; d0 += kDqCols) {
        x.ForLanes([&](int lane) {
          float* a = dqa.at(w, lane);
          ZR_UNROLL
          for (int e = 0; e < kDqCols / 2; ++e) a[e] = 0.0f;
        });
        WarpAccumulate<D, kTile, kDqCols>(x, w, dqa, qf, frag, ks, 0, d0);  // dQ_w = dS K
        x.ForLanes([&](int lane) {
          const float* a = dqa.at(w, lane);
          ZR_UNROLL
          for (int half = 0; half < 2; ++half) {
            const int q = q0 + r0 + lane / 4 + 8 * half;
            if (q >= T) continue;
            float* row = dq + (row0 + q) * ldo + int64_t{h} * D + d0 + 2 * (lane % 4);
            ZR_UNROLL
            for (int dt = 0; dt < kDqCols / 8; ++dt) {  // adjacent columns: one 8-byte atomic
              x.AtomicAdd2(row + dt * 8, a[dt * 4 + half * 2], a[dt * 4 + half * 2 + 1]);
            }
          }
        });
      }
    });
    // No barrier here: the next step rewrites dS^T only after the barrier that starts it, which
    // every warp reaches only past this dQ phase, and its copies and statistics go to the buffers
    // this step read before its dS^T barrier ([Note: the block programs' races] finds no race
    // without one; it had been there since the backward was one program).
    cur = next;
  }
  x.ForWarps([&](int w) {
    const int r0 = w * kWarpRows;
    E* rows = dqkv + (row0 + k0 + r0) * ld;
    StoreRows<D>(x, w, rows + L.k(first_h), ld, dk, T - k0 - r0);
    StoreRows<D>(x, w, rows + L.v(first_h), ld, dv, T - k0 - r0);
  });
}

}  // namespace zerort::flash
