// Preflight checks: the paths a config names, rank configs, resumability, memory fit.
#include "zerort/engine/preflight.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <span>
#include <utility>

#include "zerort/data/tokenizer.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// Nothing is created here: the directory, or its nearest existing ancestor, must be writable.
Status CheckWritableDir(const std::string& key, const std::string& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir);
  std::error_code ec;
  while (!std::filesystem::exists(p, ec)) {
    if (!p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
  }
  if (std::filesystem::exists(p, ec) && !std::filesystem::is_directory(p, ec)) {
    return absl::InvalidArgumentError(
        StrCat(key, " = \"", dir, "\": ", p.string(), " exists and is not a directory"));
  }
  if (::access(p.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        StrCat(key, " = \"", dir, "\": ", p.string(), " is not writable"));
  }
  // access() says yes to root everywhere; a directory made and removed at once tells the truth
  // (read-only mounts, /proc) and leaves nothing behind.
  std::string probe = (p / ".zerort-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr) {
    return absl::InvalidArgumentError(StrCat(key, " = \"", dir, "\": cannot create directories in ",
                                             p.string(), " (", std::strerror(errno), ")"));
  }
  ::rmdir(probe.c_str());
  return absl::OkStatus();
}

// An NVMe store's directory: it exists, is a directory, and a file can be created in it (access()
// answers yes to root, so a probe file is made and removed at once).
Status CheckNvmeDir(const std::string& key, const std::string& dir) {
  std::error_code ec;
  const auto status = std::filesystem::status(dir, ec);
  if (ec || !std::filesystem::exists(status)) {
    return absl::InvalidArgumentError(StrCat(key, " = \"", dir, "\" does not exist"));
  }
  if (!std::filesystem::is_directory(status)) {
    return absl::InvalidArgumentError(StrCat(key, " = \"", dir, "\" is not a directory"));
  }
  const std::string probe = StrCat(dir, "/.zerort-probe-", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        StrCat(key, " = \"", dir, "\" is not writable: ", std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

}  // namespace

Status CheckRunPaths(const RunConfig& c, const std::string& file) {
  Problems problems;
  for (const auto& [key, off] :
       {std::pair<const char*, const OffloadConfig*>{"zero_optimization.offload_optimizer",
                                                     &c.zero.offload_optimizer},
        {"zero_optimization.offload_param", &c.zero.offload_param}}) {
    if (off->device != "nvme") continue;
    if (key == std::string_view("zero_optimization.offload_param") &&
        off->nvme_path == c.zero.offload_optimizer.nvme_path) {
      continue;  // the same directory, probed once
    }
    problems.Add(CheckNvmeDir(StrCat(key, ".nvme_path"), off->nvme_path));
  }
  // data.path, or each file of data.blend. A Megatron dataset is named by its prefix: its .idx
  // is what must be there.
  std::vector<std::pair<std::string, std::string>> data = {{"data.path", c.data.path}};
  data.emplace_back("data.tokenizer", c.data.tokenizer);
  for (size_t i = 1; i < c.data.blend.size(); i += 2) {
    data.emplace_back(StrCat("data.blend[", i, "]"), c.data.blend[i]);
  }
  for (const auto& [key, path] : data) {
    if (path.empty()) continue;
    // The error_code forms: a name too long for the file system is an answer, not an exception.
    std::error_code ec;
    const std::string file =
        !std::filesystem::exists(path, ec) && std::filesystem::exists(path + ".idx", ec)
            ? path + ".idx"
            : path;
    const auto status = std::filesystem::status(file, ec);
    if (::access(file.c_str(), R_OK) != 0) {
      problems.Add(StrCat(
          key, " = \"", path, "\": cannot be read (", std::strerror(errno), ")",
          key == "data.tokenizer" ? "" : "; prepare one with `zerort data prepare TEXT_FILE OUT`"));
    } else if (!std::filesystem::is_regular_file(status)) {
      problems.Add(StrCat(key, " = \"", path,
                          "\": not a regular file (a directory, FIFO or device is not read as "
                          "data)"));
    } else if (key == "data.tokenizer") {
      // Read now, not when the run ends and samples: a bad file costs seconds, not the run.
      problems.Add(TextCodec::For(path, c.model.shape.vocab_size).status());
    }
  }
  if (!c.checkpoint.dir.empty()) problems.Add(CheckWritableDir("checkpoint.dir", c.checkpoint.dir));
  // The metrics file: any file but a directory (a pipe or /dev/null takes the lines), in a
  // directory that can be made.
  if (const std::string& metrics = c.logging.metrics_file; !metrics.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(metrics, ec)) {
      problems.Add(StrCat("logging.metrics_file = \"", metrics, "\" is a directory; name a file"));
    } else if (const std::filesystem::path parent = std::filesystem::path(metrics).parent_path();
               !parent.empty()) {
      problems.Add(CheckWritableDir("logging.metrics_file's directory", parent.string()));
    }
  }
  if (c.csv_monitor.enabled) {
    problems.Add(CheckWritableDir("csv_monitor.output_path", c.csv_monitor.Dir()));
  }
  return problems.empty() ? absl::OkStatus() : problems.ToStatus(file);
}

Status CompareRankConfigs(const std::vector<std::string>& all, int me) {
  // Compare with rank 0, or (when this rank agrees with it) with the first rank that does not.
  int other = all[me] != all[0] ? 0 : -1;
  for (int r = 0; other < 0 && r < static_cast<int>(all.size()); ++r) {
    if (all[r] != all[0]) other = r;
  }
  if (other < 0) return absl::OkStatus();
  nlohmann::json mine, theirs;
  try {
    mine = nlohmann::json::parse(all[me]);
    theirs = nlohmann::json::parse(all[other]);
  } catch (const nlohmann::json::exception&) {
    return absl::InvalidArgumentError(StrCat("rank ", other, "'s config could not be read"));
  }
  const nlohmann::json patch = nlohmann::json::diff(theirs, mine);
  std::string where = "(somewhere)";
  std::string has_mine = "?", has_theirs = "?";
  if (!patch.empty()) {
    const nlohmann::json::json_pointer at(patch[0].at("path").get<std::string>());
    where = at.to_string().substr(1);
    std::replace(where.begin(), where.end(), '/', '.');
    // Numbers as the config wrote them (a float field shows as 0.001, not its double widening).
    auto show = [&](const nlohmann::json& j) -> std::string {
      if (!j.contains(at)) return "nothing";
      const nlohmann::json& v = j[at];
      if (!v.is_number_float()) return v.dump();
      const double d = v.get<double>();
      const float f = static_cast<float>(d);
      return static_cast<double>(f) == d ? fmt::format("{}", f) : fmt::format("{}", d);
    };
    has_mine = show(mine);
    has_theirs = show(theirs);
  }
  return absl::InvalidArgumentError(
      StrCat("the ranks run different configs: at ", where, " rank ", me, " has ", has_mine,
             ", rank ", other, " has ", has_theirs,
             " (every rank must run the same config: check the launch line and --set)"));
}

Status CheckMemoryFits(const MemoryModelInput& in, const MachineMemory& machine) {
  const bool cuda = machine.cuda;
  const int ranks_here = std::max(1, machine.ranks_on_node);
  // Host bytes this rank's node needs (on the CPU every in-memory tier is host memory) and GPU
  // bytes this rank needs, from one rank's bytes in each tier: `bytes(tier)`.
  auto on_machine = [&](const auto& bytes) {
    int64_t host = bytes(MemoryTier::kPinnedHost) + bytes(MemoryTier::kHost);
    if (!cuda) host += bytes(MemoryTier::kDevice);
    return std::pair<int64_t, int64_t>{host * ranks_here, cuda ? bytes(MemoryTier::kDevice) : 0};
  };
  // From the allocator-level (reserved) peaks.
  auto needs = [&](const MemoryEstimate& e) {
    return on_machine([&](MemoryTier t) { return e.PeakReserved(t); });
  };
  const HostMemory& host = machine.host;
  const int64_t gpu = machine.gpu_bytes;
  // Before any replay: the largest unit's gathered weights, which every layout (any ZeRO stage,
  // any offload) holds whole in the memory that computes while the unit runs. A model whose one
  // block cannot fit is refused at once, whatever its number of blocks.
  {
    const DecoderConfig& m = in.model;
    const int tp = std::max(in.tp, 1);
    const int64_t unit =
        std::max(m.BlockParameters() / tp, PaddedVocab(m, tp, in.vocab_multiple) / tp * m.d_model);
    const auto bytes = static_cast<double>(unit) * static_cast<double>(DTypeSize(in.compute()));
    const double room =
        cuda ? static_cast<double>(gpu) : static_cast<double>(host.available) / ranks_here;
    if (room > 0 && bytes > room) {
      return absl::InvalidArgumentError(StrCat(
          "this run cannot fit: its largest unit (one transformer block or the embedding, ", unit,
          " parameters per rank at tensor_parallel_size ", tp, ") is ",
          fmt::format("{:.2f} GiB", bytes / 1073741824.0), " gathered in ", DTypeName(in.compute()),
          ", and ", cuda ? "the GPU has " : "this rank's host memory is ",
          fmt::format("{:.2f} GiB", room / 1073741824.0),
          "; every ZeRO stage and offload gathers a unit whole to compute it (more "
          "tensor_parallel_size splits it)"));
    }
  }
  // Before the replay too (seconds for tens of thousands of blocks): every layout but the
  // optimizer on NVMe keeps each parameter's fp32 master and the optimizer's moments in memory,
  // host or GPU, this rank's share of them at least the model over the tensor-parallel ranks,
  // sharded over the data ranks from stage 1. (With pipeline stages the ranks of a node hold
  // different shares: the replay decides.) A model whose share cannot fit in the node's memory,
  // host and GPUs together, is refused at once.
  if (in.pp == 1 && in.manager.placement.optimizer != MemoryTier::kNvme && host.available >= 0) {
    const int shard = in.stage() >= 1 ? in.shard_ranks() : 1;
    const int per_param = 4 * (1 + in.optimizer_states());
    const double share =
        static_cast<double>(in.model.NumParameters()) / std::max(in.tp, 1) / shard * per_param;
    const double room =
        static_cast<double>(host.available) + (cuda ? static_cast<double>(gpu) * ranks_here : 0);
    if (share * ranks_here > room) {
      auto gib = [](double b) { return fmt::format("{:.2f} GiB", b / 1073741824.0); };
      return absl::InvalidArgumentError(StrCat(
          "this run cannot fit: its fp32 masters and ", in.optimizer_states(),
          " optimizer moment(s) alone, ", in.model.NumParameters(), " parameters x ", per_param,
          " bytes over tensor_parallel_size ", std::max(in.tp, 1), " and ", shard,
          " rank(s) sharding them, are ", gib(share), " per rank x ", ranks_here,
          " rank(s) on this node = ", gib(share * ranks_here), ", but this node has ", gib(room),
          " (", host.source,
          cuda ? StrCat(", and ", ranks_here, " GPU(s) of ", gib(static_cast<double>(gpu))) : "",
          "); every layout but offload_optimizer.device nvme keeps them in memory: more data "
          "ranks at stage 1 or above, tensor parallelism or the optimizer on NVMe. "
          "train.check_memory = false skips this check"));
    }
  }
  StatusOr<MemoryEstimate> estimate = EstimateMemory(in);
  if (!estimate.ok()) return absl::OkStatus();
  auto fits = [&](const std::pair<int64_t, int64_t>& need) {
    return (host.available < 0 || need.first <= host.available) &&
           (!cuda || gpu <= 0 || need.second <= gpu);
  };
  const auto need = needs(*estimate);
  if (fits(need)) return absl::OkStatus();
  auto gib = [](int64_t b) { return fmt::format("{:.2f} GiB", b / 1073741824.0); };
  std::string what;
  if (host.available >= 0 && need.first > host.available) {
    what = StrCat("host memory: ", gib(need.first / ranks_here), " per rank x ", ranks_here,
                  " rank(s) on this node = ", gib(need.first), ", but ", gib(host.available),
                  " is available (", host.source, ")");
  } else {
    what = StrCat("GPU memory: ", gib(need.second), " per rank, the GPU has ", gib(gpu));
  }
  const MemoryEstimate& e = *estimate;
  std::string table;
  for (MemoryCategory cat :
       {MemoryCategory::kParameters, MemoryCategory::kGradients, MemoryCategory::kOptimizerState,
        MemoryCategory::kGatheredWeights, MemoryCategory::kActivations,
        MemoryCategory::kCommBuffers, MemoryCategory::kWorkspace}) {
    const int64_t b = e.Peak(MemoryTier::kDevice, cat);
    if (b > 0) StrAppend(&table, table.empty() ? "" : ", ", MemoryCategoryName(cat), " ", gib(b));
  }
  const MemoryTerm* largest = nullptr;  // the term to act on first
  for (const MemoryTerm& t : e.terms) {
    if (t.tier != MemoryTier::kNvme && (largest == nullptr || t.bytes > largest->bytes)) {
      largest = &t;
    }
  }
  if (largest != nullptr) {
    StrAppend(&table, "; the largest term: ", largest->what, " = ", gib(largest->bytes), " (",
              largest->formula, ")");
  }
  // The layouts of the same run that would fit: ZeRO stage x activation checkpointing. Each is a
  // replay of the step (seconds for thousands of blocks), and none holds less model state than
  // this estimate's parameters, gradients and optimizer state sharded over the data ranks: when
  // even that does not fit, none is tried.
  const auto least = on_machine([&](MemoryTier t) {
    int64_t state = 0;
    for (MemoryCategory cat : {MemoryCategory::kParameters, MemoryCategory::kGradients,
                               MemoryCategory::kOptimizerState}) {
      state += e.Peak(t, cat) / std::max(1, in.shard_ranks());
    }
    return state;
  });
  std::string fitting;
  for (int stage = 0; stage <= 3 && fits(least); ++stage) {
    for (bool checkpointing : {false, true}) {
      MemoryModelInput alt = in;
      alt.manager.stage = static_cast<ZeroStage>(stage);  // invalid with offload: skipped
      alt.activation_checkpointing = checkpointing;
      StatusOr<MemoryEstimate> a = EstimateMemory(alt);
      if (a.ok() && fits(needs(*a))) {
        StrAppend(&fitting, fitting.empty() ? "" : ", ", "zero_optimization.stage ", stage,
                  checkpointing ? " with model.activation_checkpointing" : "");
      }
    }
  }
  return absl::InvalidArgumentError(StrCat(
      "this run does not fit in ", what, ". The estimate per rank (device tier): ", table,
      "; reserved peak ", gib(e.PeakReserved(MemoryTier::kDevice)), ". ",
      fitting.empty() ? "No ZeRO stage or activation checkpointing makes it fit on this machine: "
                        "fewer parameters, a smaller micro-batch, more ranks or offload"
                      : StrCat("It would fit with ", fitting),
      ". `zerort estimate CONFIG --world-size ", machine.world_size,
      " --explain` shows every term; train.check_memory = false skips this check"));
}

}  // namespace zerort
