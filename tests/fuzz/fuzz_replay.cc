// fuzz_replay: a file fuzzer's seeds, then seeded mutations of them, through its target
// ([Note: the file fuzzers], fuzz_targets.h). Built with every compiler; no coverage guidance.
//
//   fuzz_replay TARGET --source REPO [--mutations N] [--seed S] [--only K] [--save FILE]
//               [--write-seeds DIR] [--why] [FILE ...]
//
// Exit 0 when every seed was read without error and no input crashed; 1 when a seed was refused
// (stale seeds: the message names it); a crash, a sanitizer report or an input that ran past 30 s
// ends the process with the input named ("mutant K": `--only K --save FILE` writes it). FILEs are
// inputs to replay as they are (a reproducer, a libFuzzer crash file); `--write-seeds DIR` writes
// the seeds as files (a libFuzzer corpus) and exits. `--why` prints each refused mutant's error,
// to see how deep a target's mutants get (refused at the first check, or past it).
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/mutator.h"
#include "zerort/runtime/user_file.h"

// Under a sanitizer its report ends the process without a signal: a death callback names the
// input instead (the callback is the sanitizer runtime's, linked only in those builds).
#if defined(__SANITIZE_ADDRESS__)
#define ZR_HAVE_SANITIZER_CALLBACK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define ZR_HAVE_SANITIZER_CALLBACK 1
#endif
#endif
#ifdef ZR_HAVE_SANITIZER_CALLBACK
#include <sanitizer/common_interface_defs.h>
#endif

namespace {

// What is running, for the crash report: a signal handler can reach nothing else. The one piece
// of process state here; written before each input, read only when the process is dying.
char g_running[256] = "nothing";

void WriteRunning() {
  static volatile sig_atomic_t written = 0;  // the sanitizer's callback, then its abort's signal
  if (written) return;
  written = 1;
  const char prefix[] = "\nfuzz_replay: died on ";
  (void)!write(2, prefix, sizeof(prefix) - 1);
  (void)!write(2, g_running, strlen(g_running));
  (void)!write(2, "\n", 1);
}

void OnSignal(int sig) {
  WriteRunning();
  if (sig == SIGALRM) {
    const char m[] = "fuzz_replay: the input ran past 30 s (a hang)\n";
    (void)!write(2, m, sizeof(m) - 1);
  }
  signal(sig, SIG_DFL);
  raise(sig == SIGALRM ? SIGABRT : sig);
}

void InstallCrashReport() {
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) signal(sig, OnSignal);
#ifdef ZR_HAVE_SANITIZER_CALLBACK
  __sanitizer_set_death_callback(WriteRunning);
#endif
}

int Usage(const char* why) {
  std::fprintf(
      stderr,
      "fuzz_replay: %s\nusage: fuzz_replay TARGET --source REPO [--mutations N] "
      "[--seed S] [--only K] [--save FILE] [--write-seeds DIR] [--why] [FILE ...]\ntargets:",
      why);
  for (const zerort::fuzz::FuzzTarget& t : zerort::fuzz::FuzzTargets()) {
    std::fprintf(stderr, " %.*s", static_cast<int>(t.name.size()), t.name.data());
  }
  std::fprintf(stderr, "\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using zerort::fuzz::FuzzTarget;
  if (argc < 2) return Usage("no target");
  const FuzzTarget* target = zerort::fuzz::FindFuzzTarget(argv[1]);
  if (target == nullptr) return Usage((std::string("no target named ") + argv[1]).c_str());
  std::string source, save, write_seeds;
  long long mutations = 1000, only = -1;
  unsigned long long seed = 2026;
  bool why = false;
  std::vector<std::string> files;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--source" && has_value) {
      source = argv[++i];
    } else if (a == "--mutations" && has_value) {
      mutations = std::atoll(argv[++i]);
    } else if (a == "--seed" && has_value) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--only" && has_value) {
      only = std::atoll(argv[++i]);
    } else if (a == "--save" && has_value) {
      save = argv[++i];
    } else if (a == "--write-seeds" && has_value) {
      write_seeds = argv[++i];
    } else if (a == "--why") {
      why = true;
    } else if (!a.starts_with("--")) {
      files.push_back(a);
    } else {
      return Usage(("unknown or incomplete option " + a).c_str());
    }
  }
  if (source.empty()) return Usage("--source REPO is required (the seeds' files)");

  const std::vector<std::string> seeds = target->seeds(source);
  std::vector<std::string> bases = seeds;  // what mutants start from
  if (target->more != nullptr) {
    for (std::string& m : target->more(source)) bases.push_back(std::move(m));
  }
  if (!write_seeds.empty()) {
    std::filesystem::create_directories(write_seeds);
    for (size_t i = 0; i < bases.size(); ++i) {
      std::ofstream(write_seeds + "/seed_" + std::to_string(i), std::ios::binary) << bases[i];
    }
    std::printf("fuzz_replay %s: %zu inputs written to %s\n", argv[1], bases.size(),
                write_seeds.c_str());
    return 0;
  }

  char dir_template[] = "/tmp/zr_fuzz_XXXXXX";
  const char* tmp = mkdtemp(dir_template);
  if (tmp == nullptr) return Usage("cannot make a scratch directory in /tmp");
  const zerort::fuzz::FuzzPaths paths{.scratch = tmp, .source = source};
  const std::string& dir = paths.scratch;
  InstallCrashReport();
  auto run = [&](const std::string& input, const std::string& what) {
    std::snprintf(g_running, sizeof(g_running), "%s of target %s (seed %llu)", what.c_str(),
                  argv[1], seed);
    alarm(30);
    const zerort::Status s =
        target->run({reinterpret_cast<const uint8_t*>(input.data()), input.size()}, paths);
    alarm(0);
    std::vector<std::filesystem::path> left;  // the target's files, removed after the scan
    for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(e.path());
    for (const auto& p : left) std::filesystem::remove_all(p);
    return s;
  };

  const auto start = std::chrono::steady_clock::now();
  int failed = 0;
  for (size_t i = 0; i < seeds.size() && only < 0; ++i) {
    const zerort::Status s = run(seeds[i], "seed " + std::to_string(i));
    if (!s.ok()) {
      std::fprintf(stderr, "fuzz_replay %s: seed %zu is refused (stale seeds?): %s\n", argv[1], i,
                   std::string(s.message()).c_str());
      ++failed;
    }
  }
  for (const std::string& f : files) {
    const zerort::StatusOr<std::string> input = zerort::ReadDataFile(f, int64_t{1} << 30);
    if (!input.ok()) return Usage(std::string(input.status().message()).c_str());
    (void)run(*input, "file " + f);
  }

  long long refused = 0;
  uint64_t rng = seed;
  for (long long k = 0; k < mutations && !bases.empty(); ++k) {
    // Each mutant draws from its own state, so --only K makes mutant K without the others.
    uint64_t state = rng ^ (static_cast<uint64_t>(k) * 0xD1B54A32D192ED03ull);
    const std::string& base = bases[state % bases.size()];
    const std::string input = zerort::fuzz::Mutate(base, target->json, state);
    if (only >= 0 && k != only) continue;
    if (only >= 0 && !save.empty()) {
      std::ofstream(save, std::ios::binary) << input;
      std::printf("fuzz_replay %s: mutant %lld (%zu bytes) written to %s\n", argv[1], k,
                  input.size(), save.c_str());
    }
    const zerort::Status s = run(input, "mutant " + std::to_string(k));
    if (s.ok()) continue;
    ++refused;
    if (why) std::printf("mutant %lld: %.200s\n", k, std::string(s.message()).c_str());
  }
  std::filesystem::remove_all(dir);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "fuzz_replay %s: %zu seeds (%d refused), %zu more inputs, %lld mutants (%lld "
      "refused, %lld read), %zu files, %.1f s\n",
      argv[1], seeds.size(), failed, bases.size() - seeds.size(), only >= 0 ? 1 : mutations,
      refused, (only >= 0 ? 1 : mutations) - refused, files.size(), seconds);
  return failed == 0 ? 0 : 1;
}
