// zerort bench comm: sweeps message sizes for all-gather, reduce-scatter and all-reduce through a
// zerort Communicator and through a baseline on the same buffers in the same run (raw MPI for
// the MPI backend, raw NCCL for NCCL, a memcpy of the output bytes for loopback), in
// alternating rounds, and reports medians, algorithm and bus bandwidth (nccl-tests' definition).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "bench_stats.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "raw_mpi.h"
#include "raw_nccl.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/mpi_communicator.h"
#include "zerort/runtime/nccl_communicator.h"
#include "zerort/runtime/strings.h"

namespace zerort::cli {

StatusOr<size_t> ParseBytes(const std::string& text) {
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  double scale = 1;
  for (const auto& [suffix, factor] :
       std::initializer_list<std::pair<const char*, double>>{{"kib", 1024.0},
                                                             {"mib", 1024.0 * 1024},
                                                             {"gib", 1024.0 * 1024 * 1024},
                                                             {"tib", 1024.0 * 1024 * 1024 * 1024},
                                                             {"kb", 1e3},
                                                             {"mb", 1e6},
                                                             {"gb", 1e9},
                                                             {"tb", 1e12},
                                                             {"b", 1}}) {
    if (absl::EndsWith(s, suffix)) {
      s.resize(s.size() - std::strlen(suffix));
      scale = factor;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(s, &value) || !(value >= 0)) {
    return absl::InvalidArgumentError(
        StrCat("'", text, "' is not a size (e.g. 4096, 4KiB, 64MiB)"));
  }
  // 1e400 parses as infinity, and a size_t cannot hold more than 2^64: sizes end at 1 EiB.
  if (!(value * scale <= 1152921504606846976.0)) {
    return absl::InvalidArgumentError(StrCat("'", text, "' is more than 1 EiB"));
  }
  return static_cast<size_t>(value * scale);
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return fmt::sprintf(bytes == std::floor(bytes) ? "%.0f %s" : "%.1f %s", bytes, units[u]);
}

namespace {

struct CommRow {
  CollectiveOp op;
  size_t bytes;
  size_t count;
  double time_s;
  double baseline_s;
  std::string algorithm;
};

StatusOr<CollectiveOp> ParseOp(const std::string& name) {
  for (CollectiveOp op :
       {CollectiveOp::kAllGather, CollectiveOp::kReduceScatter, CollectiveOp::kAllReduce}) {
    if (name == CollectiveOpName(op)) return op;
  }
  return absl::InvalidArgumentError(
      StrCat("unknown operation '", name, "'; expected all_gather, reduce_scatter or all_reduce"));
}

// Everything one rank needs to run the sweep on its communicator.
struct Harness {
  Communicator& comm;
  Stream* stream;        // null for host buffers
  Allocator& allocator;  // where the buffers live
  // (op, send, recv, count, output bytes): the baseline on the same buffers.
  std::function<Status(CollectiveOp, const void*, void*, size_t, size_t)> baseline;
};

// The copy floor: each rank copies the operation's output bytes from a buffer of its own into
// the output buffer, on the same device and stream. No collective can move less.
class CopyFloor {
 public:
  CopyFloor(Allocator& allocator, Stream* stream) : allocator_(allocator), stream_(stream) {}
  Status operator()(CollectiveOp, const void*, void* recv, size_t, size_t out_bytes) {
    if (source_.bytes() < out_bytes) {
      ZR_ASSIGN_OR_RETURN(source_,
                          allocator_.Allocate(out_bytes, MemoryCategory::kWorkspace, stream_));
      std::vector<std::byte> ones(out_bytes, std::byte{1});
      ZR_RETURN_IF_ERROR(CopyBytes(source_.data(), allocator_.device(), ones.data(), Device::Cpu(),
                                   out_bytes, nullptr));
    }
    return CopyBytes(recv, allocator_.device(), source_.data(), allocator_.device(), out_bytes,
                     stream_);
  }

 private:
  Allocator& allocator_;
  Stream* stream_;
  Buffer source_;
};

// Runs `fn` `iters` times between barriers; returns the slowest rank's seconds per iteration.
StatusOr<double> TimeIters(Harness& h, int iters, const std::function<Status()>& fn) {
  ZR_RETURN_IF_ERROR(h.comm.Barrier());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) ZR_RETURN_IF_ERROR(fn());
  if (h.stream != nullptr) ZR_RETURN_IF_ERROR(h.stream->Synchronize());
  const auto t1 = std::chrono::steady_clock::now();
  int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count() / iters;
  ZR_RETURN_IF_ERROR(h.comm.AllReduce(&ns, &ns, 1, DType::kI64, ReduceOp::kMax));
  return static_cast<double>(ns) * 1e-9;
}

StatusOr<std::vector<CommRow>> Sweep(Harness& h, const BenchCommOptions& o,
                                     const std::vector<CollectiveOp>& ops, size_t min_bytes,
                                     size_t max_bytes, DType dtype) {
  const size_t elem = DTypeSize(dtype);
  const size_t n = static_cast<size_t>(h.comm.size());
  std::vector<CommRow> rows;
  std::mt19937 rng(1234 + h.comm.rank());
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (CollectiveOp op : ops) {
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      const size_t count =
          std::max<size_t>(1, op == CollectiveOp::kAllReduce ? bytes / elem : bytes / elem / n);
      const size_t send_elems = op == CollectiveOp::kReduceScatter ? count * n : count;
      const size_t recv_elems = op == CollectiveOp::kAllGather ? count * n : count;
      const size_t size_bytes = std::max(send_elems, recv_elems) * elem;
      ZR_ASSIGN_OR_RETURN(
          Buffer send,
          h.allocator.Allocate(send_elems * elem, MemoryCategory::kCommBuffers, h.stream));
      ZR_ASSIGN_OR_RETURN(
          Buffer recv,
          h.allocator.Allocate(recv_elems * elem, MemoryCategory::kCommBuffers, h.stream));
      std::vector<float> host(send_elems);
      for (float& x : host) x = dist(rng);
      ZR_RETURN_IF_ERROR(CopyBytes(send.data(), h.allocator.device(), host.data(), Device::Cpu(),
                                   send_elems * elem, nullptr));
      auto run = [&]() -> Status {
        switch (op) {
          case CollectiveOp::kAllGather:
            return h.comm.AllGather(send.data(), recv.data(), count, dtype, h.stream);
          case CollectiveOp::kReduceScatter:
            return h.comm.ReduceScatter(send.data(), recv.data(), count, dtype, ReduceOp::kSum,
                                        h.stream);
          default:
            return h.comm.AllReduce(send.data(), recv.data(), count, dtype, ReduceOp::kSum,
                                    h.stream);
        }
      };
      auto base = [&]() {
        return h.baseline(op, send.data(), recv.data(), count, recv_elems * elem);
      };
      // Calibrate the iteration count on zerort's path; all ranks take the largest.
      ZR_RETURN_IF_ERROR(run());
      ZR_RETURN_IF_ERROR(base());
      ZR_ASSIGN_OR_RETURN(double once, TimeIters(h, 1, run));
      int64_t iters = std::clamp<int64_t>(
          static_cast<int64_t>(o.seconds_per_round / std::max(once, 1e-7)), 2, 2000);
      ZR_RETURN_IF_ERROR(h.comm.AllReduce(&iters, &iters, 1, DType::kI64, ReduceOp::kMax));
      std::vector<double> ours;
      std::vector<double> theirs;
      for (int round = 0; round < o.rounds; ++round) {
        ZR_ASSIGN_OR_RETURN(double a, TimeIters(h, static_cast<int>(iters), run));
        ZR_ASSIGN_OR_RETURN(double b, TimeIters(h, static_cast<int>(iters), base));
        ours.push_back(a);
        theirs.push_back(b);
      }
      rows.push_back(
          CommRow{op, size_bytes, count, Median(ours), Median(theirs), h.comm.algorithm(op)});
    }
  }
  return rows;
}

void Report(const std::vector<CommRow>& rows, const BenchCommOptions& o, std::string_view backend,
            int ranks, const std::string& baseline) {
  const double kGB = 1e9;
  // The headline ratio covers messages of 4 MiB and more (bandwidth-bound), or every message
  // when the sweep stops below that.
  const bool any_big = std::any_of(rows.begin(), rows.end(),
                                   [](const CommRow& r) { return r.bytes >= (size_t{4} << 20); });
  std::vector<double> big_ratios;
  nlohmann::json results = nlohmann::json::array();
  for (const CommRow& r : rows) {
    const double ratio = r.baseline_s / r.time_s;
    if (!any_big || r.bytes >= (size_t{4} << 20)) big_ratios.push_back(ratio);
    results.push_back(
        {{"op", CollectiveOpName(r.op)},
         {"bytes", r.bytes},
         {"count_per_rank", r.count},
         {"time_us", r.time_s * 1e6},
         {"algbw_gbps", r.bytes / r.time_s / kGB},
         {"busbw_gbps", r.bytes / r.time_s / kGB * RingFactor(r.op, ranks)},
         {"baseline_time_us", r.baseline_s * 1e6},
         {"baseline_busbw_gbps", r.bytes / r.baseline_s / kGB * RingFactor(r.op, ranks)},
         {"ratio", ratio},
         {"algorithm", r.algorithm}});
  }
  double geo = 0;
  for (double x : big_ratios) geo += std::log(x);
  const double big_geo = big_ratios.empty() ? 0 : std::exp(geo / big_ratios.size());
  const double big_min =
      big_ratios.empty() ? 0 : *std::min_element(big_ratios.begin(), big_ratios.end());
  if (o.json) {
    const nlohmann::json out = {
        {"bench", "comm"},
        {"backend", backend},
        {"ranks", ranks},
        {"dtype", o.dtype},
        {"baseline", baseline},
        {"ratio", big_geo},
        {"ratio_definition", StrCat("geometric mean of baseline time / zerort time over messages ",
                                    any_big ? ">= 4 MiB" : "of every size (none reached 4 MiB)")},
        {"min_ratio", big_min},
        {"results", results}};
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("zerort bench comm: backend %s, %d ranks, %s; baseline: %s\n",
              std::string(backend).c_str(), ranks, o.dtype.c_str(), baseline.c_str());
  std::printf("%-15s %10s %12s %11s %11s %13s %7s  %s\n", "op", "size", "zerort_us", "algbw_GB/s",
              "busbw_GB/s", "baseline_us", "ratio", "algorithm");
  for (const auto& r : results) {
    std::printf("%-15s %10s %12.1f %11.3f %11.3f %13.1f %7.3f  %s\n",
                r["op"].get<std::string>().c_str(), FormatBytes(r["bytes"].get<double>()).c_str(),
                r["time_us"].get<double>(), r["algbw_gbps"].get<double>(),
                r["busbw_gbps"].get<double>(), r["baseline_time_us"].get<double>(),
                r["ratio"].get<double>(), r["algorithm"].get<std::string>().c_str());
  }
  std::printf(
      "ratio (baseline time / zerort time) over messages %s: geometric mean %.3f, "
      "min %.3f\n",
      any_big ? ">= 4 MiB" : "of every size", big_geo, big_min);
}

}  // namespace

int RunBenchComm(const BenchCommOptions& o, const LaunchEnv& launch, int* argc, char*** argv) {
  const std::string backend =
      !o.backend.empty() ? o.backend : (launch.world_size > 1 ? "mpi" : "loopback");
  auto fail = [](const Status& s, int code) {
    Logger()->error("bench comm: {}", s.message());
    return code;
  };
  StatusOr<DType> dtype = ParseDType(o.dtype);
  if (!dtype.ok()) return fail(dtype.status(), kExitUsage);
  if (!IsFloatingPoint(*dtype)) {
    return fail(absl::InvalidArgumentError("--dtype must be a floating-point type"), kExitUsage);
  }
  StatusOr<size_t> min_bytes = ParseBytes(o.min_bytes);
  StatusOr<size_t> max_bytes = ParseBytes(o.max_bytes);
  if (!min_bytes.ok()) {
    return fail(absl::InvalidArgumentError(StrCat("--min-bytes ", min_bytes.status().message())),
                kExitUsage);
  }
  if (!max_bytes.ok()) {
    return fail(absl::InvalidArgumentError(StrCat("--max-bytes ", max_bytes.status().message())),
                kExitUsage);
  }
  if (*min_bytes == 0 || *min_bytes > *max_bytes) {
    return fail(absl::InvalidArgumentError("--min-bytes must be positive and at most --max-bytes"),
                kExitUsage);
  }
  // Each rank holds a few buffers of the largest message (and the baseline's).
  constexpr size_t kMaxMessage = size_t{4} << 30;
  if (*max_bytes > kMaxMessage) {
    return fail(absl::InvalidArgumentError(
                    StrCat("--max-bytes ", o.max_bytes, ": at most 4 GiB per message")),
                kExitUsage);
  }
  std::vector<CollectiveOp> ops;
  for (const std::string& name : o.ops) {
    StatusOr<CollectiveOp> op = ParseOp(name);
    if (!op.ok()) return fail(op.status(), kExitUsage);
    ops.push_back(*op);
  }
  if (o.rounds < 1 || o.rounds > 1000) {
    return fail(absl::InvalidArgumentError(StrCat("--rounds ", o.rounds, " must be in [1, 1000]")),
                kExitUsage);
  }
  if (!(o.seconds_per_round > 0 && o.seconds_per_round <= 60)) {
    return fail(absl::InvalidArgumentError(
                    StrCat("--seconds-per-round ", o.seconds_per_round, " must be in (0, 60]")),
                kExitUsage);
  }

  CommOptions comm_options;
  comm_options.timeout = std::chrono::seconds(20);

  if (backend == "loopback") {
    if (o.ranks < 1 || o.ranks > 256) {  // one thread per loopback rank
      return fail(absl::InvalidArgumentError(StrCat("--ranks ", o.ranks, " must be in [1, 256]")),
                  kExitUsage);
    }
    MemoryTracker tracker;
    std::vector<CommRow> rows;
    Status status =
        RunLoopbackRanks(o.ranks, comm_options, nullptr, [&](Communicator& comm) -> Status {
          std::unique_ptr<Allocator> allocator = MakeCpuCachingAllocator(&tracker);
          CopyFloor floor(*allocator, nullptr);
          Harness h{comm, nullptr, *allocator, std::ref(floor)};
          ZR_ASSIGN_OR_RETURN(std::vector<CommRow> mine,
                              Sweep(h, o, ops, *min_bytes, *max_bytes, *dtype));
          if (comm.rank() == 0) rows = std::move(mine);
          return absl::OkStatus();
        });
    if (!status.ok()) return fail(status, kExitRuntimeFailure);
    Report(rows, o, backend, o.ranks,
           "memcpy of each rank's output bytes by every rank at once (a memory-bandwidth floor)");
    return kExitOk;
  }

  if (backend != "mpi" && backend != "nccl") {
    return fail(absl::InvalidArgumentError(
                    StrCat("unknown backend '", backend, "'; expected loopback, mpi or nccl")),
                kExitUsage);
  }
  MpiContext::Options mpi_options;
  mpi_options.install_signal_dump = true;
  StatusOr<std::unique_ptr<MpiContext>> mpi = MpiContext::Init(argc, argv, std::move(mpi_options));
  if (!mpi.ok()) return fail(mpi.status(), kExitRuntimeFailure);
  int code = kExitOk;
  {
    StatusOr<std::unique_ptr<Communicator>> world = (*mpi)->World(comm_options);
    if (!world.ok()) return fail(world.status(), kExitRuntimeFailure);
    MemoryTracker tracker;
    std::vector<CommRow> rows;
    Status status;
    std::string baseline;
    if (backend == "mpi") {
      if (*dtype != DType::kF32) {
        return fail(absl::InvalidArgumentError("the raw MPI baseline needs --dtype f32"),
                    kExitUsage);
      }
      std::unique_ptr<Allocator> allocator = MakeCpuCachingAllocator(&tracker);
      Harness h{**world, nullptr, *allocator,
                [&](CollectiveOp op, const void* send, void* recv, size_t count, size_t) {
                  return RawMpiCollective(op, send, recv, count, *dtype);
                }};
      StatusOr<std::vector<CommRow>> r = Sweep(h, o, ops, *min_bytes, *max_bytes, *dtype);
      status = r.status();
      if (r.ok()) rows = std::move(*r);
      baseline =
          "raw MPI (MPI_Allgather / MPI_Reduce_scatter_block / MPI_Allreduce) on the same buffers";
    } else {
      const int devices = CudaDeviceCount();
      const Device device = Device::Cuda(devices > 0 ? launch.local_rank % devices : 0);
      StatusOr<std::unique_ptr<Communicator>> nccl =
          CreateNcclCommunicator(**world, device, comm_options, &(*mpi)->watchdog());
      StatusOr<std::unique_ptr<Allocator>> allocator = MakeCudaCachingAllocator(device, &tracker);
      StatusOr<std::unique_ptr<Stream>> stream = CreateStream(device, "bench");
      StatusOr<std::unique_ptr<RawNccl>> raw = CreateRawNccl(device);
      status = !nccl.ok()        ? nccl.status()
               : !allocator.ok() ? allocator.status()
               : !stream.ok()    ? stream.status()
                                 : raw.status();
      if (status.ok()) {
        Harness h{**nccl, stream->get(), **allocator,
                  [&](CollectiveOp op, const void* send, void* recv, size_t count, size_t) {
                    return (*raw)->Run(op, send, recv, count, *dtype, **stream);
                  }};
        StatusOr<std::vector<CommRow>> r = Sweep(h, o, ops, *min_bytes, *max_bytes, *dtype);
        status = r.status();
        if (r.ok()) rows = std::move(*r);
      }
      baseline =
          "raw NCCL (ncclAllGather / ncclReduceScatter / ncclAllReduce) on the same buffers and "
          "stream";
    }
    if (!status.ok()) {
      code = fail(status, kExitRuntimeFailure);
    } else if ((*world)->rank() == 0) {
      Report(rows, o, backend, (*world)->size(), baseline);
    }
  }
  return code;
}

}  // namespace zerort::cli
