// The decoder's whole-model passes on one process's stage (forward and backward of one
// micro-batch, the loss, the logits, generation): each runs DecoderStages' calls
// (decoder_model.cc) in order (the pipeline executor runs the same calls across stages).
#include <algorithm>
#include <random>

#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/strings.h"

namespace zerort {
StatusOr<double> DecoderModel::Run(std::span<const int32_t> tokens,
                                   std::span<const int32_t> targets, int batch, int seq, bool train,
                                   float loss_scale, std::vector<double>* logits,
                                   int64_t logits_from_row) {
  DecoderStages& s = *stages_;
  ZR_ASSIGN_OR_RETURN(DecoderStages::MicroBatchPtr mb, s.Begin(tokens, targets, batch, seq, train));
  const int L = config().n_layer;
  ZR_RETURN_IF_ERROR(s.EmbedForward(*mb));
  ZR_RETURN_IF_ERROR(s.BlocksForward(*mb, 0, L));
  ZR_ASSIGN_OR_RETURN(double loss, s.HeadForward(*mb, loss_scale, logits, logits_from_row));
  if (!train) return loss;
  ZR_RETURN_IF_ERROR(s.HeadBackward(*mb));
  ZR_RETURN_IF_ERROR(s.BlocksBackward(*mb, 0, L));
  ZR_RETURN_IF_ERROR(s.EmbedBackward(*mb));
  return loss;
}

StatusOr<double> DecoderModel::ForwardBackward(std::span<const int32_t> tokens,
                                               std::span<const int32_t> targets, int batch, int seq,
                                               float loss_scale) {
  if (targets.empty()) return absl::InvalidArgumentError("ForwardBackward needs targets");
  return Run(tokens, targets, batch, seq, true, loss_scale, nullptr, 0);
}

StatusOr<double> DecoderModel::Loss(std::span<const int32_t> tokens,
                                    std::span<const int32_t> targets, int batch, int seq) {
  if (targets.empty()) return absl::InvalidArgumentError("Loss needs targets");
  return Run(tokens, targets, batch, seq, false, 0.0f, nullptr, 0);
}

StatusOr<std::vector<double>> DecoderModel::Logits(std::span<const int32_t> tokens, int batch,
                                                   int seq) {
  std::vector<double> out;
  ZR_RETURN_IF_ERROR(Run(tokens, {}, batch, seq, false, 0.0f, &out, 0).status());
  return out;
}

StatusOr<std::vector<int32_t>> DecoderModel::Generate(std::vector<int32_t> prompt, int new_tokens,
                                                      const SamplingOptions& sampling) {
  if (prompt.empty()) return absl::InvalidArgumentError("Generate: the prompt is empty");
  if (new_tokens < 0) return absl::InvalidArgumentError("Generate: new_tokens is negative");
  std::mt19937_64 rng(sampling.seed);
  for (int i = 0; i < new_tokens; ++i) {
    const int seq = std::min<int>(static_cast<int>(prompt.size()), config().seq_len);
    std::vector<double> last;  // only the last position is needed
    ZR_RETURN_IF_ERROR(
        Run(std::span(prompt).last(seq), {}, 1, seq, false, 0.0f, &last, seq - 1).status());
    prompt.push_back(SampleToken(last, sampling, rng));
  }
  return prompt;
}

}  // namespace zerort
