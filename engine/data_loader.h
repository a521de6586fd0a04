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
// Tokens are read from a TokenSource (memory-mapped, in their stored width: [Note: the token
// files zerort reads], token_source.h), one window at a time; a token outside the model's
// vocabulary fails the read that meets it, naming the file and the token's index.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engine/config.h"
#include "engine/token_source.h"
#include "runtime/status.h"

namespace zerort {

// The tokens of data.path read as data.format, or the built-in corpus (1 MiB of byte tokens)
// when it is empty; a file that records a vocabulary larger than `vocab_size` is refused.
StatusOr<std::unique_ptr<TokenSource>> OpenTokens(const DataConfig& data, int vocab_size);

class DataLoader {
 public:
  // Windows of `tokens`, whose ids must lie in [0, vocab).
  static StatusOr<DataLoader> Create(std::shared_ptr<const TokenSource> tokens, int seq_len,
                                     double validation_fraction, int vocab);
  // A run's data (OpenTokens), split for training and validation.
  static StatusOr<DataLoader> Load(const DataConfig& data, int seq_len, int vocab_size);

  // Writes sequence g's inputs and targets (seq_len each).
  Status TrainSequence(int64_t g, std::span<int32_t> inputs, std::span<int32_t> targets) const;
  int64_t validation_windows() const;
  Status ValidationWindow(int64_t w, std::span<int32_t> inputs, std::span<int32_t> targets) const;

  int64_t train_tokens() const { return train_tokens_; }
  int64_t validation_tokens() const { return tokens_->size() - train_tokens_; }
  const TokenSource& tokens() const { return *tokens_; }
  const std::string& source() const { return tokens_->name(); }

 private:
  DataLoader(std::shared_ptr<const TokenSource> tokens, int seq_len, int64_t train_tokens,
             int vocab)
      : tokens_(std::move(tokens)), seq_len_(seq_len), train_tokens_(train_tokens), vocab_(vocab) {}
  // The window of seq_len + 1 tokens at `start`: inputs its first seq_len, targets its last.
  Status Window(int64_t start, std::span<int32_t> inputs, std::span<int32_t> targets) const;
  std::shared_ptr<const TokenSource> tokens_;
  int seq_len_;
  int64_t train_tokens_;
  int vocab_;
};

}  // namespace zerort
