#include "zerort/runtime/session.h"

#include <algorithm>
#include <chrono>

#include "zerort/runtime/log.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/mpi_communicator.h"
#include "zerort/runtime/nccl_communicator.h"
#include "zerort/runtime/strings.h"

namespace zerort {

void Session::EndAfterError(int exit_code) {
  if (mpi_ != nullptr) mpi_->EndAfterError(exit_code, std::chrono::seconds(5));
}

Session::~Session() {
  allocator_.reset();                         // before the tracker it reports to
  while (!comms_.empty()) comms_.pop_back();  // NCCL's before MPI's, both before MPI_Finalize
}

namespace {

// [Note: nodes] (runtime/topology.h): every rank's hostname over `host_world`, a communicator
// of host memory (MPI's world, or the loopback group of one), then ZERORT_RANKS_PER_NODE.
StatusOr<Topology> DiscoverTopology(Communicator& host_world, const LaunchEnv& launch) {
  constexpr size_t kName = 256;
  std::string mine = HostName();
  mine.resize(kName - 1);
  std::vector<char> all(kName * static_cast<size_t>(host_world.size()));
  host_world.recorder().SetLabel("hostnames");
  ZR_RETURN_IF_ERROR(host_world.AllGather(mine.c_str(), all.data(), kName, DType::kU8));
  host_world.recorder().SetLabel("");
  std::vector<std::string> hosts;
  for (int r = 0; r < host_world.size(); ++r) hosts.emplace_back(all.data() + r * kName);
  Topology topology = TopologyFromHosts(hosts);
  ZR_RETURN_IF_ERROR(CheckLaunchAgrees(topology, launch));
  ZR_ASSIGN_OR_RETURN(const std::optional<int> k, RanksPerNodeOverride(ProcessEnv()));
  if (k.has_value()) return SimulatedTopology(topology, *k);
  return topology;
}

}  // namespace

StatusOr<std::unique_ptr<Session>> Session::Start(int* argc, char*** argv,
                                                  const SessionOptions& options) {
  if (options.device != "" && options.device != "cpu" && options.device != "cuda") {
    return absl::InvalidArgumentError(
        StrCat("session device \"", options.device, "\" (expected \"cpu\", \"cuda\" or \"\")"));
  }
  if (!(options.collective_timeout_s > 0)) {
    return absl::InvalidArgumentError(
        StrCat("collective_timeout_s ", options.collective_timeout_s, " (expected > 0)"));
  }
  std::unique_ptr<Session> s(new Session());
  ZR_ASSIGN_OR_RETURN(s->launch_, DiscoverLaunchEnv(ProcessEnv()));
  if (options.configure_logging) ConfigureLogging({s->launch_.rank, s->launch_.world_size});
  // Before MPI, NCCL or cudaSetDevice: a machine without a working driver, or whose GPU this
  // build's code does not run on, fails here by name.
  ZR_ASSIGN_OR_RETURN(const Device device, ChooseDevice(options.device, s->launch_.local_rank));
  const bool gpu = device.is_cuda();
  CommOptions comm_options;
  comm_options.name = "world";
  comm_options.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(options.collective_timeout_s * 1000.0));
  if (s->launch_.world_size > 1) {
    MpiContext::Options mpi_options;
    mpi_options.install_signal_dump = true;
    StatusOr<std::unique_ptr<MpiContext>> mpi = MpiContext::Init(argc, argv, mpi_options);
    if (!mpi.ok()) {
      return Annotate(mpi.status(), StrCat("starting MPI for ", s->launch_.world_size, " ranks (",
                                           s->launch_.source, " launcher)"));
    }
    s->mpi_ = std::move(*mpi);
    if (options.thread_multiple && !s->mpi_->thread_multiple()) {
      return absl::InvalidArgumentError(StrCat(
          "collectives issued from several threads need MPI_THREAD_MULTIPLE; this MPI provides "
          "thread level ",
          s->mpi_->thread_level(), " only"));
    }
    ZR_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, s->mpi_->World(comm_options));
    s->world_ = world.get();
    s->comms_.push_back(std::move(world));
    s->world_source_ =
        StrCat("world size ", s->launch_.world_size, " from the ", s->launch_.source, " launcher");
    if (gpu) {
      StatusOr<std::unique_ptr<Communicator>> nccl =
          CreateNcclCommunicator(*s->world_, device, comm_options, &s->mpi_->watchdog());
      if (nccl.ok()) {
        s->world_ = nccl->get();
        s->comms_.push_back(std::move(*nccl));
      } else {
        Logger()->warn("NCCL unavailable ({}); collectives go through MPI with host staging",
                       nccl.status().message());
      }
    }
  } else {
    ZR_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Communicator>> group,
                        CreateLoopbackGroup(1, comm_options, nullptr));
    s->world_ = group[0].get();
    s->comms_ = std::move(group);
    s->world_source_ = "a single process (no launcher)";
  }
  ZR_ASSIGN_OR_RETURN(s->topology_, DiscoverTopology(*s->comms_.front(), s->launch_));
  for (auto& comm : s->comms_) comm->SetCrossesNodes(s->topology_.nodes() > 1);
  if (gpu) {
    ZR_RETURN_IF_ERROR(SetCurrentDevice(device));
    ZR_ASSIGN_OR_RETURN(s->allocator_, MakeCudaCachingAllocator(device, &s->tracker_));
  } else {
    s->allocator_ = MakeCpuCachingAllocator(&s->tracker_);
  }
  return s;
}

}  // namespace zerort
