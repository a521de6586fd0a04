// Preflight checks: rank configs, resumability, memory fit.
#include "engine/preflight.h"

#include <algorithm>
#include <utility>

#include "runtime/strings.h"

namespace zerort {

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

Status CheckResumable(const nlohmann::json& saved, const nlohmann::json& now,
                      const std::string& step_dir) {
  static const char* const kShaping[][2] = {
      {"model", "n_layer"},    {"model", "n_head"},   {"model", "d_model"}, {"model", "seq_len"},
      {"model", "vocab_size"}, {"optimizer", "type"}, {"bf16", "enabled"}};
  for (const auto& [section, key] : kShaping) {
    auto at = [&](const nlohmann::json& j) {
      return j.is_object() && j.contains(section) && j[section].is_object() &&
                     j[section].contains(key)
                 ? j[section][key]
                 : nlohmann::json();
    };
    const nlohmann::json was = at(saved), is = at(now);
    if (was != is) {
      return absl::InvalidArgumentError(StrCat(
          "--resume: ", step_dir, " was saved with ", section, ".", key, " = ", was.dump(),
          ", this run's config has ", is.dump(),
          ": resume with the same value (the ZeRO stage, world size and layout, batch size and "
          "learning-rate schedule may change)"));
    }
  }
  return absl::OkStatus();
}

Status CheckMemoryFits(const MemoryModelInput& in, const MachineMemory& machine) {
  const bool cuda = machine.cuda;
  const int ranks_here = std::max(1, machine.ranks_on_node);
  // Host bytes this rank's node needs (on the CPU every in-memory tier is host memory) and GPU
  // bytes this rank needs, from the allocator-level (reserved) peaks.
  auto needs = [&](const MemoryEstimate& e) {
    int64_t host = e.PeakReserved(MemoryTier::kPinnedHost) + e.PeakReserved(MemoryTier::kHost);
    if (!cuda) host += e.PeakReserved(MemoryTier::kDevice);
    return std::pair<int64_t, int64_t>{host * ranks_here,
                                       cuda ? e.PeakReserved(MemoryTier::kDevice) : 0};
  };
  StatusOr<MemoryEstimate> estimate = EstimateMemory(in);
  if (!estimate.ok()) return absl::OkStatus();
  const HostMemory& host = machine.host;
  const int64_t gpu = machine.gpu_bytes;
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
  // The layouts of the same run that would fit: ZeRO stage x activation checkpointing.
  std::string fitting;
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool checkpointing : {false, true}) {
      MemoryModelInput alt = in;
      alt.stage = stage;
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
