// The GPT model's CPU operations: every backward against central finite differences in double
// precision (loss = sum(out * R) for a fixed random R, so dout = R), a small chain of them
// through the cross-entropy, and the float instantiation against the double one.
#include "zerort/kernels/model_ops.h"

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/random_floats.h"

namespace zerort::cpu {
namespace {

std::vector<double> Random(size_t n, uint32_t seed, double scale = 1) {
  return testing::RandomNormal<double>(n, seed, scale);
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares `analytic` with central differences of `loss` with respect to `x`.
void CheckGradient(const char* what, std::vector<double>& x, const std::vector<double>& analytic,
                   const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double scale = 1e-3;
  for (double g : analytic) scale = std::max(scale, std::abs(g));
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    const double h = 1e-6 * std::max(1.0, std::abs(saved));
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2 * h);
    ASSERT_NEAR(analytic[i], numeric, 1e-6 * scale) << what << " element " << i;
  }
}

TEST(ModelOpsTest, MatmulGradients) {
  const int rows = 5, in = 7, out = 4;
  std::vector<double> x = Random(rows * in, 1), w = Random(out * in, 2), b = Random(out, 3);
  const std::vector<double> r = Random(rows * out, 4);
  auto loss = [&] {
    std::vector<double> y(rows * out);
    MatmulForward(y.data(), x.data(), w.data(), b.data(), rows, in, out);
    return Dot(y, r);
  };
  std::vector<double> dx(x.size(), 0.0), dw(w.size(), 0.0), db(b.size(), 0.0);
  MatmulBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), rows, in, out);
  CheckGradient("matmul dinp", x, dx, loss);
  CheckGradient("matmul dweight", w, dw, loss);
  CheckGradient("matmul dbias", b, db, loss);
}

TEST(ModelOpsTest, LayerNormGradients) {
  const int rows = 3, c = 8;
  std::vector<double> x = Random(rows * c, 5, 2.0), g = Random(c, 6), b = Random(c, 7);
  const std::vector<double> r = Random(rows * c, 8);
  std::vector<double> mean(rows), rstd(rows);
  auto loss = [&] {
    std::vector<double> y(rows * c);
    LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), rows, c);
    return Dot(y, r);
  };
  loss();  // fills mean and rstd at the unperturbed point
  std::vector<double> dx(x.size(), 0.0), dg(c, 0.0), db(c, 0.0);
  LayerNormBackward(dx.data(), dg.data(), db.data(), r.data(), x.data(), g.data(), mean.data(),
                    rstd.data(), rows, c);
  CheckGradient("layernorm dinp", x, dx, loss);
  CheckGradient("layernorm dweight", g, dg, loss);
  CheckGradient("layernorm dbias", b, db, loss);
}

TEST(ModelOpsTest, GeluGradient) {
  std::vector<double> x = Random(40, 9, 2.0);
  const std::vector<double> r = Random(40, 10);
  auto loss = [&] {
    std::vector<double> y(x.size());
    GeluForward(y.data(), x.data(), static_cast<int64_t>(x.size()));
    return Dot(y, r);
  };
  std::vector<double> dx(x.size(), 0.0);
  GeluBackward(dx.data(), x.data(), r.data(), static_cast<int64_t>(x.size()));
  CheckGradient("gelu", x, dx, loss);
  // Known values of GPT-2's tanh approximation.
  double y[3];
  const double in[3] = {0.0, 1.0, -2.0};
  GeluForward(y, in, 3);
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 0.8411919906082768, 1e-15);
  EXPECT_NEAR(y[2], -0.04540230591222453, 1e-15);
}

TEST(ModelOpsTest, SoftmaxCrossEntropyGradientAndValue) {
  const int rows = 4, vocab = 9;
  std::vector<double> z = Random(rows * vocab, 11, 3.0);
  const std::vector<int32_t> targets = {0, 8, 3, 3};
  std::vector<double> probs(z.size());
  auto loss = [&] {
    return SoftmaxCrossEntropyForward(probs.data(), z.data(), targets.data(), rows, vocab);
  };
  const double value = loss();
  // Independent value: mean of log(sum exp z) - z[target].
  double want = 0;
  for (int r = 0; r < rows; ++r) {
    double s = 0;
    for (int v = 0; v < vocab; ++v) s += std::exp(z[r * vocab + v]);
    want += std::log(s) - z[r * vocab + targets[r]];
  }
  EXPECT_NEAR(value, want / rows, 1e-12);
  std::vector<double> dz(z.size(), 0.0);
  SoftmaxCrossEntropyBackward(dz.data(), probs.data(), targets.data(), rows, vocab, 1.0);
  CheckGradient("softmax cross-entropy", z, dz, loss);
}

TEST(ModelOpsTest, AttentionGradientAndCausality) {
  const int batch = 2, seq = 4, c = 6, heads = 2;
  std::vector<double> qkv = Random(batch * seq * 3 * c, 23);
  const std::vector<double> r = Random(batch * seq * c, 24);
  std::vector<double> att(batch * heads * seq * seq);
  std::vector<double> y(batch * seq * c);
  auto loss = [&] {
    AttentionForward(y.data(), att.data(), qkv.data(), batch, seq, c, heads, heads);
    return Dot(y, r);
  };
  loss();
  // Causal: no weight above the diagonal, rows sum to one; the first position sees only itself,
  // so its output is its own value vector.
  for (int bh = 0; bh < batch * heads; ++bh) {
    for (int t = 0; t < seq; ++t) {
      double sum = 0;
      for (int t2 = 0; t2 < seq; ++t2) {
        const double a = att[(bh * seq + t) * seq + t2];
        if (t2 > t) {
          EXPECT_EQ(a, 0.0);
        }
        sum += a;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
    }
  }
  for (int i = 0; i < c; ++i) EXPECT_NEAR(y[i], qkv[2 * c + i], 1e-12);
  std::vector<double> dqkv(qkv.size(), 0.0);
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), batch, seq, c, heads, heads);
  CheckGradient("attention dqkv", qkv, dqkv, loss);
}

// [Note: the qkv layout]: 4 query heads reading 2 key/value heads in place equal multi-head
// attention on the same values with each key/value head repeated for its 2 query heads (Hugging
// Face's repeat_kv), and a key/value head's gradient is the sum of its repeated copies'. The
// gradient by finite differences too.
TEST(ModelOpsTest, GroupedQueryAttentionReadsKeyValueHeadsInPlace) {
  const int batch = 2, seq = 5, heads = 4, kv = 2, hs = 3, c = heads * hs, group = heads / kv;
  const int gqa_row = (heads + 2 * kv) * hs, mha_row = 3 * c;
  std::vector<double> qkv = Random(batch * seq * gqa_row, 31);
  const std::vector<double> r = Random(batch * seq * c, 32);
  // The repeated layout: [q | k repeated | v repeated] per token.
  std::vector<double> rep(batch * seq * mha_row);
  for (int t = 0; t < batch * seq; ++t) {
    const double* g = qkv.data() + t * gqa_row;
    double* m = rep.data() + t * mha_row;
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < hs; ++i) {
        m[h * hs + i] = g[h * hs + i];
        m[c + h * hs + i] = g[c + (h / group) * hs + i];
        m[2 * c + h * hs + i] = g[c + kv * hs + (h / group) * hs + i];
      }
    }
  }
  std::vector<double> att(batch * heads * seq * seq), att_rep(att.size());
  std::vector<double> y(batch * seq * c), y_rep(y.size());
  AttentionForward(y.data(), att.data(), qkv.data(), batch, seq, c, heads, kv);
  AttentionForward(y_rep.data(), att_rep.data(), rep.data(), batch, seq, c, heads, heads);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], y_rep[i], 1e-13) << i;
  std::vector<double> dqkv(qkv.size(), 0.0), drep(rep.size(), 0.0);
  AttentionBackward(dqkv.data(), r.data(), qkv.data(), att.data(), batch, seq, c, heads, kv);
  AttentionBackward(drep.data(), r.data(), rep.data(), att_rep.data(), batch, seq, c, heads, heads);
  for (int t = 0; t < batch * seq; ++t) {
    const double* g = dqkv.data() + t * gqa_row;
    const double* m = drep.data() + t * mha_row;
    for (int i = 0; i < c; ++i) EXPECT_NEAR(g[i], m[i], 1e-13) << "dq " << t << " " << i;
    for (int j = 0; j < kv; ++j) {
      for (int i = 0; i < hs; ++i) {
        double dk = 0, dv = 0;
        for (int h = j * group; h < (j + 1) * group; ++h) {
          dk += m[c + h * hs + i];
          dv += m[2 * c + h * hs + i];
        }
        EXPECT_NEAR(g[c + j * hs + i], dk, 1e-13) << "dk " << t << " " << j;
        EXPECT_NEAR(g[c + kv * hs + j * hs + i], dv, 1e-13) << "dv " << t << " " << j;
      }
    }
  }
  auto loss = [&] {
    AttentionForward(y.data(), att.data(), qkv.data(), batch, seq, c, heads, kv);
    return Dot(y, r);
  };
  CheckGradient("grouped-query attention dqkv", qkv, dqkv, loss);
}

TEST(ModelOpsTest, EmbeddingGradients) {
  const int batch = 2, seq = 3, c = 4, vocab = 5;
  std::vector<double> wte = Random(vocab * c, 12), wpe = Random(seq * c, 13);
  const std::vector<int32_t> tokens = {1, 4, 1, 0, 2, 1};  // token 1 repeats: gradients add up
  const std::vector<double> r = Random(batch * seq * c, 14);
  auto loss = [&] {
    std::vector<double> y(batch * seq * c);
    EmbeddingForward(y.data(), tokens.data(), wte.data(), wpe.data(), batch, seq, c, 0, vocab);
    return Dot(y, r);
  };
  std::vector<double> dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  EmbeddingBackward(dwte.data(), dwpe.data(), r.data(), tokens.data(), batch, seq, c, 0, vocab);
  CheckGradient("embedding dwte", wte, dwte, loss);
  CheckGradient("embedding dwpe", wpe, dwpe, loss);
}

// The vocabulary-parallel embedding: slices of the vocabulary, each with its own rows, summed
// (the position term added by one slice only) give the whole embedding and its gradients.
TEST(ModelOpsTest, EmbeddingVocabularySlicesSumToTheWhole) {
  const int batch = 2, seq = 3, c = 4, vocab = 6;
  const std::vector<double> wte = Random(vocab * c, 12), wpe = Random(seq * c, 13);
  const std::vector<int32_t> tokens = {1, 5, 1, 0, 2, 3};
  const std::vector<double> r = Random(batch * seq * c, 14);
  std::vector<double> whole(batch * seq * c), dwte(wte.size(), 0.0);
  EmbeddingForward(whole.data(), tokens.data(), wte.data(), wpe.data(), batch, seq, c, 0, vocab);
  EmbeddingBackward(dwte.data(), static_cast<double*>(nullptr), r.data(), tokens.data(), batch, seq,
                    c, 0, vocab);
  std::vector<double> sum(whole.size(), 0.0), y(whole.size());
  for (int begin : {0, 2, 4}) {
    EmbeddingForward(y.data(), tokens.data(), wte.data() + begin * c,
                     begin == 0 ? wpe.data() : nullptr, batch, seq, c, begin, 2);
    for (size_t i = 0; i < y.size(); ++i) sum[i] += y[i];
    std::vector<double> part(2 * c, 0.0);
    EmbeddingBackward(part.data(), static_cast<double*>(nullptr), r.data(), tokens.data(), batch,
                      seq, c, begin, 2);
    for (int i = 0; i < 2 * c; ++i) EXPECT_EQ(part[i], dwte[begin * c + i]) << begin << " " << i;
  }
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(sum[i], whole[i]) << i;
}

// LayerNorm -> Matmul -> GELU -> Matmul -> cross-entropy: the backward pieces compose, and the
// accumulating (+=) contract holds when a weight is used twice (tied weights).
TEST(ModelOpsTest, ChainWithTiedWeights) {
  const int rows = 3, c = 6, hidden = 5, vocab = 6;
  std::vector<double> x = Random(rows * c, 15), g = Random(c, 16), b = Random(c, 17);
  std::vector<double> w1 = Random(hidden * c, 18), w2 = Random(vocab * hidden, 19);
  const std::vector<int32_t> targets = {2, 0, 5};
  struct Saved {
    std::vector<double> mean, rstd, ln, h, a, z, probs;
  } s;
  auto forward = [&] {
    s.mean.assign(rows, 0);
    s.rstd.assign(rows, 0);
    s.ln.assign(rows * c, 0);
    s.h.assign(rows * hidden, 0);
    s.a.assign(rows * hidden, 0);
    s.z.assign(rows * vocab, 0);
    s.probs.assign(rows * vocab, 0);
    LayerNormForward(s.ln.data(), s.mean.data(), s.rstd.data(), x.data(), g.data(), b.data(), rows,
                     c);
    MatmulForward(s.h.data(), s.ln.data(), w1.data(), static_cast<const double*>(nullptr), rows, c,
                  hidden);
    GeluForward(s.a.data(), s.h.data(), rows * hidden);
    MatmulForward(s.z.data(), s.a.data(), w2.data(), static_cast<const double*>(nullptr), rows,
                  hidden, vocab);
    // w1 is used a second time, as a tied weight is: ln @ w1^T is also added (overlaid by flat
    // index) onto the logits, so dw1 must accumulate both contributions.
    std::vector<double> extra(rows * hidden);
    MatmulForward(extra.data(), s.ln.data(), w1.data(), static_cast<const double*>(nullptr), rows,
                  c, hidden);
    for (int i = 0; i < rows * vocab && i < rows * hidden; ++i) s.z[i] += 0.5 * extra[i];
    return SoftmaxCrossEntropyForward(s.probs.data(), s.z.data(), targets.data(), rows, vocab);
  };
  forward();
  std::vector<double> dz(rows * vocab, 0), da(rows * hidden, 0), dh(rows * hidden, 0),
      dln(rows * c, 0);
  std::vector<double> dx(x.size(), 0), dg(c, 0), db(c, 0), dw1(w1.size(), 0), dw2(w2.size(), 0);
  SoftmaxCrossEntropyBackward(dz.data(), s.probs.data(), targets.data(), rows, vocab, 1.0);
  std::vector<double> dextra(rows * hidden, 0);
  for (int i = 0; i < rows * vocab && i < rows * hidden; ++i) dextra[i] = 0.5 * dz[i];
  MatmulBackward(dln.data(), dw1.data(), static_cast<double*>(nullptr), dextra.data(), s.ln.data(),
                 w1.data(), rows, c, hidden);
  MatmulBackward(da.data(), dw2.data(), static_cast<double*>(nullptr), dz.data(), s.a.data(),
                 w2.data(), rows, hidden, vocab);
  GeluBackward(dh.data(), s.h.data(), da.data(), rows * hidden);
  MatmulBackward(dln.data(), dw1.data(), static_cast<double*>(nullptr), dh.data(), s.ln.data(),
                 w1.data(), rows, c, hidden);
  LayerNormBackward(dx.data(), dg.data(), db.data(), dln.data(), x.data(), g.data(), s.mean.data(),
                    s.rstd.data(), rows, c);
  CheckGradient("chain dx", x, dx, forward);
  CheckGradient("chain dgamma", g, dg, forward);
  CheckGradient("chain dbeta", b, db, forward);
  CheckGradient("chain dw1 (used twice)", w1, dw1, forward);
  CheckGradient("chain dw2", w2, dw2, forward);
}

TEST(ModelOpsTest, FloatAgreesWithDouble) {
  const int rows = 16, in = 64, out = 48;
  const std::vector<double> xd = Random(rows * in, 20), wd = Random(out * in, 21),
                            bd = Random(out, 22);
  std::vector<float> xf(xd.begin(), xd.end()), wf(wd.begin(), wd.end()), bf(bd.begin(), bd.end());
  std::vector<double> yd(rows * out);
  std::vector<float> yf(rows * out);
  MatmulForward(yd.data(), xd.data(), wd.data(), bd.data(), rows, in, out);
  MatmulForward(yf.data(), xf.data(), wf.data(), bf.data(), rows, in, out);
  for (int i = 0; i < rows * out; ++i) ASSERT_NEAR(yf[i], yd[i], 1e-5 * (std::abs(yd[i]) + 8)) << i;
  std::vector<double> md(rows), rd(rows), ld(rows * in);
  std::vector<float> mf(rows), rf(rows), lf(rows * in);
  const std::vector<double> gd(in, 1.5), betad(in, -0.25);
  const std::vector<float> gf(in, 1.5f), betaf(in, -0.25f);
  LayerNormForward(ld.data(), md.data(), rd.data(), xd.data(), gd.data(), betad.data(), rows, in);
  LayerNormForward(lf.data(), mf.data(), rf.data(), xf.data(), gf.data(), betaf.data(), rows, in);
  for (int i = 0; i < rows * in; ++i) ASSERT_NEAR(lf[i], ld[i], 1e-5) << i;
}

}  // namespace
}  // namespace zerort::cpu
