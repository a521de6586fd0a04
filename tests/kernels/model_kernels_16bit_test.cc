// The 16-bit CPU model kernels (bf16 and fp16 storage, fp32 math): each op widens its operands,
// runs the float kernel and rounds each result once, so its output is, bit for bit, the float
// kernel's output on the widened inputs rounded to the format (and fp32 outputs equal exactly);
// the attention rounds its probabilities as the CUDA flash programs do, inside the float kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tests/kernels/random_floats.h"
#include "zerort/kernels/cpu/fast_ops.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/runtime/dtype.h"

namespace zerort {
namespace {

struct Format {
  CpuPrecision precision;
  uint16_t (*to_bits)(float);
  float (*to_float)(uint16_t);
  const char* name;
};
const Format kFormats[] = {{CpuPrecision::kBf16, FloatToBf16Bits, Bf16BitsToFloat, "bf16"},
                           {CpuPrecision::kF16, FloatToF16Bits, F16BitsToFloat, "fp16"}};

// Random values already representable in the format, as bits and as floats.
struct Values {
  std::vector<uint16_t> bits;
  std::vector<float> floats;
};
Values Make(const Format& f, size_t n, uint32_t seed, float scale = 1.0f) {
  Values v;
  for (float x : testing::RandomNormal<float>(n, seed, scale)) {
    v.bits.push_back(f.to_bits(x));
    v.floats.push_back(f.to_float(v.bits.back()));
  }
  return v;
}

void ExpectRounded(const Format& f, const std::vector<uint16_t>& got,
                   const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], f.to_bits(want[i])) << f.name << " " << what << " element " << i;
  }
}

TEST(ModelKernels16BitTest, EveryOpIsTheFloatOpRoundedOnce) {
  auto fk = MakeCpuModelKernels(CpuPrecision::kFloat);
  for (const Format& f : kFormats) {
    auto k = MakeCpuModelKernels(f.precision);
    EXPECT_EQ(k->act_size(), 2u);
    const int rows = 24, in = 16, out = 20;
    Values x = Make(f, rows * in, 1), w = Make(f, out * in, 2, 0.3f), b = Make(f, out, 3);
    std::vector<uint16_t> y(rows * out);
    std::vector<float> yf(rows * out);
    ASSERT_TRUE(
        k->Matmul(y.data(), x.bits.data(), w.bits.data(), b.bits.data(), rows, in, out).ok());
    ASSERT_TRUE(
        fk->Matmul(yf.data(), x.floats.data(), w.floats.data(), b.floats.data(), rows, in, out)
            .ok());
    ExpectRounded(f, y, yf, "Matmul");
    // A linear layer into the residual stream: the product and the residual added in fp32, then
    // rounded once (as the CUDA kernels' one cuBLASLt call does), not the product rounded and
    // added to the residual and rounded again.
    Values res = Make(f, rows * out, 6, 4.0f);
    std::vector<uint16_t> yr(rows * out), twice(rows * out);
    std::vector<float> yrf(rows * out);
    ASSERT_TRUE(k->MatmulResidual(yr.data(), x.bits.data(), w.bits.data(), b.bits.data(),
                                  res.bits.data(), rows, in, out)
                    .ok());
    ASSERT_TRUE(fk->MatmulResidual(yrf.data(), x.floats.data(), w.floats.data(), b.floats.data(),
                                   res.floats.data(), rows, in, out)
                    .ok());
    ExpectRounded(f, yr, yrf, "MatmulResidual");
    ASSERT_TRUE(k->Add(twice.data(), y.data(), res.bits.data(), rows * out).ok());
    EXPECT_NE(yr, twice) << f.name << ": MatmulResidual rounded twice";
    EXPECT_FALSE(k->MatmulResidual(res.bits.data(), x.bits.data(), w.bits.data(), nullptr,
                                   res.bits.data(), rows, in, out)
                     .ok())
        << "out aliasing the residual is refused";

    Values g = Make(f, in, 4), beta = Make(f, in, 5);
    std::vector<uint16_t> ln(rows * in);
    std::vector<float> lnf(rows * in), mean(rows), rstd(rows), meanf(rows), rstdf(rows);
    ASSERT_TRUE(k->LayerNorm(ln.data(), mean.data(), rstd.data(), x.bits.data(), g.bits.data(),
                             beta.bits.data(), rows, in)
                    .ok());
    ASSERT_TRUE(fk->LayerNorm(lnf.data(), meanf.data(), rstdf.data(), x.floats.data(),
                              g.floats.data(), beta.floats.data(), rows, in)
                    .ok());
    ExpectRounded(f, ln, lnf, "LayerNorm");
    EXPECT_EQ(mean, meanf) << f.name << " LayerNorm statistics are fp32";
    EXPECT_EQ(rstd, rstdf);

    std::vector<uint16_t> ge(rows * in);
    std::vector<float> gef(rows * in);
    ASSERT_TRUE(k->Gelu(ge.data(), x.bits.data(), rows * in).ok());
    ASSERT_TRUE(fk->Gelu(gef.data(), x.floats.data(), rows * in).ok());
    ExpectRounded(f, ge, gef, "Gelu");

    // Weight gradients are fp32: equal to the float kernel's on the same inputs.
    Values dy = Make(f, rows * out, 6);
    std::vector<uint16_t> dx(rows * in, 0);
    std::vector<float> dxf(rows * in, 0.0f), dw(out * in, 0.0f), dwf(out * in, 0.0f), db(out, 0.0f),
        dbf(out, 0.0f);
    ASSERT_TRUE(k->MatmulBackward(dx.data(), dw.data(), db.data(), dy.bits.data(), x.bits.data(),
                                  w.bits.data(), rows, in, out)
                    .ok());
    ASSERT_TRUE(fk->MatmulBackward(dxf.data(), dwf.data(), dbf.data(), dy.floats.data(),
                                   x.floats.data(), w.floats.data(), rows, in, out)
                    .ok());
    ExpectRounded(f, dx, dxf, "MatmulBackward dinp");
    EXPECT_EQ(dw, dwf) << f.name;
    EXPECT_EQ(db, dbf) << f.name;

    // Grouped-query: 4 query heads of 2 channels read 2 key/value heads ([Note: the qkv layout]).
    const int batch = 2, seq = 6, channels = 8, heads = 4, kv = 2;
    Values qkv = Make(f, batch * seq * (channels + 2 * kv * channels / heads), 7);
    // The attention's saved state is the float kernels' own (fp32 log-sum-exp per query).
    ASSERT_EQ(k->AttentionSavedBytes(batch, seq, heads, channels / heads),
              int64_t{batch} * heads * seq * 4);
    std::vector<uint16_t> att_out(batch * seq * channels);
    std::vector<float> att_outf(att_out.size()), lse(batch * heads * seq), lsef(lse.size());
    ASSERT_TRUE(
        k->Attention(att_out.data(), lse.data(), qkv.bits.data(), batch, seq, channels, heads, kv)
            .ok());
    // The attention is the float flash kernel with its P (and, backward, dS) rounded to the
    // format before the products that read them, as the CUDA programs round them
    // (cpu::fast::FlashAttentionForward's `products`); the float model kernels keep them in fp32.
    const DType products = f.precision == CpuPrecision::kBf16 ? DType::kBF16 : DType::kF16;
    cpu::fast::FlashAttentionForward(att_outf.data(), lsef.data(), qkv.floats.data(), batch, seq,
                                     channels, heads, kv, products);
    EXPECT_EQ(lse, lsef) << f.name;
    ExpectRounded(f, att_out, att_outf, "Attention");
    std::vector<float> unrounded(att_outf.size()), lse_unrounded(lse.size());
    ASSERT_TRUE(fk->Attention(unrounded.data(), lse_unrounded.data(), qkv.floats.data(), batch, seq,
                              channels, heads, kv)
                    .ok());
    EXPECT_NE(unrounded, att_outf) << f.name << ": the float kernels round nothing";

    // SwiGLU's backward writes every element of dgate_up (both start as NaN), gate and up
    // interleaved as one GEMM's output.
    const int cols = 8;
    Values gate_up = Make(f, 2 * rows * cols, 8), dact = Make(f, rows * cols, 9);
    std::vector<uint16_t> dgate_up(2 * rows * cols, f.to_bits(std::nanf("")));
    std::vector<float> dgate_upf(dgate_up.size(), std::nanf(""));
    ASSERT_TRUE(
        k->SwiGluBackward(dgate_up.data(), dact.bits.data(), gate_up.bits.data(), rows, cols, true)
            .ok());
    ASSERT_TRUE(fk->SwiGluBackward(dgate_upf.data(), dact.floats.data(), gate_up.floats.data(),
                                   rows, cols, true)
                    .ok());
    for (float v : dgate_upf) ASSERT_TRUE(std::isfinite(v)) << f.name << " SwiGluBackward";
    ExpectRounded(f, dgate_up, dgate_upf, "SwiGluBackward");
  }
}

// A null input gradient is skipped, as ModelKernels' contract says, after other calls have left
// scratch blocks in the kernels' pool: the norms' backward once wrote rows x channels floats into
// whichever pooled block it was given in place of the missing dinp (ASan: a heap overflow), and
// their weight gradients are the float kernels' with dinp null.
TEST(ModelKernels16BitTest, ANullInputGradientIsSkipped) {
  auto fk = MakeCpuModelKernels(CpuPrecision::kFloat);
  for (const Format& f : kFormats) {
    auto k = MakeCpuModelKernels(f.precision);
    const int rows = 24, ch = 16;
    Values x = Make(f, rows * ch, 11), dy = Make(f, rows * ch, 12), w = Make(f, ch, 13);
    Values bias = Make(f, ch, 14);
    std::vector<uint16_t> y(rows * ch);
    std::vector<float> mean(rows), rstd(rows), meanf(rows), rstdf(rows), yf(rows * ch);
    // The forwards leave blocks of ch and rows x ch floats in the pool.
    ASSERT_TRUE(k->LayerNorm(y.data(), mean.data(), rstd.data(), x.bits.data(), w.bits.data(),
                             bias.bits.data(), rows, ch)
                    .ok());
    ASSERT_TRUE(fk->LayerNorm(yf.data(), meanf.data(), rstdf.data(), x.floats.data(),
                              w.floats.data(), bias.floats.data(), rows, ch)
                    .ok());
    std::vector<float> dw(ch), db(ch), dwf(ch), dbf(ch);
    ASSERT_TRUE(k->LayerNormBackward(nullptr, dw.data(), db.data(), dy.bits.data(), x.bits.data(),
                                     w.bits.data(), mean.data(), rstd.data(), rows, ch)
                    .ok());
    ASSERT_TRUE(fk->LayerNormBackward(nullptr, dwf.data(), dbf.data(), dy.floats.data(),
                                      x.floats.data(), w.floats.data(), meanf.data(), rstdf.data(),
                                      rows, ch)
                    .ok());
    EXPECT_EQ(dw, dwf) << f.name << " LayerNormBackward";
    EXPECT_EQ(db, dbf) << f.name << " LayerNormBackward";
    ASSERT_TRUE(
        k->RmsNorm(y.data(), rstd.data(), x.bits.data(), w.bits.data(), rows, ch, 1e-5f).ok());
    ASSERT_TRUE(
        fk->RmsNorm(yf.data(), rstdf.data(), x.floats.data(), w.floats.data(), rows, ch, 1e-5f)
            .ok());
    std::fill(dw.begin(), dw.end(), 0.0f);
    std::fill(dwf.begin(), dwf.end(), 0.0f);
    ASSERT_TRUE(k->RmsNormBackward(nullptr, dw.data(), dy.bits.data(), x.bits.data(), w.bits.data(),
                                   rstd.data(), rows, ch)
                    .ok());
    ASSERT_TRUE(fk->RmsNormBackward(nullptr, dwf.data(), dy.floats.data(), x.floats.data(),
                                    w.floats.data(), rstdf.data(), rows, ch)
                    .ok());
    EXPECT_EQ(dw, dwf) << f.name << " RmsNormBackward";
  }
}

// fp16's range: a value beyond 65504 becomes inf (the loss scaler's overflow), bf16 keeps it.
TEST(ModelKernels16BitTest, Fp16OverflowsWhereBf16DoesNot) {
  const float big[] = {300.0f, 300.0f};
  for (const Format& f : kFormats) {
    auto k = MakeCpuModelKernels(f.precision);
    const uint16_t a[] = {f.to_bits(big[0]), f.to_bits(big[1])};
    uint16_t out[2];
    const uint16_t w[] = {f.to_bits(300.0f), f.to_bits(0.0f)};
    ASSERT_TRUE(k->Matmul(out, a, w, nullptr, 1, 2, 1).ok());  // 300 x 300 = 90000
    const float got = f.to_float(out[0]);
    if (f.precision == CpuPrecision::kF16) {
      EXPECT_TRUE(std::isinf(got)) << got;
    } else {
      EXPECT_NEAR(got, 90000.0f, 90000.0f / 128) << got;
    }
  }
}

}  // namespace
}  // namespace zerort
