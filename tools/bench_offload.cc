// zerort bench offload: the NVMe store's sequential write and read bandwidth (one request of
// --size bytes split into --block-size blocks, --queue-depth in flight, O_DIRECT) against fio run
// by the bench on the same directory, file size, block size and queue depth with O_DIRECT, with
// both of fio's asynchronous engines (io_uring and libaio; the faster is the baseline: on some
// virtual disks fio's io_uring engine is much the slower), alternating round by round in the
// same run; and, with --config, the median step time
// of that run config as written (offload) against the same config with offload removed (and,
// with the optimizer on the host, with its step not overlapping the next forward).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "bench_stats.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "zerort/config/config.h"
#include "zerort/engine/preflight.h"
#include "zerort/engine/trainer.h"
#include "zerort/offload/nvme_store.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/strings.h"

namespace zerort::cli {
namespace {

// One fio job on `file`; returns its bandwidth in bytes/s. fio runs from an argument vector
// (posix_spawnp), never through a shell, so any directory name is passed as it is.
StatusOr<double> Fio(const BenchOffloadOptions& o, const std::string& file, bool write,
                     const char* engine) {
  const std::string out = StrCat(file, ".json");
  std::vector<std::string> args = {"fio",
                                   "--name=zerort",
                                   StrCat("--filename=", file),
                                   StrCat("--rw=", write ? "write" : "read"),
                                   StrCat("--bs=", o.block_size),
                                   StrCat("--iodepth=", o.queue_depth),
                                   StrCat("--size=", o.size_bytes),
                                   StrCat("--ioengine=", engine),
                                   "--direct=1",
                                   "--numjobs=1",
                                   "--thread",
                                   "--output-format=json",
                                   StrCat("--output=", out)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "fio", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (rc == 0) ::waitpid(pid, &status, 0);
  if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::filesystem::remove(out);
    return absl::InternalError(StrCat(
        "fio (", engine, ") failed on ", file, rc != 0 ? StrCat(": ", std::strerror(rc)) : "",
        "; is it installed (apt-get install fio) and does ", o.path, " allow O_DIRECT?"));
  }
  StatusOr<nlohmann::json> parsed = ParseJsonFile(out);
  std::filesystem::remove(out);
  if (!parsed.ok()) return absl::InternalError(StrCat("fio's output: ", parsed.status().message()));
  const nlohmann::json& j = *parsed;
  try {
    return j.at("jobs").at(0).at(write ? "write" : "read").at("bw_bytes").get<double>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InternalError(StrCat("fio's JSON: ", e.what()));
  }
}

// Median step time (steps after the first) of `config` trained in this process.
StatusOr<double> StepTime(RunConfig c, const std::string& metrics) {
  c.logging.metrics_file = metrics;
  c.checkpoint.dir.clear();
  c.train.sample_tokens = 0;
  c.train.eval_interval = 0;
  ZR_ASSIGN_OR_RETURN(auto group, CreateLoopbackGroup(1, {}, nullptr));
  std::FILE* sink = std::fopen("/dev/null", "w");
  StatusOr<TrainResult> r =
      Train(c, {.world = group[0].get(), .world_source = "bench", .out = sink});
  std::fclose(sink);
  if (!r.ok()) return r.status();
  std::ifstream in(metrics);
  std::vector<double> times;
  std::string line;
  for (int i = 0; std::getline(in, line); ++i) {
    ZR_ASSIGN_OR_RETURN(const nlohmann::json record,
                        ParseJsonText(line, StrCat(metrics, ": line ", i + 1)));
    const auto t = record.find("step_time_s");
    if (t == record.end() || !t->is_number()) {
      return absl::InternalError(StrCat(metrics, ": line ", i + 1, " has no step_time_s"));
    }
    if (i > 0) times.push_back(t->get<double>());
  }
  std::filesystem::remove(metrics);
  if (times.empty()) return absl::InvalidArgumentError("the config trains fewer than 2 steps");
  return Median(times);
}

}  // namespace

int RunBenchOffload(const BenchOffloadOptions& o) {
  auto fail = [](const Status& s) {
    Logger()->error("bench offload: {}", s.message());
    return s.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitRuntimeFailure;
  };
  if (o.size_bytes < o.block_size || o.block_size < 4096 || o.block_size % 4096 != 0 ||
      o.queue_depth < 1 || o.rounds < 1) {
    return fail(absl::InvalidArgumentError(
        "--block-size must be a multiple of 4096, --size at least one block, --queue-depth and "
        "--rounds at least 1"));
  }
  NvmeStoreOptions so;
  so.dir = o.path;
  so.file_tag = "zerort-bench";
  so.engine = o.engine == "threads"    ? IoEngine::kThreads
              : o.engine == "io_uring" ? IoEngine::kIoUring
                                       : IoEngine::kAuto;
  so.block_bytes = o.block_size;
  so.queue_depth = o.queue_depth;
  if (Status s = NvmeStore::CheckFreeSpace(o.path, 2 * o.size_bytes, "--path"); !s.ok()) {
    return fail(s);
  }
  StatusOr<std::unique_ptr<NvmeStore>> store = NvmeStore::Create(so);
  if (!store.ok()) return fail(store.status());
  StatusOr<NvmeRegion> region = (*store)->Reserve(o.size_bytes, MemoryCategory::kStaging);
  if (!region.ok()) return fail(region.status());
  HostAllocator host({.alignment = 4096, .tier = MemoryTier::kHost, .tracker = nullptr});
  StatusOr<Buffer> buf = host.Allocate(region->capacity, MemoryCategory::kStaging, nullptr);
  if (!buf.ok()) return fail(buf.status());
  for (int64_t i = 0; i < region->capacity; i += 4096) buf->as<char>()[i] = static_cast<char>(i);
  const std::string fio_file = StrCat(o.path, "/zerort-bench-fio.", ::getpid());

  std::vector<double> ours_w, ours_r;
  std::map<std::string, std::vector<double>> fio_w, fio_r;  // by fio engine
  for (int round = 0; round < o.rounds; ++round) {
    for (bool write : {true, false}) {
      const auto t0 = std::chrono::steady_clock::now();
      IoHandle h = write ? (*store)->StartWrite(*region, 0, buf->data(), o.size_bytes)
                         : (*store)->StartRead(*region, 0, buf->data(), o.size_bytes);
      if (Status s = h.Finish(); !s.ok()) return fail(s);
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (write ? ours_w : ours_r).push_back(o.size_bytes / dt);
      for (const char* engine : {"io_uring", "libaio"}) {
        StatusOr<double> f = Fio(o, fio_file, write, engine);
        if (!f.ok()) {
          std::filesystem::remove(fio_file);
          return fail(f.status());
        }
        (write ? fio_w : fio_r)[engine].push_back(*f);
      }
    }
  }
  std::filesystem::remove(fio_file);
  const double w = Median(ours_w), r = Median(ours_r);
  const double fw = std::max(Median(fio_w["io_uring"]), Median(fio_w["libaio"]));
  const double fr = std::max(Median(fio_r["io_uring"]), Median(fio_r["libaio"]));
  nlohmann::json j = {
      {"bench", "offload"},
      {"baseline",
       "fio (io_uring, O_DIRECT) on the same path, file size, block size and queue "
       "depth, alternating with zerort in the same run"},
      {"path", o.path},
      {"engine", std::string(IoEngineName((*store)->engine()))},
      {"direct", (*store)->direct()},
      {"size_bytes", o.size_bytes},
      {"block_size", o.block_size},
      {"queue_depth", o.queue_depth},
      {"rounds", o.rounds},
      {"write_bytes_per_s", w},
      {"read_bytes_per_s", r},
      {"fio_write_bytes_per_s", fw},
      {"fio_read_bytes_per_s", fr},
      {"fio_io_uring_write_bytes_per_s", Median(fio_w["io_uring"])},
      {"fio_io_uring_read_bytes_per_s", Median(fio_r["io_uring"])},
      {"fio_libaio_write_bytes_per_s", Median(fio_w["libaio"])},
      {"fio_libaio_read_bytes_per_s", Median(fio_r["libaio"])},
      {"write_ratio", w / fw},
      {"read_ratio", r / fr},
      {"ratio", std::min(w / fw, r / fr)},
  };
  store->reset();
  if (!o.config.empty()) {
    StatusOr<RunConfig> c = LoadRunConfig(o.config);
    if (!c.ok()) return fail(c.status());
    if (Status s = CheckRunPaths(*c, o.config); !s.ok()) return fail(s);
    if (Status s = ResolveBatch(*c, 1, "bench offload (one process)"); !s.ok()) return fail(s);
    RunConfig plain = *c;
    plain.zero.offload_optimizer.device = plain.zero.offload_param.device = "none";
    const std::string metrics = StrCat(o.path, "/zerort-bench-metrics.", ::getpid(), ".jsonl");
    StatusOr<double> off = StepTime(*c, metrics);
    if (!off.ok()) return fail(off.status());
    StatusOr<double> base = StepTime(plain, metrics);
    if (!base.ok()) return fail(base.status());
    j["config"] = o.config;
    j["step_time_s"] = *off;
    j["step_time_s_without_offload"] = *base;
    j["step_time_ratio"] = *base / *off;  // higher is better for the offloaded run
    if (c->zero.offload_optimizer.device == "cpu" && c->train.overlap_host_step) {
      // The host step that ends before the next forward ([Note: the host step behind the
      // forward]): what the overlap gains, in the same run.
      RunConfig serial = *c;
      serial.train.overlap_host_step = false;
      StatusOr<double> t = StepTime(serial, metrics);
      if (!t.ok()) return fail(t.status());
      j["step_time_s_host_step_not_overlapped"] = *t;
    }
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf(
      "bench offload: %s, %s engine, O_DIRECT %s, %lld MiB, block %lld KiB, queue depth %d, "
      "%d rounds (medians)\n",
      o.path.c_str(), j["engine"].get<std::string>().c_str(),
      j["direct"].get<bool>() ? "on" : "off", static_cast<long long>(o.size_bytes >> 20),
      static_cast<long long>(o.block_size >> 10), o.queue_depth, o.rounds);
  std::printf("  %-6s %12s %16s %14s %8s\n", "", "zerort MB/s", "fio io_uring MB/s",
              "fio libaio MB/s", "ratio");
  std::printf("  %-6s %12.0f %16.0f %14.0f %8.3f\n", "write", w / 1e6,
              Median(fio_w["io_uring"]) / 1e6, Median(fio_w["libaio"]) / 1e6, w / fw);
  std::printf("  %-6s %12.0f %16.0f %14.0f %8.3f\n", "read", r / 1e6,
              Median(fio_r["io_uring"]) / 1e6, Median(fio_r["libaio"]) / 1e6, r / fr);
  if (!o.config.empty()) {
    std::printf("  step time: %.4f s with the config's offload, %.4f s without (ratio %.3f)\n",
                j["step_time_s"].get<double>(), j["step_time_s_without_offload"].get<double>(),
                j["step_time_ratio"].get<double>());
    if (j.contains("step_time_s_host_step_not_overlapped")) {
      std::printf("  step time with the host step not overlapping the forward: %.4f s\n",
                  j["step_time_s_host_step_not_overlapped"].get<double>());
    }
  }
  return kExitOk;
}

}  // namespace zerort::cli
