// Token files, byte tokens and the built-in corpus.
#include "zerort/data/token_file.h"

#include <cerrno>
#include <cstring>
#include <random>

#include "zerort/data/token_source.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {
namespace {

constexpr char kMagic[8] = {'Z', 'R', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr uint32_t kVersion = 1;

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens, int vocab_size) {
  if (vocab_size < 1) return absl::InvalidArgumentError("vocabulary size below 1");
  const int width = vocab_size <= 256 ? 1 : vocab_size <= 65536 ? 2 : 4;
  std::string out;
  out.append(kMagic, sizeof(kMagic));
  PutU32(out, kVersion);
  PutU32(out, static_cast<uint32_t>(width));
  PutU64(out, tokens.size());
  PutU32(out, static_cast<uint32_t>(vocab_size));
  PutU32(out, 0);
  out.reserve(out.size() + tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(
          StrCat("token ", i, " = ", t, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    for (int b = 0; b < width; ++b) out.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
  }
  // Written next to the target and renamed: a reader never sees half a file.
  return WriteFileAtomically(path, out, "token file");
}

StatusOr<TokenFile> ReadTokenFile(const std::string& path) {
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<TokenSource> source,
                      TokenSource::Open(path, TokenFormat::kDetect));
  if (source->format_name() != "zerort") {
    return absl::InvalidArgumentError(
        StrCat(path, ": a ", source->format_name(), " token file, not a zerort one"));
  }
  TokenFile out;
  out.width = source->width();
  out.vocab_size = source->vocab_size();
  out.tokens.resize(static_cast<size_t>(source->size()));
  ZR_RETURN_IF_ERROR(source->Read(0, out.tokens, out.vocab_size));
  return out;
}

std::vector<int32_t> ByteTokens(std::string_view text) {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string BytesText(const std::vector<int32_t>& tokens) {
  std::string out;
  for (int32_t t : tokens) {
    if (t == '\n' || (t >= 32 && t < 127)) {
      out.push_back(static_cast<char>(t));
    } else {
      out += fmt::format("\\x{:02x}", t & 0xff);
    }
  }
  return out;
}

std::string DefaultCorpus() { return BuiltinCorpus(size_t{1} << 20, 20261121); }

std::string BuiltinCorpus(size_t bytes, uint64_t seed) {
  // A small grammar: enough structure for a byte-level model to learn in a few hundred steps
  // (spelling, spacing, agreement of a few patterns), enough variety that it cannot memorise it.
  static const char* kSubjects[] = {
      "the shard manager", "every rank", "the optimizer",      "a gathered unit", "the gradient",
      "the loss scaler",   "each layer", "the compute stream", "a small model",   "the checkpoint"};
  static const char* kVerbs[] = {"gathers", "releases", "reduces", "scatters", "updates",
                                 "records", "saves",    "loads",   "checks",   "splits"};
  static const char* kObjects[] = {"the weights",     "its shard",       "the buckets",
                                   "every parameter", "the master copy", "the optimizer state",
                                   "a flat vector",   "the activations", "the next block",
                                   "the loss"};
  static const char* kTails[] = {
      "before the step", "after the backward",   "on every rank",          "in the same order",
      "without a copy",  "while others compute", "at the end of the pass", "once per step"};
  std::mt19937_64 rng(seed);
  auto pick = [&](const auto& list) { return list[rng() % (sizeof(list) / sizeof(list[0]))]; };
  std::string out;
  out.reserve(bytes + 128);
  int in_line = 0;
  while (out.size() < bytes) {
    std::string s = pick(kSubjects);
    s[0] = static_cast<char>(std::toupper(s[0]));
    s += StrCat(" ", pick(kVerbs), " ", pick(kObjects));
    if (rng() % 2 == 0) s += StrCat(" ", pick(kTails));
    s += ".";
    out += s;
    if (++in_line == 4) {
      out += "\n";
      in_line = 0;
    } else {
      out += " ";
    }
  }
  return out;
}

}  // namespace zerort
