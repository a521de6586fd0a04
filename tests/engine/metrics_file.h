// The "loss" of every line of a metrics.jsonl file, in order (tests of the training engine).
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace zerort::testing {

inline std::vector<double> MetricLosses(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line).at("loss"));
  return out;
}

}  // namespace zerort::testing
