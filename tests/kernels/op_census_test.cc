// kernels/op_census.h: every call counted under its operation's name, host reads apart, and the
// results those of the kernels counted (the census runs them as they run); over the kernels
// issued on a queued stream too (ForwardingKernels over ForwardingKernels).
#include "zerort/kernels/op_census.h"

#include <vector>

#include "gtest/gtest.h"

namespace zerort {
namespace {

TEST(OpCensusTest, CountsEachOperationAndHostReadAndRunsThemAsTheyRun) {
  for (bool queued : {false, true}) {
    std::unique_ptr<Stream> stream =
        *CreateStream(Device::Cpu(), "compute",
                      {.cpu = queued ? CpuExecution::kQueued : CpuExecution::kImmediate});
    OpCensus census;
    std::unique_ptr<ModelKernels> k =
        CountOperations(MakeCpuModelKernels(CpuPrecision::kFloat, stream.get()), &census);
    std::unique_ptr<ModelKernels> plain = MakeCpuModelKernels(CpuPrecision::kFloat);
    EXPECT_EQ(&k->stream(), stream.get());
    EXPECT_FALSE(k->launches().has_value());  // the CPU kernels' (forwarded) count: none
    const int rows = 3, in = 4, out = 5;
    std::vector<float> x(rows * in), w(out * in), y(rows * out), y_plain(rows * out);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f - 0.1f * static_cast<float>(i);
    ASSERT_TRUE(k->Matmul(y.data(), x.data(), w.data(), nullptr, rows, in, out).ok());
    ASSERT_TRUE(k->Gelu(y.data(), y.data(), rows * out).ok());
    ASSERT_TRUE(k->Gelu(y.data(), y.data(), rows * out).ok());
    std::vector<double> host(rows * out);
    ASSERT_TRUE(k->ActToHost(y.data(), rows * out, host.data()).ok());  // waits for the stream
    ASSERT_TRUE(plain->Matmul(y_plain.data(), x.data(), w.data(), nullptr, rows, in, out).ok());
    ASSERT_TRUE(plain->Gelu(y_plain.data(), y_plain.data(), rows * out).ok());
    ASSERT_TRUE(plain->Gelu(y_plain.data(), y_plain.data(), rows * out).ok());
    EXPECT_EQ(y, y_plain) << (queued ? "queued" : "immediate");
    EXPECT_EQ(census.ops,
              (std::map<std::string, int64_t>{{"ActToHost", 1}, {"Gelu", 2}, {"Matmul", 1}}));
    EXPECT_EQ(census.host_reads, 1);
    EXPECT_EQ(census.total_ops(), 4);
    census.Clear();
    EXPECT_EQ(census.total_ops(), 0);
  }
}

}  // namespace
}  // namespace zerort
