// The hang tests, run as real jobs under mpirun: a rank that skips a collective makes the others
// exit with code 3 shortly after the timeout, each printing its last collectives (the stuck
// rank prints its own when mpirun terminates it); a rank that dies does not leave the others
// waiting forever.
#include <array>
#include <chrono>
#include <cstdio>
#include <string>

#include <sys/wait.h>

#include "gtest/gtest.h"

namespace {

struct Result {
  int exit_code;
  double seconds;
  std::string output;
};

Result RunJob(const std::string& mode, int ranks, int timeout_ms) {
  const std::string command = std::string(ZR_MPIEXEC) + " -np " + std::to_string(ranks) +
                              " --oversubscribe " + ZR_HANG_PROBE + " " + mode + " " +
                              std::to_string(timeout_ms) + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  Result result{-1, 0, ""};
  if (pipe == nullptr) return result;
  std::array<char, 4096> chunk;
  while (fgets(chunk.data(), chunk.size(), pipe) != nullptr) result.output += chunk.data();
  const int status = pclose(pipe);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

TEST(HangTest, SkippedCollectiveExitsWithCode3AndEveryRankPrintsItsTrace) {
  const Result r = RunJob("skip", 3, 2000);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 2.0 + 10.0) << r.output;
  EXPECT_NE(r.output.find("timed out after"), std::string::npos) << r.output;
  for (int rank : {0, 2}) {
    EXPECT_NE(r.output.find("last 2 collectives of rank " + std::to_string(rank) + "/3"),
              std::string::npos)
        << "rank " << rank << " did not print its trace:\n"
        << r.output;
  }
  EXPECT_NE(r.output.find("unit blocks.3 backward"), std::string::npos) << r.output;
  // The stuck rank is terminated by mpirun and prints what it had done.
  EXPECT_NE(r.output.find("last 1 collectives of rank 1/3"), std::string::npos) << r.output;
}

TEST(HangTest, DeadRankDoesNotLeaveTheOthersWaiting) {
  const Result r = RunJob("die", 3, 4000);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 4.0 + 10.0) << r.output;
}

}  // namespace
