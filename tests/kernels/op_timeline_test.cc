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
      EXPECT_EQ(s[1].name, "Gelu");
      EXPECT_EQ(s[1].flops, 0.0);
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

TEST(OpTimelineTest, SummaryGroupsByKindAndGemmShape) {
  auto sample = [](const char* name, double flops, int64_t r, int64_t i, int64_t o, double sec,
                   double gap) {
    OpSample s{.name = name, .flops = flops, .seconds = sec, .gap_before = gap};
    s.shape[0] = r;
    s.shape[1] = i;
    s.shape[2] = o;
    return s;
  };
  const std::vector<OpSample> samples = {
      sample("Matmul", 100, 8, 2, 3, 1.0, 0.0),    sample("LayerNorm", 0, 0, 0, 0, 0.5, 0.25),
      sample("Matmul", 100, 8, 2, 3, 2.0, 0.0),    sample("MatmulBackward", 400, 8, 2, 3, 4.0, 0.0),
      sample("Attention", 50, 1, 4, 2, 0.75, 0.5), sample("AddRmsNorm", 0, 0, 0, 0, 0.25, 0.0),
      sample("SwiGlu", 0, 0, 0, 0, 0.125, 0.0)};
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
  EXPECT_EQ(t.kinds[3].key, "element-wise");
  ASSERT_EQ(t.gemms.size(), 2u);
  EXPECT_EQ(t.gemms[0].key, "MatmulBackward 8x2x3");
  EXPECT_EQ(t.gemms[1].key, "Matmul 8x2x3");
  EXPECT_EQ(t.gemms[1].calls, 2);
  EXPECT_DOUBLE_EQ(t.gemms[1].seconds, 3.0);
}

}  // namespace
}  // namespace zerort
