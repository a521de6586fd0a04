// The CUDA kernels' fast paths against the CPU twins (cuda_twin.h): GPT-2's MLP through
// cuBLASLt's GELU, DGELU and BGRADB epilogues ([Note: cuBLASLt epilogues]), and the 128-bit
// element-wise and row kernels with their scalar fallbacks ([Note: the row kernels' width]).
#include "tests/kernels/cuda_twin.h"

namespace zerort::testing {
namespace {

// GPT-2's MLP through cuBLASLt's GELU epilogues ([Note: cuBLASLt epilogues]): MatmulGelu (pre
// and GELU(pre)) and GeluMatmulBackward (dpre written, dW and db added) against the CPU, in 16
// bits with no GELU kernel launched, and cuBLASLt's GELU the tanh form; the bias gradient by
// BGRADB where the weight gradients are fp32.
TEST(ModelKernelsCudaTest, GeluEpiloguesMatchTheCpu) {
  ZR_NEED_GPU();
  for (auto [act, grad] : kTypes) {
    Twin t(act, grad);
    const int rows = 37, in = 48, out = 72;
    std::vector<float> x = Random(rows * in, 1), w = Random(out * in, 2, 0.2f), b = Random(out, 3);
    void *gx = t.A(x), *gw = t.A(w), *gb = t.A(b);
    // The MLP's first layer: pre and GELU(pre); in 16 bits one cuBLASLt call with the GELU
    // epilogue ([Note: cuBLASLt epilogues]), no GELU kernel launched.
    std::vector<float> pre(rows * out), act_out(rows * out);
    void *gpre = t.A(pre), *gact = t.A(act_out);
    const auto before = *t.gpu->launches();
    ASSERT_TRUE(t.gpu->MatmulGelu(gpre, gact, gx, gw, gb, rows, in, out).ok());
    ASSERT_TRUE(
        t.cpu->MatmulGelu(pre.data(), act_out.data(), x.data(), w.data(), b.data(), rows, in, out)
            .ok());
    t.Expect("MatmulGelu pre", gpre, pre, act);
    t.Expect("MatmulGelu out", gact, act_out, act);
    const auto after = *t.gpu->launches();
    auto count = [](const std::map<std::string, int64_t>& m, const char* what) {
      const auto it = m.find(what);
      return it == m.end() ? int64_t{0} : it->second;
    };
    EXPECT_EQ(count(after, "Gelu") - count(before, "Gelu"), act == DType::kF32 ? 1 : 0)
        << DTypeName(act) << ": the GELU epilogue was not used";
    // Which GELU: at x = -3 the tanh form (GPT-2's and zerort's) is -0.0036374 and erf's
    // -0.0040497, 27 of bf16's steps (1.5e-5 there) apart. x = -3 x I.
    {
      const int n8 = 8;
      std::vector<float> x3(n8 * n8, -3.0f), eye(n8 * n8, 0.0f), zero(n8, 0.0f), p3(n8 * n8),
          y3(n8 * n8);
      for (int i = 0; i < n8; ++i) eye[i * n8 + i] = 1.0f;
      void *gx3 = t.A(x3), *geye = t.A(eye), *gzero = t.A(zero), *gp3 = t.A(p3), *gy3 = t.A(y3);
      ASSERT_TRUE(t.gpu->MatmulGelu(gp3, gy3, gx3, geye, gzero, n8, n8, n8).ok());
      const std::vector<float> got = t.Down(gy3, y3.size(), act);
      EXPECT_NEAR(got[0], -0.0036374f, 3e-5f) << DTypeName(act) << ": GELU(-3) = " << got[0];
      // The derivative likewise: gelu'(-3) is -0.0115842 (tanh form), -0.0119456 (erf's).
      std::vector<float> dpre3(n8 * n8), scratch3(n8 * n8), dw3(n8 * n8), db3(n8);
      void *gdpre3 = t.A(dpre3), *gs3 = t.A(scratch3), *gdw3 = t.G(dw3), *gdb3 = t.G(db3);
      ASSERT_TRUE(
          t.gpu->GeluMatmulBackward(gdpre3, gdw3, gdb3, geye, gy3, gp3, geye, gs3, n8, n8, n8)
              .ok());
      const std::vector<float> d3 = t.Down(gdpre3, dpre3.size(), act);
      EXPECT_NEAR(d3[0], -0.0115842f, 9e-5f) << DTypeName(act) << ": gelu'(-3) = " << d3[0];
      EXPECT_EQ(d3[1], 0.0f);
    }
    // The projection's backward through GELU: dpre written (not added), dW and db added.
    {
      std::vector<float> pre2 = Random(rows * out, 31), act2(rows * out),
                         dy2 = Random(rows * in, 32), w2 = Random(in * out, 33, 0.2f),
                         dpre = Random(rows * out, 34), scratch(rows * out),
                         dw2 = Random(in * out, 35), db2 = Random(in, 36);
      for (size_t i = 0; i < act2.size(); ++i) {
        act2[i] = pre2[i] > 0 ? pre2[i] : 0.1f * pre2[i];  // any act: it only feeds dW
      }
      void *gpre2 = t.A(pre2), *gact2 = t.A(act2), *gdy2 = t.A(dy2), *gw2 = t.A(w2),
           *gdpre = t.A(dpre), *gscratch = t.A(scratch), *gdw2 = t.G(dw2), *gdb2 = t.G(db2);
      const auto launched = *t.gpu->launches();
      // rows x out in, in features out: the layer maps out (GELU's width) to in.
      ASSERT_TRUE(t.gpu
                      ->GeluMatmulBackward(gdpre, gdw2, gdb2, gdy2, gact2, gpre2, gw2, gscratch,
                                           rows, out, in)
                      .ok());
      ASSERT_TRUE(t.cpu
                      ->GeluMatmulBackward(dpre.data(), dw2.data(), db2.data(), dy2.data(),
                                           act2.data(), pre2.data(), w2.data(), scratch.data(),
                                           rows, out, in)
                      .ok());
      t.Expect("GeluMatmulBackward dpre", gdpre, dpre, act);
      t.Expect("GeluMatmulBackward dweight", gdw2, dw2, grad);
      t.Expect("GeluMatmulBackward dbias", gdb2, db2, grad);
      const auto now = *t.gpu->launches();
      EXPECT_EQ(count(now, "GeluBackward") - count(launched, "GeluBackward"),
                act == DType::kF32 ? 1 : 0)
          << DTypeName(act) << ": the DGELU epilogue was not used";
      // With fp32 weight gradients from 16-bit activations the bias gradient is BGRADB's sums,
      // added by a small kernel; otherwise the column sums read dout ([Note: column sums]).
      const bool bgradb = act != DType::kF32 && grad == DType::kF32;
      EXPECT_EQ(count(now, "BiasGradAdd") - count(launched, "BiasGradAdd"), bgradb ? 1 : 0)
          << DTypeName(act) << "/" << DTypeName(grad) << ": the BGRADB epilogue was not used";
      EXPECT_EQ(count(now, "column sums (partials)") - count(launched, "column sums (partials)"),
                bgradb ? 0 : 1)
          << DTypeName(act) << "/" << DTypeName(grad) << ": the bias's column sums";
    }
  }
}

// The element-wise kernels' 128-bit paths (kVec elements a load) and their scalar fallbacks (a
// length not a multiple of 8, a pointer not 16-byte aligned) give the CPU's bits: Add,
// Accumulate, AccumulateGrad (SwiGLU's two paths: LlamaRmsNormRopeSwiGlu); and the norms' row
// kernels at both widths agree with the CPU.
TEST(ModelKernelsCudaTest, VectorisedElementWiseKernelsAndTheirFallbacks) {
  ZR_NEED_GPU();
  for (auto [act, grad] : kTypes) {
    Twin t(act, grad);
    for (const auto& [n, offset] : {std::pair<int, size_t>{64, 0}, {61, 0}, {64, 4}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(act) << "/" << DTypeName(grad) << " n " << n
                                        << " offset " << offset << " bytes");
      std::vector<float> a = Random(n, 1), b = Random(n, 2), out(n), g = Random(n, 3),
                         h = Random(n, 4);
      void *ga = t.Up(a, act, offset), *gb = t.Up(b, act, offset), *gout = t.Up(out, act, offset);
      void *gg = t.Up(g, grad, offset), *gh = t.Up(h, grad, offset);
      ASSERT_TRUE(t.gpu->Add(gout, ga, gb, n).ok());
      ASSERT_TRUE(t.cpu->Add(out.data(), a.data(), b.data(), n).ok());
      ExpectSameBits("Add", t.Down(gout, n, act), RoundedTo(out, act));
      ASSERT_TRUE(t.gpu->Accumulate(ga, gb, n).ok());
      ASSERT_TRUE(t.cpu->Accumulate(a.data(), b.data(), n).ok());
      ExpectSameBits("Accumulate", t.Down(ga, n, act), RoundedTo(a, act));
      ASSERT_TRUE(t.gpu->AccumulateGrad(gg, gh, n).ok());
      ASSERT_TRUE(t.cpu->AccumulateGrad(g.data(), h.data(), n).ok());
      ExpectSameBits("AccumulateGrad", t.Down(gg, n, grad), RoundedTo(g, grad));
    }
    // The warp-per-row kernels at both widths ([Note: the row kernels' width]): rows of 64
    // channels (8 a lane) and of 60 (one a lane), against the CPU.
    for (const int ch : {64, 60}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(act) << " rows of " << ch << " channels");
      const int rows = 5;
      const float eps = 1e-5f;
      std::vector<float> x = Random(rows * ch, 11), r = Random(rows * ch, 12), w = Random(ch, 13),
                         b = Random(ch, 14), dy = Random(rows * ch, 15), dx = Random(rows * ch, 16),
                         dx2 = Random(rows * ch, 17), out(rows * ch), sum(rows * ch),
                         out2(rows * ch), sum2(rows * ch), mean(rows), rstd(rows), rstd2(rows);
      void *gx = t.A(x), *gr = t.A(r), *gw = t.A(w), *gb = t.A(b), *gdy = t.A(dy), *gdx = t.A(dx),
           *gdx2 = t.A(dx2), *gout = t.A(out), *gsum = t.A(sum), *gout2 = t.A(out2),
           *gsum2 = t.A(sum2);
      void *gmean = t.Up(mean, DType::kF32), *grstd = t.Up(rstd, DType::kF32),
           *grstd2 = t.Up(rstd2, DType::kF32);
      ASSERT_TRUE(t.gpu->AddLayerNorm(gsum, gout, gmean, grstd, gx, gr, gw, gb, rows, ch).ok());
      ASSERT_TRUE(t.cpu
                      ->AddLayerNorm(sum.data(), out.data(), mean.data(), rstd.data(), x.data(),
                                     r.data(), w.data(), b.data(), rows, ch)
                      .ok());
      t.Expect("AddLayerNorm out", gout, out, act);
      ASSERT_TRUE(
          t.gpu->LayerNormBackward(gdx, nullptr, nullptr, gdy, gsum, gw, gmean, grstd, rows, ch)
              .ok());
      ASSERT_TRUE(t.cpu
                      ->LayerNormBackward(dx.data(), nullptr, nullptr, dy.data(), sum.data(),
                                          w.data(), mean.data(), rstd.data(), rows, ch)
                      .ok());
      t.Expect("LayerNormBackward dinp", gdx, dx, act);
      ASSERT_TRUE(t.gpu->AddRmsNorm(gsum2, gout2, grstd2, gx, gr, gw, rows, ch, eps).ok());
      ASSERT_TRUE(t.cpu
                      ->AddRmsNorm(sum2.data(), out2.data(), rstd2.data(), x.data(), r.data(),
                                   w.data(), rows, ch, eps)
                      .ok());
      t.Expect("AddRmsNorm out", gout2, out2, act);
      ASSERT_TRUE(t.gpu->RmsNormBackward(gdx2, nullptr, gdy, gsum2, gw, grstd2, rows, ch).ok());
      ASSERT_TRUE(t.cpu
                      ->RmsNormBackward(dx2.data(), nullptr, dy.data(), sum2.data(), w.data(),
                                        rstd2.data(), rows, ch)
                      .ok());
      t.Expect("RmsNormBackward dinp", gdx2, dx2, act);
    }
  }
}

}  // namespace
}  // namespace zerort::testing
