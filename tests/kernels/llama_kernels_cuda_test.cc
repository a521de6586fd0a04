// The LLaMA family's CUDA kernels (kernels/cuda/llama_ops.cuh) against their CPU twins
// (cuda_twin.h).
#include "tests/kernels/cuda_twin.h"

namespace zerort::testing {
namespace {

// The LLaMA family's operations (cuda/llama_ops.cuh) against their CPU twins
// (cpu/llama_ops.cc): RMSNorm and its backward, the rotary embeddings with grouped-query heads
// (4 query heads on 2 key/value heads; LLaMA 3.1's frequency remap, whose three bands the head
// size 8 and original context 64 each reach) and their transpose, SwiGLU and its backward.
TEST(ModelKernelsCudaTest, LlamaRmsNormRopeSwiGlu) {
  ZR_NEED_GPU();
  for (auto [act, grad] : kTypes) {
    Twin t(act, grad);
    const int batch = 3, seq = 11, heads = 4, kv = 2, hs = 8, d = heads * hs;
    const int64_t rows = int64_t{batch} * seq;
    std::vector<float> x = Random(rows * d, 1), w = Random(d, 2), y(rows * d),
                       dy = Random(rows * d, 3), dx = Random(rows * d, 4), dw = Random(d, 5),
                       rstd(rows);
    void *gx = t.A(x), *gw = t.A(w), *gy = t.A(y), *gdy = t.A(dy), *gdx = t.A(dx), *gdw = t.G(dw);
    std::vector<float> zeros(rows);
    void* grstd = t.Up(zeros, DType::kF32);
    ASSERT_TRUE(t.gpu->RmsNorm(gy, grstd, gx, gw, rows, d, 1e-5f).ok());
    ASSERT_TRUE(t.cpu->RmsNorm(y.data(), rstd.data(), x.data(), w.data(), rows, d, 1e-5f).ok());
    t.Expect("RmsNorm", gy, y, act);
    t.Expect("RmsNorm rstd", grstd, rstd, DType::kF32);
    ASSERT_TRUE(t.gpu->RmsNormBackward(gdx, gdw, gdy, gx, gw, grstd, rows, d).ok());
    ASSERT_TRUE(t.cpu
                    ->RmsNormBackward(dx.data(), dw.data(), dy.data(), x.data(), w.data(),
                                      rstd.data(), rows, d)
                    .ok());
    t.Expect("RmsNormBackward dinp", gdx, dx, act);
    t.Expect("RmsNormBackward dweight", gdw, dw, grad);
    {  // the residual connection fused in, in place as the blocks call it
      std::vector<float> sum = x, y2(rows * d), rstd2(rows);
      void *gsum = t.A(sum), *gy2 = t.A(y2);
      void* grstd2 = t.Up(zeros, DType::kF32);
      ASSERT_TRUE(t.gpu->AddRmsNorm(gsum, gy2, grstd2, gsum, gdy, gw, rows, d, 1e-5f).ok());
      ASSERT_TRUE(t.cpu
                      ->AddRmsNorm(sum.data(), y2.data(), rstd2.data(), sum.data(), dy.data(),
                                   w.data(), rows, d, 1e-5f)
                      .ok());
      t.Expect("AddRmsNorm sum", gsum, sum, act);
      t.Expect("AddRmsNorm", gy2, y2, act);
      t.Expect("AddRmsNorm rstd", grstd2, rstd2, DType::kF32);
    }

    const Rope rope{.theta = 10000.0,
                    .scaling = {.type = RopeType::kLlama3,
                                .factor = 8,
                                .low_freq_factor = 1,
                                .high_freq_factor = 4,
                                .original_max_position_embeddings = 64}};
    std::vector<float> q = Random(rows * d, 6), k = Random(rows * kv * hs, 7),
                       v = Random(rows * kv * hs, 8), qkv(rows * (d + 2 * kv * hs));
    void *gq = t.A(q), *gk = t.A(k), *gv = t.A(v), *gqkv = t.A(qkv);
    ASSERT_TRUE(t.gpu->RopeQkv(gqkv, gq, gk, gv, batch, seq, heads, kv, hs, rope).ok());
    ASSERT_TRUE(
        t.cpu->RopeQkv(qkv.data(), q.data(), k.data(), v.data(), batch, seq, heads, kv, hs, rope)
            .ok());
    t.Expect("RopeQkv", gqkv, qkv, act);
    std::vector<float> dqkv = Random(rows * (d + 2 * kv * hs), 9), dq = Random(rows * d, 10),
                       dk = Random(rows * kv * hs, 11), dv = Random(rows * kv * hs, 12);
    void *gdqkv = t.A(dqkv), *gdq = t.A(dq), *gdk = t.A(dk), *gdv = t.A(dv);
    ASSERT_TRUE(t.gpu->RopeQkvBackward(gdq, gdk, gdv, gdqkv, batch, seq, heads, kv, hs, rope).ok());
    ASSERT_TRUE(t.cpu
                    ->RopeQkvBackward(dq.data(), dk.data(), dv.data(), dqkv.data(), batch, seq,
                                      heads, kv, hs, rope)
                    .ok());
    t.Expect("RopeQkvBackward dq", gdq, dq, act);
    t.Expect("RopeQkvBackward dk", gdk, dk, act);
    t.Expect("RopeQkvBackward dv", gdv, dv, act);
    // In place on the qkv layout, forward and transpose ([Note: a LLaMA block's projections]).
    for (const bool transpose : {false, true}) {
      std::vector<float> x = Random(rows * (d + 2 * kv * hs), transpose ? 14 : 13);
      void* gx = t.A(x);
      ASSERT_TRUE(t.gpu->RopeQkvInPlace(gx, batch, seq, heads, kv, hs, rope, transpose).ok());
      ASSERT_TRUE(t.cpu->RopeQkvInPlace(x.data(), batch, seq, heads, kv, hs, rope, transpose).ok());
      t.Expect(transpose ? "RopeQkvInPlace (transpose)" : "RopeQkvInPlace", gx, x, act);
    }

    // SwiGLU with gate and up planar and interleaved per row (one GEMM's output), rows of whole
    // 128-bit vectors (24 columns) and not (20: the scalar kernels).
    for (const auto& [cols, interleaved] :
         {std::pair{24, false}, {24, true}, {20, false}, {20, true}}) {
      SCOPED_TRACE(::testing::Message() << "SwiGLU cols " << cols);
      const int64_t n = rows * cols;
      std::vector<float> gate_up = Random(2 * n, interleaved ? 21 : 13), out(n),
                         dout = Random(n, 15), dgate_up = Random(2 * n, 16);
      void *ggate_up = t.A(gate_up), *gout = t.A(out), *gdout = t.A(dout),
           *gdgate_up = t.A(dgate_up);
      ASSERT_TRUE(t.gpu->SwiGlu(gout, ggate_up, rows, cols, interleaved).ok());
      ASSERT_TRUE(t.cpu->SwiGlu(out.data(), gate_up.data(), rows, cols, interleaved).ok());
      t.Expect("SwiGlu", gout, out, act);
      ASSERT_TRUE(t.gpu->SwiGluBackward(gdgate_up, gdout, ggate_up, rows, cols, interleaved).ok());
      ASSERT_TRUE(t.cpu
                      ->SwiGluBackward(dgate_up.data(), dout.data(), gate_up.data(), rows, cols,
                                       interleaved)
                      .ok());
      t.Expect("SwiGluBackward", gdgate_up, dgate_up, act);
    }
  }
}

// The rotary embeddings compute model_math.h's angles and turns on both devices ([Note: the
// rotary angles]): the same bits as the CPU's float kernels in fp32, bf16 and fp16, at a LLaMA
// 3.1 model's frequencies and head size and positions up to 4095 (angles up to 4095 radians, a
// few thousand quadrants), and at YaRN's (the cosines and sines scaled), forward, backward and in
// place both ways. A head size the kernels'
// argument cannot hold is refused by name.
TEST(ModelKernelsCudaTest, RopeIsBitwiseTheCpus) {
  ZR_NEED_GPU();
  const Rope llama31{.theta = 500000.0,
                     .scaling = {.type = RopeType::kLlama3,
                                 .factor = 8,
                                 .low_freq_factor = 1,
                                 .high_freq_factor = 4,
                                 .original_max_position_embeddings = 8192}};
  // Qwen2.5's YaRN for 128K: the cosines and sines scaled by 0.1 ln 4 + 1.
  const Rope yarn{
      .theta = 1000000.0,
      .scaling = {.type = RopeType::kYarn, .factor = 4, .original_max_position_embeddings = 32768}};
  for (const auto& [rope, act] : {std::pair{llama31, DType::kF32}, std::pair{llama31, DType::kBF16},
                                  std::pair{llama31, DType::kF16}, std::pair{yarn, DType::kF32},
                                  std::pair{yarn, DType::kBF16}}) {
    SCOPED_TRACE(std::string(DTypeName(act)) +
                 (rope.scaling.type == RopeType::kYarn ? " yarn" : " llama3"));
    Twin t(act, DType::kF32);
    const int batch = 2, seq = 4096, heads = 4, kv = 2, hs = 128, d = heads * hs;
    const int64_t rows = int64_t{batch} * seq, q_n = rows * d, kv_n = rows * kv * hs,
                  qkv_n = q_n + 2 * kv_n;
    std::vector<float> q = Random(q_n, 61), k = Random(kv_n, 62), v = Random(kv_n, 63), qkv(qkv_n);
    void *gq = t.A(q), *gk = t.A(k), *gv = t.A(v), *gqkv = t.A(qkv);
    ASSERT_TRUE(t.gpu->RopeQkv(gqkv, gq, gk, gv, batch, seq, heads, kv, hs, rope).ok());
    ASSERT_TRUE(
        t.cpu->RopeQkv(qkv.data(), q.data(), k.data(), v.data(), batch, seq, heads, kv, hs, rope)
            .ok());
    ExpectSameBits("RopeQkv", t.Down(gqkv, qkv_n, act), RoundedTo(qkv, act));
    std::vector<float> dqkv = Random(qkv_n, 64), dq = Random(q_n, 65), dk = Random(kv_n, 66),
                       dv = Random(kv_n, 67);
    void *gdqkv = t.A(dqkv), *gdq = t.A(dq), *gdk = t.A(dk), *gdv = t.A(dv);
    ASSERT_TRUE(t.gpu->RopeQkvBackward(gdq, gdk, gdv, gdqkv, batch, seq, heads, kv, hs, rope).ok());
    ASSERT_TRUE(t.cpu
                    ->RopeQkvBackward(dq.data(), dk.data(), dv.data(), dqkv.data(), batch, seq,
                                      heads, kv, hs, rope)
                    .ok());
    ExpectSameBits("RopeQkvBackward dq", t.Down(gdq, q_n, act), RoundedTo(dq, act));
    ExpectSameBits("RopeQkvBackward dk", t.Down(gdk, kv_n, act), RoundedTo(dk, act));
    ExpectSameBits("RopeQkvBackward dv", t.Down(gdv, kv_n, act), RoundedTo(dv, act));
    for (const bool transpose : {false, true}) {
      std::vector<float> x = Random(qkv_n, transpose ? 69 : 68);
      void* gx = t.A(x);
      ASSERT_TRUE(t.gpu->RopeQkvInPlace(gx, batch, seq, heads, kv, hs, rope, transpose).ok());
      ASSERT_TRUE(t.cpu->RopeQkvInPlace(x.data(), batch, seq, heads, kv, hs, rope, transpose).ok());
      ExpectSameBits(transpose ? "RopeQkvInPlace (transpose)" : "RopeQkvInPlace",
                     t.Down(gx, qkv_n, act), RoundedTo(x, act));
    }
  }
  Twin t(DType::kF32, DType::kF32);
  std::vector<float> x = Random(2 * 1026, 70);
  const Status too_wide = t.gpu->RopeQkvInPlace(t.A(x), 1, 1, 1, 0, 1026, {}, false);
  EXPECT_EQ(too_wide.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_wide.message())
                .find("head size 1026: the CUDA rotary embeddings "
                      "take head sizes up to 512"),
            std::string::npos)
      << too_wide;
}

}  // namespace
}  // namespace zerort::testing
