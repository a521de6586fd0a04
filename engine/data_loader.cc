// Training and validation windows of a token stream.
#include "engine/data_loader.h"

#include "engine/token_file.h"
#include "runtime/strings.h"

namespace zerort {

StatusOr<DataLoader> DataLoader::Create(std::shared_ptr<const TokenSource> tokens, int seq_len,
                                        double validation_fraction, int vocab) {
  const int64_t n = tokens->size();
  const std::string& source = tokens->name();
  const int64_t validation = static_cast<int64_t>(static_cast<double>(n) * validation_fraction);
  const int64_t train = n - validation;
  if (train < seq_len + 2) {
    return absl::InvalidArgumentError(
        StrCat(source, ": ", n, " tokens leave ", train,
               " for training, fewer than seq_len + 2 = ", seq_len + 2));
  }
  if (validation_fraction > 0 && validation < seq_len + 1) {
    return absl::InvalidArgumentError(StrCat(
        source, ": the validation split (", validation, " tokens, data.validation_fraction = ",
        validation_fraction, ") holds no window of seq_len + 1 = ", seq_len + 1, " tokens"));
  }
  return DataLoader(std::move(tokens), seq_len, train, vocab);
}

StatusOr<std::unique_ptr<TokenSource>> OpenTokens(const DataConfig& data, int vocab_size) {
  constexpr size_t kBuiltinCorpusBytes = 1 << 20;
  std::unique_ptr<TokenSource> tokens;
  if (data.path.empty()) {
    tokens = TokenSource::FromTokens(ByteTokens(BuiltinCorpus(kBuiltinCorpusBytes, 20261121)), 256,
                                     "the built-in corpus");
  } else {
    ZR_ASSIGN_OR_RETURN(const TokenFormat format, ParseTokenFormat(data.format));
    ZR_ASSIGN_OR_RETURN(tokens, TokenSource::Open(data.path, format));
  }
  if (tokens->vocab_size() > vocab_size) {
    return absl::InvalidArgumentError(StrCat(tokens->name(), " has a vocabulary of ",
                                             tokens->vocab_size(),
                                             " tokens, more than model.vocab_size = ", vocab_size));
  }
  return tokens;
}

StatusOr<DataLoader> DataLoader::Load(const DataConfig& data, int seq_len, int vocab_size) {
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> tokens, OpenTokens(data, vocab_size));
  return Create(std::move(tokens), seq_len, data.validation_fraction, vocab_size);
}

Status DataLoader::Window(int64_t start, std::span<int32_t> inputs,
                          std::span<int32_t> targets) const {
  ZR_RETURN_IF_ERROR(tokens_->Read(start, inputs.first(seq_len_), vocab_));
  return tokens_->Read(start + 1, targets.first(seq_len_), vocab_);
}

Status DataLoader::TrainSequence(int64_t g, std::span<int32_t> inputs,
                                 std::span<int32_t> targets) const {
  const int64_t positions = train_tokens_ - seq_len_ - 1;  // window starts in [0, positions]
  return Window((g * seq_len_) % (positions + 1), inputs, targets);
}

int64_t DataLoader::validation_windows() const { return validation_tokens() / (seq_len_ + 1); }

Status DataLoader::ValidationWindow(int64_t w, std::span<int32_t> inputs,
                                    std::span<int32_t> targets) const {
  return Window(train_tokens_ + w * (seq_len_ + 1), inputs, targets);
}

}  // namespace zerort
