// AgreeOnUnits: one fingerprint all-gather; on a mismatch, the entries gathered and compared.
#include "zerort/sharding/unit_agreement.h"

#include <cstdint>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// The entries as one text, a line each: what is fingerprinted and, on a mismatch, gathered.
std::string Joined(const std::vector<std::string>& entries) {
  std::string text;
  for (const std::string& e : entries) text += e + "\n";
  return text;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return lines;
}

}  // namespace

Status AgreeOnUnits(Communicator& dp, Allocator& allocator, Stream& stream,
                    const std::vector<std::string>& entries) {
  if (dp.size() == 1) return absl::OkStatus();
  const std::string text = Joined(entries);
  const uint64_t mine = XXH3_64bits(text.data(), text.size());
  std::vector<uint64_t> all(static_cast<size_t>(dp.size()));
  ZR_RETURN_IF_ERROR(
      AllGatherHostValues(dp, allocator, stream, &mine, all.data(), sizeof(mine), DType::kU8));
  bool same = true;
  for (const uint64_t f : all) same = same && f == all[0];
  if (same) return absl::OkStatus();
  // Every rank saw the same fingerprints, so every rank is here: gather the entries themselves.
  ZR_ASSIGN_OR_RETURN(std::vector<std::string> texts,
                      AllGatherHostStrings(dp, allocator, stream, text));
  const std::vector<std::string> first = SplitLines(texts[0]);
  for (int r = 1; r < dp.size(); ++r) {
    const std::vector<std::string> other = SplitLines(texts[static_cast<size_t>(r)]);
    if (other == first) continue;
    size_t i = 0;
    while (i < first.size() && i < other.size() && first[i] == other[i]) ++i;
    auto at = [&](const std::vector<std::string>& lines) {
      return i < lines.size() ? StrCat("\"", lines[i], "\"")
                              : std::string("nothing (no more units)");
    };
    return absl::InvalidArgumentError(
        StrCat("the data-parallel ranks of group '", dp.name(),
               "' registered different units: ", "entry ", i, " is ", at(first), " on rank 0 and ",
               at(other), " on rank ", r, " (", first.size(), " and ", other.size(),
               " entries); every rank must add the same units, in the same order, with the same "
               "parameters and shapes, and the same stage and dtypes"));
  }
  return absl::InternalError("unit fingerprints differ, the gathered entries do not");
}

uint64_t InitialValuesHash(std::span<const float> values) {
  const uint64_t h = XXH3_64bits(values.data(), values.size_bytes());
  return h == 0 ? 1 : h;
}

Status AgreeOnInitialValues(Communicator& dp, Allocator& allocator, Stream& stream,
                            const std::vector<uint64_t>& hashes,
                            const std::vector<std::string>& names) {
  if (dp.size() == 1 || hashes.empty()) return absl::OkStatus();
  const size_t n = hashes.size();
  std::vector<uint64_t> all(n * static_cast<size_t>(dp.size()));
  ZR_RETURN_IF_ERROR(AllGatherHostValues(dp, allocator, stream, hashes.data(), all.data(),
                                         n * sizeof(uint64_t), DType::kU8));
  for (size_t i = 0; i < n; ++i) {
    int first = -1;
    for (int r = 0; r < dp.size(); ++r) {
      const uint64_t h = all[static_cast<size_t>(r) * n + i];
      if (h == 0) continue;
      if (first < 0) {
        first = r;
      } else if (h != all[static_cast<size_t>(first) * n + i]) {
        return absl::InvalidArgumentError(StrCat(
            "parameter ", names[i], " has different initial values on data-parallel ranks ", first,
            " and ", r, " of group '", dp.name(),
            "': the initializer must give every rank the same values (seed it by the parameter, "
            "not by the rank)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace zerort
