// zerort env: version, build options, library versions, devices, launch environment.
#include <cstdio>
#include <thread>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "zerort/kernels/blas.h"
#include "zerort/kernels/cudnn_attention.h"
#include "zerort/kernels/openmp_waits.h"
#include "zerort/offload/nvme_store.h"
#include "zerort/runtime/build_info.h"
#include "zerort/runtime/cuda_arch.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/device_mesh.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/mpi_communicator.h"
#include "zerort/runtime/nccl_communicator.h"
#include "zerort/runtime/session.h"
#include "zerort/runtime/strings.h"

namespace zerort::cli {
namespace {

std::string CudaVersionString(int v) {
  return v == 0 ? "none" : fmt::sprintf("%d.%d", v / 1000, (v % 1000) / 10);
}

// The nodes and each rank's mesh groups ([Note: nodes], [Note: hybrid sharding]): the ranks
// start MPI under a launcher, agree on their hosts (Session), split the mesh and gather every
// rank's groups to rank 0. A usage error is InvalidArgument.
StatusOr<nlohmann::json> Nodes(const EnvOptions& o, const LaunchEnv& launch, int* argc,
                               char*** argv) {
  ZR_RETURN_IF_ERROR(CheckRanksPerNodeOverride(ProcessEnv(), launch.world_size));
  const int world = launch.world_size;
  if (world % (o.tp * o.pp) != 0) {
    return absl::InvalidArgumentError(
        StrCat("--tp ", o.tp, " x --pp ", o.pp, " does not divide the world size ", world));
  }
  const int dp = world / (o.tp * o.pp);
  if (o.data_shard_size > 0 && dp % o.data_shard_size != 0) {
    return absl::InvalidArgumentError(StrCat("--data-shard-size ", o.data_shard_size,
                                             " does not divide the data-parallel size ", dp));
  }
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<Session> session,
                      Session::Start(argc, argv, {.device = "cpu", .configure_logging = false}));
  const Topology& t = session->topology();
  ZR_ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceMesh> mesh,
      DeviceMesh::Create(session->world(),
                         {.data = dp,
                          .tensor = o.tp,
                          .pipeline = o.pp,
                          .data_shard = o.data_shard_size < dp ? o.data_shard_size : 0},
                         session->world().options(), &t));
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, CreateStream(Device::Cpu(), "env"));
  ZR_ASSIGN_OR_RETURN(const std::vector<std::string> groups,
                      AllGatherHostStrings(session->world(), session->allocator(), *stream,
                                           mesh->DescribeGroups()));
  nlohmann::json nodes = nlohmann::json::array();
  for (int n = 0; n < t.nodes(); ++n) {
    nodes.push_back({{"name", t.node_names[n]}, {"ranks", t.RanksOf(n)}});
  }
  return nlohmann::json{{"source", t.source},
                        {"describe", t.Describe()},
                        {"nodes", nodes},
                        {"mesh",
                         {{"data", dp},
                          {"tensor", o.tp},
                          {"pipeline", o.pp},
                          {"data_shard_size", o.data_shard_size}}},
                        {"groups", groups},
                        {"rank", session->rank()}};
}

}  // namespace

int RunEnv(const EnvOptions& options, const LaunchEnv& launch, int* argc, char*** argv) {
  StatusOr<nlohmann::json> nodes = Nodes(options, launch, argc, argv);
  if (!nodes.ok()) {
    std::fprintf(stderr, "zerort env: %s\n", std::string(nodes.status().message()).c_str());
    return absl::IsInvalidArgument(nodes.status()) ? kExitUsage : kExitRuntimeFailure;
  }
  if ((*nodes)["rank"].get<int>() != 0) return 0;  // rank 0 prints for every rank
  nodes->erase("rank");
  const BuildInfo build = GetBuildInfo();
  const CudaInfo cuda = QueryCuda();
  nlohmann::json devices = nlohmann::json::array();
  for (const CudaDeviceInfo& d : cuda.devices) {
    // MFU's denominator unless train.peak_tflops gives one; null: unknown.
    const double peak = DenseBf16PeakFlops(d.name);
    devices.push_back(
        {{"index", d.index},
         {"name", d.name},
         {"compute_capability",
          fmt::sprintf("%d.%d", d.compute_capability_major, d.compute_capability_minor)},
         {"memory_bytes", d.total_memory_bytes},
         {"multiprocessors", d.multiprocessor_count},
         {"shared_memory_per_block", d.shared_memory_per_block},
         {"dense_bf16_peak_tflops", peak > 0 ? nlohmann::json(peak / 1e12) : nlohmann::json()},
         {"unusable_reason", d.unusable_reason}});
  }
  // What aio.engine "auto" gets on this machine (offload/nvme_store.h).
  const Status uring = IoUringUsable();
  const std::string uring_refused = uring.ok() ? "" : std::string(uring.message());
  const nlohmann::json out = {
      {"version", build.version},
      {"build",
       {{"type", build.build_type},
        {"compiler", build.compiler},
        {"cuda", build.cuda},
        {"cuda_architectures", build.cuda ? build.cuda_architectures : ""},
        {"cuda_code", build.cuda ? DescribeCudaArchitectures(build.cuda_architectures) : ""},
        {"mpi", build.mpi},
        {"nccl", build.nccl},
        {"cudnn_attention", internal::CudnnAttentionBuilt().ok()},
        {"sanitizers", build.sanitizers}}},
      {"cuda",
       {{"runtime", CudaVersionString(cuda.runtime_version)},
        {"driver", CudaVersionString(cuda.driver_version)},
        {"unavailable_reason", cuda.unavailable_reason},
        {"devices", devices}}},
      {"nccl", NcclVersion()},
      {"mpi", MpiLibraryVersion()},
      {"openblas", {{"config", BlasVersion()}, {"threads", BlasThreads()}}},
      {"cpu_gemm", CpuGemmLibrary()},
      {"cpu_gemm_warning", BlasCoreWarning()},
      {"cpu_loops", CpuLoopLevel()},
      {"nvme_io", {{"io_uring", uring.ok()}, {"io_uring_refused", uring_refused}}},
      {"openmp_waits", DescribeOpenMpWaits(ProcessEnv())},
      {"host", {{"hardware_threads", std::thread::hardware_concurrency()}}},
      {"launch",
       {{"source", launch.source},
        {"rank", launch.rank},
        {"world_size", launch.world_size},
        {"local_rank", launch.local_rank},
        {"local_world_size", launch.local_world_size},
        {"notes", launch.notes}}},
      {"topology", *nodes},
  };
  if (options.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("zerort %s (%s, %s)\n", build.version.c_str(), build.build_type.c_str(),
              build.compiler.c_str());
  std::printf(
      "%-10s cuda=%s%s mpi=%s nccl=%s cudnn-attention=%s sanitizers=%s\n",
      "build:", build.cuda ? "on" : "off",
      build.cuda ? (" (" + DescribeCudaArchitectures(build.cuda_architectures) + ")").c_str() : "",
      build.mpi ? "on" : "off", build.nccl ? "on" : "off",
      internal::CudnnAttentionBuilt().ok() ? "on" : "off",
      build.sanitizers.empty() ? "none" : build.sanitizers.c_str());
  std::printf("%-10s runtime %s, driver %s%s%s\n",
              "CUDA:", CudaVersionString(cuda.runtime_version).c_str(),
              CudaVersionString(cuda.driver_version).c_str(),
              cuda.unavailable_reason.empty() ? "" : "; ", cuda.unavailable_reason.c_str());
  if (cuda.devices.empty()) std::printf("%-10s none (runs use the CPU)\n", "devices:");
  for (size_t i = 0; i < cuda.devices.size(); ++i) {
    const CudaDeviceInfo& d = cuda.devices[i];
    const nlohmann::json& peak = devices[i]["dense_bf16_peak_tflops"];
    const std::string mfu = !peak.is_null()
                                ? fmt::format("bf16 peak {:g} TFLOP/s", peak.get<double>())
                                : "bf16 peak unknown (MFU needs train.peak_tflops)";
    std::printf("%-10s cuda:%d %s, sm %d.%d, %.1f GiB, %d SMs, %lld KiB shared a block, %s%s%s\n",
                "device:", d.index, d.name.c_str(), d.compute_capability_major,
                d.compute_capability_minor, static_cast<double>(d.total_memory_bytes) / (1 << 30),
                d.multiprocessor_count, static_cast<long long>(d.shared_memory_per_block / 1024),
                mfu.c_str(),
                d.unusable_reason.empty() ? "" : "; unusable: ", d.unusable_reason.c_str());
  }
  std::printf("%-10s %s\n", "NCCL:", NcclVersion().c_str());
  std::printf("%-10s %s\n", "MPI:", MpiLibraryVersion().c_str());
  std::printf("%-10s %s (%d threads)\n", "OpenBLAS:", BlasVersion().c_str(), BlasThreads());
  std::printf("%-10s %s\n", "CPU GEMM:", CpuGemmLibrary().c_str());
  if (const std::string w = BlasCoreWarning(); !w.empty()) {
    std::printf("%-10s %s\n", "warning:", w.c_str());
  }
  std::printf("%-10s %s\n", "CPU loops:", CpuLoopLevel().c_str());
  std::printf(
      "%-10s %s\n", "NVMe I/O:",
      uring.ok()
          ? "io_uring (aio engine auto)"
          : StrCat("threads for aio engine auto: io_uring refused (", uring_refused, ")").c_str());
  std::printf("%-10s %s\n", "OpenMP:", DescribeOpenMpWaits(ProcessEnv()).c_str());
  std::printf("%-10s %u hardware threads\n", "host:", std::thread::hardware_concurrency());
  std::printf("%-10s %s\n", "launch:", launch.ToString().c_str());
  const nlohmann::json& t = *nodes;
  std::printf("%-10s %s\n", "nodes:", t["describe"].get<std::string>().c_str());
  for (size_t n = 0; n < t["nodes"].size(); ++n) {
    std::printf("%-10s %s: ranks %s\n", StrCat("node ", n, ":").c_str(),
                t["nodes"][n]["name"].get<std::string>().c_str(),
                absl::StrJoin(t["nodes"][n]["ranks"].get<std::vector<int>>(), ",").c_str());
  }
  const auto& groups = t["groups"];
  for (size_t r = 0; r < groups.size(); ++r) {
    const std::string text = groups[r].get<std::string>();
    std::printf("%-10s %s\n", StrCat("rank ", r, ":").c_str(),
                text.empty() ? "one data-parallel group, the world" : "");
    for (const auto& line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      std::printf("%-10s   %s\n", "", std::string(line).c_str());
    }
  }
  return 0;
}

}  // namespace zerort::cli
