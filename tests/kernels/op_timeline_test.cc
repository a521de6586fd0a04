// kernels/op_timeline.h and runtime/device.h's stream marks: a mark reads the clock where its
// stream reaches it (an immediate stream at once, a queued one on its thread), the timeline
// samples each operation between two marks in issue order with its FLOPs and kind, the gap
// before an operation holds the stream's other work, the kernels timed compute what they compute
// untimed, and the summary groups the samples.
#include "zerort/kernels/op_timeline.h"

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace zerort {
namespace {

void Sleep(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

std::unique_ptr<Stream> CpuStream(bool queued) {
  return *CreateStream(Device::Cpu(), "compute",
                       {.cpu = queued ? CpuExecution::kQueued : CpuExecution::kImmediate});
}

TEST(StreamMarkTest, ReadsTheClockWhereTheStreamReachesIt) {
  for (bool queued : {false, true}) {
    SCOPED_TRACE(queued ? "queued" : "immediate");
    std::unique_ptr<Stream> stream = CpuStream(queued);
    std::unique_ptr<StreamMark> a = *CreateStreamMark(Device::Cpu());
    std::unique_ptr<StreamMark> b = *CreateStreamMark(Device::Cpu());
    EXPECT_EQ(b->SecondsSince(*a).status().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(a->Record(*stream).ok());
    // On a queued stream the sleep runs on the stream's thread, between the two marks; the host
    // returns at once, so the marks time the stream's work, not the host's issue.
    ASSERT_TRUE(RunOnHostInOrder(stream.get(), [] {
                  Sleep(30);
                  return absl::OkStatus();
                }).ok());
    ASSERT_TRUE(b->Record(*stream).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
    const double ab = *b->SecondsSince(*a);
    EXPECT_GE(ab, 0.030);
    EXPECT_LT(ab, 10.0);
    EXPECT_DOUBLE_EQ(*a->SecondsSince(*b), -ab);
  }
}

TEST(StreamMarkTest, AQueuedMarkNotReachedIsRefusedNotGuessed) {
  std::unique_ptr<Stream> stream = CpuStream(true);
  std::unique_ptr<StreamMark> a = *CreateStreamMark(Device::Cpu());
  std::unique_ptr<StreamMark> b = *CreateStreamMark(Device::Cpu());
  ASSERT_TRUE(a->Record(*stream).ok());
  std::atomic<bool> go{false};
  ASSERT_TRUE(stream
                  ->Launch([&] {
                    while (!go.load()) Sleep(1);
                    return absl::OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(b->Record(*stream).ok());
  const StatusOr<double> early = b->SecondsSince(*a);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("synchronize"), std::string_view::npos);
  go = true;
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_GE(*b->SecondsSince(*a), 0.0);
}

TEST(OpTimelineTest, SamplesEachOperationInOrderAndRunsThemAsTheyRun) {
  for (bool queued : {false, true}) {
    SCOPED_TRACE(queued ? "queued" : "immediate");
    std::unique_ptr<Stream> stream = CpuStream(queued);
    OpTimeline timeline(Device::Cpu());
    std::unique_ptr<ModelKernels> k =
        TimeOperations(MakeCpuModelKernels(CpuPrecision::kFloat, stream.get()), &timeline);
    std::unique_ptr<ModelKernels> plain = MakeCpuModelKernels(CpuPrecision::kFloat);
    EXPECT_EQ(&k->stream(), stream.get());
    const int rows = 3, in = 4, out = 5;
    std::vector<float> x(rows * in), w(out * in), y(rows * out), y_plain(rows * out);
    std::vector<float> dx(rows * in), dw(out * in), dx_plain(rows * in), dw_plain(out * in);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f - 0.1f * static_cast<float>(i);
    for (int pass = 0; pass < 2; ++pass) {  // the second pass reuses the first's marks
      timeline.Clear();
      std::fill(dx.begin(), dx.end(), 0.0f);
      std::fill(dw.begin(), dw.end(), 0.0f);
      ASSERT_TRUE(k->Matmul(y.data(), x.data(), w.data(), nullptr, rows, in, out).ok());
      // The stream's own work between two operations: the second one's gap.
      ASSERT_TRUE(RunOnHostInOrder(&k->stream(), [] {
                    Sleep(20);
                    return absl::OkStatus();
                  }).ok());
      ASSERT_TRUE(k->Gelu(y.data(), y.data(), rows * out).ok());
      ASSERT_TRUE(k->MatmulBackward(dx.data(), dw.data(), nullptr, y.data(), x.data(), w.data(),
                                    rows, in, out)
                      .ok());
      std::vector<double> host(rows * out);
      ASSERT_TRUE(k->ActToHost(y.data(), rows * out, host.data()).ok());
      ASSERT_TRUE(stream->Synchronize().ok());  // the read's end mark is queued after it
      const std::vector<OpSample> s = *timeline.Collect();
      ASSERT_EQ(s.size(), 4u);
      EXPECT_EQ(s[0].name, "Matmul");
      EXPECT_EQ(s[0].flops, 2.0 * rows * in * out);
      EXPECT_EQ(s[0].shape[0], rows);
      EXPECT_EQ(s[0].shape[1], in);
      EXPECT_EQ(s[0].shape[2], out);
      EXPECT_EQ(s[0].gap_before, 0.0);
      EXPECT_EQ(s[0].bytes, 0.0);  // bound by its FLOPs
      EXPECT_EQ(s[1].name, "Gelu");
      EXPECT_EQ(s[1].flops, 0.0);
      EXPECT_EQ(s[1].bytes, 2.0 * rows * out * sizeof(float));  // read once, written once
      EXPECT_GE(s[1].gap_before, 0.020);
      EXPECT_EQ(s[2].name, "MatmulBackward");
      EXPECT_EQ(s[2].flops, 2 * 2.0 * rows * in * out);  // dinp and dweight
      EXPECT_EQ(s[3].name, "ActToHost");
      EXPECT_TRUE(s[3].host_read);
      EXPECT_FALSE(s[2].host_read);
      for (const OpSample& o : s) {
        EXPECT_GE(o.seconds, 0.0) << o.name;
        EXPECT_GE(o.gap_before, 0.0) << o.name;
        EXPECT_LT(o.seconds, 10.0) << o.name;
      }
    }
    ASSERT_TRUE(plain->Matmul(y_plain.data(), x.data(), w.data(), nullptr, rows, in, out).ok());
    ASSERT_TRUE(plain->Gelu(y_plain.data(), y_plain.data(), rows * out).ok());
    ASSERT_TRUE(plain
                    ->MatmulBackward(dx_plain.data(), dw_plain.data(), nullptr, y_plain.data(),
                                     x.data(), w.data(), rows, in, out)
                    .ok());
    EXPECT_EQ(y, y_plain);
    EXPECT_EQ(dx, dx_plain);
    EXPECT_EQ(dw, dw_plain);
  }
}

// [Note: an operation's bytes] in the bf16 kernels' element sizes (activations 2 bytes, weight
// gradients and statistics 4), by hand: each input read, each output written, each gradient
// added into read and written, a null gradient not counted.
TEST(OpTimelineTest, TheMemoryBoundOperationsSayTheBytesTheyMove) {
  std::unique_ptr<Stream> stream = CpuStream(false);
  OpTimeline timeline(Device::Cpu());
  std::unique_ptr<ModelKernels> k =
      TimeOperations(MakeCpuModelKernels(CpuPrecision::kBf16, stream.get()), &timeline);
  ASSERT_EQ(k->act_size(), 2u);
  ASSERT_EQ(k->grad_size(), 4u);
  ASSERT_EQ(k->stat_size(), 4u);
  const int rows = 3, ch = 8;
  std::vector<uint16_t> x(rows * ch), y(rows * ch), dy(rows * ch), dx(rows * ch), w(ch), b(ch);
  std::vector<float> mean(rows), rstd(rows), dw(ch), db(ch);
  ASSERT_TRUE(
      k->LayerNorm(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, ch)
          .ok());
  ASSERT_TRUE(k->LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                   mean.data(), rstd.data(), rows, ch)
                  .ok());
  ASSERT_TRUE(k->LayerNormBackward(nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(),
                                   mean.data(), rstd.data(), rows, ch)
                  .ok());
  // 2 sequences of 3 tokens over a vocabulary of 4: at most 4 wte rows, and 3 wpe rows.
  const std::vector<int32_t> tokens = {0, 1, 2, 3, 1, 0};
  std::vector<float> dwte(4 * ch), dwpe(3 * ch);
  std::vector<uint16_t> dout(6 * ch);
  ASSERT_TRUE(
      k->EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), 2, 3, ch, 0, 4)
          .ok());
  std::vector<uint16_t> logits(2 * 5);
  std::vector<float> losses(2);
  const std::vector<int32_t> targets = {1, 4};
  ASSERT_TRUE(k->CrossEntropy(logits.data(), losses.data(), targets.data(), 2, 5, 5, 0.5f).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  const std::vector<OpSample> s = *timeline.Collect();
  ASSERT_EQ(s.size(), 5u);
  // LayerNorm: x read, y written (2 x 24 x 2), weight and bias (2 x 8 x 2), mean and rstd (2 x 3 x
  // 4).
  EXPECT_EQ(s[0].bytes, 96 + 32 + 24);
  // Its backward: dy and x read, dx added (4 x 24 x 2), weight (8 x 2), dweight and dbias added
  // (2 x 2 x 8 x 4), mean and rstd; without dx and dbias: 2 x 24 x 2 + 8 x 2 + 2 x 8 x 4 + 24.
  EXPECT_EQ(s[1].bytes, 192 + 16 + 128 + 24);
  EXPECT_EQ(s[2].bytes, 96 + 16 + 64 + 24);
  // EmbeddingBackward: dout (6 x 8 x 2), the token ids (6 x 4), the 4 wte and 3 wpe gradient rows
  // added (7 x 8 x 4 x 2).
  EXPECT_EQ(s[3].bytes, 96 + 24 + 448);
  // CrossEntropy with its gradient: the logits read and overwritten (2 x 10 x 2), the losses
  // written and the targets read (2 x (4 + 4)).
  EXPECT_EQ(s[4].bytes, 40 + 16);
}

TEST(OpTimelineTest, AHostReadReturnsWhatTheKernelsReturn) {
  std::unique_ptr<Stream> stream = CpuStream(true);
  OpTimeline timeline(Device::Cpu());
  std::unique_ptr<ModelKernels> k =
      TimeOperations(MakeCpuModelKernels(CpuPrecision::kFloat, stream.get()), &timeline);
  std::vector<float> losses = {1.0f, 2.0f, 6.0f};
  ASSERT_TRUE(k->AddToLossLedger(losses.data(), 3, 3.0).ok());
  EXPECT_DOUBLE_EQ(*k->TakeLossLedger(), 3.0);
  ASSERT_TRUE(stream->Synchronize().ok());
  const std::vector<OpSample> s = *timeline.Collect();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(OpKind(s[0].name, s[0].host_read), "classifier");
  EXPECT_EQ(OpKind(s[1].name, s[1].host_read), "host read");
}

TEST(OpTimelineTest, SummaryGroupsByKindGemmShapeAndOperation) {
  auto sample = [](const char* name, double flops, int64_t r, int64_t i, int64_t o, double sec,
                   double gap) {
    OpSample s{.name = name, .flops = flops, .seconds = sec, .gap_before = gap};
    s.shape[0] = r;
    s.shape[1] = i;
    s.shape[2] = o;
    return s;
  };
  std::vector<OpSample> samples = {
      sample("Matmul", 100, 8, 2, 3, 1.0, 0.0),    sample("LayerNorm", 0, 0, 0, 0, 0.5, 0.25),
      sample("Matmul", 100, 8, 2, 3, 2.0, 0.0),    sample("MatmulBackward", 400, 8, 2, 3, 4.0, 0.0),
      sample("Attention", 50, 1, 4, 2, 0.75, 0.5), sample("AddRmsNorm", 0, 0, 0, 0, 0.25, 0.0),
      sample("SwiGlu", 0, 0, 0, 0, 0.125, 0.0)};
  samples[1].bytes = 100;
  samples[5].bytes = 60;
  const TimelineSummary t = Summarize(samples);
  EXPECT_EQ(t.calls, 7);
  EXPECT_EQ(t.host_reads, 0);
  EXPECT_DOUBLE_EQ(t.op_seconds, 8.625);
  EXPECT_DOUBLE_EQ(t.gap_seconds, 0.75);
  EXPECT_DOUBLE_EQ(t.span_seconds, 9.375);
  ASSERT_EQ(t.kinds.size(), 4u);
  EXPECT_EQ(t.kinds[0].key, "gemm");
  EXPECT_EQ(t.kinds[0].calls, 3);
  EXPECT_DOUBLE_EQ(t.kinds[0].seconds, 7.0);
  EXPECT_DOUBLE_EQ(t.kinds[0].flops, 600);
  EXPECT_EQ(t.kinds[1].key, "attention");
  EXPECT_EQ(t.kinds[2].key, "norm");
  EXPECT_EQ(t.kinds[2].calls, 2);
  EXPECT_DOUBLE_EQ(t.kinds[2].bytes, 160);  // LayerNorm's and AddRmsNorm's
  EXPECT_EQ(t.kinds[3].key, "element-wise");
  ASSERT_EQ(t.gemms.size(), 2u);
  EXPECT_EQ(t.gemms[0].key, "MatmulBackward 8x2x3");
  EXPECT_EQ(t.gemms[1].key, "Matmul 8x2x3");
  EXPECT_EQ(t.gemms[1].calls, 2);
  EXPECT_DOUBLE_EQ(t.gemms[1].seconds, 3.0);
  // The rest by operation: the two norms apart, the attention with its FLOPs.
  ASSERT_EQ(t.others.size(), 4u);
  EXPECT_EQ(t.others[0].key, "Attention");
  EXPECT_DOUBLE_EQ(t.others[0].flops, 50);
  EXPECT_EQ(t.others[1].key, "LayerNorm");
  EXPECT_DOUBLE_EQ(t.others[1].seconds, 0.5);
  EXPECT_DOUBLE_EQ(t.others[1].bytes, 100);
  EXPECT_EQ(t.others[2].key, "AddRmsNorm");
  EXPECT_EQ(t.others[3].key, "SwiGlu");
  EXPECT_EQ(t.others[3].calls, 1);
}

}  // namespace
}  // namespace zerort
