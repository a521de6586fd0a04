// Flash attention's block programs (kernels/flash_tiles.h) run on the CPU by an executor that runs
// a block's threads one after another, and the double reference both that run and the CUDA
// kernels' are checked against (flash_tiles_test.cc, flash_attention_cuda_test.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "zerort/kernels/flash_backward.h"
#include "zerort/kernels/flash_forward.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/kernels/model_ops.h"
#include "zerort/runtime/float_bits.h"
#include "zerort/runtime/strings.h"

namespace zerort::testing {

// The CPU twin of the CUDA executor: indices in turn, each warp instruction emulated over the
// 32 lanes' registers by its PTX fragment layout; and the barriers checked ([Note: the block
// programs' races] in kernels/flash_tiles.h) over the shared memory given to Watch.
template <bool kBf16, int Warps = flash::kWarps>
struct CpuFlashExec {
  using Elem = uint16_t;
  static constexpr int kWarps = Warps;
  static float ToF(uint16_t v) { return kBf16 ? Bf16BitsToFloat(v) : F16BitsToFloat(v); }
  static uint16_t FromF(float v) { return kBf16 ? FloatToBf16Bits(v) : FloatToF16Bits(v); }
  template <typename F>
  void ForThreads(F&& f) const {
    for (int t = 0; t < 32 * Warps; ++t) {
      thread_ = t;
      f(t);
    }
    thread_ = -1;
    WarpInstructions();
  }
  template <typename F>
  void ForWarps(F&& f) const {
    for (int w = 0; w < Warps; ++w) {
      warp_ = w;
      f(w);
    }
    warp_ = -1;
  }
  template <typename F>
  void ForLanes(F&& f) const {
    for (int lane = 0; lane < 32; ++lane) {
      thread_ = warp_ * 32 + lane;
      f(lane);
    }
    thread_ = -1;
    WarpInstructions();
  }
  void SyncBlock() const { ++phase_; }

  // [Note: the block programs' races]: who accessed shared memory, a thread (inside ForThreads or
  // ForLanes) or a warp's collective (ldmatrix: thread -1, any of its lanes). Two accesses
  // conflict when they are of different warps, or of two different threads of one warp.
  struct Who {
    int thread = -1, warp = -1;
  };
  static bool Conflict(Who a, Who b) {
    return a.warp != b.warp || (a.thread >= 0 && b.thread >= 0 && a.thread != b.thread);
  }
  struct Shadow {  // two bytes of shared memory
    int write_phase = -1;
    Who writer;
    int read_phase = -1;
    Who reader;
    bool many_readers = false;  // conflicting readers in read_phase
    int pending = -1;           // the thread whose copy into it is not yet waited for
  };
  // The block's shared memory whose accesses are checked, from the start of a block.
  void Watch(const void* base, size_t bytes) const {
    base_ = static_cast<const unsigned char*>(base);
    shadow_.assign(bytes / 2, Shadow{});
    phase_ = 0;
  }
  // The races found since the first Watch: how many, and the first few described.
  int races() const { return races_; }
  const std::string& race_report() const { return report_; }
  // [Note: shared-memory wavefronts]: the warp instructions on watched shared memory that took
  // more wavefronts than their bytes need (bank conflicts), how many wavefronts those cost
  // beyond the need, and the first few described.
  int conflicted() const { return conflicted_; }
  int64_t excess_wavefronts() const { return excess_; }
  const std::string& conflict_report() const { return conflict_report_; }
  // Registers of every lane of every warp, NaN until written.
  template <typename T, int N>
  struct Regs {
    Regs() { std::memset(v, 0xFF, sizeof(v)); }
    T* at(int w, int lane) { return v[w][lane]; }
    const T* at(int w, int lane) const { return v[w][lane]; }
    T v[Warps][32][N];
  };
  static float Exp2(float v) { return std::exp2(v); }
  static uint32_t Pack(float lo, float hi) {
    return uint32_t{FromF(lo)} | uint32_t{FromF(hi)} << 16;
  }
  // ldmatrix .x4: lane l gets, of matrix m (rows at the addresses of lanes 8 m .. 8 m + 7), row
  // l / 4's elements 2 (l % 4) and 2 (l % 4) + 1; transposed, column l / 4's rows 2 (l % 4) and
  // 2 (l % 4) + 1.
  template <int N, typename Addr>
  void LdMatrix(int w, Regs<uint32_t, N>& r, int i, Addr addr) const {
    Ld(w, r, i, addr, false);
  }
  template <int N, typename Addr>
  void LdMatrixTrans(int w, Regs<uint32_t, N>& r, int i, Addr addr) const {
    Ld(w, r, i, addr, true);
  }
  template <int N, typename Addr>
  void Ld(int w, Regs<uint32_t, N>& r, int i, Addr addr, bool trans) const {
    const Elem* rows[32];
    int64_t at[32];
    for (int l = 0; l < 32; ++l) {
      rows[l] = addr(l);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(rows[l]) % 16, 0u) << "ldmatrix row of lane " << l;
      Read(rows[l], 16, Who{-1, w}, "ldmatrix");
      at[l] = Offset(rows[l], 16);
    }
    Wavefronts(w, at, 16, trans ? "ldmatrix.trans" : "ldmatrix");
    for (int l = 0; l < 32; ++l) {
      for (int m = 0; m < 4; ++m) {
        const int g = l / 4, t = l % 4;
        const Elem lo = trans ? rows[8 * m + 2 * t][g] : rows[8 * m + g][2 * t];
        const Elem hi = trans ? rows[8 * m + 2 * t + 1][g] : rows[8 * m + g][2 * t + 1];
        r.at(w, l)[i + m] = uint32_t{lo} | uint32_t{hi} << 16;
      }
    }
  }
  // mma.sync m16n8k16 with the PTX fragment layouts (g = lane / 4, t = lane % 4): A registers
  // (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8), each with the next column; B registers
  // (2t, g), (2t + 8, g), each with the next row; C (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8,
  // 2t + 1).
  template <int NC, int NA, int NB>
  void MmaSync(int w, Regs<float, NC>& c, int i, const Regs<uint32_t, NA>& a, int j,
               const Regs<uint32_t, NB>& b, int k) const {
    float am[16][16], bm[16][8];
    auto lo = [](uint32_t v) { return ToF(static_cast<Elem>(v & 0xFFFF)); };
    auto hi = [](uint32_t v) { return ToF(static_cast<Elem>(v >> 16)); };
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      const uint32_t* ar = a.at(w, l) + j;
      const uint32_t* br = b.at(w, l) + k;
      for (int e = 0; e < 2; ++e) {
        auto pick = [&](uint32_t v) { return e == 0 ? lo(v) : hi(v); };
        am[g][2 * t + e] = pick(ar[0]);
        am[g + 8][2 * t + e] = pick(ar[1]);
        am[g][2 * t + 8 + e] = pick(ar[2]);
        am[g + 8][2 * t + 8 + e] = pick(ar[3]);
        bm[2 * t + e][g] = pick(br[0]);
        bm[2 * t + 8 + e][g] = pick(br[1]);
      }
    }
    for (int l = 0; l < 32; ++l) {
      const int g = l / 4, t = l % 4;
      float* cr = c.at(w, l) + i;
      for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
        float sum = cr[e];
        for (int kk = 0; kk < 16; ++kk) sum += am[row][kk] * bm[kk][col];
        cr[e] = sum;
      }
    }
  }
  // Two xor shuffles, as the CUDA executor's __shfl_xor_sync(1) then (2): lane l's value becomes
  // op(own, lane l ^ 1's), then op(that, lane l ^ 2's).
  template <typename T, int N, typename Op>
  void QuadAllReduce(int w, Regs<T, N>& r, int i, Op op) const {
    T v[32], v1[32];
    for (int l = 0; l < 32; ++l) v[l] = r.at(w, l)[i];
    for (int l = 0; l < 32; ++l) v1[l] = op(v[l], v[l ^ 1]);
    for (int l = 0; l < 32; ++l) r.at(w, l)[i] = op(v1[l], v1[l ^ 2]);
  }
  // cp.async: a copy lands only when a wait lets it (as late as the hardware may deliver it),
  // so a program reading a tile before waiting for it reads the NaN shared memory starts with.
  void CpAsync16(void* dst, const void* src, bool valid) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(dst) % 16, 0u);
    Note(dst, 16, "cp.async");
    Each(dst, 16, [&](Shadow& e, int64_t at) {
      if (e.pending >= 0) Race(at, "a copy issued while another into it is in flight");
      if (e.read_phase == phase_ && (e.many_readers || Conflict(e.reader, Current()))) {
        Race(at, "a copy issued over what another thread reads in this phase");
      }
      e.pending = thread_;
    });
    open_.push_back({dst, src, valid, thread_});
  }
  void CpAsyncCommit() const { groups_.push_back(std::exchange(open_, {})); }
  void CpAsyncWait(int in_flight) const {
    while (static_cast<int>(groups_.size()) > in_flight) {
      for (const PendingCopy& p : groups_.front()) {
        if (p.valid) {
          std::memcpy(p.dst, p.src, 16);
        } else {
          std::memset(p.dst, 0, 16);
        }
        // Landed: the issuing thread sees it now, the others after the next barrier.
        Each(p.dst, 16, [&](Shadow& e, int64_t) {
          e.pending = -1;
          e.write_phase = phase_;
          e.writer = Who{p.thread, p.thread / 32};
        });
      }
      groups_.erase(groups_.begin());
    }
  }
  // A global fp32 atomic add: the lanes run in turn, so a plain add.
  void AtomicAdd(float* p, float v) const { *p = *p + v; }
  // The 8-byte vector atomic: two adds, at the alignment the hardware requires.
  void AtomicAdd2(float* p, float a, float b) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 8, 0u);
    p[0] = p[0] + a;
    p[1] = p[1] + b;
  }
  // A 32-bit store of a packed pair (the lower element first, as on the little-endian GPU).
  void Store32(Elem* p, uint32_t v) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4, 0u);
    Write(p, 4);
    Note(p, 4, "a 32-bit store");
    std::memcpy(p, &v, sizeof v);
  }
  // 16 bytes of global memory (not watched), at the alignment the hardware requires.
  template <typename T>
  flash::Vec16<T> LoadGlobal16(const T* p) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
    flash::Vec16<T> v;
    std::memcpy(v.v, p, 16);
    return v;
  }
  template <typename T>
  void StoreGlobal16(T* p, const flash::Vec16<T>& v) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
    std::memcpy(p, v.v, 16);
  }
  void StoreShared(float* p, float v) const {
    Write(p, 4);
    Note(p, 4, "a float store");
    *p = v;
  }
  float LoadShared(const float* p) const {
    Read(p, 4, Current(), "a load");
    Note(p, 4, "a float load");
    return *p;
  }
  bool CopiesDone() const { return open_.empty() && groups_.empty(); }
  struct PendingCopy {
    void* dst;
    const void* src;
    bool valid;
    int thread;
  };
  mutable std::vector<PendingCopy> open_;
  mutable std::vector<std::vector<PendingCopy>> groups_;

 private:
  Who Current() const {
    EXPECT_GE(thread_, 0) << "a shared-memory access outside ForThreads and ForLanes";
    return Who{thread_, thread_ / 32};
  }
  // f(entry, byte offset) for each watched two bytes of [p, p + bytes).
  template <typename F>
  void Each(const void* p, size_t bytes, F&& f) const {
    const int64_t first = Offset(p, bytes);
    if (first < 0) return;
    for (int64_t at = first; at < first + static_cast<int64_t>(bytes); at += 2) {
      f(shadow_[at / 2], at);
    }
  }
  void Read(const void* p, size_t bytes, Who who, const char* what) const {
    Each(p, bytes, [&](Shadow& e, int64_t at) {
      if (e.pending >= 0) Race(at, StrCat(what, " of a copy not yet waited for"));
      if (e.write_phase == phase_ && Conflict(e.writer, who)) {
        Race(at, StrCat(what, " by warp ", who.warp, " of what thread ", e.writer.thread,
                        " wrote in the same phase"));
      }
      if (e.read_phase != phase_) {
        e.read_phase = phase_;
        e.reader = who;
        e.many_readers = false;
      } else if (Conflict(e.reader, who)) {
        e.many_readers = true;
      }
    });
  }
  void Write(const void* p, size_t bytes) const {
    const Who who = Current();
    Each(p, bytes, [&](Shadow& e, int64_t at) {
      if (e.pending >= 0) Race(at, "a store over a copy in flight");
      if (e.write_phase == phase_ && Conflict(e.writer, who)) {
        Race(at, StrCat("a store by thread ", who.thread, " over what thread ", e.writer.thread,
                        " wrote in the same phase"));
      }
      if (e.read_phase == phase_ && (e.many_readers || Conflict(e.reader, who))) {
        Race(at, StrCat("a store by thread ", who.thread,
                        " over what another thread reads in "
                        "the same phase"));
      }
      e.write_phase = phase_;
      e.writer = who;
    });
  }
  void Race(int64_t at, const std::string& what) const {
    if (++races_ <= 5) StrAppend(&report_, "\n  phase ", phase_, ", byte ", at, ": ", what);
  }

  // [Note: shared-memory wavefronts]
  // Shared memory is 32 banks of 4-byte words (bank = word % 32, counted from the start of the
  // block's shared memory, which the kernels align to 128 bytes). A warp instruction is served in
  // wavefronts, each reading or writing at most one word of every bank (lanes asking for the same
  // word share it); 16-byte accesses (cp.async, and ldmatrix, whose matrix m is the rows of lanes
  // 8 m .. 8 m + 7) are served a quarter of the warp at a time, 8-byte ones half. An instruction
  // needs, per such group, as many wavefronts as its distinct words fill 32 banks; it takes as
  // many as the bank holding the most distinct words. The executor counts the difference for
  // every warp instruction on the watched shared memory: the programs' swizzled tiles and their
  // statistics are laid out so that it is zero (a conflict there costs the GPU time and changes
  // no result, so only this count would show it off a GPU). A lane's accesses inside ForThreads
  // or ForLanes are its instructions in order: the i-th of each lane of a warp is one instruction
  // (the programs' shared-memory accesses are uniform across lanes).
  struct Access {
    int64_t at;  // byte offset in the watched shared memory
    int bytes;
    const char* what;
  };
  // The byte offset of [p, p + bytes) in the watched shared memory, or -1 when outside it.
  int64_t Offset(const void* p, size_t bytes) const {
    const auto* c = static_cast<const unsigned char*>(p);
    if (base_ == nullptr || c < base_ || c + bytes > base_ + 2 * shadow_.size()) return -1;
    return c - base_;
  }
  void Note(const void* p, int bytes, const char* what) const {
    const int64_t at = Offset(p, bytes);
    if (at < 0 || thread_ < 0) return;
    if (lane_accesses_.empty()) lane_accesses_.resize(32 * Warps);
    lane_accesses_[thread_].push_back({at, bytes, what});
  }
  // The lanes' accesses since the last call, as warp instructions.
  void WarpInstructions() const {
    for (int w = 0; w < Warps && !lane_accesses_.empty(); ++w) {
      size_t most = 0;
      for (int l = 0; l < 32; ++l) most = std::max(most, lane_accesses_[32 * w + l].size());
      for (size_t i = 0; i < most; ++i) {
        int64_t at[32];
        int bytes = 0;
        const char* what = "";
        for (int l = 0; l < 32; ++l) {
          const std::vector<Access>& a = lane_accesses_[32 * w + l];
          at[l] = i < a.size() ? a[i].at : -1;
          if (i < a.size()) {
            EXPECT_TRUE(bytes == 0 || bytes == a[i].bytes) << "lanes' accesses of two widths";
            bytes = a[i].bytes;
            what = a[i].what;
          }
        }
        Wavefronts(w, at, bytes, what);
      }
    }
    for (std::vector<Access>& a : lane_accesses_) a.clear();
  }
  // One warp instruction: lane l's access of `bytes` at offset at[l] (-1: none).
  void Wavefronts(int w, const int64_t* at, int bytes, const char* what) const {
    const int group = bytes >= 16 ? 8 : bytes == 8 ? 16 : 32;
    int taken = 0, needed = 0;
    for (int g0 = 0; g0 < 32; g0 += group) {
      int64_t words[32 * 4];
      int n = 0;
      for (int l = g0; l < g0 + group; ++l) {
        if (at[l] < 0) continue;
        for (int b = 0; b < bytes; b += 4) words[n++] = (at[l] + b) / 4;
      }
      std::sort(words, words + n);
      n = static_cast<int>(std::unique(words, words + n) - words);
      int per_bank[32] = {};
      for (int i = 0; i < n; ++i) ++per_bank[words[i] % 32];
      taken += n == 0 ? 0 : *std::max_element(per_bank, per_bank + 32);
      needed += (n + 31) / 32;
    }
    if (taken == needed) return;
    excess_ += taken - needed;
    if (++conflicted_ <= 5) {
      StrAppend(&conflict_report_, "\n  phase ", phase_, ", warp ", w, ", ", what, ": ", taken,
                " wavefronts where ", needed, " serve its bytes (offsets");
      for (int l = 0; l < 32; ++l) {
        if (at[l] >= 0) StrAppend(&conflict_report_, " ", at[l]);
      }
      StrAppend(&conflict_report_, ")");
    }
  }
  mutable int thread_ = -1, warp_ = -1, phase_ = 0, races_ = 0, conflicted_ = 0;
  mutable int64_t excess_ = 0;
  mutable std::vector<std::vector<Access>> lane_accesses_;  // by thread ([Note: shared-memory
                                                            // wavefronts])
  mutable std::string conflict_report_;
  mutable const unsigned char* base_ = nullptr;
  mutable std::vector<Shadow> shadow_;
  mutable std::string report_;
};

struct FlashCase {
  bool bf16 = true;
  int batch = 1, seq = 1, heads = 1, kv_heads = 1, hs = 64;
};

inline float FlashToF(bool bf16, uint16_t v) {
  return bf16 ? Bf16BitsToFloat(v) : F16BitsToFloat(v);
}

// Random 16-bit inputs and the same values as doubles; dqkv starts as NaN (the backward writes
// every element of it: one it skips fails the comparison).
struct FlashInputs {
  FlashCase c;
  std::vector<uint16_t> qkv, dout, dqkv;
  std::vector<double> qkv_d, dout_d;
  int64_t row() const { return int64_t{c.heads + 2 * c.kv_heads} * c.hs; }
  int64_t out_size() const { return int64_t{c.batch} * c.seq * c.heads * c.hs; }
  int64_t stat_size() const { return int64_t{c.batch} * c.heads * c.seq; }
  flash::Shape shape() const {
    return {c.batch, c.seq, c.heads, c.kv_heads, 1.0f / std::sqrt(static_cast<float>(c.hs))};
  }
};

inline void RandomBits(bool bf16, int64_t n, uint32_t seed, double sd, std::vector<uint16_t>* bits,
                       std::vector<double>* values) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(sd));
  bits->resize(n);
  values->resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    (*bits)[i] = bf16 ? FloatToBf16Bits(v) : FloatToF16Bits(v);
    (*values)[i] = FlashToF(bf16, (*bits)[i]);
  }
}

inline FlashInputs MakeFlashInputs(const FlashCase& c) {
  FlashInputs in{.c = c};
  const int64_t n_qkv = int64_t{c.batch} * c.seq * in.row();
  RandomBits(c.bf16, n_qkv, 7 + c.seq, 1.5, &in.qkv, &in.qkv_d);
  RandomBits(c.bf16, in.out_size(), 11 + c.seq, 1.0, &in.dout, &in.dout_d);
  in.dqkv.assign(n_qkv, c.bf16 ? uint16_t{0x7FC0} : uint16_t{0x7E00});  // quiet NaNs
  return in;
}

struct FlashOutputs {
  std::vector<uint16_t> out, dqkv;
  std::vector<float> lse, dvec;
};

// Every block of the three programs' grids, in the order the CUDA launches run them; shared
// memory starts as NaN, so a program that reads what it never wrote fails the comparison.
// G: the forward's row groups a warp; C: the backward main program's query chunk; W: its warps
// (4: 64-key blocks; 8: 128); FW: the forward's warps (4, or 8: 128-query blocks of one group a
// warp).
template <bool kBf16, int D, int G = flash::kForwardGroups<D>, int C = flash::kBackwardChunk<D>,
          int W = flash::kBackwardWarps<D>, int FW = flash::kForwardWarps<D>>
FlashOutputs RunFlashOnCpuAs(const FlashInputs& in) {
  const CpuFlashExec<kBf16> x;
  const CpuFlashExec<kBf16, W> xw;
  const CpuFlashExec<kBf16, FW> xf;
  const flash::Shape sh = in.shape();
  FlashOutputs r{.out = std::vector<uint16_t>(in.out_size()), .dqkv = in.dqkv};
  r.lse.assign(in.stat_size(), -1.0f);
  std::vector<unsigned char> smem;
  auto fresh = [&](const auto& exec, int bytes) {  // and watched for races
    smem.assign(bytes, 0xFF);
    exec.Watch(smem.data(), smem.size());
    return smem.data();
  };
  // The 1-D grids' order, as the kernels map it ([Note: the longest blocks first]).
  const int forward_tiles = flash::ForwardTiles<D, G, FW>(sh), heads = sh.batch * sh.heads;
  for (int64_t i = 0; i < int64_t{forward_tiles} * heads; ++i) {
    const flash::GridBlock b = flash::LongestFirst(i, heads);
    flash::ForwardProgram<D, G>(xf, fresh(xf, flash::ForwardSmem<D, G, FW>::bytes), in.qkv.data(),
                                r.out.data(), r.lse.data(), sh, forward_tiles - 1 - b.rank, b.head);
    EXPECT_TRUE(xf.CopiesDone()) << "the forward left copies in flight";
  }
  // One fp32 workspace, D then the dQ accumulator, at the offsets the CUDA launch gives them
  // (so that the executor checks their accesses' alignment where the GPU makes them), all NaN:
  // the Dot program must write every D and zero every row of dQ the others add to.
  const int64_t dq_at = FlashBackwardDqOffset(sh.batch, sh.heads, sh.seq);
  std::vector<float> workspace(dq_at + in.out_size(), std::numeric_limits<float>::quiet_NaN());
  float* dvec = workspace.data();
  float* dq = workspace.data() + dq_at;
  for (int bh = 0; bh < sh.batch * sh.heads; ++bh) {
    for (int t = 0; t < sh.tiles(); ++t) {
      flash::BackwardDotProgram<D>(x, in.dout.data(), r.out.data(), dvec, dq, sh, t, bh);
    }
  }
  r.dvec.assign(dvec, dvec + in.stat_size());
  constexpr int kKeys = 16 * W;
  const int kv = sh.batch * sh.kv_heads;
  for (int64_t i = 0; i < int64_t{sh.tiles(kKeys)} * kv; ++i) {
    const flash::GridBlock b = flash::LongestFirst(i, kv);
    flash::BackwardProgram<D, C>(xw, fresh(xw, flash::BackwardSmem<D, kKeys>::bytes), r.dqkv.data(),
                                 dq, in.dout.data(), in.qkv.data(), r.lse.data(), dvec, sh, b.rank,
                                 b.head);
    EXPECT_TRUE(xw.CopiesDone()) << "the backward left copies in flight";
  }
  for (int bh = 0; bh < sh.batch * sh.heads; ++bh) {
    for (int t = 0; t < sh.tiles(); ++t) {
      flash::BackwardStoreDqProgram<D>(x, r.dqkv.data(), dq, sh, t, bh);
    }
  }
  EXPECT_EQ(x.races() + xw.races() + xf.races(), 0)
      << "shared-memory races ([Note: the block programs' races])" << x.race_report()
      << xw.race_report() << xf.race_report();
  EXPECT_EQ(x.conflicted() + xw.conflicted() + xf.conflicted(), 0)
      << "bank conflicts ([Note: shared-memory wavefronts]): "
      << x.excess_wavefronts() + xw.excess_wavefronts() + xf.excess_wavefronts()
      << " wavefronts beyond the need" << x.conflict_report() << xw.conflict_report()
      << xf.conflict_report();
  return r;
}

inline FlashOutputs RunFlashOnCpu(const FlashInputs& in) {
  if (in.c.hs == 64)
    return in.c.bf16 ? RunFlashOnCpuAs<true, 64>(in) : RunFlashOnCpuAs<false, 64>(in);
  return in.c.bf16 ? RunFlashOnCpuAs<true, 128>(in) : RunFlashOnCpuAs<false, 128>(in);
}

// ||got - want|| / ||want||.
inline double FlashRelativeError(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

inline std::vector<double> FlashValues(bool bf16, const std::vector<uint16_t>& bits) {
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = FlashToF(bf16, bits[i]);
  return v;
}

// `got` against the double reference attention (materialised probabilities) on the same rounded
// inputs: out and the gradients norm-wise within what rounding P, dS and the outputs to 16 bits
// costs; each query's log-sum-exp and D = dout . out (of the run's own out) almost exactly.
// `got.dvec` empty: a program that keeps no D (cuDNN's); `lse_tolerance`: the log-sum-exps'
// absolute error.
inline void ExpectFlashMatchesReference(const FlashInputs& in, const FlashOutputs& got,
                                        double lse_tolerance = 1e-5) {
  const FlashCase& c = in.c;
  SCOPED_TRACE(::testing::Message()
               << (c.bf16 ? "bf16" : "fp16") << " B" << c.batch << " T" << c.seq << " H" << c.heads
               << ":" << c.kv_heads << " hs" << c.hs);
  const int T = c.seq, C = c.heads * c.hs, D = c.hs;
  const int64_t row = in.row();
  std::vector<double> out_ref(in.out_size()), att(int64_t{c.batch} * c.heads * T * T);
  cpu::AttentionForward<double>(out_ref.data(), att.data(), in.qkv_d.data(), c.batch, T, C, c.heads,
                                c.kv_heads);
  std::vector<double> dqkv_ref(in.qkv_d.size());
  cpu::AttentionBackward<double>(dqkv_ref.data(), in.dout_d.data(), in.qkv_d.data(), att.data(),
                                 c.batch, T, C, c.heads, c.kv_heads);
  const std::vector<double> out = FlashValues(c.bf16, got.out);
  EXPECT_LT(FlashRelativeError(out, out_ref), c.bf16 ? 0.006 : 0.001);
  const std::vector<double> grad = FlashValues(c.bf16, got.dqkv);
  EXPECT_LT(FlashRelativeError(grad, dqkv_ref), c.bf16 ? 0.01 : 0.0015);

  double worst_lse = 0, worst_d = 0;
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.heads; ++h) {
      const int kvh = h / (c.heads / c.kv_heads);
      for (int q = 0; q < T; ++q) {
        const double* qv = &in.qkv_d[(int64_t{b} * T + q) * row + int64_t{h} * D];
        std::vector<double> s(q + 1);
        double m = -INFINITY;
        for (int k = 0; k <= q; ++k) {
          const double* kv = &in.qkv_d[(int64_t{b} * T + k) * row + int64_t{c.heads + kvh} * D];
          double dot = 0;
          for (int i = 0; i < D; ++i) dot += qv[i] * kv[i];
          s[k] = dot / std::sqrt(static_cast<double>(D));
          m = std::max(m, s[k]);
        }
        double sum = 0;
        for (double v : s) sum += std::exp(v - m);
        const int64_t at = (int64_t{b} * c.heads + h) * T + q;
        worst_lse = std::max(worst_lse, std::abs(got.lse[at] - (m + std::log(sum))));
        double d = 0;
        for (int i = 0; i < D; ++i) {
          const int64_t o = (int64_t{b} * T + q) * C + int64_t{h} * D + i;
          d += in.dout_d[o] * out[o];
        }
        if (!got.dvec.empty()) {
          worst_d = std::max(worst_d, std::abs(got.dvec[at] - d) / (1 + std::abs(d)));
        }
      }
    }
  }
  EXPECT_LT(worst_lse, lse_tolerance);
  EXPECT_LT(worst_d, 1e-5);
}

// The cases both tests run: tails (1, 70, 100, 130), whole tiles (64, 128), multi-head and
// grouped 2:1 and 4:1, head sizes 64 and 128, bf16 and fp16.
inline std::vector<FlashCase> FlashCases() {
  // The forwards with 128-query blocks: 300 and 200 make several blocks, the last one's second
  // row group (head size 64) or its last four warps (130 at head size 128: wholly, 70: partly)
  // past the end.
  return {{true, 2, 100, 4, 2, 64},  {true, 1, 128, 4, 1, 64}, {true, 1, 1, 3, 3, 64},
          {true, 1, 130, 2, 2, 128}, {false, 1, 64, 2, 2, 64}, {false, 1, 100, 4, 2, 64},
          {false, 2, 70, 4, 1, 128}, {true, 1, 300, 2, 1, 64}, {false, 1, 200, 2, 2, 64}};
}

}  // namespace zerort::testing
