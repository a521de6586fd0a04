// Flash attention's CUDA block programs, the part they share: the executor they are written
// against, the tiles' shapes and shared-memory layout, the asynchronous tile copies and the warp
// products. The programs (kernels/flash_forward.h, kernels/flash_backward.h) are written once for
// the GPU and for a CPU that runs them warp by warp (tests/kernels/flash_tiles_test.cc), so that
// the kernels' fragments, tiling, indexing, masks, tails and grouped-query reads are checked
// without a GPU. kernels/cuda/flash_attention.cu launches them; kernels/flash_math.h holds the
// element arithmetic they share with the CPU's own flash kernel.
//
// [Note: flash attention's block programs]
// A program is the code of one thread block, written against an executor `X` that says how a
// block's threads run:
//   X::Elem                        the 16-bit element (bf16 or fp16), X::ToF / X::FromF convert;
//   X::kWarps                      the block's warps (kWarps = 4, or 8: kTileOf<X> = 16 a warp);
//   x.ForThreads(f)                f(t) for each of the block's kThreads threads;
//   x.ForWarps(f)                  f(w) for each of its kWarps warps; inside it,
//   x.ForLanes(f)                  f(lane) for each of the warp's 32 lanes;
//   x.SyncBlock()                  a barrier;
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
//   x.Store32(p, v)                two packed elements in one 32-bit store (shared or global
//                                  memory), p 4-byte aligned;
//   x.LoadGlobal16(p), x.StoreGlobal16(p, v)
//                                  16 bytes of global memory (a Vec16<T>) in one 128-bit load
//                                  or store, p 16-byte aligned;
//   x.StoreShared(p, v), x.LoadShared(p)
//                                  a float of shared memory, by one thread;
//   X::Exp2, X::Pack               2^x; two floats as a register of two elements, each
//                                  rounded as FromF rounds a finite value.
// Every access to shared memory is one of these (ldmatrix, cp.async, Store32, StoreShared,
// LoadShared), so that the CPU executor can check the barriers ([Note: the block programs'
// races]).
// On CUDA every thread runs each f for its own index and the warp instructions are the PTX ones;
// the CPU executor runs the indices one after another and emulates each warp instruction over
// the 32 lanes' registers by its PTX fragment layout (its copies land only when waited for, its
// registers and shared memory start as NaN). Code inside ForWarps but outside ForLanes is uniform
// (loop bounds, pointers, the warp instructions) and every write to shared or global memory is
// inside ForLanes, ForThreads or a copy, so running the lanes in turn computes what the warp
// computes, as long as a lane only reads in a phase (between barriers) what no other lane writes
// in it: the programs are split into phases so that this holds.
//
// [Note: the block programs' races]
// On the GPU a thread sees another thread's write to shared memory (a store, or a cp.async
// copy that the issuing thread waited for) only after a barrier between them, and a write must
// not land where another thread still reads in the same phase (between two barriers). The CPU
// executor runs one thread after another, so a missing barrier changes nothing there; instead it
// keeps, for every two bytes of the block's shared memory, the phase and thread of the last write
// and of the reads since, and the copies issued and not yet waited for, and fails a program that
// reads what another thread wrote in the same phase (a warp's ldmatrix counts as its 32 lanes),
// writes what another thread wrote or read in it, reads a copy before it was waited for, or
// issues a copy over what another thread read in the phase (tests/kernels/flash_harness.h).
//
// Tiles: a block takes kTile = 64 queries (forward, dQ) or 64 keys (dK/dV); each of its 4 warps
// owns 16 of them (the forward's 128-query blocks: 32, as two row groups; the backward's main
// program with 8 warps: 128 keys, 16 a warp, meeting 128 queries a step), and the block meets 64
// keys (or queries) at a time in shared memory, the next tile copied in while the current one is
// computed (two buffers). Head sizes 64 and 128 (D); any sequence length (rows past the end load
// zeros and write nothing); causal, the tiles wholly above the diagonal never visited; a query head
// reads its key/value head in place ([Note: the qkv layout]). Tiles are [64][D] in shared memory
// with 16-byte chunk c of row r stored at chunk c ^ (r % 8) of its group of 8 (`Swizzled`), so the
// 8 rows an ldmatrix phase reads, and the 8 chunks a copy phase writes, fall in 8 different bank
// groups (the CPU executor counts every shared-memory access's wavefronts and the tests expect
// none beyond the need: [Note: shared-memory wavefronts] in tests/kernels/flash_harness.h).
// A warp's products keep their operands and results in registers: a 16 x N product of two tiles
// (`WarpScores`: S = Q K^T and its kin, B fragments by ldmatrix from the second tile's rows; N is
// 64, or 32 where a program's registers would not hold 64), and a 16 x D accumulation of P times
// a tile (`WarpAccumulate`: O += P V and its kin), whose A fragments are the 16 x N
// accumulators themselves rounded to the element type (`PackFrags`: an
// m16n8 accumulator's registers for columns 16 k .. 16 k + 15 are the A fragment of k-step k) and
// whose B fragments come by ldmatrix.trans. In an accumulator lane l holds rows g = l / 4 and
// g + 8, columns 2 (l % 4) and 2 (l % 4) + 1 of each 8-column n-tile (`ForTileElems`).
// The softmax statistics are fp32; P and dS are rounded to the element type for the tensor-core
// products, accumulators are fp32 until written.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "zerort/kernels/flash_math.h"
#include "zerort/kernels/model_math.h"

// Device code under nvcc (the CUDA executor's functions are device functions); plain C++ for
// the CPU executor, which compiles them with the host compiler.
#if defined(__CUDACC__)
#define ZR_TILE_PROGRAM __device__
#define ZR_UNROLL _Pragma("unroll")
#else
#define ZR_TILE_PROGRAM
#define ZR_UNROLL
#endif

namespace zerort::flash {

inline constexpr int kTile = 64;  // queries or keys a block owns, and per step
inline constexpr int kWarps = 4;  // 16 rows of the tile each
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kWarpRows = kTile / kWarps;  // 16, whatever a program's warp count

struct Shape {
  int batch = 0, seq = 0, heads = 0, kv_heads = 0;
  float scale = 0;  // 1 / sqrt(head size)
  ZR_HOST_DEVICE int tiles(int tile = kTile) const { return (seq + tile - 1) / tile; }
};

// [Note: the longest blocks first]
// A causal grid's blocks do unequal work: a forward query tile visits the key tiles up to its own
// (1 .. tiles of them), a backward key tile the query tiles from its own on. A GPU starts blocks
// in the order of their index as slots free up, so a long block started last finishes alone.
// Ordered head by head (a grid of tiles x heads), a greedy model of the schedule puts that tail
// at 12-31% of the kernel's time at GPT-2's and LLaMA-1B's shapes, 0.3-7% with every head's
// longest tile first (docs/gpu.md). So the forward and the backward's main program take a
// one-dimensional grid, index i being head i % heads of rank i / heads, rank 0 the longest
// tiles (the forward's last query tile, the backward's first key tile); CheckFlashAttention
// keeps the index within a grid's 2^31 - 1. The CPU executor runs the blocks in the same order.
struct GridBlock {
  int rank = 0, head = 0;
};
ZR_HOST_DEVICE inline GridBlock LongestFirst(int64_t index, int heads) {
  return {static_cast<int>(index / heads), static_cast<int>(index % heads)};
}

// 16 bytes of global memory in registers: what one 128-bit load or store moves
// (x.LoadGlobal16, x.StoreGlobal16). The programs' passes over global memory alone (D, the dQ
// accumulator's zeros and its rounding into dqkv) move 16 bytes a thread an access, not 2 or 4.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kCount = 16 / static_cast<int>(sizeof(T));
  T v[kCount];
};

// An executor's per-lane registers of a block's warps.
template <typename X, typename T, int N>
using Regs = typename X::template Regs<T, N>;

// The element offset of (row, col) in a swizzled [64][D] tile: col's 16-byte chunk moves to
// chunk ^ (row % 8), the element keeps its place in it.
template <int D>
ZR_HOST_DEVICE constexpr int Swizzled(int row, int col) {
  return row * D + (((col / 8) ^ (row & 7)) * 8) + col % 8;
}

// Lane l's row for an ldmatrix .x4 of the 16 x 16 block at (r0, c0) of a swizzled tile, matrix i
// being rows 8 (i % 2), columns 8 (i / 2): an A fragment (rows are m, columns k) or, transposed,
// two B fragments of a tile whose rows are k and columns n.
template <int D, typename E>
ZR_HOST_DEVICE const E* FragRowsFirst(const E* tile, int r0, int c0, int lane) {
  return tile + Swizzled<D>(r0 + lane % 8 + 8 * (lane / 8 % 2), c0 + 8 * (lane / 16));
}
// ... matrix i being rows 8 (i / 2), columns 8 (i % 2): the B fragments of two n-tiles of a tile
// whose rows are n (rows r0 .. r0 + 7 and r0 + 8 .. r0 + 15) and columns k.
template <int D, typename E>
ZR_HOST_DEVICE const E* FragColsFirst(const E* tile, int r0, int c0, int lane) {
  return tile + Swizzled<D>(r0 + lane % 8 + 8 * (lane / 16), c0 + 8 * (lane / 8 % 2));
}

// The rows of a block's tile: 16 a warp (X::kWarps warps; kTile with the default 4).
template <typename X>
inline constexpr int kTileOf = kWarpRows* X::kWarps;

// Copies `rows` x D elements (row i at src + i * ld) into a swizzled [kRowsT][D] tile (the
// block's tile, kTileOf<X>, unless a program says otherwise) by asynchronous 16-byte copies;
// zeros past `rows` (those copies read nothing).
//
// [Note: the tile copies' addresses]
// Thread t copies chunk t % (D / 8) of rows t / (D / 8) + p R (R = the block's threads / (D / 8),
// a multiple of 8), so its column, its swizzle (row % 8 is the same in every pass) and its row's
// offsets are computed once and each pass adds a constant. The loop over chunks c = t, t +
// threads, ... it replaces had a trip count unknown to the compiler and divided c by the chunks a
// row in every copy: about 23 instructions a copy in sm_90's SASS (docs/gpu.md, "The tile copies'
// instructions"). A whole tile (every row inside the sequence: all but a sequence's last) takes
// its copies without the bound and the pointer select a tail's need, about 3 instructions a copy
// fewer.
template <int D, int kRowsT = 0, typename X>
ZR_TILE_PROGRAM void LoadTileAsync(const X& x, typename X::Elem* tile, const typename X::Elem* src,
                                   int64_t ld, int rows) {
  constexpr int kTileRows = kRowsT == 0 ? kTileOf<X> : kRowsT;
  constexpr int kChunks = D / 8;                        // 16-byte chunks a row
  constexpr int kRowsAPass = 32 * X::kWarps / kChunks;  // rows the block's threads copy at once
  constexpr int kPasses = kTileRows / kRowsAPass;
  static_assert(32 * X::kWarps % kChunks == 0 && kRowsAPass % 8 == 0 && kTileRows % kRowsAPass == 0,
                "LoadTileAsync: whole passes of whole rows, each pass's rows a multiple of 8");
  x.ForThreads([&](int t) {
    const int r0 = static_cast<int>(static_cast<unsigned>(t) / kChunks);
    const int col = static_cast<int>(static_cast<unsigned>(t) % kChunks) * 8;
    typename X::Elem* to = tile + Swizzled<D>(r0, col);
    const typename X::Elem* from = src + r0 * ld + col;
    auto copies = [&](auto bounded) {  // a std::bool_constant: whole tiles take no bound
      ZR_UNROLL
      for (int p = 0; p < kPasses; ++p) {
        const bool valid = !bounded || r0 + p * kRowsAPass < rows;
        x.CpAsync16(to + p * kRowsAPass * D, valid ? from + p * kRowsAPass * ld : src + col, valid);
      }
    };
    if (rows >= kTileRows) {  // a whole tile (the block's threads agree): every copy reads
      copies(std::false_type{});
    } else {
      copies(std::true_type{});
    }
  });
}

// f(i, half, col) for each of lane's N / 2 registers of a 16 x N accumulator: register i holds
// row lane / 4 + 8 half, column col.
template <int N = kTile, typename F>
ZR_TILE_PROGRAM void ForTileElems(int lane, F&& f) {
  ZR_UNROLL
  for (int nt = 0; nt < N / 8; ++nt) {
    ZR_UNROLL
    for (int e = 0; e < 4; ++e) f(nt * 4 + e, e / 2, nt * 8 + 2 * (lane % 4) + e % 2);
  }
}

// c (16 G x N) = A B^T over D: A the rows a_r0 .. a_r0 + 16 G - 1 of tile a, B^T the rows
// b_r0 .. b_r0 + N - 1 of tile b. G row groups of 16 (registers g N / 2 .. (g + 1) N / 2 - 1 of c
// hold group g's 16 x N accumulator) share each B fragment, loaded once. frag: NF = 4 G + 4
// scratch registers, the A fragments of the groups, then B's.
template <int D, int N = kTile, int G = 1, int NF = 4 * G + 4, typename X>
ZR_TILE_PROGRAM void WarpScores(const X& x, int w, Regs<X, float, G * N / 2>& c,
                                Regs<X, uint32_t, NF>& frag, const typename X::Elem* a, int a_r0,
                                const typename X::Elem* b, int b_r0 = 0) {
  static_assert(NF >= 4 * G + 4, "WarpScores: 4 fragment registers a group and 4 for B");
  x.ForLanes([&](int lane) {
    float* cw = c.at(w, lane);
    ZR_UNROLL
    for (int i = 0; i < G * N / 2; ++i) cw[i] = 0.0f;
  });
  ZR_UNROLL
  for (int kk = 0; kk < D / 16; ++kk) {
    ZR_UNROLL
    for (int g = 0; g < G; ++g) {
      x.LdMatrix(w, frag, 4 * g,
                 [&](int lane) { return FragRowsFirst<D>(a, a_r0 + 16 * g, kk * 16, lane); });
    }
    ZR_UNROLL
    for (int kg = 0; kg < N / 16; ++kg) {
      x.LdMatrix(w, frag, 4 * G,
                 [&](int lane) { return FragColsFirst<D>(b, b_r0 + kg * 16, kk * 16, lane); });
      ZR_UNROLL
      for (int g = 0; g < G; ++g) {
        x.MmaSync(w, c, g * N / 2 + 2 * kg * 4, frag, 4 * g, frag, 4 * G);
        x.MmaSync(w, c, g * N / 2 + (2 * kg + 1) * 4, frag, 4 * g, frag, 4 * G + 2);
      }
    }
  }
}

// The G 16 x N accumulators s as the A fragments of N / 16 k-steps each (group g's at
// registers g N / 4 ..), rounded to the element type.
template <int N = kTile, int G = 1, typename X>
ZR_TILE_PROGRAM void PackFrags(const X& x, int w, const Regs<X, float, G * N / 2>& s,
                               Regs<X, uint32_t, G * N / 4>& pf) {
  x.ForLanes([&](int lane) {
    ZR_UNROLL
    for (int g = 0; g < G; ++g) {
      const float* sw = s.at(w, lane) + g * N / 2;
      uint32_t* pw = pf.at(w, lane) + g * N / 4;
      ZR_UNROLL
      for (int kk = 0; kk < N / 16; ++kk) {  // n-tiles 2 kk and 2 kk + 1 make k-step kk
        pw[kk * 4 + 0] = X::Pack(sw[2 * kk * 4 + 0], sw[2 * kk * 4 + 1]);
        pw[kk * 4 + 1] = X::Pack(sw[2 * kk * 4 + 2], sw[2 * kk * 4 + 3]);
        pw[kk * 4 + 2] = X::Pack(sw[(2 * kk + 1) * 4 + 0], sw[(2 * kk + 1) * 4 + 1]);
        pw[kk * 4 + 3] = X::Pack(sw[(2 * kk + 1) * 4 + 2], sw[(2 * kk + 1) * 4 + 3]);
      }
    }
  });
}

// c (16 G x DC) += P B over N: P as the G groups' A fragments (PackFrags), B the rows b_r0 ..
// b_r0 + N - 1 and the columns d0 .. d0 + DC - 1 of tile b (of D columns); each B fragment
// (registers 4 .. 7 of frag) loaded once for the G groups.
template <int D, int N = kTile, int DC = D, int G = 1, int NF = 8, typename X>
ZR_TILE_PROGRAM void WarpAccumulate(const X& x, int w, Regs<X, float, G * DC / 2>& c,
                                    const Regs<X, uint32_t, G * N / 4>& pf,
                                    Regs<X, uint32_t, NF>& frag, const typename X::Elem* b,
                                    int b_r0 = 0, int d0 = 0) {
  static_assert(NF >= 8, "WarpAccumulate: B's fragments in registers 4 .. 7");
  ZR_UNROLL
  for (int kk = 0; kk < N / 16; ++kk) {
    ZR_UNROLL
    for (int dg = 0; dg < DC / 16; ++dg) {
      x.LdMatrixTrans(w, frag, 4, [&](int lane) {
        return FragRowsFirst<D>(b, b_r0 + kk * 16, d0 + dg * 16, lane);
      });
      ZR_UNROLL
      for (int g = 0; g < G; ++g) {
        x.MmaSync(w, c, g * DC / 2 + 2 * dg * 4, pf, g * N / 4 + kk * 4, frag, 4);
        x.MmaSync(w, c, g * DC / 2 + (2 * dg + 1) * 4, pf, g * N / 4 + kk * 4, frag, 6);
      }
    }
  }
}

// Stores a warp's 16 x D accumulator, rounded once, into the rows before `rows` of a head (row r
// at dst + r * ld): a lane's two adjacent columns as one packed pair, one 32-bit store (dst and
// ld even).
template <int D, typename X>
ZR_TILE_PROGRAM void StoreRows(const X& x, int w, typename X::Elem* dst, int64_t ld,
                               const Regs<X, float, D / 2>& acc, int rows) {
  x.ForLanes([&](int lane) {
    const float* a = acc.at(w, lane);
    ZR_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int r = lane / 4 + 8 * half;
      if (r >= rows) continue;
      typename X::Elem* row = dst + r * ld + 2 * (lane % 4);
      ZR_UNROLL
      for (int dt = 0; dt < D / 8; ++dt) {
        x.Store32(row + dt * 8, X::Pack(a[dt * 4 + half * 2], a[dt * 4 + half * 2 + 1]));
      }
    }
  });
}

}  // namespace zerort::flash
