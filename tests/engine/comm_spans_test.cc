// CommSpans ([Note: exposed communication]): exposed communication on the asynchronous CPU device
// is the part of the compute stream's waits on "comm" during which a collective ran there, so it
// never exceeds the communication, however long the comm stream's other work keeps compute
// waiting.
#include "zerort/engine/comm_spans.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "zerort/runtime/loopback_communicator.h"

namespace zerort {
namespace {

std::unique_ptr<Stream> Queued(const std::string& name) {
  return std::move(*CreateStream(Device::Cpu(), name, StreamOptions{.cpu = CpuExecution::kQueued}));
}

Status Sleep(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return absl::OkStatus();
}

TEST(CommSpansTest, ExposedIsTheComputeStreamsWaitWhileACollectiveRanOnComm) {
  // Rank 0: its comm stream works 150 ms (no collective), then all-reduces with rank 1, which
  // issues 300 ms late: the collective runs from about 150 to 300 ms. Its compute stream waits
  // for the all-reduce from the start: 300 ms of waiting, of which about 150 ms is communication.
  // The bounds come from the ranks' own clocks, not from those numbers: on a busy machine either
  // rank's thread can start late, and the collective run much longer or shorter than 150 ms.
  // Rank 0 notes when its comm stream's other work ended and when its compute stream's wait did:
  // the exposed time lies between the two. Rank 1 notes when it issued: rank 0's collective ran
  // at least from the end of the other work to then.
  using Clock = std::chrono::steady_clock;
  Clock::time_point other_work_ended, wait_ended, rank1_issued;
  std::vector<CommSpans::Step> steps(2);
  CommOptions options;
  options.timeout = std::chrono::seconds(60);
  ASSERT_TRUE(RunLoopbackRanks(2, options, nullptr, [&](Communicator& comm) -> Status {
                CommSpans spans;
                spans.Attach(comm);
                auto compute = Queued("compute");
                auto stream = Queued("comm");
                ZR_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, CreateEvent(Device::Cpu()));
                std::vector<float> x(256, 1.0f);
                if (comm.rank() == 0) {
                  ZR_RETURN_IF_ERROR(stream->Launch([&] {
                    ZR_RETURN_IF_ERROR(Sleep(150));
                    other_work_ended = Clock::now();
                    return absl::OkStatus();
                  }));
                } else {
                  ZR_RETURN_IF_ERROR(Sleep(300));
                  rank1_issued = Clock::now();
                }
                ZR_RETURN_IF_ERROR(comm.AllReduce(x.data(), x.data(), x.size(), DType::kF32,
                                                  ReduceOp::kSum, stream.get()));
                ZR_RETURN_IF_ERROR(done->Record(*stream));
                ZR_RETURN_IF_ERROR(compute->WaitEvent(*done));
                ZR_RETURN_IF_ERROR(compute->Synchronize());
                if (comm.rank() == 0) wait_ended = Clock::now();
                ZR_RETURN_IF_ERROR(stream->Synchronize());
                steps[comm.rank()] = spans.Take(*compute);
                const CommSpans::Step again = spans.Take(*compute);
                if (again.comm_s != 0 || again.exposed_s != 0) {
                  return absl::InternalError("a second take is not empty");
                }
                return absl::OkStatus();
              }).ok());
  const CommSpans::Step& r0 = steps[0];
  const double rank1_late = std::chrono::duration<double>(rank1_issued - other_work_ended).count();
  EXPECT_GT(r0.comm_s, rank1_late - 1e-3) << "the all-reduce waited for rank 1";
  EXPECT_GT(r0.exposed_s, rank1_late - 1e-3) << "compute waited for it";
  EXPECT_LE(r0.exposed_s, r0.comm_s + 1e-3) << "the 150 ms of other comm work is not exposed";
  const double after_other_work =
      std::chrono::duration<double>(wait_ended - other_work_ended).count();
  EXPECT_LE(r0.exposed_s, after_other_work + 1e-3)
      << "compute waited about 300 ms in all, the first 150 ms for other comm work";
  EXPECT_LE(steps[1].exposed_s, steps[1].comm_s + 1e-3);
}

}  // namespace
}  // namespace zerort
