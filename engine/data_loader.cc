// Training and validation windows of a token stream.
#include "engine/data_loader.h"

#include <algorithm>

#include "engine/token_file.h"
#include "runtime/strings.h"

namespace zerort {

StatusOr<DataLoader> DataLoader::Create(std::vector<int32_t> tokens, int seq_len,
                                        double validation_fraction, std::string source) {
  const int64_t n = static_cast<int64_t>(tokens.size());
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
  return DataLoader(std::move(tokens), seq_len, train, std::move(source));
}

StatusOr<DataLoader> DataLoader::Load(const std::string& path, int seq_len,
                                      double validation_fraction, int vocab_size) {
  constexpr size_t kBuiltinCorpusBytes = 1 << 20;
  std::vector<int32_t> tokens;
  std::string source;
  int vocab = 256;
  if (path.empty()) {
    source = "the built-in corpus";
    tokens = ByteTokens(BuiltinCorpus(kBuiltinCorpusBytes, 20261121));
  } else {
    source = path;
    ZR_ASSIGN_OR_RETURN(TokenFile file, ReadTokenFile(path));
    tokens = std::move(file.tokens);
    vocab = file.vocab_size;
  }
  if (vocab > vocab_size) {
    return absl::InvalidArgumentError(StrCat(source, " has a vocabulary of ", vocab,
                                             " tokens, more than model.vocab_size = ", vocab_size));
  }
  return Create(std::move(tokens), seq_len, validation_fraction, std::move(source));
}

void DataLoader::TrainSequence(int64_t g, std::span<int32_t> inputs,
                               std::span<int32_t> targets) const {
  const int64_t positions = train_tokens_ - seq_len_ - 1;  // window starts in [0, positions]
  const int64_t start = (g * seq_len_) % (positions + 1);
  std::copy_n(tokens_.begin() + start, seq_len_, inputs.begin());
  std::copy_n(tokens_.begin() + start + 1, seq_len_, targets.begin());
}

int64_t DataLoader::validation_windows() const { return validation_tokens() / (seq_len_ + 1); }

void DataLoader::ValidationWindow(int64_t w, std::span<int32_t> inputs,
                                  std::span<int32_t> targets) const {
  const int64_t start = train_tokens_ + w * (seq_len_ + 1);
  std::copy_n(tokens_.begin() + start, seq_len_, inputs.begin());
  std::copy_n(tokens_.begin() + start + 1, seq_len_, targets.begin());
}

}  // namespace zerort
