// zerort env: version, build options, library versions, devices, launch environment.
#include <cstdio>
#include <thread>

#include "absl/strings/str_join.h"
#include "kernels/blas.h"
#include "nlohmann/json.hpp"
#include "runtime/build_info.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "runtime/nccl_communicator.h"
#include "runtime/strings.h"
#include "tools/commands.h"

namespace zerort::cli {
namespace {

std::string CudaVersionString(int v) {
  return v == 0 ? "none" : fmt::sprintf("%d.%d", v / 1000, (v % 1000) / 10);
}

}  // namespace

int RunEnv(const EnvOptions& options, const LaunchEnv& launch) {
  const BuildInfo build = GetBuildInfo();
  const CudaInfo cuda = QueryCuda();
  nlohmann::json devices = nlohmann::json::array();
  for (const CudaDeviceInfo& d : cuda.devices) {
    devices.push_back({{"index", d.index},
                       {"name", d.name},
                       {"compute_capability", fmt::sprintf("%d.%d", d.compute_capability_major,
                                                           d.compute_capability_minor)},
                       {"memory_bytes", d.total_memory_bytes},
                       {"multiprocessors", d.multiprocessor_count}});
  }
  const nlohmann::json out = {
      {"version", build.version},
      {"build",
       {{"type", build.build_type},
        {"compiler", build.compiler},
        {"cuda", build.cuda},
        {"cuda_architectures", build.cuda ? build.cuda_architectures : ""},
        {"mpi", build.mpi},
        {"nccl", build.nccl},
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
      {"host", {{"hardware_threads", std::thread::hardware_concurrency()}}},
      {"launch",
       {{"source", launch.source},
        {"rank", launch.rank},
        {"world_size", launch.world_size},
        {"local_rank", launch.local_rank},
        {"local_world_size", launch.local_world_size},
        {"notes", launch.notes}}},
  };
  if (options.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("zerort %s (%s, %s)\n", build.version.c_str(), build.build_type.c_str(),
              build.compiler.c_str());
  std::printf("%-10s cuda=%s%s mpi=%s nccl=%s sanitizers=%s\n", "build:", build.cuda ? "on" : "off",
              build.cuda ? (" (sm " + build.cuda_architectures + ")").c_str() : "",
              build.mpi ? "on" : "off", build.nccl ? "on" : "off",
              build.sanitizers.empty() ? "none" : build.sanitizers.c_str());
  std::printf("%-10s runtime %s, driver %s%s%s\n",
              "CUDA:", CudaVersionString(cuda.runtime_version).c_str(),
              CudaVersionString(cuda.driver_version).c_str(),
              cuda.unavailable_reason.empty() ? "" : "; ", cuda.unavailable_reason.c_str());
  if (cuda.devices.empty()) std::printf("%-10s none (runs use the CPU)\n", "devices:");
  for (const CudaDeviceInfo& d : cuda.devices) {
    std::printf("%-10s cuda:%d %s, sm %d.%d, %.1f GiB, %d SMs\n", "device:", d.index,
                d.name.c_str(), d.compute_capability_major, d.compute_capability_minor,
                static_cast<double>(d.total_memory_bytes) / (1 << 30), d.multiprocessor_count);
  }
  std::printf("%-10s %s\n", "NCCL:", NcclVersion().c_str());
  std::printf("%-10s %s\n", "MPI:", MpiLibraryVersion().c_str());
  std::printf("%-10s %s (%d threads)\n", "OpenBLAS:", BlasVersion().c_str(), BlasThreads());
  std::printf("%-10s %s\n", "CPU GEMM:", CpuGemmLibrary().c_str());
  if (const std::string w = BlasCoreWarning(); !w.empty()) {
    std::printf("%-10s %s\n", "warning:", w.c_str());
  }
  std::printf("%-10s %u hardware threads\n", "host:", std::thread::hardware_concurrency());
  std::printf("%-10s %s\n", "launch:", launch.ToString().c_str());
  return 0;
}

}  // namespace zerort::cli
