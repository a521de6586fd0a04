// The replay driver's mutator (mutator.h).
#include "tests/fuzz/mutator.h"

#include <algorithm>
#include <array>
#include <climits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zerort::fuzz {
namespace {

uint64_t Next(uint64_t& s) {  // splitmix64
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
size_t Below(uint64_t& s, size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next(s) % n); }

// A position biased to the start, where headers and their counts are.
size_t Position(uint64_t& s, size_t size) {
  if (size == 0) return 0;
  return Below(s, 2) == 0 ? Below(s, std::min<size_t>(size, 64)) : Below(s, size);
}

void MutateBytes(std::string& b, uint64_t& s) {
  static constexpr std::array<uint64_t, 10> kInteresting = {
      0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FFFFFFFFFFFFFFFull};
  switch (Below(s, 7)) {
    case 0:  // flip a bit
      if (!b.empty()) b[Position(s, b.size())] ^= static_cast<char>(1 << Below(s, 8));
      break;
    case 1:  // a random byte
      if (!b.empty()) b[Position(s, b.size())] = static_cast<char>(Next(s));
      break;
    case 2: {  // insert random bytes
      std::string ins(1 + Below(s, 8), '\0');
      for (char& c : ins) c = static_cast<char>(Next(s));
      b.insert(Position(s, b.size() + 1), ins);
      break;
    }
    case 3: {  // remove a range
      if (b.empty()) break;
      const size_t at = Position(s, b.size());
      b.erase(at, 1 + Below(s, std::min<size_t>(b.size() - at, 16)));
      break;
    }
    case 4: {  // copy a range elsewhere
      if (b.empty()) break;
      const size_t from = Below(s, b.size());
      const std::string piece = b.substr(from, 1 + Below(s, std::min<size_t>(b.size() - from, 32)));
      b.insert(Position(s, b.size() + 1), piece);
      break;
    }
    case 5: {  // an interesting integer, 1-8 bytes little-endian
      const int width = 1 << Below(s, 4);
      if (b.size() < static_cast<size_t>(width)) break;
      uint64_t v = kInteresting[Below(s, kInteresting.size())];
      if (Below(s, 4) == 0) v = ~v;
      const size_t at = Position(s, b.size() - width + 1);
      for (int i = 0; i < width; ++i) b[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
      break;
    }
    default:  // cut the end
      if (!b.empty()) b.resize(Below(s, b.size()));
      break;
  }
}

nlohmann::json HostileValue(uint64_t& s) {
  switch (Below(s, 22)) {
    case 0:
      return 0;
    case 1:
      return -1;
    case 2:
      return 1;
    case 3:
      return 2;
    case 4:
      return 1.5;
    case 5:
      return -0.5;
    case 6:
      return 1e300;
    case 7:
      return int64_t{1} << 31;
    case 8:
      return int64_t{1} << 53;
    case 9:
      return INT64_MAX;
    case 10:
      return INT64_MIN;
    case 11:
      return uint64_t{UINT64_MAX};
    case 12:
      return "";
    case 13:
      return "x";
    case 14:
      return "..";
    case 15:
      return nullptr;
    case 16:
      return true;
    case 17:
      return nlohmann::json::array();
    case 18:
      return nlohmann::json::object();
    case 19:
      return std::string(5000, 'a');
    case 20:
      return -1e-300;
    default:
      return nlohmann::json::array({1, "a", nullptr});
  }
}

// Every value in the tree with its parent (null for the root) in document order.
struct Slot {
  nlohmann::json* value;
  nlohmann::json* parent;
  std::string key;  // in an object parent
  size_t index;     // in an array parent
};
void Collect(nlohmann::json& j, nlohmann::json* parent, std::string key, size_t index,
             std::vector<Slot>& out) {
  out.push_back({&j, parent, key, index});
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) Collect(it.value(), &j, it.key(), 0, out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) Collect(j[i], &j, "", i, out);
  }
}

bool MutateJson(std::string& text, uint64_t& s) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return false;
  const int edits = 1 + static_cast<int>(Below(s, 2));
  for (int e = 0; e < edits; ++e) {
    std::vector<Slot> slots;
    Collect(j, nullptr, "", 0, slots);
    const Slot& slot = slots[Below(s, slots.size())];
    nlohmann::json& v = *slot.value;
    switch (Below(s, 5)) {
      case 0:  // another value
        v = HostileValue(s);
        break;
      case 1:  // a neighbouring or scaled number
        if (v.is_number_integer()) {
          const uint64_t n = static_cast<uint64_t>(v.get<int64_t>());  // wraps, as a bit flip
          const uint64_t options[] = {n + 1, n - 1, n * 2, 0 - n, n >> 1, 0};
          v = static_cast<int64_t>(options[Below(s, 6)]);
        } else if (v.is_number_float()) {
          const double options[] = {v.get<double>() * 2, -v.get<double>(), 0.0, 1e-30};
          v = options[Below(s, 4)];
        } else {
          v = HostileValue(s);
        }
        break;
      case 2:  // removed
        if (slot.parent == nullptr) break;
        if (slot.parent->is_object()) {
          slot.parent->erase(slot.key);
        } else {
          slot.parent->erase(slot.index);
        }
        break;
      case 3:  // an array element doubled, or an object's value copied under another key
        if (slot.parent != nullptr && slot.parent->is_array()) {
          slot.parent->push_back(nlohmann::json(v));
        } else if (slot.parent != nullptr && slot.parent->is_object()) {
          (*slot.parent)[slot.key + "_"] = nlohmann::json(v);
        }
        break;
      default:  // a value moved: another slot's value put here
        v = nlohmann::json(*slots[Below(s, slots.size())].value);
        break;
    }
  }
  text = j.dump();
  return true;
}

}  // namespace

std::string Mutate(const std::string& seed, bool json, uint64_t& rng_state) {
  std::string out = seed;
  if (json && Below(rng_state, 3) != 0 && MutateJson(out, rng_state)) {
    if (Below(rng_state, 4) != 0) return out;  // sometimes bytes too
  }
  const int edits = 1 + static_cast<int>(Below(rng_state, 4));
  for (int e = 0; e < edits; ++e) MutateBytes(out, rng_state);
  return out;
}

}  // namespace zerort::fuzz
