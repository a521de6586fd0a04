// OneBitAllReduce: DeepSpeed's compressed all-reduce of 1-bit Adam's momentum, with error
// feedback on both sides.
//
// [Note: 1-bit Adam]
// DeepSpeed's OnebitAdam (deepspeed/runtime/fp16/onebit/adam.py and the NCCL backend's
// compressed_allreduce), at ZeRO stage 0, as zerort runs it (ShardedOptimizer, GradientReducer):
//   step 1:  DeepSpeed's initialisation step: the parameters and both moments stay as they are.
//   steps 2 .. max(freeze_step, 2) (warm-up): gradients all-reduced and averaged as at stage 0;
//            m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, p -= lr (m / (sqrt(v) + eps) + wd p).
//   later steps (compression): no gradient all-reduce (each rank keeps the gradient of its own
//            micro-batches); v frozen; m = b1 m + (1-b1) g_local, then m = the compressed
//            all-reduce of m below, alike on every rank; then the same parameter update.
// No bias correction (DeepSpeed's bias_correction key is ignored by OnebitAdam, and by zerort).
// The compressed all-reduce of one unit over the N data-parallel ranks, parameter by parameter
// (DeepSpeed compresses each parameter tensor, with its own scales):
//   a parameter of n elements is padded with zeros to P = n rounded up to N x lcm(N, 8);
//   worker: b = m + e_w (P values, e_w this rank's worker error); scale s = ||b|| / sqrt(P);
//           signs of b (1 bit each, 0 counted as +); e_w = b - s sign(b);
//   phase 1: an all-to-all (a ring of SendRecv) of the signs, chunk r (P/N elements) to rank r,
//           every scale going along: one message per peer of every parameter's chunk and scales;
//   server: c = sum over w of sign_w x (s_w / N) + e_s (P/N values, e_s this rank's server
//           error); s' = ||c|| / sqrt(P/N); e_s = c - s' sign(c);
//   phase 2: an all-gather of every rank's server signs and scales; every rank rebuilds the same
//           m = s'_r sign_r over the chunks r, the padding dropped.
// Bytes per rank and unit: 2 (N-1) x (sum of P/(8N) + 4 x parameters, rounded up to 4 bytes)
// against the fp32 all-reduce's 2 (N-1)/N x 4 n: about 1/32.
// State per unit: e_w (sum of P) and e_s (sum of P/N) fp32 values on the optimizer tier,
// UnitPlan's kWorkerError and kServerError rows (the estimator counts them). They are not saved:
// a checkpoint load zeroes them, as DeepSpeed resets them (they are per rank and bound to N).
// Unlike DeepSpeed, whose first step after a restart is again an initialisation step, zerort's
// is step 1 of the run, so a resume during the warm-up continues the uninterrupted curve.
//
// [Note: 0/1 Adam]
// DeepSpeed's ZeroOneAdam (onebit/zoadam.py), at ZeRO stage 0, with the same compressed all-reduce
// and errors; its counters are ZeroOneSchedule's (zero_one_schedule.h):
//   step 1: the initialisation step (nothing changes);
//   until var_freeze_step + 1: steps that are multiples of the variance interval (1, doubling
//     after every var_update_scaler of them) all-reduce the gradient and update m and v; the
//     others compress the gradient g (scaled by the step's grad_scale) and set m = b1 m +
//     (1-b1) g_mean (with one rank, m stays); every step p -= lr (m / (sqrt(v) + eps) + wd p);
//   later (the errors zeroed once): local steps, m from this rank's gradient, t = -lr x update
//     added to p and to the accumulator acc, the learning rates summed in lrs; at multiples of
//     the local-step interval (1, doubling every local_step_scaler steps up to
//     local_step_clipper): p -= acc, acc x= sqrt(v) + eps, acc = its compressed mean, m =
//     -acc / lrs, p += acc / (sqrt(v) + eps), acc = 0, lrs = 0.
// Between synchronisations the ranks' parameters and momenta differ (each its own local steps);
// checkpoints hold rank 0's. A load zeroes the errors, the accumulator and lrs (DeepSpeed pops
// the errors and the accumulator).
//
// [Note: 1-bit LAMB]
// DeepSpeed's OnebitLamb (onebit/lamb.py), at ZeRO stage 0 and tensor-parallel size 1, with the
// same compressed all-reduce (ShardedOptimizer::StepOneBitLamb):
//   step 1: the initialisation step (nothing changes);
//   steps 2 .. max(freeze_step, 2) (warm-up): gradients all-reduced; LAMB without bias
//     correction (m, v; u = m / (sqrt(v) + eps) + wd p; trust ratio ||p|| / ||u|| clamped to
//     [min_coeff, max_coeff], 1 where either norm is 0; p -= lr x ratio x u), and per parameter
//     the frozen coefficient c = coeff_beta c + (1 - coeff_beta) ratio whenever ratio != 1; at
//     step freeze_step (when it is >= 2) v_fresh = v.
//   later steps (compression): no gradient all-reduce; v and c frozen. At the first of them
//     each parameter's scaling = (mean over the rank's parameters of ||m|| / sqrt(n)) /
//     (its own ||m|| / sqrt(n)) (1 where its momentum is 0: DeepSpeed divides by zero there).
//     fused = (b1 m + (1-b1) g_local) x scaling for every parameter, one flat buffer over every
//     unit of the rank (DeepSpeed's exp_avg_flat: the parameters in model order, padded to
//     N x lcm(N, 8)) compressed as ONE segment (not per parameter, as 1-bit Adam); its padding
//     keeps what the last mean left there, as DeepSpeed's dummy tensor does. Then per parameter
//     m' = fused / scaling, r = (m' - b1 m) / (1-b1), v_fresh = b2 v_fresh + (1-b2) r^2, m = m',
//     u0 = m' / (sqrt(v) + eps), u = u0 + wd p; factor = max over elements of
//     (sqrt(v) + eps) / (sqrt(v_fresh) + eps), with decay blended as f x q + (1 - q),
//     q = min(1, ||u0|| / ||u||); clamped to [factor_min, factor_max] and to last_factor x
//     (1 -/+ factor_threshold); last_factor = factor; p -= lr x c x factor x u.
// State: v_fresh per element (UnitPlan's kExpAvgSqFresh, saved as "exp_avg_sq_fresh"); per
// parameter c, last_factor and scaling (OneBitLambParam, saved in the checkpoint's parameter
// table: stage 0 keeps them alike on every data rank); per rank the fused momentum, the worker
// and the server error (PlanRankBuffers: about two copies of the momentum more than DeepSpeed's,
// whose momenta are views into its fused buffer). A load zeroes the errors and the fused buffer's
// padding (DeepSpeed rebuilds both); unlike DeepSpeed, which resets c, last_factor and scaling on
// a load in the warm-up, zerort restores them, so a resume in the warm-up is the uninterrupted run.
// Bytes per rank and step: 2 (N-1) x (P/(8N) + 4, rounded up to 4) for P padded elements.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/communicator.h"
#include "zerort/runtime/tensor.h"
#include "zerort/sharding/flat_layout.h"

namespace zerort {

// 1-bit LAMB's scalars of one parameter ([Note: 1-bit LAMB]); DeepSpeed's initial values.
struct OneBitLambParam {
  float coeff_freeze = 0.0f;  // lamb_coeff_freeze
  float last_factor = 1.0f;
  float scaling = 0.0f;  // scaling_coeff; 0 until the first compressed step sets it
};

class OneBitAllReduce {
 public:
  // One parameter of a unit: `numel` elements at `offset` of the unit's flat fp32 momentum.
  struct Segment {
    int64_t offset = 0;
    int64_t numel = 0;
  };
  // n padded as DeepSpeed pads it for `ranks` ranks: a multiple of ranks x lcm(ranks, 8).
  static int64_t Padded(int64_t numel, int ranks);
  // The worker error's elements (sum of the padded sizes); the server error's are this / ranks.
  static int64_t WorkerErrorNumel(std::span<const Segment> segments, int ranks);
  // Bytes of one phase's message to one peer: the chunks' signs, then 4-byte aligned scales.
  static int64_t MessageBytes(std::span<const Segment> segments, int ranks);
  // The buffers Run takes, in order, given back when it returns: the messages sent and received
  // (ranks x MessageBytes each), the package gathered, the sums of squares and scales (3 x 4 B a
  // segment). The memory model replays them.
  struct Buffers {
    int64_t send = 0, recv = 0, package = 0, sums = 0;
  };
  static Buffers BufferBytes(std::span<const Segment> segments, int ranks);

  // Buffers come from `memory` (on the momentum's device).
  OneBitAllReduce(Communicator& dp, Allocator& memory) : dp_(dp), memory_(memory) {}

  // Replaces `momentum` (the unit's flat fp32 values) by its compressed mean over the group,
  // updating this rank's `worker_error` and `server_error`. On `stream`.
  Status Run(std::span<const Segment> segments, const TensorView& momentum,
             const TensorView& worker_error, const TensorView& server_error, Stream* stream);

 private:
  Communicator& dp_;
  Allocator& memory_;
};

// A stage-0 unit's parameters as segments of its flat vector, in layout order.
std::vector<OneBitAllReduce::Segment> OneBitSegments(const FlatLayout& layout);

}  // namespace zerort
