// Pipeline schedule tables for every p in 1..8, m in 1..16, v in 1..4 the schedules allow: every
// (micro-batch, chunk) goes forward once and backward once, forward first; the warm-up counts are
// Megatron-LM core v0.10's (m = p included); executed together with buffered sends and blocking
// receives, every stage finishes and every receive gets the send it expects, in order, on its link;
// micro-batches in flight stay within the schedule's bound; with uniform costs the bubble is
// (p-1)/m for GPipe and 1F1B and (p-1)/(v m) for the interleaved schedule.
#include "zerort/layers/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <tuple>

namespace zerort {
namespace {

std::vector<PipelineShape> AllShapes() {
  std::vector<PipelineShape> out;
  for (PipelineSchedule s :
       {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        for (int v = 1; v <= 4; ++v) {
          const PipelineShape shape{s, p, m, v};
          if (ValidatePipelineShape(shape).ok()) out.push_back(shape);
        }
      }
    }
  }
  return out;
}

std::string Name(const PipelineShape& s) {
  return std::string(PipelineScheduleName(s.schedule)) + " p" + std::to_string(s.stages) + " m" +
         std::to_string(s.micro_batches) + " v" + std::to_string(s.virtual_stages);
}

// Megatron-LM's num_warmup_microbatches (core v0.10 and later, schedules.py, with
// microbatch_group_size_per_vp_stage = p), written out independently.
int MegatronWarmup(const PipelineShape& s, int rank) {
  const int p = s.stages, m = s.micro_batches, v = s.virtual_stages;
  if (s.schedule == PipelineSchedule::kGpipe) return m;
  if (s.schedule == PipelineSchedule::k1F1B) return std::min(p - rank - 1, m);
  return std::min((p - rank - 1) * 2 + (v - 1) * p, m * v);
}

// The most (micro-batch, chunk) forwards a stage's list has run and not yet taken back: the chunk
// activation sets it holds at once.
int MaxChunkSetsHeld(const std::vector<PipelineAction>& actions) {
  int held = 0, most = 0;
  for (const PipelineAction& a : actions) {
    if (a.op == PipelineOp::kForward) most = std::max(most, ++held);
    if (a.op == PipelineOp::kBackward) --held;
  }
  return most;
}

// At m = p, Megatron core v0.9 and earlier ran every forward of the interleaved schedule first
// (m v on every stage); since November 2024 (core v0.10) the usual rule holds, so every stage but
// the first starts 1F1B before its last forward, and the later stages hold fewer micro-batches.
TEST(PipelineScheduleTest, InterleavedWarmupAtMEqualsPIsCurrentMegatrons) {
  for (int p = 2; p <= 8; ++p) {
    for (int v = 2; v <= 4; ++v) {
      const PipelineShape s{PipelineSchedule::kInterleaved, p, p, v};
      const int total = p * v;
      for (int stage = 0; stage < p; ++stage) {
        const int want = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
        EXPECT_EQ(PipelineWarmup(s, stage), want) << Name(s) << " stage " << stage;
        // The stages past the middle (2 (p - s - 1) < p) start 1F1B before their last forward,
        // and those with 2 (p - s - 1) + 1 < p hold fewer chunk activation sets than all m v.
        const int held = MaxChunkSetsHeld(*PipelineActions(s, stage));
        if (2 * (p - stage - 1) < p) {
          EXPECT_LT(PipelineWarmup(s, stage), total) << Name(s) << " stage " << stage;
          EXPECT_EQ(held, want + 1) << Name(s) << " stage " << stage;
        } else {
          EXPECT_EQ(held, total) << Name(s) << " stage " << stage;
        }
        if (2 * (p - stage - 1) + 1 < p) {
          EXPECT_LT(held, total) << Name(s) << " stage " << stage;
        }
      }
      EXPECT_EQ(PipelineWarmup(s, p - 1), (v - 1) * p) << Name(s);
    }
  }
}

TEST(PipelineScheduleTest, EveryMicroBatchOnceForwardFirstWithMegatronsWarmup) {
  int shapes = 0;
  for (const PipelineShape& s : AllShapes()) {
    ++shapes;
    for (int stage = 0; stage < s.stages; ++stage) {
      const std::vector<PipelineAction> actions = *PipelineActions(s, stage);
      std::map<std::pair<int, int>, int> forwarded, backwarded;
      int forwards_before_first_backward = -1, forwards = 0;
      for (size_t i = 0; i < actions.size(); ++i) {
        const PipelineAction& a = actions[i];
        const auto key = std::make_pair(a.micro_batch, a.chunk);
        if (a.op == PipelineOp::kForward) {
          ++forwards;
          ASSERT_EQ(forwarded[key]++, 0) << Name(s) << " stage " << stage;
        }
        if (a.op == PipelineOp::kBackward) {
          if (forwards_before_first_backward < 0) forwards_before_first_backward = forwards;
          ASSERT_EQ(forwarded[key], 1) << Name(s) << ": backward before forward";
          ASSERT_EQ(backwarded[key]++, 0) << Name(s);
        }
      }
      ASSERT_EQ(forwarded.size(), static_cast<size_t>(s.micro_batches * s.virtual_stages));
      ASSERT_EQ(backwarded.size(), forwarded.size());
      // The warm-up forwards, then the steady phase's first forward (when there is one).
      const int total = s.micro_batches * s.virtual_stages;
      EXPECT_EQ(forwards_before_first_backward, std::min(MegatronWarmup(s, stage) + 1, total))
          << Name(s) << " stage " << stage;
      EXPECT_EQ(PipelineWarmup(s, stage), MegatronWarmup(s, stage)) << Name(s);
    }
  }
  EXPECT_GT(shapes, 300);
}

struct Simulation {
  bool finished = false;
  std::string error;
  double bubble = 0;               // (step time - ideal) / ideal
  std::vector<int> max_in_flight;  // per stage
};

// Runs every stage's list together: a send is buffered on its link at once; a receive blocks
// until the matching message is first on its link. Forward costs 1 / v, backward 2 / v.
Simulation Simulate(const PipelineShape& s) {
  const int p = s.stages;
  std::vector<std::vector<PipelineAction>> lists(p);
  for (int st = 0; st < p; ++st) lists[st] = *PipelineActions(s, st);
  struct Message {
    int micro_batch, chunk;  // as the receiver names it
    double time;
  };
  // links[{from, to, backward}]
  std::map<std::tuple<int, int, bool>, std::deque<Message>> links;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0.0);
  std::vector<int> in_flight(p, 0);
  Simulation out;
  out.max_in_flight.assign(p, 0);
  const double tf = 1.0 / s.virtual_stages, tb = 2.0 / s.virtual_stages;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int st = 0; st < p; ++st) {
      while (next[st] < lists[st].size()) {
        const PipelineAction& a = lists[st][next[st]];
        if (a.op == PipelineOp::kRecvForward || a.op == PipelineOp::kRecvBackward) {
          const bool bwd = a.op == PipelineOp::kRecvBackward;
          const ChunkAddress from = bwd ? NextChunk(s, st, a.chunk) : PreviousChunk(s, st, a.chunk);
          auto& q = links[{from.stage, st, bwd}];
          if (q.empty()) break;  // blocks
          const Message msg = q.front();
          q.pop_front();
          if (msg.micro_batch != a.micro_batch || msg.chunk != a.chunk) {
            out.error = Name(s) + ": stage " + std::to_string(st) + " received micro-batch " +
                        std::to_string(msg.micro_batch) + " chunk " + std::to_string(msg.chunk) +
                        ", expected " + std::to_string(a.micro_batch) + "/" +
                        std::to_string(a.chunk);
            return out;
          }
          clock[st] = std::max(clock[st], msg.time);
        } else if (a.op == PipelineOp::kSendForward || a.op == PipelineOp::kSendBackward) {
          const bool bwd = a.op == PipelineOp::kSendBackward;
          const ChunkAddress to = bwd ? PreviousChunk(s, st, a.chunk) : NextChunk(s, st, a.chunk);
          links[{st, to.stage, bwd}].push_back({a.micro_batch, to.chunk, clock[st]});
        } else if (a.op == PipelineOp::kForward) {
          clock[st] += tf;
          out.max_in_flight[st] = std::max(out.max_in_flight[st], ++in_flight[st]);
        } else {
          clock[st] += tb;
          --in_flight[st];
        }
        ++next[st];
        progress = true;
      }
    }
  }
  for (int st = 0; st < p; ++st) {
    if (next[st] != lists[st].size()) {
      out.error = Name(s) + ": deadlock at stage " + std::to_string(st) + " action " +
                  std::to_string(next[st]);
      return out;
    }
  }
  for (const auto& [link, q] : links) {
    if (!q.empty()) {
      out.error = Name(s) + ": a send nobody received";
      return out;
    }
  }
  const double ideal = s.micro_batches * (tf + tb) * s.virtual_stages;
  out.bubble = (*std::max_element(clock.begin(), clock.end()) - ideal) / ideal;
  out.finished = true;
  return out;
}

TEST(PipelineScheduleTest, SendsPairWithReceivesAndNothingDeadlocks) {
  for (const PipelineShape& s : AllShapes()) {
    const Simulation sim = Simulate(s);
    ASSERT_TRUE(sim.finished) << sim.error;
    for (int st = 0; st < s.stages; ++st) {
      int bound = 0;
      switch (s.schedule) {
        case PipelineSchedule::kGpipe:
          bound = s.micro_batches;  // every micro-batch's activations at once
          break;
        case PipelineSchedule::k1F1B:
          bound = std::min(s.stages - st, s.micro_batches);  // at most p
          break;
        case PipelineSchedule::kInterleaved:
          bound = std::min(PipelineWarmup(s, st) + 1, s.micro_batches * s.virtual_stages);
          break;
      }
      EXPECT_EQ(sim.max_in_flight[st], bound) << Name(s) << " stage " << st;
      // What the estimator reads: whole micro-batches held by the executor (a micro-batch holds
      // every local chunk's activations from its first forward to its chunk-0 backward).
      const int live = PipelineLiveMicroBatches(*PipelineActions(s, st));
      if (s.schedule == PipelineSchedule::kInterleaved) {
        const int v = s.virtual_stages;
        EXPECT_GE(live, (bound + v - 1) / v) << Name(s) << " stage " << st;
        EXPECT_LE(live, s.micro_batches) << Name(s) << " stage " << st;
      } else {
        EXPECT_EQ(live, bound) << Name(s) << " stage " << st;
      }
    }
  }
}

TEST(PipelineScheduleTest, LiveMicroBatchesOfForwardOnlyLists) {
  // Evaluation holds a micro-batch until its last local forward, and runs each one through all
  // its chunks before the next: one at a time, whatever the schedule.
  for (const PipelineShape& s : {PipelineShape{PipelineSchedule::kGpipe, 4, 8, 1},
                                 PipelineShape{PipelineSchedule::k1F1B, 4, 8, 1},
                                 PipelineShape{PipelineSchedule::kInterleaved, 4, 8, 2}}) {
    for (int st = 0; st < 4; ++st) {
      EXPECT_EQ(PipelineLiveMicroBatches(*PipelineForwardActions(s, st)), 1) << Name(s) << st;
    }
  }
}

// The executor's batches: a batch of receives completes once the partner send of each has been
// posted; a send is posted and never waited for (rendezvous or not, it completes once its
// receive is posted, in the background). With `blocking_sends` a send instead waits for its
// receive to be posted (what MPI_Send or a lone ncclSend does with large messages), which the
// interleaved schedule cannot survive. Returns "" or what went wrong.
std::string SimulateRendezvous(const PipelineShape& s, bool forward_only,
                               bool blocking_sends = false) {
  const int p = s.stages;
  std::vector<std::vector<std::vector<PipelineAction>>> batches(p);
  // Per link (from, to, backward): the batch index holding the k-th send at `from` and the
  // k-th receive at `to`.
  std::map<std::tuple<int, int, bool>, std::vector<size_t>> send_at, recv_at;
  struct Op {
    std::tuple<int, int, bool> link;
    size_t ordinal;
    bool send;
  };
  std::vector<std::vector<std::vector<Op>>> ops(p);
  for (int st = 0; st < p; ++st) {
    auto actions = forward_only ? PipelineForwardActions(s, st) : PipelineActions(s, st);
    if (!actions.ok()) return actions.status().ToString();
    batches[st] = PipelineBatches(*actions);
    ops[st].resize(batches[st].size());
    for (size_t b = 0; b < batches[st].size(); ++b) {
      const auto& batch = batches[st][b];
      if (batch.size() > 1) {
        for (const PipelineAction& a : batch) {
          if (!IsCommunication(a.op)) return Name(s) + ": compute inside a batch";
        }
      }
      for (const PipelineAction& a : batch) {
        const bool bwd = a.op == PipelineOp::kSendBackward || a.op == PipelineOp::kRecvBackward;
        if (a.op == PipelineOp::kSendForward || a.op == PipelineOp::kSendBackward) {
          const ChunkAddress to = bwd ? PreviousChunk(s, st, a.chunk) : NextChunk(s, st, a.chunk);
          auto& v = send_at[{st, to.stage, bwd}];
          ops[st][b].push_back({{st, to.stage, bwd}, v.size(), true});
          v.push_back(b);
        } else if (IsCommunication(a.op)) {
          const ChunkAddress from = bwd ? NextChunk(s, st, a.chunk) : PreviousChunk(s, st, a.chunk);
          auto& v = recv_at[{from.stage, st, bwd}];
          ops[st][b].push_back({{from.stage, st, bwd}, v.size(), false});
          v.push_back(b);
        }
      }
    }
  }
  std::vector<size_t> at(p, 0);  // each stage's current batch (posted)
  bool progress = true;
  while (progress) {
    progress = false;
    for (int st = 0; st < p; ++st) {
      while (at[st] < batches[st].size()) {
        bool done = true;
        for (const Op& op : ops[st][at[st]]) {
          if (op.send && !blocking_sends) continue;
          const auto& [from, to, bwd] = op.link;
          const auto& partners = op.send ? recv_at[op.link] : send_at[op.link];
          if (op.ordinal >= partners.size()) return Name(s) + ": an operation without a partner";
          if (partners[op.ordinal] > at[op.send ? to : from]) done = false;
        }
        if (!done) break;
        ++at[st];
        progress = true;
      }
    }
  }
  for (int st = 0; st < p; ++st) {
    if (at[st] != batches[st].size()) {
      return Name(s) + (forward_only ? " forward-only" : "") + ": deadlock at stage " +
             std::to_string(st) + " batch " + std::to_string(at[st]);
    }
  }
  return "";
}

TEST(PipelineScheduleTest, BatchesOfReceivesWithPostedSendsNeverDeadlock) {
  for (const PipelineShape& s : AllShapes()) {
    ASSERT_EQ(SimulateRendezvous(s, false), "");
    ASSERT_EQ(SimulateRendezvous(s, true), "");
  }
  // Why sends are posted: sends that wait for their receive deadlock (1F1B's steady state: two
  // neighbours send to each other at once).
  EXPECT_NE(SimulateRendezvous({PipelineSchedule::k1F1B, 4, 8, 1}, false, true), "");
}

TEST(PipelineScheduleTest, BubbleFractionsAreTheTextbooksWithUniformCosts) {
  for (const PipelineShape& s : AllShapes()) {
    const Simulation sim = Simulate(s);
    ASSERT_TRUE(sim.finished) << sim.error;
    const double p = s.stages, m = s.micro_batches, v = s.virtual_stages;
    const double want =
        s.schedule == PipelineSchedule::kInterleaved ? (p - 1) / (v * m) : (p - 1) / m;
    EXPECT_NEAR(sim.bubble, want, 1e-9) << Name(s);
  }
}

TEST(PipelineScheduleTest, RefusesShapesTheSchedulesDoNotAllow) {
  EXPECT_FALSE(ValidatePipelineShape({PipelineSchedule::k1F1B, 4, 3, 1}).ok());         // m < p
  EXPECT_FALSE(ValidatePipelineShape({PipelineSchedule::kInterleaved, 4, 6, 2}).ok());  // m % p
  EXPECT_FALSE(ValidatePipelineShape({PipelineSchedule::kInterleaved, 2, 4, 1}).ok());  // v < 2
  EXPECT_FALSE(ValidatePipelineShape({PipelineSchedule::kGpipe, 2, 4, 2}).ok());
  EXPECT_FALSE(ValidatePipelineShape({PipelineSchedule::kGpipe, 0, 4, 1}).ok());
  EXPECT_NE(ValidatePipelineShape({PipelineSchedule::k1F1B, 4, 3, 1}).message().find("3 micro"),
            std::string::npos);
  EXPECT_FALSE(PipelineActions({PipelineSchedule::k1F1B, 2, 4, 1}, 2).ok());
  EXPECT_EQ(*ParsePipelineSchedule("interleaved"), PipelineSchedule::kInterleaved);
  EXPECT_FALSE(ParsePipelineSchedule("zb-h1").ok());
}

}  // namespace
}  // namespace zerort
