// zerort estimate's output (estimate_output.h).
#include "estimate_output.h"

#include <cstdio>

#include "zerort/runtime/strings.h"

namespace zerort::cli {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}  // namespace

std::string Gib(double bytes) { return fmt::format("{:.2f}", bytes / kGiB); }
std::string Mib(double bytes) { return fmt::format("{:.1f}", bytes / 1048576.0); }

void PrintCategories(const MemoryEstimate& e, const MemorySnapshot* measured) {
  std::printf("  %-10s %-18s %12s", "tier", "category", "estimate MiB");
  if (measured != nullptr) std::printf(" %12s %8s", "measured MiB", "error");
  std::printf("\n");
  for (int t = 0; t < kNumMemoryTiers; ++t) {
    for (int k = 0; k < kNumMemoryCategories; ++k) {
      const auto tier = static_cast<MemoryTier>(t);
      const auto cat = static_cast<MemoryCategory>(k);
      const int64_t est = e.Peak(tier, cat);
      const int64_t got = measured != nullptr ? measured->Get(tier, cat).peak : 0;
      if (est == 0 && got == 0) continue;
      std::printf("  %-10s %-18s %12s", std::string(MemoryTierName(tier)).c_str(),
                  std::string(MemoryCategoryName(cat)).c_str(), Mib(est).c_str());
      if (measured != nullptr) {
        std::printf(" %12s %7.2f%%", Mib(got).c_str(),
                    got > 0 ? 100.0 * (static_cast<double>(est) - got) / got : 0.0);
      }
      std::printf("\n");
    }
    const int64_t est = e.PeakTotal(static_cast<MemoryTier>(t));
    const int64_t got = measured != nullptr ? measured->in_use[t].peak : 0;
    if (est == 0 && got == 0) continue;
    std::printf("  %-10s %-18s %12s",
                std::string(MemoryTierName(static_cast<MemoryTier>(t))).c_str(), "TOTAL (peak)",
                Mib(est).c_str());
    if (measured != nullptr) {
      std::printf(" %12s %7.2f%%", Mib(got).c_str(),
                  got > 0 ? 100.0 * (static_cast<double>(est) - got) / got : 0.0);
    }
    std::printf("\n");
  }
  for (int t = 0; t < kNumMemoryTiers; ++t) {
    const auto tier = static_cast<MemoryTier>(t);
    const int64_t est = e.PeakReserved(tier);
    const int64_t got = measured != nullptr ? measured->reserved[t].peak : 0;
    if (est == 0 && got == 0) continue;
    std::printf("  %-10s %-18s %12s", std::string(MemoryTierName(tier)).c_str(), "RESERVED (peak)",
                Mib(est).c_str());
    if (measured != nullptr) {
      std::printf(" %12s %7.2f%%", Mib(got).c_str(),
                  got > 0 ? 100.0 * (static_cast<double>(est) - got) / got : 0.0);
    }
    std::printf("   allocator overhead %s MiB\n", Mib(est - e.PeakTotal(tier)).c_str());
  }
  std::printf("  phases (device): forward %s MiB, backward %s MiB, optimizer step %s MiB\n",
              Mib(e.phase_forward[0]).c_str(), Mib(e.phase_backward[0]).c_str(),
              Mib(e.phase_step[0]).c_str());
}

nlohmann::json EstimateJson(const MemoryEstimate& e) {
  nlohmann::json tiers = nlohmann::json::object();
  for (int t = 0; t < kNumMemoryTiers; ++t) {
    nlohmann::json cats = nlohmann::json::object();
    for (int k = 0; k < kNumMemoryCategories; ++k) {
      cats[std::string(MemoryCategoryName(static_cast<MemoryCategory>(k)))] =
          e.Peak(static_cast<MemoryTier>(t), static_cast<MemoryCategory>(k));
    }
    tiers[std::string(MemoryTierName(static_cast<MemoryTier>(t)))] = {
        {"categories", cats},
        {"total", e.PeakTotal(static_cast<MemoryTier>(t))},
        {"reserved", e.PeakReserved(static_cast<MemoryTier>(t))}};
  }
  return {{"tiers", tiers},
          {"parameters", e.parameters},
          {"phases_device",
           {{"forward", e.phase_forward[0]},
            {"backward", e.phase_backward[0]},
            {"step", e.phase_step[0]}}}};
}

Status CheckLinkSpeeds(const EstimateOptions& o) {
  if (o.intra_gbps >= 0 && o.intra_gbps <= 1e6 && o.inter_gbps >= 0 && o.inter_gbps <= 1e6) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(StrCat("--intra-gbps ", o.intra_gbps, " / --inter-gbps ",
                                           o.inter_gbps, " must be in [0, 1e6] Gb/s"));
}

nlohmann::json CommJson(const StepComm& c, const EstimateOptions& o) {
  nlohmann::json j = {{"intra_node_bytes", c.intra}, {"inter_node_bytes", c.inter}};
  if (o.intra_gbps > 0 || o.inter_gbps > 0) j["seconds"] = c.Seconds(o.intra_gbps, o.inter_gbps);
  return j;
}

// "0.21 MB in node, 0.07 MB across[, 0.0012 s at 2400/200 Gb/s]".
std::string CommText(const StepComm& c, const EstimateOptions& o) {
  std::string text =
      fmt::format("{:.2f} MB within a node, {:.2f} MB across nodes", c.intra / 1e6, c.inter / 1e6);
  if (o.intra_gbps > 0 || o.inter_gbps > 0) {
    text += fmt::format(", {:.4f} s at {:g} / {:g} Gb/s", c.Seconds(o.intra_gbps, o.inter_gbps),
                        o.intra_gbps, o.inter_gbps);
  }
  return text;
}

void Explain(const MemoryEstimate& e) {
  std::printf("terms:\n");
  for (const MemoryTerm& t : e.terms) {
    std::printf("  [%s/%s] %s = %s: %s MiB\n", std::string(MemoryTierName(t.tier)).c_str(),
                std::string(MemoryCategoryName(t.category)).c_str(), t.what.c_str(),
                t.formula.c_str(), Mib(t.bytes).c_str());
  }
}

}  // namespace zerort::cli
