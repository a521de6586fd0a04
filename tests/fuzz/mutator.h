// The replay driver's mutator ([Note: the file fuzzers], fuzz_targets.h): bits, bytes, extreme
// integers, ranges removed or copied, and for JSON a value replaced, removed, doubled or moved in
// the parsed tree. libFuzzer's programs use libFuzzer's own.
#pragma once

#include <cstdint>
#include <string>

namespace zerort::fuzz {

// A mutant of `seed` (deterministic in `rng_state`, which it advances); `json`: the seed is JSON
// text, whose parsed tree is mutated too.
std::string Mutate(const std::string& seed, bool json, uint64_t& rng_state);

}  // namespace zerort::fuzz
