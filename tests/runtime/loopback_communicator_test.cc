// Loopback collectives: semantics for 1-8 ranks, sub-groups, mismatches, timeouts, hang exit.
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/strings.h"

#include <atomic>
#include <csignal>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "tests/runtime/comm_test_util.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/watchdog.h"

namespace zerort {
namespace {

CommOptions Quick(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  CommOptions o;
  o.timeout = timeout;
  return o;
}

class LoopbackSemantics : public ::testing::TestWithParam<int> {};

TEST_P(LoopbackSemantics, EveryCollectiveEveryDtype) {
  const int size = GetParam();
  std::vector<std::string> errors(size);
  ASSERT_TRUE(RunLoopbackRanks(size, Quick(), nullptr, [&](Communicator& comm) {
                errors[comm.rank()] = testing::CheckEverything(comm, 42 + size);
                return absl::OkStatus();
              }).ok());
  for (int r = 0; r < size; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, LoopbackSemantics, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(LoopbackTest, SplitFormsGroupsOrderedByKey) {
  // Colours: even/odd ranks; keys reverse the order inside each group; rank 5 opts out.
  std::vector<std::string> errors(6);
  ASSERT_TRUE(RunLoopbackRanks(6, Quick(), nullptr, [&](Communicator& comm) -> Status {
                const int color = comm.rank() == 5 ? kNoColor : comm.rank() % 2;
                ZR_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub,
                                    comm.Split(color, -comm.rank(), Quick()));
                if (comm.rank() == 5) {
                  if (sub != nullptr) errors[5] = "rank 5 got a group for kNoColor";
                  return absl::OkStatus();
                }
                const int expected_size = color == 0 ? 3 : 2;  // {0,2,4} and {1,3}
                if (sub->size() != expected_size) {
                  errors[comm.rank()] = StrCat("size ", sub->size());
                  return absl::OkStatus();
                }
                // Higher world rank, lower key, lower sub-rank.
                const int expected_rank =
                    color == 0 ? (4 - comm.rank()) / 2 : (3 - comm.rank()) / 2;
                if (sub->rank() != expected_rank)
                  errors[comm.rank()] = StrCat("sub rank ", sub->rank());
                // The sub-group works and is independent of the other one.
                int32_t v = comm.rank();
                ZR_RETURN_IF_ERROR(sub->AllReduce(&v, &v, 1, DType::kI32, ReduceOp::kSum));
                const int want = color == 0 ? 0 + 2 + 4 : 1 + 3;
                if (v != want && errors[comm.rank()].empty())
                  errors[comm.rank()] = StrCat("sum ", v);
                errors[comm.rank()] += testing::CheckEverything(*sub, 7);
                return absl::OkStatus();
              }).ok());
  for (int r = 0; r < 6; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(LoopbackTest, MismatchedCollectivesNameBothCalls) {
  std::vector<Status> results(2);
  ASSERT_FALSE(RunLoopbackRanks(2, Quick(), nullptr, [&](Communicator& comm) {
                 float x[4] = {1, 2, 3, 4};
                 float y[8];
                 results[comm.rank()] = comm.rank() == 0
                                            ? comm.AllReduce(x, x, 4, DType::kF32, ReduceOp::kSum)
                                            : comm.AllGather(x, y, 4, DType::kF32);
                 return results[comm.rank()];
               }).ok());
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("rank 0 called all_reduce(count=4, f32, sum)"), std::string::npos)
        << s;
    EXPECT_NE(s.message().find("rank 1 called all_gather(count=4, f32)"), std::string::npos) << s;
  }
}

TEST(LoopbackTest, ValidationRejectsBadArguments) {
  ASSERT_TRUE(RunLoopbackRanks(2, Quick(), nullptr, [&](Communicator& comm) {
                float buf[8] = {};
                EXPECT_EQ(comm.Broadcast(buf, 1, DType::kF32, 2).code(),
                          absl::StatusCode::kInvalidArgument);
                EXPECT_EQ(comm.AllReduce(buf, buf, 1, DType::kI32, ReduceOp::kAvg).code(),
                          absl::StatusCode::kInvalidArgument);
                EXPECT_EQ(comm.AllReduce(buf, buf + 1, 4, DType::kF32, ReduceOp::kSum).code(),
                          absl::StatusCode::kInvalidArgument);
                EXPECT_EQ(comm.p2p().Send(buf, 1, DType::kF32, comm.rank()).code(),
                          absl::StatusCode::kInvalidArgument);
                EXPECT_EQ(comm.AllGather(nullptr, buf, 1, DType::kF32).code(),
                          absl::StatusCode::kInvalidArgument);
                return absl::OkStatus();
              }).ok());
}

TEST(LoopbackTest, MissingPeerTimesOutWithoutWatchdog) {
  std::vector<Status> results(3);
  const auto start = Clock::now();
  RunLoopbackRanks(3, Quick(std::chrono::milliseconds(300)), nullptr, [&](Communicator& comm) {
    float x = 1;
    // Rank 2 skips the collective.
    results[comm.rank()] = comm.rank() == 2
                               ? absl::OkStatus()
                               : comm.AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
    return results[comm.rank()];
  }).IgnoreError();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded) << results[0];
  EXPECT_EQ(results[1].code(), absl::StatusCode::kDeadlineExceeded) << results[1];
}

TEST(LoopbackTest, WatchdogReportsTheHungCollective) {
  std::string report;
  std::atomic<bool> fired{false};
  Watchdog::Options wo;
  wo.poll_interval = std::chrono::milliseconds(20);
  wo.on_timeout = [&](const std::string& r) {
    report = r;
    fired = true;
  };
  Watchdog watchdog(wo);
  RunLoopbackRanks(2, Quick(std::chrono::milliseconds(200)), &watchdog, [&](Communicator& comm) {
    comm.recorder().SetLabel("gather blocks.3");
    float x[2] = {1, 2};
    if (comm.rank() == 0) return comm.Broadcast(x, 2, DType::kF32, 0);
    return absl::OkStatus();
  }).IgnoreError();
  ASSERT_TRUE(fired.load());
  EXPECT_NE(report.find("broadcast seq 1 of rank 0/2 in group 'world' timed out"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("TIMED-OUT"), std::string::npos) << report;
  EXPECT_NE(report.find("gather blocks.3"), std::string::npos) << report;
  EXPECT_NE(report.find("last 0 collectives of rank 1/2"), std::string::npos) << report;
}

TEST(LoopbackDeathTest, HungCollectiveExitsWithCode3AndTrace) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(
      {
        Watchdog watchdog(Watchdog::Options{std::chrono::milliseconds(20), {}});
        RunLoopbackRanks(
            3, Quick(std::chrono::milliseconds(300)), &watchdog,
            [&](Communicator& comm) -> Status {
              float x = 1;
              ZR_RETURN_IF_ERROR(comm.AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum));
              if (comm.rank() == 1) return absl::OkStatus();  // skips the next one
              return comm.AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
            })
            .IgnoreError();
        std::exit(0);
      },
      ::testing::ExitedWithCode(kExitCollectiveTimeout),
      "all_reduce seq 2 of rank [02]/3 in group .world. timed out(.|\n)*"
      "last 2 collectives of rank 0/3(.|\n)*seq 2 all_reduce");
}

// A program that handles SIGTERM itself forwards it (Watchdog::ForwardStopSignal): nothing in
// flight, or a collective that completes within the grace, is a graceful stop; a collective still
// blocked after the grace (a dead peer under mpirun) ends the run as a timeout would.
TEST(WatchdogTest, ForwardedStopSignalAbortsOnlyWhenACollectiveStaysBlocked) {
  std::mutex mu;
  std::string report;
  std::atomic<int> fired{0};
  Watchdog::Options wo;
  wo.poll_interval = std::chrono::milliseconds(20);
  wo.stop_grace = std::chrono::milliseconds(200);
  wo.on_timeout = [&](const std::string& r) {
    std::lock_guard lock(mu);
    report = r;
    ++fired;
  };
  Watchdog watchdog(wo);
  ASSERT_TRUE(watchdog.InstallSignalDump().ok());
  CollectiveTrace trace("world", "test", 0, 2, 16);
  watchdog.Register(&trace, nullptr);
  Watchdog::ForwardStopSignal(SIGUSR1);  // nothing in flight
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(fired.load(), 0);
  const uint64_t quick =
      trace.Begin(CollectiveOp::kAllReduce, 4, DType::kF32, -1, std::chrono::seconds(60));
  Watchdog::ForwardStopSignal(SIGUSR1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  trace.End(quick, true);  // completes within the grace
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(fired.load(), 0);
  trace.SetLabel("recv_forward 0.0");
  trace.Begin(CollectiveOp::kExchange, 8, DType::kF32, 1, std::chrono::seconds(60));
  Watchdog::ForwardStopSignal(SIGUSR1);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_EQ(fired.load(), 1);
  {
    std::lock_guard lock(mu);
    EXPECT_NE(report.find("still waiting 0.2 s after signal"), std::string::npos) << report;
    EXPECT_NE(report.find("recv_forward 0.0"), std::string::npos) << report;
  }
  watchdog.Unregister(&trace);
}

// LoopbackSends::kRendezvous imitates NCCL: two ranks that each post a send to the other and then
// receive on the same communicator wait for each other for ever (NCCL runs a communicator's
// operations in order, and a send ends when received): each fails with DeadlineExceeded. The same
// transfers on two directed communicators (one per direction, as the pipeline executor's links)
// complete; buffered sends (MPI-like) complete either way.
Status CrossedSends(Communicator& comm, LoopbackSends sends, bool directed) {
  const int peer = 1 - comm.rank();
  std::unique_ptr<Communicator> up, down;  // 0 -> 1 and 1 -> 0
  Communicator* out = &comm;
  Communicator* in = &comm;
  if (directed) {
    ZR_ASSIGN_OR_RETURN(up, comm.Split(0, comm.rank(), comm.options()));
    ZR_ASSIGN_OR_RETURN(down, comm.Split(0, comm.rank(), comm.options()));
    out = comm.rank() == 0 ? up.get() : down.get();
    in = comm.rank() == 0 ? down.get() : up.get();
  }
  const float mine = static_cast<float>(comm.rank() + 1);
  float theirs = 0;
  ZR_RETURN_IF_ERROR(out->p2p().PostSend(&mine, 1, DType::kF32, peer));
  if (sends == LoopbackSends::kRendezvous && !directed) {
    // Not received yet: the peer is blocked in its own receive.
    if (out->p2p().posted_sends() != 1)
      return absl::InternalError("the posted send completed early");
  }
  ZR_RETURN_IF_ERROR(in->p2p().Recv(&theirs, 1, DType::kF32, peer));
  if (theirs != static_cast<float>(peer + 1)) return absl::InternalError("wrong value received");
  ZR_RETURN_IF_ERROR(out->p2p().WaitSends());
  return out->p2p().posted_sends() == 0
             ? absl::OkStatus()
             : absl::InternalError("a send still posted after WaitSends");
}

TEST(LoopbackRendezvousTest, CrossedPostedSendsDeadlockOnOneCommunicatorOnly) {
  const CommOptions quick = Quick(std::chrono::milliseconds(300));
  for (bool directed : {false, true}) {
    EXPECT_TRUE(
        RunLoopbackRanks(
            2, quick, nullptr,
            [&](Communicator& c) { return CrossedSends(c, LoopbackSends::kBuffered, directed); },
            LoopbackSends::kBuffered)
            .ok());
  }
  const Status one = RunLoopbackRanks(
      2, quick, nullptr,
      [&](Communicator& c) { return CrossedSends(c, LoopbackSends::kRendezvous, false); },
      LoopbackSends::kRendezvous);
  EXPECT_EQ(one.code(), absl::StatusCode::kDeadlineExceeded) << one;
  EXPECT_NE(one.message().find("was not received in time"), std::string_view::npos) << one;
  const Status two = RunLoopbackRanks(
      2, quick, nullptr,
      [&](Communicator& c) { return CrossedSends(c, LoopbackSends::kRendezvous, true); },
      LoopbackSends::kRendezvous);
  EXPECT_TRUE(two.ok()) << two;
}

// Host values staged through an allocator's memory in chunks (runtime/host_collectives.h): more
// than one chunk and a remainder, summed over three ranks, every element right.
TEST(HostCollectivesTest, AllReduceHostValuesInChunks) {
  constexpr size_t kCount = 2 * (kHostValuesChunkBytes / sizeof(float)) + 5;
  std::vector<std::string> errors(3);
  ASSERT_TRUE(RunLoopbackRanks(3, Quick(), nullptr, [&](Communicator& comm) -> Status {
                std::unique_ptr<Allocator> allocator = MakeCpuCachingAllocator(nullptr);
                ZR_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream,
                                    CreateStream(Device::Cpu(), "compute"));
                std::vector<float> values(kCount);
                for (size_t i = 0; i < kCount; ++i) values[i] = float(i % 1000) + comm.rank();
                ZR_RETURN_IF_ERROR(AllReduceHostValues(comm, *allocator, *stream, values.data(),
                                                       kCount, DType::kF32, ReduceOp::kSum));
                for (size_t i = 0; i < kCount; ++i) {
                  if (values[i] != 3 * float(i % 1000) + 3) {
                    errors[comm.rank()] = StrCat("element ", i, " is ", values[i]);
                    break;
                  }
                }
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(errors, std::vector<std::string>(3));
}

}  // namespace
}  // namespace zerort
