// Training and validation windows of a token stream.
#include "zerort/data/data_loader.h"

#include <algorithm>
#include <tuple>

#include "zerort/data/token_file.h"
#include "zerort/data/tokenizer.h"
#include "zerort/runtime/strings.h"

namespace zerort {

StatusOr<DataLoader::Part> DataLoader::Split(std::shared_ptr<const TokenSource> tokens, int seq_len,
                                             double validation_fraction) {
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
  return Part{std::move(tokens), train};
}

StatusOr<DataLoader> DataLoader::Create(std::shared_ptr<const TokenSource> tokens, int seq_len,
                                        double validation_fraction, int vocab) {
  std::string name = tokens->name();
  ZR_ASSIGN_OR_RETURN(Part part, Split(std::move(tokens), seq_len, validation_fraction));
  return DataLoader({std::move(part)}, nullptr, seq_len, vocab, std::move(name));
}

StatusOr<DataLoader> DataLoader::CreateBlend(std::vector<std::shared_ptr<const TokenSource>> tokens,
                                             std::vector<double> weights, int seq_len,
                                             double validation_fraction, int vocab) {
  if (tokens.size() != weights.size()) {
    return absl::InvalidArgumentError(
        StrCat(tokens.size(), " token files and ", weights.size(), " weights"));
  }
  ZR_ASSIGN_OR_RETURN(BlendIndex blend, BlendIndex::Create(weights));
  std::vector<Part> parts;
  std::string name = StrCat("blend of ", tokens.size(), ":");
  for (size_t d = 0; d < tokens.size(); ++d) {
    name += StrCat(d == 0 ? " " : ", ", fmt::format("{:.4g}", blend.weight(static_cast<int>(d))),
                   " ", tokens[d]->name());
    ZR_ASSIGN_OR_RETURN(Part part, Split(std::move(tokens[d]), seq_len, validation_fraction));
    parts.push_back(std::move(part));
  }
  return DataLoader(std::move(parts), std::make_shared<const BlendIndex>(std::move(blend)), seq_len,
                    vocab, std::move(name));
}

StatusOr<std::unique_ptr<TokenSource>> OpenTokens(const DataConfig& data, int vocab_size) {
  std::unique_ptr<TokenSource> tokens;
  if (data.path.empty()) {
    tokens = TokenSource::FromTokens(ByteTokens(DefaultCorpus()), 256, "the built-in corpus");
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

StatusOr<int32_t> EodMaskToken(const DataConfig& data, int vocab_size) {
  if (!data.eod_mask_loss) return -1;
  int32_t eos = data.eos_token_id;
  if (eos < 0 && !data.tokenizer.empty()) {
    StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(data.tokenizer);
    if (!t.ok()) {
      return absl::InvalidArgumentError(StrCat("data.tokenizer: ", t.status().message()));
    }
    eos = (*t)->EndOfText().value_or(-1);
  }
  if (eos < 0 || eos >= vocab_size) {
    return absl::InvalidArgumentError(
        StrCat("data.eod_mask_loss needs the end-of-text token: data.eos_token_id (", eos,
               eos >= vocab_size ? StrCat(" is outside model.vocab_size = ", vocab_size) : "",
               ") or a data.tokenizer that has one"));
  }
  return eos;
}

StatusOr<DataLoader> DataLoader::Load(const DataConfig& data, int seq_len, int vocab_size) {
  ZR_ASSIGN_OR_RETURN(const int32_t eos, EodMaskToken(data, vocab_size));
  ZR_ASSIGN_OR_RETURN(DataLoader loader, LoadUnmasked(data, seq_len, vocab_size));
  loader.set_mask_after(eos);
  return loader;
}

StatusOr<DataLoader> DataLoader::LoadUnmasked(const DataConfig& data, int seq_len, int vocab_size) {
  if (data.blend.empty()) {
    ZR_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> tokens, OpenTokens(data, vocab_size));
    return Create(std::move(tokens), seq_len, data.validation_fraction, vocab_size);
  }
  std::vector<std::shared_ptr<const TokenSource>> sources;
  std::vector<double> weights;
  for (size_t i = 0; i + 1 < data.blend.size(); i += 2) {
    DataConfig one = data;
    one.path = data.blend[i + 1];
    one.blend.clear();
    ZR_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> tokens, OpenTokens(one, vocab_size));
    sources.push_back(std::move(tokens));
    weights.push_back(std::stod(data.blend[i]));  // ReadBlend wrote it
  }
  return CreateBlend(std::move(sources), std::move(weights), seq_len, data.validation_fraction,
                     vocab_size);
}

Status DataLoader::Window(const Part& part, int64_t start, std::span<int32_t> inputs,
                          std::span<int32_t> targets) const {
  ZR_RETURN_IF_ERROR(part.tokens->Read(start, inputs.first(seq_len_), vocab_));
  ZR_RETURN_IF_ERROR(part.tokens->Read(start + 1, targets.first(seq_len_), vocab_));
  if (mask_after_ >= 0) {
    for (int i = 0; i < seq_len_; ++i) {
      if (inputs[i] == mask_after_) targets[i] = kMaskedTarget;
    }
  }
  return absl::OkStatus();
}

Status DataLoader::TrainSequence(int64_t g, std::span<int32_t> inputs,
                                 std::span<int32_t> targets) const {
  int d = 0;
  int64_t k = g;
  if (blend_ != nullptr) std::tie(d, k) = blend_->At(g);
  const Part& part = parts_[static_cast<size_t>(d)];
  const int64_t positions = part.train_tokens - seq_len_ - 1;  // window starts in [0, positions]
  return Window(part, (k * seq_len_) % (positions + 1), inputs, targets);
}

int64_t DataLoader::PartWindows(const Part& part) const {
  return (part.tokens->size() - part.train_tokens) / (seq_len_ + 1);
}

int64_t DataLoader::validation_windows() const {
  int64_t fewest = PartWindows(parts_[0]);
  for (const Part& p : parts_) fewest = std::min(fewest, PartWindows(p));
  return fewest * static_cast<int64_t>(parts_.size());
}

Status DataLoader::ValidationWindow(int64_t w, std::span<int32_t> inputs,
                                    std::span<int32_t> targets) const {
  const int64_t D = static_cast<int64_t>(parts_.size());
  const Part& part = parts_[static_cast<size_t>(w % D)];
  return Window(part, part.train_tokens + (w / D) * (seq_len_ + 1), inputs, targets);
}

int64_t DataLoader::train_tokens() const {
  int64_t n = 0;
  for (const Part& p : parts_) n += p.train_tokens;
  return n;
}

int64_t DataLoader::validation_tokens() const {
  int64_t n = 0;
  for (const Part& p : parts_) n += p.tokens->size() - p.train_tokens;
  return n;
}

}  // namespace zerort
