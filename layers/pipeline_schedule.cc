// Pipeline schedules as data.
#include "zerort/layers/pipeline_schedule.h"

#include <algorithm>
#include <set>

#include "zerort/runtime/strings.h"

namespace zerort {

std::string_view PipelineScheduleName(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::kGpipe:
      return "gpipe";
    case PipelineSchedule::k1F1B:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
  }
  return "?";
}

StatusOr<PipelineSchedule> ParsePipelineSchedule(std::string_view name) {
  for (PipelineSchedule s :
       {PipelineSchedule::kGpipe, PipelineSchedule::k1F1B, PipelineSchedule::kInterleaved}) {
    if (name == PipelineScheduleName(s)) return s;
  }
  return absl::InvalidArgumentError(
      StrCat("pipeline schedule '", name, "': one of gpipe, 1f1b, interleaved"));
}

std::string_view PipelineOpName(PipelineOp op) {
  switch (op) {
    case PipelineOp::kRecvForward:
      return "recv_forward";
    case PipelineOp::kForward:
      return "forward";
    case PipelineOp::kSendForward:
      return "send_forward";
    case PipelineOp::kRecvBackward:
      return "recv_backward";
    case PipelineOp::kBackward:
      return "backward";
    case PipelineOp::kSendBackward:
      return "send_backward";
  }
  return "?";
}

Status ValidatePipelineShape(const PipelineShape& s) {
  const int p = s.stages, m = s.micro_batches, v = s.virtual_stages;
  if (p < 1 || m < 1 || v < 1) {
    return absl::InvalidArgumentError(StrCat("pipeline of ", p, " stages, ", m, " micro-batches, ",
                                             v, " virtual stages: each must be at least 1"));
  }
  switch (s.schedule) {
    case PipelineSchedule::kGpipe:
    case PipelineSchedule::k1F1B:
      if (v != 1) {
        return absl::InvalidArgumentError(StrCat("virtual_pipeline_stages = ", v,
                                                 " needs the interleaved schedule, not ",
                                                 PipelineScheduleName(s.schedule)));
      }
      if (s.schedule == PipelineSchedule::k1F1B && m < p) {
        return absl::InvalidArgumentError(
            StrCat("the 1f1b schedule needs at least as many micro-batches per step as stages: ", m,
                   " micro-batches (gradient_accumulation_steps) < ", p, " stages"));
      }
      return absl::OkStatus();
    case PipelineSchedule::kInterleaved:
      if (p < 2) {
        return absl::InvalidArgumentError(
            "the interleaved schedule needs at least 2 pipeline stages (one stage runs its "
            "chunks one after the other: use 1f1b)");
      }
      if (v < 2) {
        return absl::InvalidArgumentError(
            StrCat("the interleaved schedule needs virtual_pipeline_stages >= 2 (", v, " given)"));
      }
      if (m % p != 0) {
        return absl::InvalidArgumentError(
            StrCat("the interleaved schedule needs the micro-batches per step to be a multiple "
                   "of the stages (Megatron's requirement): ",
                   m, " micro-batches, ", p, " stages"));
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown pipeline schedule");
}

int PipelineLiveMicroBatches(const std::vector<PipelineAction>& actions) {
  bool training = false;
  int last_chunk = 0;
  for (const PipelineAction& a : actions) {
    training = training || a.op == PipelineOp::kBackward;
    last_chunk = std::max(last_chunk, a.chunk);
  }
  std::set<int> live, done_with;
  size_t peak = 0;
  for (const PipelineAction& a : actions) {
    if (done_with.contains(a.micro_batch)) continue;  // its last send
    live.insert(a.micro_batch);
    peak = std::max(peak, live.size());
    const bool done = training ? a.op == PipelineOp::kBackward && a.chunk == 0
                               : a.op == PipelineOp::kForward && a.chunk == last_chunk;
    if (done) {
      live.erase(a.micro_batch);
      done_with.insert(a.micro_batch);
    }
  }
  return static_cast<int>(peak);
}

int PipelineWarmup(const PipelineShape& s, int stage) {
  const int p = s.stages, m = s.micro_batches, v = s.virtual_stages;
  switch (s.schedule) {
    case PipelineSchedule::kGpipe:
      return m;
    case PipelineSchedule::k1F1B:
      return std::min(p - stage - 1, m);
    case PipelineSchedule::kInterleaved:
      // Megatron-LM core v0.10 and later (microbatch_group_size_per_vp_stage = p, its default):
      // up to v0.9 a step with m = p ran every forward first; since November 2024 that case
      // follows the same rule, so later stages start 1F1B earlier.
      return std::min((p - stage - 1) * 2 + (v - 1) * p, m * v);
  }
  return 0;
}

ChunkAddress NextChunk(const PipelineShape& s, int stage, int chunk) {
  if (stage + 1 < s.stages) return {stage + 1, chunk};
  if (chunk + 1 < s.virtual_stages) return {0, chunk + 1};
  return {};
}

ChunkAddress PreviousChunk(const PipelineShape& s, int stage, int chunk) {
  if (stage > 0) return {stage - 1, chunk};
  if (chunk > 0) return {s.stages - 1, chunk - 1};
  return {};
}

StatusOr<std::vector<PipelineAction>> PipelineActions(const PipelineShape& s, int stage) {
  ZR_RETURN_IF_ERROR(ValidatePipelineShape(s));
  const int p = s.stages, m = s.micro_batches, v = s.virtual_stages;
  if (stage < 0 || stage >= p) {
    return absl::InvalidArgumentError(StrCat("pipeline stage ", stage, " of ", p));
  }
  std::vector<PipelineAction> out;
  auto forward = [&](int mb, int chunk) {
    const bool first = PreviousChunk(s, stage, chunk).stage < 0;
    const bool last = NextChunk(s, stage, chunk).stage < 0;
    if (!first) out.push_back({PipelineOp::kRecvForward, mb, chunk});
    out.push_back({PipelineOp::kForward, mb, chunk});
    if (!last) out.push_back({PipelineOp::kSendForward, mb, chunk});
  };
  auto backward = [&](int mb, int chunk) {
    const bool first = PreviousChunk(s, stage, chunk).stage < 0;
    const bool last = NextChunk(s, stage, chunk).stage < 0;
    if (!last) out.push_back({PipelineOp::kRecvBackward, mb, chunk});
    out.push_back({PipelineOp::kBackward, mb, chunk});
    if (!first) out.push_back({PipelineOp::kSendBackward, mb, chunk});
  };
  // Step k of the forward (backward) sequence: which micro-batch and chunk. Interleaved: groups
  // of p micro-batches go through chunk 0, then chunk 1, ... (backward: the last chunk first).
  auto micro_batch = [&](int k) {
    return s.schedule == PipelineSchedule::kInterleaved ? (k / (p * v)) * p + k % p : k;
  };
  auto chunk_of = [&](int k, bool fwd) {
    if (s.schedule != PipelineSchedule::kInterleaved) return 0;
    const int c = (k % (p * v)) / p;
    return fwd ? c : v - 1 - c;
  };
  const int total = m * v;
  const int warmup = PipelineWarmup(s, stage);
  const int steady = total - warmup;
  for (int k = 0; k < warmup; ++k) forward(micro_batch(k), chunk_of(k, true));
  for (int i = 0; i < steady; ++i) {
    forward(micro_batch(warmup + i), chunk_of(warmup + i, true));
    backward(micro_batch(i), chunk_of(i, false));
  }
  for (int k = steady; k < total; ++k) backward(micro_batch(k), chunk_of(k, false));
  return out;
}

bool IsCommunication(PipelineOp op) {
  return op != PipelineOp::kForward && op != PipelineOp::kBackward;
}

std::vector<std::vector<PipelineAction>> PipelineBatches(
    const std::vector<PipelineAction>& actions) {
  std::vector<std::vector<PipelineAction>> out;
  bool open = false;  // the last batch takes more receives
  for (const PipelineAction& a : actions) {
    const bool recv = a.op == PipelineOp::kRecvForward || a.op == PipelineOp::kRecvBackward;
    if (recv && open) {
      out.back().push_back(a);
      continue;
    }
    out.push_back({a});
    open = recv;
  }
  return out;
}

StatusOr<std::vector<PipelineAction>> PipelineForwardActions(const PipelineShape& s, int stage) {
  if (s.stages < 1 || s.micro_batches < 1 || s.virtual_stages < 1 || stage < 0 ||
      stage >= s.stages) {
    return absl::InvalidArgumentError(StrCat("pipeline stage ", stage, " of ", s.stages, ", ",
                                             s.micro_batches, " micro-batches, ", s.virtual_stages,
                                             " virtual stages"));
  }
  std::vector<PipelineAction> out;
  for (int mb = 0; mb < s.micro_batches; ++mb) {
    for (int c = 0; c < s.virtual_stages; ++c) {
      if (PreviousChunk(s, stage, c).stage >= 0) out.push_back({PipelineOp::kRecvForward, mb, c});
      out.push_back({PipelineOp::kForward, mb, c});
      if (NextChunk(s, stage, c).stage >= 0) out.push_back({PipelineOp::kSendForward, mb, c});
    }
  }
  return out;
}

StageLiveness PipelineStageLiveness(const std::vector<PipelineAction>& actions,
                                    const std::vector<std::pair<int, int>>& chunks,
                                    int virtual_stages) {
  StageLiveness out;
  out.micro_batches = PipelineLiveMicroBatches(actions);
  int held = 0;
  for (const PipelineAction& a : actions) {
    const auto [first, last] = chunks[static_cast<size_t>(a.chunk)];
    if (a.op == PipelineOp::kForward) held += last - first;
    if (a.op == PipelineOp::kBackward) held -= last - first;
    out.block_sets = std::max(out.block_sets, held);
  }
  // Spans as forward/backward pairs of one chunk, measured by PipelineLiveMicroBatches.
  const int last_chunk = virtual_stages - 1;
  std::vector<PipelineAction> scratch, head;
  for (const PipelineAction& a : actions) {
    if (a.op == PipelineOp::kBackward && a.chunk == last_chunk) {
      scratch.push_back({PipelineOp::kForward, a.micro_batch, 1});
    }
    if (a.op == PipelineOp::kBackward && a.chunk == 0) {
      scratch.push_back({PipelineOp::kBackward, a.micro_batch, 0});
    }
    if (a.chunk == last_chunk && (a.op == PipelineOp::kForward || a.op == PipelineOp::kBackward)) {
      head.push_back({a.op, a.micro_batch, 0});
    }
  }
  out.backward = PipelineLiveMicroBatches(scratch);
  out.head = PipelineLiveMicroBatches(head);
  return out;
}

}  // namespace zerort
