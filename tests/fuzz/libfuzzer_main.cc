// zr_fuzz_<target>: one file fuzzer's target under libFuzzer (-DZR_FUZZ=ON, clang; [Note: the
// file fuzzers], fuzz_targets.h). ZR_FUZZ_TARGET names the target, ZR_SOURCE_DIR the repository;
// the scratch directory is made once and emptied after each input.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_targets.h"

namespace {

struct Fuzzer {
  const zerort::fuzz::FuzzTarget* target = nullptr;
  zerort::fuzz::FuzzPaths paths;
};

// libFuzzer's entry points are plain functions: the target and its directory live here.
Fuzzer& State() {
  static Fuzzer f;
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Fuzzer& f = State();
  f.target = zerort::fuzz::FindFuzzTarget(ZR_FUZZ_TARGET);
  char dir_template[] = "/tmp/zr_fuzz_XXXXXX";
  if (f.target == nullptr || mkdtemp(dir_template) == nullptr) {
    std::fprintf(stderr, "zr_fuzz: no target " ZR_FUZZ_TARGET " or no scratch directory\n");
    std::exit(2);
  }
  f.paths = {.scratch = dir_template, .source = ZR_SOURCE_DIR};
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fuzzer& f = State();
  (void)f.target->run({data, size}, f.paths);
  std::vector<std::filesystem::path> left;
  for (const auto& e : std::filesystem::directory_iterator(f.paths.scratch)) {
    left.push_back(e.path());
  }
  for (const auto& p : left) std::filesystem::remove_all(p);
  return 0;
}
