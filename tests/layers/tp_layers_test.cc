// Megatron's tensor-parallel linears at TP 2 and 4 (loopback ranks) against the single-rank
// linear on the same global tensors: column-parallel (output split; the input gradient reduced
// over the group and added to what dx held), row-parallel (input split; the partial outputs
// reduced and the bias added once), every output and gradient to 1e-5; the sequence-parallel
// mappings as each other's inverse; the vocabulary-parallel cross-entropy with a padded vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "zerort/layers/tp_layers.h"
#include "zerort/runtime/loopback_communicator.h"

namespace zerort {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The elements of `global` that rank `part` of `parts` holds when split along `dim`.
std::vector<float> Slice(const std::vector<float>& global, Shape shape, int dim, int parts,
                         int part) {
  const ParamSpec s =
      *SplitParam("t", shape, true, {.split_dim = dim, .parts = parts, .part = part});
  std::vector<float> local(s.numel());
  for (int64_t i = 0; i < s.numel(); ++i) local[i] = global[GlobalIndex(s, i)];
  return local;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << what << " element " << i;
  }
}

constexpr int64_t kRows = 5;
constexpr int kIn = 8, kOut = 8;

struct Reference {
  std::vector<float> w, b, x, dout, out, dx, dw, db;
};

Reference Compute(uint32_t seed) {
  Reference r{Random(kOut * kIn, seed), Random(kOut, seed + 1), Random(kRows * kIn, seed + 2),
              Random(kRows * kOut, seed + 3)};
  auto k = MakeCpuModelKernels(CpuPrecision::kFloat);
  r.out.assign(kRows * kOut, 0);
  r.dx.assign(kRows * kIn, 0);
  r.dw.assign(kOut * kIn, 0);
  r.db.assign(kOut, 0);
  ZR_CHECK_OK(k->Matmul(r.out.data(), r.x.data(), r.w.data(), r.b.data(), kRows, kIn, kOut));
  ZR_CHECK_OK(k->MatmulBackward(r.dx.data(), r.dw.data(), r.db.data(), r.dout.data(), r.x.data(),
                                r.w.data(), kRows, kIn, kOut));
  return r;
}

template <typename F>
void OnRanks(int tp, F f) {
  const Status s = RunLoopbackRanks(tp, {}, nullptr, [&](Communicator& comm) -> Status {
    MemoryTracker tracker;
    auto workspace = MakeCpuCachingAllocator(&tracker);
    auto kernels = MakeCpuModelKernels(CpuPrecision::kFloat);
    TpContext ctx{{&comm}, kernels.get(), workspace.get()};
    f(ctx, comm.rank());
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

TEST(TpLayers, ColumnParallelEqualsTheWholeLinear) {
  const Reference ref = Compute(1);
  for (int tp : {2, 4}) {
    OnRanks(tp, [&](const TpContext& ctx, int r) {
      const int out_local = kOut / tp;
      const std::vector<float> w = Slice(ref.w, {kOut, kIn}, 0, tp, r);
      const std::vector<float> b = Slice(ref.b, {kOut}, 0, tp, r);
      const std::vector<float> dout = Slice(ref.dout, {kRows, kOut}, 1, tp, r);
      std::vector<float> out(kRows * out_local), dw(w.size(), 0), db(b.size(), 0);
      std::vector<float> dx(kRows * kIn, 1.0f);  // another branch's gradient, kept as it is
      ZR_CHECK_OK(ColumnParallelForward(ctx, out.data(), ref.x.data(), w.data(), b.data(), kRows,
                                        kIn, out_local));
      ZR_CHECK_OK(ColumnParallelBackward(ctx, dx.data(), dw.data(), db.data(), dout.data(),
                                         ref.x.data(), w.data(), kRows, kIn, out_local));
      ExpectClose(out, Slice(ref.out, {kRows, kOut}, 1, tp, r), "column output");
      std::vector<float> want_dx = ref.dx;
      for (float& v : want_dx) v += 1.0f;
      ExpectClose(dx, want_dx, "column input gradient");
      ExpectClose(dw, Slice(ref.dw, {kOut, kIn}, 0, tp, r), "column weight gradient");
      ExpectClose(db, Slice(ref.db, {kOut}, 0, tp, r), "column bias gradient");
    });
  }
}

TEST(TpLayers, RowParallelEqualsTheWholeLinearWithTheBiasAddedOnce) {
  const Reference ref = Compute(2);
  for (int tp : {2, 4}) {
    OnRanks(tp, [&](const TpContext& ctx, int r) {
      const int in_local = kIn / tp;
      const std::vector<float> w = Slice(ref.w, {kOut, kIn}, 1, tp, r);
      const std::vector<float> x = Slice(ref.x, {kRows, kIn}, 1, tp, r);
      std::vector<float> out(kRows * kOut), dx(x.size(), 0), dw(w.size(), 0), db(kOut, 0);
      ZR_CHECK_OK(RowParallelForward(ctx, out.data(), x.data(), w.data(), ref.b.data(), kRows,
                                     in_local, kOut));
      ZR_CHECK_OK(RowParallelBackward(ctx, dx.data(), dw.data(), db.data(), ref.dout.data(),
                                      x.data(), w.data(), kRows, in_local, kOut));
      ExpectClose(out, ref.out, "row output");
      ExpectClose(dx, Slice(ref.dx, {kRows, kIn}, 1, tp, r), "row input gradient");
      ExpectClose(dw, Slice(ref.dw, {kOut, kIn}, 1, tp, r), "row weight gradient");
      ExpectClose(db, ref.db, "row bias gradient (the same on every rank)");
    });
  }
}

TEST(TpLayers, SequenceGatherAndScatterAreEachOthersBackward) {
  const int tp = 2;
  const int64_t local_n = 6;
  const std::vector<float> full_grad = Random(local_n * tp, 9);
  OnRanks(tp, [&](const TpContext& ctx, int r) {
    std::vector<float> local(local_n, static_cast<float>(r + 1)), full(local_n * tp);
    ZR_CHECK_OK(GatherFromSequence(ctx, local.data(), full.data(), local_n));
    for (int q = 0; q < tp; ++q) {
      for (int64_t i = 0; i < local_n; ++i) ASSERT_EQ(full[q * local_n + i], q + 1.0f);
    }
    // Its backward: every rank's gradient of the gathered rows, summed, scattered back.
    std::vector<float> mine(local_n);
    ZR_CHECK_OK(ScatterToSequence(ctx, full_grad.data(), mine.data(), local_n));
    for (int64_t i = 0; i < local_n; ++i) {
      ASSERT_NEAR(mine[i], tp * full_grad[r * local_n + i], 1e-6);
    }
  });
}

// Against the single-rank fused cross-entropy on the whole rows: losses and every logit's
// gradient. At TP 4 the 10-word vocabulary is padded to 12 (Megatron's
// make_vocab_size_divisible_by); the padding columns hold large values that must change nothing.
TEST(TpLayers, VocabularyParallelCrossEntropyEqualsTheWholeOne) {
  constexpr int64_t kRowsCe = 6;
  constexpr int kVocab = 10;
  const std::vector<float> logits = Random(kRowsCe * kVocab, 21);
  const std::vector<int32_t> targets = {0, 9, 4, 5, 3, 7};
  const float dloss = 0.75f;
  std::vector<float> want_grad = logits, want_loss(kRowsCe);
  ZR_CHECK_OK(MakeCpuModelKernels(CpuPrecision::kFloat)
                  ->CrossEntropy(want_grad.data(), want_loss.data(), targets.data(), kRowsCe,
                                 kVocab, kVocab, dloss));
  for (int tp : {1, 2, 4}) {
    const int local = (kVocab + tp - 1) / tp;  // padded: local x tp >= kVocab
    OnRanks(tp, [&](const TpContext& ctx, int r) {
      const int begin = r * local;
      const int valid = std::max(0, std::min(local, kVocab - begin));
      std::vector<float> mine(kRowsCe * local, 100.0f);  // padding: large, and never counted
      for (int64_t row = 0; row < kRowsCe; ++row) {
        for (int c = 0; c < valid; ++c) mine[row * local + c] = logits[row * kVocab + begin + c];
      }
      std::vector<float> loss(kRowsCe);
      ZR_CHECK_OK(VocabParallelCrossEntropy(ctx, mine.data(), loss.data(), targets.data(), kRowsCe,
                                            local, valid, begin, dloss));
      ExpectClose(loss, want_loss, "losses");
      for (int64_t row = 0; row < kRowsCe; ++row) {
        for (int c = 0; c < local; ++c) {
          const float want = c < valid ? want_grad[row * kVocab + begin + c] : 0.0f;
          ASSERT_NEAR(mine[row * local + c], want, 1e-6)
              << "tp " << tp << " row " << row << " column " << begin + c;
        }
      }
    });
  }
}

}  // namespace
}  // namespace zerort
