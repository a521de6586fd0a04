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
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace zerort {

class DataLoader {
 public:
  // `source` names the data in messages (a file path, or "the built-in corpus").
  static StatusOr<DataLoader> Create(std::vector<int32_t> tokens, int seq_len,
                                     double validation_fraction, std::string source);
  // A run's data: the token file at `path` (data.path), or the built-in corpus (1 MiB of byte
  // tokens) when it is empty; a file whose vocabulary exceeds `vocab_size` is refused.
  static StatusOr<DataLoader> Load(const std::string& path, int seq_len, double validation_fraction,
                                   int vocab_size);

  // Writes sequence g's inputs and targets (seq_len each).
  void TrainSequence(int64_t g, std::span<int32_t> inputs, std::span<int32_t> targets) const;
  int64_t validation_windows() const;
  void ValidationWindow(int64_t w, std::span<int32_t> inputs, std::span<int32_t> targets) const;

  int64_t train_tokens() const { return train_tokens_; }
  int64_t validation_tokens() const { return static_cast<int64_t>(tokens_.size()) - train_tokens_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::string& source() const { return source_; }

 private:
  DataLoader(std::vector<int32_t> tokens, int seq_len, int64_t train_tokens, std::string source)
      : tokens_(std::move(tokens)),
        seq_len_(seq_len),
        train_tokens_(train_tokens),
        source_(std::move(source)) {}
  std::vector<int32_t> tokens_;
  int seq_len_;
  int64_t train_tokens_;
  std::string source_;
};

}  // namespace zerort
