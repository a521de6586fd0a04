// CUDA twins of the GPT model's kernels against the CPU ones, on fresh random inputs (gpu label;
// skipped with the reason when no GPU is present), in fp32 (1e-5 norm-wise: fp32 accumulation
// in another order) and bf16 (2e-2: bf16 storage of inputs, outputs and intermediates), by the
// harness of cuda_twin.h. The epilogues' and vector kernels' fast paths are
// kernel_fast_paths_cuda_test.cc, the LLaMA family's kernels llama_kernels_cuda_test.cc, the
// whole model on CUDA against the CPU whole_model_cuda_test.cc.
#include <bit>
#include <cmath>
#include <map>
#include <random>
#include <string>

#include "tests/kernels/cuda_twin.h"
#include "zerort/kernels/model_math.h"
#include "zerort/kernels/model_ops.h"
#include "zerort/kernels/op_census.h"
#include "zerort/kernels/op_timeline.h"

namespace zerort::testing {
namespace {

// bf16/fp16 attention at head sizes 64 and 128 runs zerort's flash kernels through the model's
// interface: the log-sum-exp saved (the CPU kernels' own size and values), the backward adding
// into dqkv, against the CPU float kernels on the same rounded inputs; with a sequence tail and
// grouped-query heads.
TEST(ModelKernelsCudaTest, FlashAttentionThroughTheModelKernels) {
  ZR_NEED_GPU();
  for (DType act : {DType::kBF16, DType::kF16}) {
    Twin t(act, DType::kF32);
    for (const int hs : {64, 128}) {
      const int batch = 2, seq = 100, heads = 4, kv = hs == 64 ? 2 : 4, channels = heads * hs;
      SCOPED_TRACE(::testing::Message() << DTypeName(act) << " hs " << hs << " kv " << kv);
      const int64_t rows = int64_t{batch} * seq, row = channels + 2 * int64_t{kv} * hs;
      ASSERT_EQ(t.gpu->attention_program(batch, heads, hs), AttentionProgram::kFlash);
      ASSERT_EQ(t.gpu->AttentionSavedBytes(batch, seq, heads, hs),
                int64_t{batch} * heads * seq * 4);
      std::vector<float> qkv = Random(rows * row, 1, 0.5f), out(rows * channels),
                         lse(int64_t{batch} * heads * seq), glse_host(lse.size()),
                         dout = Random(rows * channels, 2), dqkv = Random(rows * row, 3);
      void *gqkv = t.A(qkv), *gout = t.A(out), *glse = t.Up(glse_host, DType::kF32),
           *gdout = t.A(dout), *gdqkv = t.A(dqkv);
      ASSERT_TRUE(t.gpu->Attention(gout, glse, gqkv, batch, seq, channels, heads, kv).ok());
      ASSERT_TRUE(
          t.cpu->Attention(out.data(), lse.data(), qkv.data(), batch, seq, channels, heads, kv)
              .ok());
      t.Expect("flash Attention out", gout, out, act);
      const std::vector<float> got_lse = t.Down(glse, lse.size(), DType::kF32);
      EXPECT_LE(RelErr(got_lse, lse), 1e-3) << "the saved log-sum-exp";
      // The backward reads the GPU's own out (as the model passes it), writing over dqkv's random
      // values (both sides write it).
      ASSERT_TRUE(
          t.gpu->AttentionBackward(gdqkv, gdout, gqkv, gout, glse, batch, seq, channels, heads, kv)
              .ok());
      ASSERT_TRUE(t.cpu
                      ->AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                          lse.data(), batch, seq, channels, heads, kv)
                      .ok());
      t.Expect("flash AttentionBackward (dqkv written)", gdqkv, dqkv, act);
    }
    const auto launches = *t.gpu->launches();
    EXPECT_EQ(launches.at("FlashAttention"), 2);
    EXPECT_EQ(launches.at("FlashAttentionBackward"), 6);  // D, the main program, dQ: each shape
    EXPECT_EQ(launches.count("CausalSoftmax"), 0u);
  }
  // The bench's baseline: every shape materialised on request.
  Twin t(DType::kBF16, DType::kF32);
  auto stream = *CreateStream(Device::Cuda(0), "compute");
  auto materialised = *MakeCudaModelKernels(DType::kBF16, DType::kF32, *stream, *t.allocator,
                                            AttentionProgram::kMaterialised);
  EXPECT_EQ(materialised->attention_program(2, 4, 64), AttentionProgram::kMaterialised);
  // Wrapped for `bench model --census` and `--timeline`: the wrapper's program (and so the saved
  // bytes the model allocates) is still the run's, not the shape's default (flash here, whose
  // saved bytes are a log-sum-exp a query: the materialised probabilities would overrun them).
  OpCensus census;
  OpTimeline timeline(Device::Cuda(0));
  auto counted = CountOperations(std::move(materialised), &census);
  auto timed = TimeOperations(std::move(counted), &timeline);
  EXPECT_EQ(timed->attention_program(2, 4, 64), AttentionProgram::kMaterialised);
  EXPECT_EQ(timed->AttentionSavedBytes(2, 128, 4, 64), int64_t{2} * 4 * 128 * 128 * 2);
}

TEST(ModelKernelsCudaTest, LinearLayerNormGeluResidual) {
  ZR_NEED_GPU();
  for (auto [act, grad] : kTypes) {
    Twin t(act, grad);
    const int rows = 37, in = 48, out = 72;
    std::vector<float> x = Random(rows * in, 1), w = Random(out * in, 2, 0.2f), b = Random(out, 3),
                       dy = Random(rows * out, 4);
    std::vector<float> y(rows * out), dx = Random(rows * in, 5), dw = Random(out * in, 6),
                                      db = Random(out, 7);
    void *gx = t.A(x), *gw = t.A(w), *gb = t.A(b), *gdy = t.A(dy), *gy = t.A(y);
    void *gdx = t.A(dx), *gdw = t.G(dw), *gdb = t.G(db);
    ASSERT_TRUE(t.gpu->Matmul(gy, gx, gw, gb, rows, in, out).ok());
    ASSERT_TRUE(t.cpu->Matmul(y.data(), x.data(), w.data(), b.data(), rows, in, out).ok());
    t.Expect("Matmul", gy, y, act);
    // A linear layer into the residual stream: one cuBLASLt call with the residual as its C, no
    // Add kernel.
    {
      std::vector<float> res = Random(rows * out, 16), yr(rows * out);
      void *gres = t.A(res), *gyr = t.A(yr);
      const auto before = *t.gpu->launches();
      ASSERT_TRUE(t.gpu->MatmulResidual(gyr, gx, gw, gb, gres, rows, in, out).ok());
      const auto after = *t.gpu->launches();
      ASSERT_TRUE(
          t.cpu->MatmulResidual(yr.data(), x.data(), w.data(), b.data(), res.data(), rows, in, out)
              .ok());
      t.Expect("MatmulResidual", gyr, yr, act);
      auto count = [](const std::map<std::string, int64_t>& m, const char* name) {
        const auto it = m.find(name);
        return it == m.end() ? int64_t{0} : it->second;
      };
      EXPECT_EQ(count(after, "Add"), count(before, "Add")) << "the residual added by an Add kernel";
      EXPECT_EQ(count(after, "cuBLASLt matmul"), count(before, "cuBLASLt matmul") + 1);
      EXPECT_FALSE(t.gpu->MatmulResidual(gres, gx, gw, gb, gres, rows, in, out).ok());
    }
    ASSERT_TRUE(t.gpu->MatmulBackward(gdx, gdw, gdb, gdy, gx, gw, rows, in, out).ok());
    ASSERT_TRUE(t.cpu
                    ->MatmulBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                     rows, in, out)
                    .ok());
    t.Expect("MatmulBackward dinp", gdx, dx, act);
    t.Expect("MatmulBackward dweight", gdw, dw, grad);
    t.Expect("MatmulBackward dbias", gdb, db, grad);
    // The same with dinp written over what it held (beta 0 on the GPU, a fill on the CPU).
    ASSERT_TRUE(t.gpu->MatmulBackwardWrite(gdx, gdw, gdb, gdy, gx, gw, rows, in, out).ok());
    ASSERT_TRUE(t.cpu
                    ->MatmulBackwardWrite(dx.data(), dw.data(), db.data(), dy.data(), x.data(),
                                          w.data(), rows, in, out)
                    .ok());
    t.Expect("MatmulBackwardWrite dinp", gdx, dx, act);
    t.Expect("MatmulBackwardWrite dweight", gdw, dw, grad);
    t.Expect("MatmulBackwardWrite dbias", gdb, db, grad);

    std::vector<float> lw = Random(in, 8), lb = Random(in, 9), ln(rows * in), mean(rows),
                       rstd(rows), dln = Random(rows * in, 10), dlw = Random(in, 11),
                       dlb = Random(in, 12), dlx = Random(rows * in, 13);
    void *glw = t.A(lw), *glb = t.A(lb), *gln = t.A(ln), *gdln = t.A(dln), *gdlx = t.A(dlx);
    void *gdlw = t.G(dlw), *gdlb = t.G(dlb);
    std::vector<float> zeros(rows);
    void* gmean = t.Up(zeros, DType::kF32);
    void* grstd = t.Up(zeros, DType::kF32);
    ASSERT_TRUE(t.gpu->LayerNorm(gln, gmean, grstd, gx, glw, glb, rows, in).ok());
    ASSERT_TRUE(t.cpu
                    ->LayerNorm(ln.data(), mean.data(), rstd.data(), x.data(), lw.data(), lb.data(),
                                rows, in)
                    .ok());
    t.Expect("LayerNorm", gln, ln, act);
    t.Expect("LayerNorm rstd", grstd, rstd, DType::kF32);
    ASSERT_TRUE(
        t.gpu->LayerNormBackward(gdlx, gdlw, gdlb, gdln, gx, glw, gmean, grstd, rows, in).ok());
    ASSERT_TRUE(t.cpu
                    ->LayerNormBackward(dlx.data(), dlw.data(), dlb.data(), dln.data(), x.data(),
                                        lw.data(), mean.data(), rstd.data(), rows, in)
                    .ok());
    t.Expect("LayerNormBackward dinp", gdlx, dlx, act);
    t.Expect("LayerNormBackward dweight", gdlw, dlw, grad);
    t.Expect("LayerNormBackward dbias", gdlb, dlb, grad);

    const int64_t n = rows * in;
    std::vector<float> ge(n), dge = Random(n, 14), sum(n), acc = Random(n, 15);
    void *gge = t.A(ge), *gdge = t.A(dge), *gsum = t.A(sum), *gacc = t.A(acc);
    ASSERT_TRUE(t.gpu->Gelu(gge, gx, n).ok());
    ASSERT_TRUE(t.cpu->Gelu(ge.data(), x.data(), n).ok());
    t.Expect("Gelu", gge, ge, act);
    ASSERT_TRUE(t.gpu->GeluBackward(gdge, gx, gdx, n).ok());
    ASSERT_TRUE(t.cpu->GeluBackward(dge.data(), x.data(), dx.data(), n).ok());
    t.Expect("GeluBackward", gdge, dge, act);
    ASSERT_TRUE(t.gpu->Add(gsum, gx, gdx, n).ok());
    ASSERT_TRUE(t.cpu->Add(sum.data(), x.data(), dx.data(), n).ok());
    t.Expect("Add", gsum, sum, act);
    // The residual connection and the LayerNorm after it, in one launch on the GPU: what Add then
    // LayerNorm give, and in place (sum is a) as the blocks call it.
    {
      std::vector<float> fsum(n), fln(n), fmean(rows), frstd(rows), fln2(n);
      void *gfsum = t.A(fsum), *gfln = t.A(fln), *gfln2 = t.A(fln2), *gin_place = t.A(x);
      void* gfmean = t.Up(zeros, DType::kF32);
      void* gfrstd = t.Up(zeros, DType::kF32);
      ASSERT_TRUE(
          t.gpu->AddLayerNorm(gfsum, gfln, gfmean, gfrstd, gx, gdx, glw, glb, rows, in).ok());
      ASSERT_TRUE(t.cpu
                      ->AddLayerNorm(fsum.data(), fln.data(), fmean.data(), frstd.data(), x.data(),
                                     dx.data(), lw.data(), lb.data(), rows, in)
                      .ok());
      t.Expect("AddLayerNorm sum", gfsum, fsum, act);
      t.Expect("AddLayerNorm", gfln, fln, act);
      t.Expect("AddLayerNorm rstd", gfrstd, frstd, DType::kF32);
      ASSERT_TRUE(
          t.gpu->AddLayerNorm(gin_place, gfln2, gfmean, gfrstd, gin_place, gdx, glw, glb, rows, in)
              .ok());
      t.Expect("AddLayerNorm in place, sum", gin_place, fsum, act);
      t.Expect("AddLayerNorm in place", gfln2, fln, act);
    }
    ASSERT_TRUE(t.gpu->Accumulate(gacc, gx, n).ok());
    ASSERT_TRUE(t.cpu->Accumulate(acc.data(), x.data(), n).ok());
    t.Expect("Accumulate", gacc, acc, act);
    // A weight gradient reduced over the tensor-parallel group, added (grad dtype).
    std::vector<float> wgrad = Random(n, 10), reduced = Random(n, 11);
    void *gwgrad = t.G(wgrad), *greduced = t.G(reduced);
    ASSERT_TRUE(t.gpu->AccumulateGrad(gwgrad, greduced, n).ok());
    ASSERT_TRUE(t.cpu->AccumulateGrad(wgrad.data(), reduced.data(), n).ok());
    t.Expect("AccumulateGrad", gwgrad, wgrad, grad);
    // The row-parallel linear's bias, added after the reduction.
    std::vector<float> biased = Random(rows * out, 8), bias = Random(out, 9);
    void *gbiased = t.A(biased), *gbias = t.A(bias);
    ASSERT_TRUE(t.gpu->AddBias(gbiased, gbias, rows, out).ok());
    ASSERT_TRUE(t.cpu->AddBias(biased.data(), bias.data(), rows, out).ok());
    t.Expect("AddBias", gbiased, biased, act);
  }
}

// The column sums over many row chunks ([Note: column sums] in kernels/launch_geometry.h): 1000
// rows (16 chunks of 64; 32 of 32, the last of 8 rows, for a norm's one-pass backward), rows of
// whole 16-byte vectors (768 columns) and not (100): LayerNorm's and RMSNorm's input and weight
// gradients in one pass (two launches), each alone (their own kernels), and a bias gradient alone
// (no weight gradient, so no BGRADB).
TEST(ModelKernelsCudaTest, ColumnSumsOverManyRowChunks) {
  ZR_NEED_GPU();
  for (auto [act, grad] : kTypes) {
    Twin t(act, grad);
    for (const int d : {768, 100}) {
      SCOPED_TRACE(::testing::Message() << d << " channels");
      const int64_t rows = 1000, n = rows * d;
      std::vector<float> x = Random(n, 1), w = Random(d, 2), b = Random(d, 3), y(n), mean(rows),
                         rstd(rows), dy = Random(n, 4), dx(n), dw = Random(d, 5), db = Random(d, 6),
                         rms_dw = Random(d, 7), rms_rstd(rows);
      void *gx = t.A(x), *gw = t.A(w), *gb = t.A(b), *gy = t.A(y), *gdy = t.A(dy), *gdx = t.A(dx);
      void *gdw = t.G(dw), *gdb = t.G(db), *grms_dw = t.G(rms_dw);
      std::vector<float> zeros(rows);
      void* gmean = t.Up(zeros, DType::kF32);
      void* grstd = t.Up(zeros, DType::kF32);
      void* grms_rstd = t.Up(zeros, DType::kF32);
      ASSERT_TRUE(t.gpu->LayerNorm(gy, gmean, grstd, gx, gw, gb, rows, d).ok());
      ASSERT_TRUE(
          t.cpu
              ->LayerNorm(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, d)
              .ok());
      // All three gradients: one pass over the rows and the finish ([Note: column sums]).
      const std::map<std::string, int64_t> before = *t.gpu->launches();
      ASSERT_TRUE(t.gpu->LayerNormBackward(gdx, gdw, gdb, gdy, gx, gw, gmean, grstd, rows, d).ok());
      const std::map<std::string, int64_t> after = *t.gpu->launches();
      ASSERT_TRUE(t.cpu
                      ->LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(),
                                          w.data(), mean.data(), rstd.data(), rows, d)
                      .ok());
      t.Expect("LayerNormBackward dinp", gdx, dx, act);
      t.Expect("LayerNormBackward dweight", gdw, dw, grad);
      t.Expect("LayerNormBackward dbias", gdb, db, grad);
      auto launched = [&](const char* name) {
        auto count = [&](const std::map<std::string, int64_t>& m) {
          const auto it = m.find(name);
          return it == m.end() ? int64_t{0} : it->second;
        };
        return count(after) - count(before);
      };
      EXPECT_EQ(launched("LayerNormBackward"), 1);
      EXPECT_EQ(launched("column sums (finish)"), 1);
      EXPECT_EQ(launched("column sums (partials)"), 0) << "dout and inp read twice";
      // The input gradient alone, then the weight and bias gradients alone (their own kernels).
      ASSERT_TRUE(
          t.gpu->LayerNormBackward(gdx, nullptr, nullptr, gdy, gx, gw, gmean, grstd, rows, d).ok());
      ASSERT_TRUE(t.cpu
                      ->LayerNormBackward(dx.data(), nullptr, nullptr, dy.data(), x.data(),
                                          w.data(), mean.data(), rstd.data(), rows, d)
                      .ok());
      t.Expect("LayerNormBackward dinp alone", gdx, dx, act);
      ASSERT_TRUE(
          t.gpu->LayerNormBackward(nullptr, gdw, gdb, gdy, gx, gw, gmean, grstd, rows, d).ok());
      ASSERT_TRUE(t.cpu
                      ->LayerNormBackward(nullptr, dw.data(), db.data(), dy.data(), x.data(),
                                          w.data(), mean.data(), rstd.data(), rows, d)
                      .ok());
      t.Expect("LayerNormBackward dweight alone", gdw, dw, grad);
      t.Expect("LayerNormBackward dbias alone", gdb, db, grad);
      ASSERT_TRUE(t.gpu->RmsNorm(gy, grms_rstd, gx, gw, rows, d, 1e-5f).ok());
      ASSERT_TRUE(
          t.cpu->RmsNorm(y.data(), rms_rstd.data(), x.data(), w.data(), rows, d, 1e-5f).ok());
      ASSERT_TRUE(t.gpu->RmsNormBackward(gdx, grms_dw, gdy, gx, gw, grms_rstd, rows, d).ok());
      ASSERT_TRUE(t.cpu
                      ->RmsNormBackward(dx.data(), rms_dw.data(), dy.data(), x.data(), w.data(),
                                        rms_rstd.data(), rows, d)
                      .ok());
      t.Expect("RmsNormBackward dinp", gdx, dx, act);
      t.Expect("RmsNormBackward dweight", grms_dw, rms_dw, grad);
      ASSERT_TRUE(t.gpu->RmsNormBackward(nullptr, grms_dw, gdy, gx, gw, grms_rstd, rows, d).ok());
      ASSERT_TRUE(t.cpu
                      ->RmsNormBackward(nullptr, rms_dw.data(), dy.data(), x.data(), w.data(),
                                        rms_rstd.data(), rows, d)
                      .ok());
      t.Expect("RmsNormBackward dweight alone", grms_dw, rms_dw, grad);
      std::vector<float> bias_grad = Random(d, 8);
      void* gbias_grad = t.G(bias_grad);
      ASSERT_TRUE(
          t.gpu->MatmulBackward(nullptr, nullptr, gbias_grad, gdy, gx, gw, rows, d, d).ok());
      ASSERT_TRUE(t.cpu
                      ->MatmulBackward(nullptr, nullptr, bias_grad.data(), dy.data(), x.data(),
                                       w.data(), rows, d, d)
                      .ok());
      t.Expect("MatmulBackward dbias alone", gbias_grad, bias_grad, grad);
    }
  }
}

// The element arithmetic both devices share (kernels/model_math.h) gives the same bits: GELU and
// its backward and SwiGLU and its backward element by element against the CPU kernels, and
// LayerNorm's and RMSNorm's outputs and LayerNorm's input gradient against the shared functions
// evaluated on the host with the GPU's own row statistics (the order of a row's sum is what the
// devices do not share), in fp32 and bf16.
TEST(ModelKernelsCudaTest, SharedElementMathIsBitwiseTheCpus) {
  ZR_NEED_GPU();
  for (DType act : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(act));
    Twin t(act, DType::kF32);
    const int rows = 67, ch = 768;
    const int64_t n = int64_t{rows} * ch;
    std::vector<float> x = Random(n, 41, 3.0f), dout = Random(n, 42), g(n), dg = Random(n, 43);
    void *gx = t.A(x), *gdout = t.A(dout), *gg = t.A(g), *gdg = t.A(dg);
    ASSERT_TRUE(t.gpu->Gelu(gg, gx, n).ok());
    ASSERT_TRUE(t.cpu->Gelu(g.data(), x.data(), n).ok());
    ExpectSameBits("Gelu", t.Down(gg, n, act), RoundedTo(g, act));
    ASSERT_TRUE(t.gpu->GeluBackward(gdg, gx, gdout, n).ok());
    ASSERT_TRUE(t.cpu->GeluBackward(dg.data(), x.data(), dout.data(), n).ok());
    ExpectSameBits("GeluBackward", t.Down(gdg, n, act), RoundedTo(dg, act));

    std::vector<float> w = Random(ch, 44), b = Random(ch, 45), ln(n), stats(rows),
                       dx = Random(n, 46);
    void *gw = t.A(w), *gb = t.A(b), *gln = t.A(ln), *gdx = t.A(dx);
    void* gmean = t.Up(stats, DType::kF32);
    void* grstd = t.Up(stats, DType::kF32);
    ASSERT_TRUE(t.gpu->LayerNorm(gln, gmean, grstd, gx, gw, gb, rows, ch).ok());
    const std::vector<float> mean = t.Down(gmean, rows, DType::kF32),
                             rstd = t.Down(grstd, rows, DType::kF32);
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = math::LayerNormOut(x[i], mean[i / ch], rstd[i / ch], w[i % ch], b[i % ch]);
    }
    ExpectSameBits("LayerNorm", t.Down(gln, n, act), RoundedTo(want, act));
    // The input gradient with the row means of the dnorm terms computed on the host: only the
    // sums' order may differ, so compare to a tolerance of one part in 1e5 of the row's scale.
    ASSERT_TRUE(
        t.gpu->LayerNormBackward(gdx, nullptr, nullptr, gdout, gx, gw, gmean, grstd, rows, ch)
            .ok());
    const std::vector<float> got_dx = t.Down(gdx, n, act);
    for (int r = 0; r < rows; ++r) {
      double dm = 0, dnm = 0;
      for (int c = 0; c < ch; ++c) {
        const float dnorm = math::LayerNormDnorm(dout[r * ch + c], w[c]);
        dm += dnorm;
        dnm += math::LayerNormDnormNorm(dnorm, x[r * ch + c], mean[r], rstd[r]);
      }
      for (int c = 0; c < ch; c += 97) {
        const int64_t i = int64_t{r} * ch + c;
        const float want_dx = dx[i] + math::LayerNormInputGrad(dout[i], w[c], x[i], mean[r],
                                                               rstd[r], static_cast<float>(dm / ch),
                                                               static_cast<float>(dnm / ch));
        EXPECT_NEAR(got_dx[i], want_dx,
                    (act == DType::kF32 ? 1e-4 : 2e-2) * (1 + std::abs(want_dx)))
            << "LayerNormBackward dinp at row " << r << " column " << c;
      }
    }

    // The LLaMA family's: RMSNorm's output from the GPU's rstd, SwiGLU and its backward (the
    // gate_up rows interleaved: x as [rows, 2 x 384]; the vectorised kernels).
    std::vector<float> rms(n);
    void* grms = t.A(rms);
    void* grr = t.Up(stats, DType::kF32);
    ASSERT_TRUE(t.gpu->RmsNorm(grms, grr, gx, gw, rows, ch, 1e-5f).ok());
    const std::vector<float> rr = t.Down(grr, rows, DType::kF32);
    for (int64_t i = 0; i < n; ++i) want[i] = math::RmsNormOut(x[i], rr[i / ch], w[i % ch]);
    ExpectSameBits("RmsNorm", t.Down(grms, n, act), RoundedTo(want, act));
    const int cols = ch / 2;
    std::vector<float> sg(n / 2), dgu = Random(n, 47);
    void *gsg = t.A(sg), *gdgu = t.A(dgu);
    ASSERT_TRUE(t.gpu->SwiGlu(gsg, gx, rows, cols, true).ok());
    ASSERT_TRUE(t.cpu->SwiGlu(sg.data(), x.data(), rows, cols, true).ok());
    ExpectSameBits("SwiGlu", t.Down(gsg, n / 2, act), RoundedTo(sg, act));
    ASSERT_TRUE(t.gpu->SwiGluBackward(gdgu, gdout, gx, rows, cols, true).ok());
    ASSERT_TRUE(t.cpu->SwiGluBackward(dgu.data(), dout.data(), x.data(), rows, cols, true).ok());
    ExpectSameBits("SwiGluBackward", t.Down(gdgu, n, act), RoundedTo(dgu, act));
  }
}

// The GEMMs on operands as the model hands them: sub-views of flat buffers, 32 bytes past a
// 256-byte boundary (FlatLayout's alignment in bf16; cuBLASLt assumes 256 unless told,
// [Note: cuBLASLt plans]), GPT-2's odd vocabulary as the output width, and the same shape again
// at another alignment (a second plan). Then empty launches: no rows.
TEST(ModelKernelsCudaTest, MatmulOnSubViewsOddShapesAndNoRows) {
  ZR_NEED_GPU();
  const int rows = 8, in = 768, out = 50257;
  const std::vector<float> x0 = Random(rows * in, 21), w0 = Random(size_t{out} * in, 22, 0.05f),
                           b0 = Random(out, 23), dy0 = Random(size_t{rows} * out, 24),
                           dx0 = Random(rows * in, 25), dw0 = Random(size_t{out} * in, 26),
                           db0 = Random(out, 27);
  for (auto [act, grad] : kTypes) {
    Twin t(act, grad);
    for (size_t offset : {size_t{32}, size_t{0}, size_t{96}}) {
      std::vector<float> x = x0, w = w0, b = b0, dy = dy0, y(size_t{rows} * out), dx = dx0,
                         dw = dw0, db = db0;
      void *gx = t.Up(x, act, offset), *gw = t.Up(w, act, offset), *gb = t.Up(b, act, offset);
      void *gdy = t.Up(dy, act, offset), *gy = t.Up(y, act, offset);
      void *gdx = t.Up(dx, act, offset), *gdw = t.Up(dw, grad, offset),
           *gdb = t.Up(db, grad, offset);
      SCOPED_TRACE(::testing::Message() << "offset " << offset << " " << DTypeName(act));
      ASSERT_TRUE(t.gpu->Matmul(gy, gx, gw, gb, rows, in, out).ok());
      ASSERT_TRUE(t.cpu->Matmul(y.data(), x.data(), w.data(), b.data(), rows, in, out).ok());
      t.Expect("Matmul", gy, y, act);
      ASSERT_TRUE(t.gpu->MatmulBackward(gdx, gdw, gdb, gdy, gx, gw, rows, in, out).ok());
      ASSERT_TRUE(t.cpu
                      ->MatmulBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(),
                                       w.data(), rows, in, out)
                      .ok());
      t.Expect("MatmulBackward dinp", gdx, dx, act);
      t.Expect("MatmulBackward dweight", gdw, dw, grad);
      t.Expect("MatmulBackward dbias", gdb, db, grad);
      t.buffers.clear();
    }
    // No rows: every launch is a no-op that succeeds (a grid of 0 is an invalid configuration).
    std::vector<float> w = Random(64 * 32, 28), b = Random(64, 29), lw = Random(32, 30);
    void *gw = t.A(w), *gb = t.A(b), *glw = t.A(lw);
    std::vector<float> one(1);
    void* scratch = t.Up(one, DType::kF32);
    EXPECT_TRUE(t.gpu->Matmul(scratch, scratch, gw, gb, 0, 32, 64).ok());
    EXPECT_TRUE(
        t.gpu->MatmulBackward(scratch, scratch, scratch, scratch, scratch, gw, 0, 32, 64).ok());
    EXPECT_TRUE(t.gpu->LayerNorm(scratch, scratch, scratch, scratch, glw, glw, 0, 32).ok());
    EXPECT_TRUE(t.gpu->Gelu(scratch, scratch, 0).ok());
    EXPECT_TRUE(t.gpu->Add(scratch, scratch, scratch, 0).ok());
    EXPECT_TRUE(t.gpu->CrossEntropy(scratch, scratch, nullptr, 0, 64, 64, 1.0f).ok());
    EXPECT_TRUE(t.gpu->VocabMax(scratch, scratch, 0, 64, 64).ok());
    EXPECT_TRUE(t.stream->Synchronize().ok());
  }
}

// A token seen 1024 times gets the sum of its 1024 rows, also when the gradients are 16-bit:
// bf16 atomic adds would stop at 256 (256 + 1 rounds to 256); the sums are made in fp32.
TEST(ModelKernelsCudaTest, RepeatedTokenGradientsAreSummedInFp32) {
  ZR_NEED_GPU();
  for (auto [act, grad] : kTypes) {
    SCOPED_TRACE(::testing::Message() << DTypeName(act) << "/" << DTypeName(grad));
    Twin t(act, grad);
    const int batch = 4, seq = 256, ch = 8, vocab = 16;
    std::vector<float> dout(size_t{batch} * seq * ch, 1.0f), dwte(vocab * ch, 0.0f),
        dwpe(seq * ch, 0.0f);
    void *gdout = t.A(dout), *gdwte = t.G(dwte), *gdwpe = t.G(dwpe);
    int32_t* ids = t.Ids(std::vector<int32_t>(batch * seq, 3));
    ASSERT_TRUE(t.gpu->EmbeddingBackward(gdwte, gdwpe, gdout, ids, batch, seq, ch, 0, vocab).ok());
    const std::vector<float> wte = t.Down(gdwte, vocab * ch, grad);
    const std::vector<float> wpe = t.Down(gdwpe, seq * ch, grad);
    for (int i = 0; i < vocab * ch; ++i) ASSERT_EQ(wte[i], i / ch == 3 ? 1024.0f : 0.0f) << i;
    for (int i = 0; i < seq * ch; ++i) ASSERT_EQ(wpe[i], 4.0f) << i;
  }
}

// [Note: the training loss ledger]: per-row losses (fp32 statistics) reduced on the device into
// the ledger, read once and zeroed, against the CPU kernels' double ledger.
TEST(ModelKernelsCudaTest, LossLedgerMatchesTheCpus) {
  ZR_NEED_GPU();
  Twin t(DType::kF32, DType::kF32);
  std::vector<float> a = Random(1000, 11), b = Random(37, 12);
  const void* ga = t.A(a);
  const void* gb = t.A(b);
  for (int repeat = 0; repeat < 2; ++repeat) {
    ASSERT_TRUE(t.gpu->AddToLossLedger(ga, 1000, 1000.0).ok());
    ASSERT_TRUE(t.gpu->AddToLossLedger(gb, 37, 37.0).ok());
    ASSERT_TRUE(t.cpu->AddToLossLedger(a.data(), 1000, 1000.0).ok());
    ASSERT_TRUE(t.cpu->AddToLossLedger(b.data(), 37, 37.0).ok());
  }
  const double want = *t.cpu->TakeLossLedger();
  EXPECT_NEAR(*t.gpu->TakeLossLedger(), want, 1e-5 * std::abs(want) + 1e-6);
  EXPECT_EQ(*t.gpu->TakeLossLedger(), 0.0);
}

// The launch counts `zerort bench model --census` reads: one per kernel, per library GEMM, per
// memset and per copy to the host, by kind; the CPU kernels count none.
TEST(ModelKernelsCudaTest, LaunchesAreCountedByKind) {
  ZR_NEED_GPU();
  Twin t(DType::kF32, DType::kF32);
  EXPECT_FALSE(t.cpu->launches().has_value());
  ASSERT_TRUE(t.gpu->launches().has_value());
  const std::map<std::string, int64_t> before = *t.gpu->launches();
  auto delta = [&](const std::string& what) {
    const std::map<std::string, int64_t> now = *t.gpu->launches();
    const auto b = before.find(what);
    const auto a = now.find(what);
    return (a != now.end() ? a->second : 0) - (b != before.end() ? b->second : 0);
  };
  const int rows = 4, in = 8, out = 16;
  std::vector<float> x = Random(rows * in, 1), w = Random(out * in, 2), y(rows * out),
                     lw = Random(in, 3), lb = Random(in, 4), ln(rows * in), stats(rows);
  void *gx = t.A(x), *gw = t.A(w), *gy = t.A(y), *glw = t.A(lw), *glb = t.A(lb), *gln = t.A(ln);
  void* gmean = t.Up(stats, DType::kF32);
  void* grstd = t.Up(stats, DType::kF32);
  ASSERT_TRUE(t.gpu->Matmul(gy, gx, gw, nullptr, rows, in, out).ok());
  ASSERT_TRUE(t.gpu->LayerNorm(gln, gmean, grstd, gx, glw, glb, rows, in).ok());
  ASSERT_TRUE(t.gpu->LayerNorm(gln, gmean, grstd, gx, glw, glb, rows, in).ok());
  std::vector<double> host(rows * out);
  ASSERT_TRUE(t.gpu->ActToHost(gy, rows * out, host.data()).ok());
  EXPECT_EQ(delta("cuBLASLt matmul"), 1);
  EXPECT_EQ(delta("LayerNorm"), 2);
  EXPECT_EQ(delta("copy to host"), 1);
}

TEST(ModelKernelsCudaTest, AttentionEmbeddingCrossEntropy) {
  ZR_NEED_GPU();
  for (auto [act, grad] : kTypes) {
    Twin t(act, grad);
    const int batch = 3, seq = 33, channels = 48, heads = 4, vocab = 101;
    const int64_t rows = int64_t{batch} * seq;
    // Each side saves its own state for the backward: the GPU the probabilities, the CPU (flash)
    // a log-sum-exp per query; the GPU's probabilities are checked against the CPU reference
    // (model_ops.h, which saves probabilities). Multi-head, then grouped-query (4 query heads on
    // 2 key/value heads, [Note: the qkv layout]).
    std::vector<float> dout = Random(rows * channels, 2);
    void* gdout = t.A(dout);
    for (const int kv : {heads, 2}) {
      SCOPED_TRACE(::testing::Message() << kv << " key/value heads");
      const int64_t row = channels + 2 * int64_t{kv} * (channels / heads);
      std::vector<float> qkv = Random(rows * row, 1), out(rows * channels),
                         att(int64_t{batch} * heads * seq * seq), probs(att.size()),
                         lse(int64_t{batch} * heads * seq), ref_out(out.size()),
                         dqkv = Random(rows * row, 3);
      void *gqkv = t.A(qkv), *gout = t.A(out), *gatt = t.A(att), *gdqkv = t.A(dqkv);
      ASSERT_EQ(t.gpu->attention_program(batch, heads, channels / heads),
                AttentionProgram::kMaterialised);  // head size 12
      ASSERT_EQ(t.gpu->AttentionSavedBytes(batch, seq, heads, channels / heads),
                static_cast<int64_t>(att.size() * DTypeSize(act)));
      ASSERT_TRUE(t.gpu->Attention(gout, gatt, gqkv, batch, seq, channels, heads, kv).ok());
      ASSERT_TRUE(
          t.cpu->Attention(out.data(), lse.data(), qkv.data(), batch, seq, channels, heads, kv)
              .ok());
      cpu::AttentionForward<float>(ref_out.data(), probs.data(), qkv.data(), batch, seq, channels,
                                   heads, kv);
      t.Expect("Attention out", gout, out, act);
      t.Expect("Attention probabilities", gatt, probs, act);
      ASSERT_TRUE(
          t.gpu->AttentionBackward(gdqkv, gdout, gqkv, gout, gatt, batch, seq, channels, heads, kv)
              .ok());
      ASSERT_TRUE(t.cpu
                      ->AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                          lse.data(), batch, seq, channels, heads, kv)
                      .ok());
      t.Expect("AttentionBackward", gdqkv, dqkv, act);
    }

    std::vector<int32_t> tokens(rows);
    std::mt19937 rng(4);
    for (int32_t& id : tokens) id = static_cast<int32_t>(rng() % vocab);
    int32_t* gtok = t.Ids(tokens);
    std::vector<float> wte = Random(vocab * channels, 5), wpe = Random(seq * channels, 6),
                       emb(rows * channels), dwte = Random(vocab * channels, 7),
                       dwpe = Random(seq * channels, 8);
    void *gwte = t.A(wte), *gwpe = t.A(wpe), *gemb = t.A(emb), *gdwte = t.G(dwte),
         *gdwpe = t.G(dwpe);
    ASSERT_TRUE(t.gpu->Embedding(gemb, gtok, gwte, gwpe, batch, seq, channels, 0, vocab).ok());
    ASSERT_TRUE(t.cpu
                    ->Embedding(emb.data(), tokens.data(), wte.data(), wpe.data(), batch, seq,
                                channels, 0, vocab)
                    .ok());
    t.Expect("Embedding", gemb, emb, act);
    ASSERT_TRUE(
        t.gpu->EmbeddingBackward(gdwte, gdwpe, gdout, gtok, batch, seq, channels, 0, vocab).ok());
    ASSERT_TRUE(t.cpu
                    ->EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), batch,
                                        seq, channels, 0, vocab)
                    .ok());
    t.Expect("EmbeddingBackward wte", gdwte, dwte, grad);
    t.Expect("EmbeddingBackward wpe", gdwpe, dwpe, grad);
    // A vocabulary slice (tensor parallelism): rows [40, 80) of wte, no position term.
    ASSERT_TRUE(t.gpu->Embedding(gemb, gtok, gwte, nullptr, batch, seq, channels, 40, 40).ok());
    ASSERT_TRUE(t.cpu
                    ->Embedding(emb.data(), tokens.data(), wte.data(), nullptr, batch, seq,
                                channels, 40, 40)
                    .ok());
    t.Expect("Embedding slice", gemb, emb, act);
    ASSERT_TRUE(
        t.gpu->EmbeddingBackward(gdwte, nullptr, gdout, gtok, batch, seq, channels, 40, 40).ok());
    ASSERT_TRUE(t.cpu
                    ->EmbeddingBackward(dwte.data(), nullptr, dout.data(), tokens.data(), batch,
                                        seq, channels, 40, 40)
                    .ok());
    t.Expect("EmbeddingBackward slice", gdwte, dwte, grad);

    // The fused cross-entropy over rows of 101 logits (the scalar kernel) and of 104 (whole
    // 128-bit vectors: CrossEntropyKernel at kVec); and of 20001 and 50304, where each of the
    // block's 1024 threads meets several logits or vectors and its running maximum rises
    // ([Note: the cross-entropy's online sum]); and padded rows (GPT-2's 50,257 of 50,304; 101
    // of 104, the last vector part padding), the padding large and never counted, its gradient 0.
    // The targets are tokens below `vocab` (101), so every one is a real column: a target in the
    // padding is the caller's error (the thirteenth GPU run had 97 of 104, and the two sides
    // wrote different gradients there).
    for (const auto& [cv, valid] : {std::pair{vocab, vocab},
                                    {104, 104},
                                    {104, vocab},
                                    {20001, 20001},
                                    {50304, 50304},
                                    {50304, 50257}}) {
      SCOPED_TRACE(::testing::Message() << "cross-entropy over " << valid << " of " << cv);
      std::vector<float> logits = Random(rows * cv, 9, 3.0f), losses(rows);
      for (int64_t r = 0; r < rows; ++r) {
        std::fill(logits.begin() + r * cv + valid, logits.begin() + (r + 1) * cv, 50.0f);
      }
      void* glogits = t.A(logits);
      std::vector<float> zeros(rows);
      void* glosses = t.Up(zeros, DType::kF32);
      ASSERT_TRUE(t.gpu->CrossEntropy(glogits, glosses, gtok, rows, cv, valid, 2.0f).ok());
      ASSERT_TRUE(
          t.cpu->CrossEntropy(logits.data(), losses.data(), tokens.data(), rows, cv, valid, 2.0f)
              .ok());
      t.Expect("CrossEntropy losses", glosses, losses, DType::kF32);
      t.Expect("CrossEntropy gradient", glogits, logits, act);
    }

    // The vocabulary-parallel parts on one rank's 40 columns, 33 of them real, from column 60.
    const int local = 40, valid = 33, begin = 60;
    std::vector<float> part = Random(rows * local, 10, 3.0f), vmax(rows), sums(2 * rows),
                       vloss(rows);
    void* gpart = t.A(part);
    std::vector<float> zmax(rows), zsums(2 * rows), zloss(rows);
    void *gmax = t.Up(zmax, DType::kF32), *gsums = t.Up(zsums, DType::kF32),
         *gvloss = t.Up(zloss, DType::kF32);
    ASSERT_TRUE(t.gpu->VocabMax(gpart, gmax, rows, local, valid).ok());
    ASSERT_TRUE(t.cpu->VocabMax(part.data(), vmax.data(), rows, local, valid).ok());
    t.Expect("VocabMax", gmax, vmax, DType::kF32);
    ASSERT_TRUE(t.gpu->VocabSums(gpart, gmax, gtok, gsums, rows, local, valid, begin).ok());
    ASSERT_TRUE(t.cpu
                    ->VocabSums(part.data(), vmax.data(), tokens.data(), sums.data(), rows, local,
                                valid, begin)
                    .ok());
    t.Expect("VocabSums", gsums, sums, DType::kF32);
    ASSERT_TRUE(t.gpu
                    ->VocabCrossEntropyFinish(gpart, gvloss, gmax, gsums, gtok, rows, local, valid,
                                              begin, 2.0f)
                    .ok());
    ASSERT_TRUE(t.cpu
                    ->VocabCrossEntropyFinish(part.data(), vloss.data(), vmax.data(), sums.data(),
                                              tokens.data(), rows, local, valid, begin, 2.0f)
                    .ok());
    t.Expect("VocabCrossEntropyFinish losses", gvloss, vloss, DType::kF32);
    t.Expect("VocabCrossEntropyFinish gradient", gpart, part, act);
  }
}

}  // namespace
}  // namespace zerort::testing
