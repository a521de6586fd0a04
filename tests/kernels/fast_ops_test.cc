// The float path of the model's CPU operations (kernels/cpu/fast_ops: threaded, vectorised,
// flash-style attention) against the double reference of model_ops.cc, op by op, forward
// and backward (backward ops add into non-zero gradients); the same bits at 1, 2 and 3 OpenMP
// threads; causality of the flash attention (a prefix reproduces the full sequence's rows).
// Shapes are chosen so that the ops are split over threads and the attention's sequence is not
// a multiple of its 64-position tiles.
#include <omp.h>

#include <cmath>
#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/random_floats.h"
#include "zerort/kernels/cpu/fast_ops.h"
#include "zerort/kernels/cpu/vector_math.h"
#include "zerort/kernels/model_math.h"
#include "zerort/kernels/model_ops.h"

namespace zerort::cpu {
namespace {

std::vector<double> Random(size_t n, uint32_t seed, double scale = 1) {
  return testing::RandomNormal<double>(n, seed, scale);
}
std::vector<float> ToFloat(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// |float - double| <= tol x (|double| + floor), element by element.
void ExpectClose(const char* what, const std::vector<float>& f, const std::vector<double>& d,
                 double tol, double floor = 1.0) {
  ASSERT_EQ(f.size(), d.size()) << what;
  for (size_t i = 0; i < f.size(); ++i) {
    ASSERT_NEAR(f[i], d[i], tol * (std::abs(d[i]) + floor)) << what << " element " << i;
  }
}

constexpr int kRows = 200, kChannels = 96;

// FastExp against libm over its whole range: relative error below 3e-7; the clamps; NaN.
TEST(FastOpsTest, FastExpIsAccurateEverywhere) {
  double worst = 0;
  for (float x = -87.0f; x < 88.3f; x += 0.00137f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(FastExp(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_GT(FastExp(-1000.0f), 0.0f);
  EXPECT_LT(FastExp(-1000.0f), 2e-38f);
  EXPECT_TRUE(std::isfinite(FastExp(1000.0f)));
  EXPECT_GT(FastExp(1000.0f), 1e38f);
  EXPECT_TRUE(std::isnan(FastExp(NAN)));
  EXPECT_EQ(FastExp(0.0f), 1.0f);
}

TEST(FastOpsTest, MatmulBiasAndItsGradient) {
  const int in = 40, out = kChannels;
  const auto x = Random(kRows * in, 1), w = Random(out * in, 2), b = Random(out, 3),
             dy = Random(kRows * out, 4), db0 = Random(out, 5);
  std::vector<double> yd(kRows * out), dbd = db0;
  std::vector<float> yf(kRows * out), dbf = ToFloat(db0);
  MatmulForward(yd.data(), x.data(), w.data(), b.data(), kRows, in, out);
  MatmulForward(yf.data(), ToFloat(x).data(), ToFloat(w).data(), ToFloat(b).data(), kRows, in, out);
  ExpectClose("matmul out", yf, yd, 1e-5, 8);
  MatmulBackward<double>(nullptr, nullptr, dbd.data(), dy.data(), x.data(), w.data(), kRows, in,
                         out);
  MatmulBackward<float>(nullptr, nullptr, dbf.data(), ToFloat(dy).data(), ToFloat(x).data(),
                        ToFloat(w).data(), kRows, in, out);
  ExpectClose("bias gradient", dbf, dbd, 1e-5, 16);
}

TEST(FastOpsTest, LayerNormForwardAndBackward) {
  const auto x = Random(kRows * kChannels, 6, 2), w = Random(kChannels, 7),
             b = Random(kChannels, 8), dy = Random(kRows * kChannels, 9),
             dx0 = Random(kRows * kChannels, 10), dw0 = Random(kChannels, 11),
             db0 = Random(kChannels, 12);
  std::vector<double> yd(x.size()), md(kRows), rd(kRows), dxd = dx0, dwd = dw0, dbd = db0;
  std::vector<float> yf(x.size()), mf(kRows), rf(kRows), dxf = ToFloat(dx0), dwf = ToFloat(dw0),
                                                         dbf = ToFloat(db0);
  const auto xf = ToFloat(x), wf = ToFloat(w), bf = ToFloat(b), dyf = ToFloat(dy);
  LayerNormForward(yd.data(), md.data(), rd.data(), x.data(), w.data(), b.data(), kRows, kChannels);
  LayerNormForward(yf.data(), mf.data(), rf.data(), xf.data(), wf.data(), bf.data(), kRows,
                   kChannels);
  ExpectClose("layernorm out", yf, yd, 1e-5);
  ExpectClose("mean", mf, md, 1e-5);
  ExpectClose("rstd", rf, rd, 1e-5);
  LayerNormBackward(dxd.data(), dwd.data(), dbd.data(), dy.data(), x.data(), w.data(), md.data(),
                    rd.data(), kRows, kChannels);
  LayerNormBackward(dxf.data(), dwf.data(), dbf.data(), dyf.data(), xf.data(), wf.data(), mf.data(),
                    rf.data(), kRows, kChannels);
  ExpectClose("layernorm dinp", dxf, dxd, 1e-5);
  ExpectClose("layernorm dweight", dwf, dwd, 1e-5, 16);
  ExpectClose("layernorm dbias", dbf, dbd, 1e-5, 16);
}

// The residual add fused with the LayerNorm after it: against the double reference, and to the
// bit what Add then LayerNorm give in float (in place, as the block calls it: sum is a).
TEST(FastOpsTest, AddLayerNormIsAddThenLayerNorm) {
  const auto a = Random(kRows * kChannels, 41, 2), res = Random(kRows * kChannels, 42),
             w = Random(kChannels, 43), b = Random(kChannels, 44);
  std::vector<double> sd(a.size()), yd(a.size()), md(kRows), rd(kRows);
  for (size_t i = 0; i < a.size(); ++i) sd[i] = a[i] + res[i];
  LayerNormForward(yd.data(), md.data(), rd.data(), sd.data(), w.data(), b.data(), kRows,
                   kChannels);
  const auto resf = ToFloat(res), wf = ToFloat(w), bf = ToFloat(b);
  std::vector<float> sf = ToFloat(a), yf(a.size()), mf(kRows), rf(kRows);
  fast::AddLayerNormForward(sf.data(), yf.data(), mf.data(), rf.data(), sf.data(), resf.data(),
                            wf.data(), bf.data(), kRows, kChannels, 1e-5f);
  ExpectClose("sum", sf, sd, 1e-6);
  ExpectClose("layernorm out", yf, yd, 1e-5);
  ExpectClose("mean", mf, md, 1e-5);
  ExpectClose("rstd", rf, rd, 1e-5);
  std::vector<float> s2 = ToFloat(a), y2(a.size()), m2(kRows), r2(kRows);
  fast::Add(s2.data(), s2.data(), resf.data(), static_cast<int64_t>(s2.size()));
  LayerNormForward(y2.data(), m2.data(), r2.data(), s2.data(), wf.data(), bf.data(), kRows,
                   kChannels);
  EXPECT_EQ(sf, s2);
  EXPECT_EQ(yf, y2);
  EXPECT_EQ(mf, m2);
  EXPECT_EQ(rf, r2);
}

// The MLP's first-layer epilogue: bias then GELU in one pass, against the double reference, and
// without a bias.
TEST(FastOpsTest, BiasGeluIsBiasThenGelu) {
  const int cols = 4 * kChannels;
  const auto pre = Random(kRows * cols, 45, 2), bias = Random(cols, 46);
  std::vector<double> pd(pre.size()), gd(pre.size());
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < cols; ++c) pd[r * cols + c] = pre[r * cols + c] + bias[c];
  }
  GeluForward(gd.data(), pd.data(), static_cast<int64_t>(pd.size()));
  std::vector<float> pf = ToFloat(pre), gf(pre.size());
  fast::BiasGelu(pf.data(), gf.data(), ToFloat(bias).data(), kRows, cols);
  ExpectClose("pre + bias", pf, pd, 1e-6);
  ExpectClose("gelu", gf, gd, 2e-6);
  std::vector<double> g0(pre.size());
  GeluForward(g0.data(), pre.data(), static_cast<int64_t>(pre.size()));
  std::vector<float> p0 = ToFloat(pre), gf0(pre.size());
  fast::BiasGelu(p0.data(), gf0.data(), nullptr, kRows, cols);
  EXPECT_EQ(p0, ToFloat(pre));
  ExpectClose("gelu without bias", gf0, g0, 2e-6);
}

TEST(FastOpsTest, GeluForwardAndBackwardOverTheWholeRange) {
  const int n = 70'000;
  auto x = Random(n, 13, 3);
  x[0] = -100, x[1] = 100, x[2] = 0, x[3] = -9, x[4] = 9;  // saturated and exact points
  const auto dy = Random(n, 14), dx0 = Random(n, 15);
  std::vector<double> yd(n), dxd = dx0;
  std::vector<float> yf(n), dxf = ToFloat(dx0);
  GeluForward(yd.data(), x.data(), n);
  GeluForward(yf.data(), ToFloat(x).data(), n);
  ExpectClose("gelu", yf, yd, 2e-6);
  GeluBackward(dxd.data(), x.data(), dy.data(), n);
  GeluBackward(dxf.data(), ToFloat(x).data(), ToFloat(dy).data(), n);
  ExpectClose("gelu backward", dxf, dxd, 1e-5);
}

TEST(FastOpsTest, FusedCrossEntropyValueAndGradient) {
  const int rows = 70, vocab = 300;
  const auto z = Random(rows * vocab, 16, 4);
  std::vector<int32_t> targets(rows);
  for (int r = 0; r < rows; ++r) targets[r] = (r * 37) % vocab;
  std::vector<double> zd = z, ld(rows);
  std::vector<float> zf = ToFloat(z), lf(rows);
  SoftmaxCrossEntropyFused(zd.data(), ld.data(), targets.data(), rows, vocab, vocab, 2.0);
  SoftmaxCrossEntropyFused(zf.data(), lf.data(), targets.data(), rows, vocab, vocab, 2.0f);
  ExpectClose("losses", lf, ld, 1e-5);
  ExpectClose("dlogits", zf, zd, 1e-5, 1e-3);
}

// Rows padded past the vocabulary (parallel.make_vocab_size_divisible_by): the padding, however
// large, is not counted, and its gradient is 0; the rest is the unpadded row's, bitwise.
TEST(FastOpsTest, FusedCrossEntropyIgnoresThePadding) {
  const int rows = 9, vocab = 301, padded = 320;
  const auto z = Random(rows * vocab, 17, 4);
  std::vector<int32_t> targets(rows);
  for (int r = 0; r < rows; ++r) targets[r] = (r * 53) % vocab;
  auto check = [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> whole(z.begin(), z.end()), lw(rows), pad(rows * padded, T(80)), lp(rows);
    for (int r = 0; r < rows; ++r) {
      std::copy_n(whole.begin() + r * vocab, vocab, pad.begin() + r * padded);
    }
    SoftmaxCrossEntropyFused(whole.data(), lw.data(), targets.data(), rows, vocab, vocab, T(2));
    SoftmaxCrossEntropyFused(pad.data(), lp.data(), targets.data(), rows, padded, vocab, T(2));
    EXPECT_EQ(lp, lw);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < padded; ++c) {
        ASSERT_EQ(pad[r * padded + c], c < vocab ? whole[r * vocab + c] : T(0))
            << "row " << r << " column " << c;
      }
    }
  };
  check(0.0);
  check(0.0f);
}

// The LLaMA family's float path (llama_ops.cc: RMSNorm and SwiGLU through the per-width loops)
// against its double reference, forward and backward adding into non-zero gradients, SwiGLU in
// both layouts. And the same bits at 1, 2 and 3 threads: RMSNorm on 1000 rows of 96 (at least
// 2^14 elements a thread: up to 5 pieces; the weight gradient's 32 blocks of rows in up to 6),
// SwiGLU on 200 rows of 293 (3 pieces).
TEST(FastOpsTest, RmsNormAndSwiGluAgainstTheDoubleReference) {
  const int cols = 3 * kChannels + 5, rows = 1000;
  const auto x = Random(rows * kChannels, 71, 2), w = Random(kChannels, 72),
             dy = Random(rows * kChannels, 73), dx0 = Random(rows * kChannels, 74),
             dw0 = Random(kChannels, 75), gu = Random(kRows * 2 * cols, 76, 3),
             dout = Random(kRows * cols, 77), dgu0 = Random(kRows * 2 * cols, 78);
  auto run = [&](auto zero) {
    using T = decltype(zero);
    auto in = [](const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); };
    const auto xt = in(x), wt = in(w), dyt = in(dy), gut = in(gu), doutt = in(dout);
    std::vector<T> y(x.size()), rstd(rows), dx = in(dx0), dw = in(dw0), dxo = in(dx0),
                                            dwo = in(dw0);
    RmsNormForward<T>(y.data(), rstd.data(), xt.data(), wt.data(), rows, kChannels, T(1e-5));
    RmsNormBackward<T>(dx.data(), dw.data(), dyt.data(), xt.data(), wt.data(), rstd.data(), rows,
                       kChannels);
    // Each gradient alone, the other skipped.
    RmsNormBackward<T>(dxo.data(), nullptr, dyt.data(), xt.data(), wt.data(), rstd.data(), rows,
                       kChannels);
    RmsNormBackward<T>(nullptr, dwo.data(), dyt.data(), xt.data(), wt.data(), rstd.data(), rows,
                       kChannels);
    std::vector<std::vector<T>> r{y, rstd, dx, dw, dxo, dwo};
    for (bool interleaved : {false, true}) {
      std::vector<T> o(dout.size()), d = in(dgu0);
      SwiGluForward<T>(o.data(), gut.data(), kRows, cols, interleaved);
      SwiGluBackward<T>(d.data(), doutt.data(), gut.data(), kRows, cols, interleaved);
      r.push_back(o);
      r.push_back(d);
    }
    return r;
  };
  const auto ref = run(0.0);
  const auto got = run(0.0f);
  const char* names[] = {"rmsnorm out",        "rstd",
                         "rmsnorm dinp",       "rmsnorm dweight",
                         "dinp alone",         "dweight alone",
                         "swiglu planar",      "dgate_up planar",
                         "swiglu interleaved", "dgate_up interleaved"};
  const double floors[] = {1, 1, 1, 16, 1, 16, 1, 1, 1, 1};
  for (size_t i = 0; i < ref.size(); ++i) ExpectClose(names[i], got[i], ref[i], 1e-5, floors[i]);
  EXPECT_EQ(got[2], got[4]) << "the input gradient with and without the weight's";
  EXPECT_EQ(got[3], got[5]) << "the weight gradient with and without the input's";
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    const auto again = run(0.0f);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(again[i], got[i]) << names[i] << " at " << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

// [Note: sums in written-out lanes] (kernels/cpu/vector_math.h): a row's sum with element c in
// lane c % 16, the lanes then added 8, 4, 2 and 1 apart, in a plain scalar loop (this file is
// built for the baseline alone). The kernels run the machine's ZR_CPU_CLONES version, and
// tools/cpu_levels.py runs this test on emulated AVX2 and SSE4.2 CPUs: every version must give
// these bits.
float LaneSum(int n, const std::function<float(int)>& term) {
  float lane[16] = {};
  for (int c = 0; c < n; ++c) lane[c % 16] += term(c);
  for (int w = 8; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  }
  return lane[0];
}

// The LayerNorm forward and backward, the fused cross-entropy, RMSNorm and SwiGLU against the
// kernels' own arithmetic (the shared element math of kernels/model_math.h) summed in LaneSum's
// order: the same bits, whatever the machine's vector width. Rows of 101 channels: six rounds of
// the lanes and a tail of five.
TEST(FastOpsTest, RowSumsGiveTheSameBitsInEveryVectorWidth) {
  const int rows = 9, ch = 101;
  const float eps = 1e-5f;
  const auto x = ToFloat(Random(rows * ch, 51, 2)), w = ToFloat(Random(ch, 52)),
             b = ToFloat(Random(ch, 53)), dy = ToFloat(Random(rows * ch, 54)),
             dx0 = ToFloat(Random(rows * ch, 55)), dw0 = ToFloat(Random(ch, 56));
  std::vector<float> y(x.size()), mean(rows), rstd(rows), dx = dx0, dw = dw0;
  fast::LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, ch,
                         eps);
  fast::LayerNormBackward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), mean.data(),
                          rstd.data(), rows, ch);
  std::vector<float> ye(x.size()), me(rows), re(rows), dxe = dx0, dwe = dw0, pw(ch, 0.0f);
  const float inv = math::InverseCount(ch);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * ch;
    const float* dyr = dy.data() + r * ch;
    const float m = LaneSum(ch, [&](int c) { return xr[c]; }) * inv;
    const float sq = LaneSum(ch, [&](int c) { return math::SquaredDeviation(xr[c], m); });
    const float s = math::LayerNormRstd(sq, inv, eps);
    for (int c = 0; c < ch; ++c) ye[r * ch + c] = math::LayerNormOut(xr[c], m, s, w[c], b[c]);
    me[r] = m;
    re[r] = s;
    const float dm = LaneSum(ch, [&](int c) { return math::LayerNormDnorm(dyr[c], w[c]); }) * inv;
    const float dnm =
        LaneSum(ch,
                [&](int c) {
                  return math::LayerNormDnormNorm(math::LayerNormDnorm(dyr[c], w[c]), xr[c], m, s);
                }) *
        inv;
    for (int c = 0; c < ch; ++c) {
      dxe[r * ch + c] += math::LayerNormInputGrad(dyr[c], w[c], xr[c], m, s, dm, dnm);
      pw[c] += math::LayerNormWeightGrad(xr[c], m, s, dyr[c]);  // one block of rows (< 32)
    }
  }
  for (int c = 0; c < ch; ++c) dwe[c] += pw[c];
  EXPECT_EQ(y, ye);
  EXPECT_EQ(mean, me);
  EXPECT_EQ(rstd, re);
  EXPECT_EQ(dx, dxe);
  EXPECT_EQ(dw, dwe);

  const int vocab = 211, valid = 203;  // 12 rounds of the lanes and a tail of 11; padding
  const float scale = 0.5f;
  const auto z0 = ToFloat(Random(rows * vocab, 57, 4));
  std::vector<int32_t> targets(rows);
  for (int r = 0; r < rows; ++r) targets[r] = (r * 29) % valid;
  std::vector<float> z = z0, loss(rows), ze = z0, losse(rows);
  fast::SoftmaxCrossEntropyFused(z.data(), loss.data(), targets.data(), rows, vocab, valid, scale);
  for (int r = 0; r < rows; ++r) {
    float* zr = ze.data() + r * vocab;
    float max = zr[0];
    for (int v = 1; v < valid; ++v) max = std::max(max, zr[v]);
    const float log_sum = std::log(LaneSum(valid, [&](int v) { return FastExp(zr[v] - max); }));
    losse[r] = math::CrossEntropyLoss(zr[targets[r]], max, log_sum);
    for (int v = 0; v < vocab; ++v) {
      zr[v] = v < valid ? math::CrossEntropyGrad(zr[v], max + log_sum, scale) : 0.0f;
    }
    zr[targets[r]] = math::CrossEntropyTargetGrad(zr[targets[r]], scale);
  }
  EXPECT_EQ(loss, losse);
  EXPECT_EQ(z, ze);

  // RMSNorm (llama_ops.cc's float path), forward and backward, and SwiGLU's element math.
  std::vector<float> ry(x.size()), rr(rows), rdx = dx0, rdw = dw0;
  RmsNormForward<float>(ry.data(), rr.data(), x.data(), w.data(), rows, ch, eps);
  RmsNormBackward<float>(rdx.data(), rdw.data(), dy.data(), x.data(), w.data(), rr.data(), rows,
                         ch);
  std::vector<float> rye(x.size()), rre(rows), rdxe = dx0, rdwe = dw0, rpw(ch, 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * ch;
    const float* dyr = dy.data() + r * ch;
    const float s =
        math::RmsNormRstd(LaneSum(ch, [&](int c) { return math::RmsNormSquare(xr[c]); }), inv, eps);
    for (int c = 0; c < ch; ++c) rye[r * ch + c] = math::RmsNormOut(xr[c], s, w[c]);
    rre[r] = s;
    const float dot =
        LaneSum(ch, [&](int c) { return math::RmsNormDot(dyr[c], w[c], xr[c], s); }) * inv;
    for (int c = 0; c < ch; ++c) {
      rdxe[r * ch + c] = math::RmsNormInputGrad(rdxe[r * ch + c], dyr[c], w[c], xr[c], s, dot);
      rpw[c] += math::RmsNormWeightGrad(dyr[c], xr[c], s);
    }
  }
  for (int c = 0; c < ch; ++c) rdwe[c] += rpw[c];
  EXPECT_EQ(ry, rye);
  EXPECT_EQ(rr, rre);
  EXPECT_EQ(rdx, rdxe);
  EXPECT_EQ(rdw, rdwe);
  std::vector<float> so(x.size()), sd(2 * x.size());
  SwiGluForward<float>(so.data(), dx0.data(), rows, ch / 2, false);
  SwiGluBackward<float>(sd.data(), dy.data(), dx0.data(), rows, ch / 2, false);
  const int64_t n = int64_t{rows} * (ch / 2);
  for (int64_t i = 0; i < n; ++i) {
    const float g = dx0[i], u = dx0[i + n], s = math::Sigmoid(g);
    ASSERT_EQ(so[i], math::SwiGlu(g, u)) << "swiglu element " << i;
    ASSERT_EQ(sd[i], math::SwiGluGateGrad(dy[i], g, u, s)) << "d gate element " << i;
    ASSERT_EQ(sd[i + n], math::SwiGluUpGrad(dy[i], g, s)) << "d up element " << i;
  }
}

// ChunkResults (kernels/cpu/vector_math.h), which LAMB's, 1-bit LAMB's and the norm's sums use:
// a double sum over fixed chunks, added in chunk order, has the same bits at 1, 2 and 3 threads
// and equals the chunks summed one after the other here. Values of mixed magnitudes, so that
// another order (an OpenMP reduction's, or chunks that follow the thread count) changes bits.
TEST(FastOpsTest, ChunkResultsSumTheSameAtAnyThreadCount) {
  const int64_t n = 5 * 4096 + 123, chunk = 4096;
  std::vector<double> x = Random(static_cast<size_t>(n), 61);
  for (int64_t i = 0; i < n; ++i) x[i] *= std::ldexp(1.0, static_cast<int>(i % 41) - 20);
  double want = 0;
  for (int64_t b = 0; b < n; b += chunk) {
    double part = 0;
    for (int64_t i = b; i < std::min(n, b + chunk); ++i) part += x[i];
    want += part;
  }
  const int threads = omp_get_max_threads();
  for (int t : {1, 2, 3}) {
    omp_set_num_threads(t);
    double got = 0;
    for (double part : ChunkResults(n, chunk, [&](int64_t b, int64_t e) {
           double sum = 0;
           for (int64_t i = b; i < e; ++i) sum += x[i];
           return sum;
         })) {
      got += part;
    }
    EXPECT_EQ(got, want) << t << " threads";
  }
  omp_set_num_threads(threads);
}

struct AttentionShape {
  int batch = 2, seq = 150, channels = 48, heads = 3, kv_heads = 3;
  int row() const {
    return channels + 2 * kv_heads * (channels / heads);
  }  // [Note: the qkv layout]
  size_t qkv() const { return static_cast<size_t>(batch) * seq * row(); }
  size_t out() const { return static_cast<size_t>(batch) * seq * channels; }
  size_t att() const { return static_cast<size_t>(batch) * heads * seq * seq; }
  size_t lse() const { return static_cast<size_t>(batch) * heads * seq; }
};

// The flash attention (log-sum-exp saved, probabilities never held) against the double
// reference (probabilities saved): the output, each query's log-sum-exp computed here from the
// scores, and the input gradient (added into a non-zero one).
TEST(FastOpsTest, FlashAttentionForwardAndBackward) {
  // Multi-head (GPT-2), and grouped-query with groups of 2 and of 4 query heads.
  for (const AttentionShape& s : {AttentionShape{}, AttentionShape{.heads = 4, .kv_heads = 2},
                                  AttentionShape{.heads = 4, .kv_heads = 1}}) {
    SCOPED_TRACE(::testing::Message() << s.heads << " heads, " << s.kv_heads << " kv heads");
    const auto qkv = Random(s.qkv(), 17), dout = Random(s.out(), 18);
    // dqkv starts as NaN: both backwards write every element.
    std::vector<double> od(s.out()), ad(s.att()), dd(s.qkv(), std::nan(""));
    std::vector<float> of(s.out()), lse(s.lse()), df(s.qkv(), std::nanf(""));
    const auto qf = ToFloat(qkv);
    AttentionForward(od.data(), ad.data(), qkv.data(), s.batch, s.seq, s.channels, s.heads,
                     s.kv_heads);
    fast::FlashAttentionForward(of.data(), lse.data(), qf.data(), s.batch, s.seq, s.channels,
                                s.heads, s.kv_heads);
    ExpectClose("attention out", of, od, 1e-5);
    const int hs = s.channels / s.heads, group = s.heads / s.kv_heads;
    std::vector<double> lse_ref;
    for (int b = 0; b < s.batch; ++b) {
      for (int h = 0; h < s.heads; ++h) {
        for (int t = 0; t < s.seq; ++t) {
          double sum = 0;
          for (int t2 = 0; t2 <= t; ++t2) {
            double dot = 0;
            for (int c = 0; c < hs; ++c) {
              dot += qkv[(static_cast<size_t>(b) * s.seq + t) * s.row() + h * hs + c] *
                     qkv[(static_cast<size_t>(b) * s.seq + t2) * s.row() + s.channels +
                         (h / group) * hs + c];
            }
            sum += std::exp(dot / std::sqrt(static_cast<double>(hs)));
          }
          lse_ref.push_back(std::log(sum));
        }
      }
    }
    ExpectClose("log-sum-exp", lse, lse_ref, 1e-5);
    AttentionBackward(dd.data(), dout.data(), qkv.data(), ad.data(), s.batch, s.seq, s.channels,
                      s.heads, s.kv_heads);
    fast::FlashAttentionBackward(df.data(), ToFloat(dout).data(), qf.data(), of.data(), lse.data(),
                                 s.batch, s.seq, s.channels, s.heads, s.kv_heads);
    ExpectClose("dqkv", df, dd, 1e-5);
  }
}

TEST(FastOpsTest, FlashAttentionIsCausal) {
  AttentionShape full;
  const auto qkv = ToFloat(Random(full.qkv(), 20));
  std::vector<float> out(full.out()), lse(full.lse());
  fast::FlashAttentionForward(out.data(), lse.data(), qkv.data(), full.batch, full.seq,
                              full.channels, full.heads, full.kv_heads);
  for (int prefix : {1, 63, 64, 65, 129}) {
    AttentionShape p = full;
    p.seq = prefix;
    // The first `prefix` positions of every sequence, alone.
    std::vector<float> pqkv;
    for (int b = 0; b < full.batch; ++b) {
      const auto* row = qkv.data() + static_cast<size_t>(b) * full.seq * full.row();
      pqkv.insert(pqkv.end(), row, row + static_cast<size_t>(prefix) * full.row());
    }
    std::vector<float> pout(p.out()), plse(p.lse());
    fast::FlashAttentionForward(pout.data(), plse.data(), pqkv.data(), p.batch, p.seq, p.channels,
                                p.heads, p.kv_heads);
    for (int b = 0; b < full.batch; ++b) {
      for (int i = 0; i < prefix * full.channels; ++i) {
        const float want = out[static_cast<size_t>(b) * full.seq * full.channels + i];
        ASSERT_NEAR(pout[static_cast<size_t>(b) * prefix * full.channels + i], want,
                    1e-5 * (std::abs(want) + 1))
            << "prefix " << prefix << " batch " << b << " element " << i;
      }
    }
  }
}

// Every float op at 1, 2 and 3 threads: the same bits. 1000 rows of 96, so that the row ops
// split (at least 2^14 elements a thread: up to 5 pieces; the column sums' 32 blocks up to 6).
TEST(FastOpsTest, ThreadCountChangesNoBit) {
  const int rows = 1000;
  const AttentionShape s;
  const auto x = ToFloat(Random(rows * kChannels, 21)), w = ToFloat(Random(kChannels, 22)),
             b = ToFloat(Random(kChannels, 23)), dy = ToFloat(Random(rows * kChannels, 24)),
             qkv = ToFloat(Random(s.qkv(), 25)), dout = ToFloat(Random(s.out(), 26)),
             gw3 = ToFloat(Random(3 * kChannels * kChannels, 27));
  const AttentionShape gqa{.heads = 4, .kv_heads = 1};
  const auto gqkv = ToFloat(Random(gqa.qkv(), 28));
  std::vector<int32_t> targets(rows);
  for (int r = 0; r < rows; ++r) targets[r] = (r * 7) % kChannels;
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<std::vector<float>> r;
    std::vector<float> y(x.size()), m(rows), rs(rows), dx(x.size()), dw(kChannels), db(kChannels),
        g(x.size()), dg(x.size()), z = x, l(rows);
    LayerNormForward(y.data(), m.data(), rs.data(), x.data(), w.data(), b.data(), rows, kChannels);
    LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), m.data(),
                      rs.data(), rows, kChannels);
    MatmulBackward<float>(nullptr, nullptr, db.data(), dy.data(), x.data(), w.data(), rows, 1,
                          kChannels);
    // The linear layer's three GEMMs (oneDNN or OpenBLAS), the weight gradient's k = rows.
    std::vector<float> mo(static_cast<size_t>(rows) * 3 * kChannels), mdx(x.size()),
        mdw(static_cast<size_t>(3) * kChannels * kChannels);
    MatmulForward<float>(mo.data(), x.data(), gw3.data(), nullptr, rows, kChannels, 3 * kChannels);
    MatmulBackward<float>(mdx.data(), mdw.data(), nullptr, mo.data(), x.data(), gw3.data(), rows,
                          kChannels, 3 * kChannels);
    std::vector<float> asum = x, aln(x.size()), am(rows), ar(rows), bgp = x, bgo(x.size());
    fast::AddLayerNormForward(asum.data(), aln.data(), am.data(), ar.data(), asum.data(), dy.data(),
                              w.data(), b.data(), rows, kChannels, 1e-5f);
    fast::BiasGelu(bgp.data(), bgo.data(), b.data(), rows, kChannels);
    GeluForward(g.data(), x.data(), static_cast<int64_t>(x.size()));
    GeluBackward(dg.data(), x.data(), dy.data(), static_cast<int64_t>(x.size()));
    SoftmaxCrossEntropyFused(z.data(), l.data(), targets.data(), rows, kChannels, kChannels, 1.0f);
    std::vector<float> o(s.out()), a(s.lse()), dq(s.qkv());
    fast::FlashAttentionForward(o.data(), a.data(), qkv.data(), s.batch, s.seq, s.channels, s.heads,
                                s.kv_heads);
    fast::FlashAttentionBackward(dq.data(), dout.data(), qkv.data(), o.data(), a.data(), s.batch,
                                 s.seq, s.channels, s.heads, s.kv_heads);
    // Grouped-query (4 query heads on 1 key/value head): the backward's one task per key/value
    // head adds its query heads' dK and dV in order.
    std::vector<float> go(gqa.out()), ga(gqa.lse()), gdq(gqa.qkv());
    fast::FlashAttentionForward(go.data(), ga.data(), gqkv.data(), gqa.batch, gqa.seq, gqa.channels,
                                gqa.heads, gqa.kv_heads);
    fast::FlashAttentionBackward(gdq.data(), dout.data(), gqkv.data(), go.data(), ga.data(),
                                 gqa.batch, gqa.seq, gqa.channels, gqa.heads, gqa.kv_heads);
    for (auto* v : {&y,    &m,   &rs, &dx, &dw,  &db,  &g,  &dg, &z,   &l,  &o,   &a,  &dq,
                    &asum, &aln, &am, &ar, &bgp, &bgo, &go, &ga, &gdq, &mo, &mdx, &mdw})
      r.push_back(*v);
    return r;
  };
  const int saved = omp_get_max_threads();
  const auto one = run(1), two = run(2), three = run(3);
  omp_set_num_threads(saved);
  // zerort's own ops (the first 22 outputs) to the bit. The linear layer's GEMMs (the last 3) go
  // to the GEMM library, and OpenBLAS changes its blocking with the thread count (oneDNN did not
  // at these shapes): those agree to 1e-5 of the output's largest magnitude (sums of products
  // that cancel), the documented tolerance.
  for (size_t i = 0; i < one.size(); ++i) {
    if (i < 22) {
      EXPECT_EQ(one[i], two[i]) << "output " << i << " at 2 threads";
      EXPECT_EQ(one[i], three[i]) << "output " << i << " at 3 threads";
      continue;
    }
    float largest = 0;
    for (float x : one[i]) largest = std::max(largest, std::abs(x));
    for (const auto* other : {&two[i], &three[i]}) {
      ASSERT_EQ(other->size(), one[i].size());
      for (size_t j = 0; j < one[i].size(); ++j) {
        ASSERT_NEAR((*other)[j], one[i][j], 1e-5 * largest)
            << "GEMM output " << i << " element " << j;
      }
    }
  }
}

}  // namespace
}  // namespace zerort::cpu
