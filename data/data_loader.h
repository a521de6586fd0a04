// DataLoader: the training and validation streams of a token file.
//
// The file's tokens are split: the head is for training, the tail (validation_fraction of them)
// is held out. Training sequence g (a global index: step s's global batch is sequences
// [s * train_batch_size, (s + 1) * train_batch_size)) is the window of seq_len + 1 tokens at
// offset (g * seq_len) mod (train tokens - seq_len - 1): inputs its first seq_len tokens, targets
// its last. Which rank and micro-batch take which sequences of a step is the trainer's choice;
// the set of a step's sequences depends only on the step, so runs at different world sizes see
// the same global batches, and a resumed run continues from "global sequences consumed".
// Validation windows are non-overlapping windows of seq_len + 1 tokens from the tail's start.
// With data.blend ([Note: blending token files], blend_index.h) each file is split so on its own;
// training sequence g is file d's sequence k (BlendIndex), read as above in file d, and the
// validation windows take the files in turn (window w: file w mod D's window w / D, as long as
// every file has one: D x the fewest any file holds). With data.eod_mask_loss, a position whose
// input is the end-of-text token has its target masked (kMaskedTarget, the model's kIgnoreTarget:
// Megatron's eod_mask_loss), in training and validation windows alike.
// Tokens are read from a TokenSource (memory-mapped, in their stored width: [Note: the token
// files zerort reads], token_source.h), one window at a time; a token outside the model's
// vocabulary fails the read that meets it, naming the file and the token's index.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "zerort/data/blend_index.h"
#include "zerort/data/data_config.h"
#include "zerort/data/token_source.h"
#include "zerort/runtime/status.h"

namespace zerort {

// A target whose loss is masked: the model's kIgnoreTarget (layers/decoder_model.h; data/ does not
// depend on the model, and engine/trainer.cc asserts the two agree).
inline constexpr int32_t kMaskedTarget = -1;

// The tokens of data.path read as data.format, or the built-in corpus (1 MiB of byte tokens)
// when it is empty; a file that records a vocabulary larger than `vocab_size` is refused.
StatusOr<std::unique_ptr<TokenSource>> OpenTokens(const DataConfig& data, int vocab_size);

// The token after which data.eod_mask_loss masks the target (data.eos_token_id, or the
// data.tokenizer's end-of-text token); -1 without the mask. Shared by training and `zerort eval`.
StatusOr<int32_t> EodMaskToken(const DataConfig& data, int vocab_size);

class DataLoader {
 public:
  // Windows of `tokens`, whose ids must lie in [0, vocab).
  static StatusOr<DataLoader> Create(std::shared_ptr<const TokenSource> tokens, int seq_len,
                                     double validation_fraction, int vocab);
  // Windows of several token sources blended by `weights` (data.blend).
  static StatusOr<DataLoader> CreateBlend(std::vector<std::shared_ptr<const TokenSource>> tokens,
                                          std::vector<double> weights, int seq_len,
                                          double validation_fraction, int vocab);
  // A run's data (OpenTokens, for each file of data.blend), split for training and validation;
  // the end-of-text token masked when data.eod_mask_loss says so.
  static StatusOr<DataLoader> Load(const DataConfig& data, int seq_len, int vocab_size);
  // Load without data.eod_mask_loss.
  static StatusOr<DataLoader> LoadUnmasked(const DataConfig& data, int seq_len, int vocab_size);
  // Masks the targets of positions whose input is `token` (-1: none).
  void set_mask_after(int32_t token) { mask_after_ = token; }

  // Writes sequence g's inputs and targets (seq_len each).
  Status TrainSequence(int64_t g, std::span<int32_t> inputs, std::span<int32_t> targets) const;
  int64_t validation_windows() const;
  Status ValidationWindow(int64_t w, std::span<int32_t> inputs, std::span<int32_t> targets) const;

  // Over every file of a blend.
  int64_t train_tokens() const;
  int64_t validation_tokens() const;
  // "FILE" or, for a blend, "blend of 2: 0.25 FILE, 0.75 FILE".
  const std::string& source() const { return name_; }
  // The blend (null for one file).
  const BlendIndex* blend() const { return blend_.get(); }

 private:
  struct Part {
    std::shared_ptr<const TokenSource> tokens;
    int64_t train_tokens = 0;
  };
  DataLoader(std::vector<Part> parts, std::shared_ptr<const BlendIndex> blend, int seq_len,
             int vocab, std::string name)
      : parts_(std::move(parts)),
        blend_(std::move(blend)),
        seq_len_(seq_len),
        vocab_(vocab),
        name_(std::move(name)) {}
  static StatusOr<Part> Split(std::shared_ptr<const TokenSource> tokens, int seq_len,
                              double validation_fraction);
  // The window of seq_len + 1 tokens at `start` of a part: inputs its first seq_len, targets
  // its last.
  Status Window(const Part& part, int64_t start, std::span<int32_t> inputs,
                std::span<int32_t> targets) const;
  int64_t PartWindows(const Part& part) const;  // its validation windows
  std::vector<Part> parts_;
  std::shared_ptr<const BlendIndex> blend_;
  int seq_len_;
  int vocab_;
  std::string name_;
  int32_t mask_after_ = -1;
};

}  // namespace zerort
