// Cross-key rules of a run config (config_rules.h).
#include "zerort/config/config_rules.h"

#include <algorithm>
#include <tuple>

#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

bool Given(const GivenKeys& given, std::string_view path) { return given.contains(path); }

void OffloadRules(RunConfig& c, Problems& problems) {
  ZeroConfig& z = c.zero;
  for (const auto& [name, off] :
       {std::pair<const char*, OffloadConfig*>{"offload_optimizer", &z.offload_optimizer},
        {"offload_param", &z.offload_param}}) {
    const std::string path = StrCat("zero_optimization.", name);
    if (off->device == "nvme" && off->nvme_path.empty()) {
      problems.Add(StrCat(path, ".nvme_path is required when ", path, ".device is \"nvme\""));
    }
  }
  // DeepSpeed's Twin-Flow ([Note: partial optimizer offload], sharding/options.h).
  const OffloadConfig& opt_off = z.offload_optimizer;
  const std::string& type = c.optimizer.type;
  if (opt_off.ratio != 1.0 && opt_off.device == "nvme") {
    problems.Add(StrCat("zero_optimization.offload_optimizer.ratio = ", opt_off.ratio,
                        ": a partial offload keeps its share in host memory; with device "
                        "\"nvme\" use 1 (or device \"cpu\")"));
  }
  if (opt_off.ratio != 1.0 && opt_off.device == "cpu" &&
      (type == "OneBitAdam" || type == "ZeroOneAdam" || type == "OneBitLamb")) {
    problems.Add(StrCat("zero_optimization.offload_optimizer.ratio = ", opt_off.ratio,
                        " with optimizer.type \"", type,
                        "\" is not supported (its compression state spans the rank's units); "
                        "use 1"));
  }
  if (opt_off.ratio != 1.0 && opt_off.device == "none") {
    c.warnings.push_back(StrCat("zero_optimization.offload_optimizer.ratio = ", opt_off.ratio,
                                " is ignored: offload_optimizer.device is \"none\""));
  }
  // [Note: gradient sums on the device] (sharding/options.h).
  if (c.train.device_grad_sums) {
    if (opt_off.device == "nvme") {
      problems.Add(
          "train.device_grad_sums = true: with offload_optimizer.device \"nvme\" the gradient "
          "shards stream to the file; use false (or device \"cpu\")");
    } else if (opt_off.device == "none") {
      c.warnings.push_back(
          "train.device_grad_sums = true is ignored: offload_optimizer.device is \"none\" (the "
          "gradients are summed on the device already)");
    }
  }
  // DeepSpeed's rules: optimizer offload from stage 1, parameter offload at stage 3 only.
  if (z.offload_optimizer.device != "none" && z.stage == 0) {
    problems.Add(StrCat("zero_optimization.offload_optimizer.device = \"",
                        z.offload_optimizer.device,
                        "\" needs zero_optimization.stage 1, 2 or 3 (it is 0)"));
  }
  if (z.offload_param.device != "none" && z.stage != 3) {
    // DeepSpeed reads offload_param at stage 3 only and ignores it below: so does zerort, saying
    // so.
    c.warnings.push_back(StrCat("zero_optimization.offload_param.device = \"",
                                z.offload_param.device, "\" is ignored at zero_optimization.stage ",
                                z.stage,
                                " (parameters are offloaded at stage 3 only; DeepSpeed ignores it "
                                "too): the parameters stay on the device"));
    z.offload_param = ZeroConfig{}.offload_param;
  }
  if (z.offload_param.device == "nvme" && z.offload_optimizer.device != "nvme") {
    problems.Add(
        "zero_optimization.offload_param.device = \"nvme\" needs "
        "zero_optimization.offload_optimizer.device = \"nvme\" too");
  }
  if (z.offload_param.device == "nvme" &&
      z.offload_param.nvme_path != z.offload_optimizer.nvme_path) {
    problems.Add(StrCat("zero_optimization.offload_param.nvme_path = \"", z.offload_param.nvme_path,
                        "\" differs from zero_optimization.offload_optimizer.nvme_path = \"",
                        z.offload_optimizer.nvme_path, "\": zerort keeps one NVMe file per rank"));
  }
  if (z.offload_optimizer.device == "cpu" && z.offload_param.device == "cpu" &&
      z.offload_optimizer.pin_memory != z.offload_param.pin_memory) {
    problems.Add(
        "zero_optimization.offload_param.pin_memory and offload_optimizer.pin_memory differ");
  }
  if (c.manager.offload.aio_block_size % 4096 != 0) {
    problems.Add(StrCat("aio.block_size = ", c.manager.offload.aio_block_size,
                        " is not a multiple of 4096 (O_DIRECT's alignment)"));
  }
}

void PrecisionRules(RunConfig& c, Problems& problems) {
  if (c.manager.loss_scale.min_loss_scale < 1.0f) {
    c.warnings.push_back(StrCat(
        "fp16.min_loss_scale = ", c.manager.loss_scale.min_loss_scale,
        " is below 1: zerort uses it as the dynamic scale's floor, but newer DeepSpeed versions "
        "take only an integer here, so this config will not load there"));
  }
  if (c.bf16 && c.fp16.enabled) {
    problems.Add("fp16.enabled and bf16.enabled are both true: choose one compute precision");
  }
}

// A parameter given under a type that does not own it (the field table's owners).
void OwnershipRules(const RunConfig& c, const GivenKeys& given, Problems& problems) {
  for (const ConfigField& f : ConfigFields()) {
    if (f.owners.empty() || !Given(given, f.Path())) continue;
    if (f.section == "optimizer.params") {
      const std::string& type = c.optimizer.type;
      if (std::find(f.owners.begin(), f.owners.end(), type) != f.owners.end()) continue;
      std::string kind;
      if (std::find(f.owners.begin(), f.owners.end(), "AdamW") != f.owners.end()) {
        kind = "an Adam";
      } else if (f.owners.size() == 1 && f.owners[0] == "SGD") {
        kind = "an SGD";
      } else {  // "a OneBitAdam or OneBitLamb", "a Lamb or OneBitLamb"
        for (std::string_view owner : f.owners) {
          kind += StrCat(kind.empty() ? "a " : " or ", owner);
        }
      }
      problems.Add(StrCat(f.Path(), " is ", kind, " parameter, but optimizer.type is ", type));
    } else if (f.section == "scheduler.params" && !c.scheduler.type.empty()) {
      const std::string& type = c.scheduler.type;
      if (std::find(f.owners.begin(), f.owners.end(), type) != f.owners.end()) continue;
      std::string own;
      for (const ConfigField& g : ConfigFields()) {
        if (g.section == f.section &&
            std::find(g.owners.begin(), g.owners.end(), type) != g.owners.end()) {
          own += StrCat(own.empty() ? "" : ", ", g.key);
        }
      }
      problems.Add(
          StrCat(f.Path(), " is not a parameter of ", type, " (its parameters: ", own, ")"));
    }
  }
}

void OptimizerRules(const RunConfig& c, const GivenKeys& given, Problems& problems) {
  const OptimizerConfig& o = c.optimizer;
  const OptimizerOptions& p = c.manager.optimizer;  // its parameters
  if (o.type == "OneBitLamb" && !(p.coeff_beta < 1)) {
    problems.Add(StrCat("optimizer.params.coeff_beta = ", p.coeff_beta,
                        ": 1-bit LAMB's frozen trust ratio would never leave 0 (below 1 needed)"));
  }
  if (o.type == "OneBitLamb" && !(p.factor_min > 0)) {
    problems.Add(StrCat("optimizer.params.factor_min = ", p.factor_min,
                        ": 1-bit LAMB's factor must stay above 0 (it scales the trust ratio)"));
  }
  if (p.factor_min > p.factor_max) {
    problems.Add(StrCat("optimizer.params.factor_min = ", p.factor_min,
                        " is above optimizer.params.factor_max = ", p.factor_max));
  }
  if (p.min_coeff > p.max_coeff) {
    problems.Add(StrCat("optimizer.params.min_coeff = ", p.min_coeff,
                        " is above optimizer.params.max_coeff = ", p.max_coeff));
  }
  if (o.type == "AdamW" && Given(given, "optimizer.params.adam_w_mode") && !o.adam_w_mode) {
    problems.Add(
        "optimizer.params.adam_w_mode = false contradicts optimizer.type AdamW (use \"Adam\" for "
        "L2-coupled weight decay)");
  }
  if (o.type == "SGD" && p.nesterov && (p.momentum <= 0 || p.dampening != 0)) {
    problems.Add("optimizer.params.nesterov needs momentum > 0 and dampening 0 (as PyTorch's SGD)");
  }
  // [Note: 1-bit LAMB]: the scaling coefficients average over a rank's parameters, which differ
  // between the ranks of a tensor-parallel group (Lamb sums a split parameter's norm over it:
  // [Note: LAMB with tensor parallelism]).
  if (o.type == "OneBitLamb" && c.parallel.tensor_parallel_size > 1) {
    problems.Add(
        "optimizer.type = \"OneBitLamb\" with parallel.tensor_parallel_size > 1 is not "
        "implemented (each rank would scale its momenta by its own parts' mean)");
  }
  // [Note: 1-bit LAMB]: the scaling coefficients average over a rank's parameters, so a tied
  // embedding's two copies on two stages would compress differently and drift apart.
  if (o.type == "OneBitLamb" && c.parallel.pipeline_parallel_size > 1) {
    problems.Add(
        "optimizer.type = \"OneBitLamb\" with parallel.pipeline_parallel_size > 1 is not "
        "implemented (each stage would scale its momenta by its own parameters' mean)");
  }
  // DeepSpeed's engine: "1bit-Adam is not compatible with ZeRO" (and 0/1 Adam's likewise).
  if ((o.type == "OneBitAdam" || o.type == "ZeroOneAdam" || o.type == "OneBitLamb") &&
      c.zero.stage != 0) {
    problems.Add(
        StrCat("optimizer.type = \"", o.type, "\" with zero_optimization.stage = ", c.zero.stage,
               ": DeepSpeed's 1-bit optimizers run at ZeRO stage 0 only (they compress the "
               "all-reduce of a whole momentum, which sharded optimizer states do not have)"));
  }
  if (o.type == "Lamb" && c.zero.offload_optimizer.device == "nvme") {
    problems.Add(
        "optimizer.type = \"Lamb\" with zero_optimization.offload_optimizer.device \"nvme\" is "
        "not implemented (the norms need a second pass over the streamed chunks); use \"cpu\"");
  }
}

void SchedulerRules(const RunConfig& c, const GivenKeys& given, Problems& problems) {
  if (!Given(given, "scheduler")) return;
  const SchedulerConfig& s = c.scheduler;
  if (!Given(given, "scheduler.type")) {
    problems.Add("scheduler.type is required (WarmupLR, WarmupDecayLR or WarmupCosineLR)");
    return;
  }
  if (s.type.empty() || s.type == "WarmupLR") return;
  if (!Given(given, "scheduler.params.total_num_steps")) {
    problems.Add(StrCat("scheduler.params.total_num_steps is required by ", s.type));
  } else if (s.total_num_steps < s.warmup_num_steps) {
    problems.Add(StrCat("scheduler.params.total_num_steps = ", s.total_num_steps,
                        " is below scheduler.params.warmup_num_steps = ", s.warmup_num_steps));
  }
}

void ModelRules(const RunConfig& c, const GivenKeys& given, Problems& problems) {
  if (Given(given, "model")) problems.Add(c.model.shape.Validate());
  if (!c.data.blend.empty() && !c.data.path.empty()) {
    problems.Add(
        "data.path and data.blend both name the data: give one (a blend of one file is "
        "[1, \"" +
        c.data.path + "\"])");
  }
  // model.flash_attention's values; which of them a head size takes is checked with the model's
  // shape (kernels/flash_attention.h's CheckAttentionBackend, before a run or an estimate).
  const FlashTiles& tiles = c.model.flash_attention;
  for (const auto& [key, value, one, other] :
       {std::tuple<const char*, int, int, int>{"forward_block_queries", tiles.forward_block_queries,
                                               64, 128},
        {"forward_warps", tiles.forward_warps, 4, 8},
        {"backward_block_keys", tiles.backward_block_keys, 64, 128},
        {"backward_query_chunk", tiles.backward_query_chunk, 32, 64}}) {
    if (value != 0 && value != one && value != other) {
      problems.Add(StrCat("model.flash_attention.", key, " = ", value, ": one of 0 (the default), ",
                          one, ", ", other));
    }
  }
  const CsvMonitorConfig& csv = c.csv_monitor;
  if (csv.job_name.empty() || csv.job_name.find('/') != std::string::npos || csv.job_name == "." ||
      csv.job_name == "..") {
    problems.Add(
        StrCat("csv_monitor.job_name = \"", csv.job_name, "\": expected a plain directory name"));
  }
}

void PipelineRules(RunConfig& c, Problems& problems) {
  ParallelConfig& par = c.parallel;
  const int chunks = par.pipeline_parallel_size * par.virtual_pipeline_stages;
  if (!par.pipeline_layers.empty()) {
    if (par.pipeline_layers.size() != static_cast<size_t>(chunks)) {
      problems.Add(StrCat("parallel.pipeline_layers has ", par.pipeline_layers.size(),
                          " numbers: expected pipeline_parallel_size x virtual_pipeline_stages = ",
                          chunks, " (blocks per chunk)"));
    } else {
      int64_t sum = 0;
      for (int l : par.pipeline_layers) sum += l;
      if (sum != c.model.shape.n_layer) {
        problems.Add(StrCat("parallel.pipeline_layers sums to ", sum, " blocks, model.n_layer is ",
                            c.model.shape.n_layer));
      }
    }
  } else if (c.model.shape.n_layer % chunks != 0) {
    problems.Add(StrCat("model.n_layer = ", c.model.shape.n_layer,
                        " does not split into pipeline_parallel_size x virtual_pipeline_stages = ",
                        par.pipeline_parallel_size, " x ", par.virtual_pipeline_stages,
                        " equal chunks (give parallel.pipeline_layers)"));
  }
  const bool interleaved = par.pipeline_schedule == "interleaved";
  if (interleaved != (par.virtual_pipeline_stages > 1)) {
    problems.Add(StrCat("parallel.virtual_pipeline_stages = ", par.virtual_pipeline_stages,
                        " with parallel.pipeline_schedule = \"", par.pipeline_schedule,
                        "\": the interleaved schedule needs 2 or more model chunks per stage, "
                        "the others exactly 1"));
  }
}

// The asynchronous CPU device (docs/async-device.md): its jitter.
// [Note: hybrid sharding]: DeepSpeed's mics_shard_size is parallel.data_shard_size at stage 3.
void HybridShardingRules(RunConfig& c, const GivenKeys& given, Problems& problems) {
  const int mics = c.zero.mics_shard_size;
  int& shard = c.parallel.data_shard_size;
  if (mics > 0) {
    if (c.zero.stage != 3) {
      problems.Add(StrCat(
          "zero_optimization.mics_shard_size = ", mics,
          " is MiCS, which DeepSpeed runs at zero_optimization.stage 3 only (it is ", c.zero.stage,
          "); for hybrid sharding at stage 1 or 2 set "
          "parallel.data_shard_size"));
    } else if (Given(given, "parallel.data_shard_size") && shard != mics) {
      problems.Add(StrCat("zero_optimization.mics_shard_size = ", mics,
                          " and parallel.data_shard_size = ", shard,
                          " are the same setting and disagree: give one"));
    } else {
      shard = mics;
    }
  }
  if (c.manager.hpz_partition_size > 1 && c.zero.stage != 3) {
    problems.Add(
        StrCat("zero_optimization.zero_hpz_partition_size = ", c.manager.hpz_partition_size,
               " is ZeRO++ hpZ, a secondary copy of stage 3's gathered weights; "
               "zero_optimization.stage is ",
               c.zero.stage));
  }
  if (c.manager.quantized_weights && c.zero.stage != 3) {
    problems.Add(
        StrCat("zero_optimization.zero_quantized_weights is ZeRO++ qwZ, a quantized "
               "gather of stage 3's weights; zero_optimization.stage is ",
               c.zero.stage));
  }
  if (c.manager.quantized_gradients && c.zero.stage != 3) {
    problems.Add(
        StrCat("zero_optimization.zero_quantized_gradients is ZeRO++ qgZ, a quantized "
               "reduce-scatter of stage 3's gradients; zero_optimization.stage is ",
               c.zero.stage));
  }
  if (c.manager.quantized_gradients && shard > 0) {
    problems.Add(StrCat("zero_optimization.zero_quantized_gradients with parallel.data_shard_size ",
                        "(or mics_shard_size) = ", shard,
                        " is not implemented: qgZ's levels are the nodes of the whole data group"));
  }
  if (shard > 0 && c.zero.stage == 0) {
    problems.Add(StrCat("parallel.data_shard_size = ", shard,
                        " shards the model state in groups, but zero_optimization.stage 0 "
                        "shards nothing: use stage 1, 2 or 3"));
  }
}

void DeviceRules(const RunConfig& c, Problems& problems) {
  const bool async = c.train.device == "cpu-async";
  if (!async && c.train.async_jitter_seed != 0) {
    problems.Add(StrCat(
        "train.async_jitter_seed = ", c.train.async_jitter_seed,
        " delays the queued streams of train.device = \"cpu-async\"; "
        "train.device is ",
        c.train.device.empty() ? std::string("absent") : StrCat("\"", c.train.device, "\"")));
  }
}

}  // namespace

void CheckConfigRules(RunConfig& c, const GivenKeys& given, Problems& problems) {
  OffloadRules(c, problems);
  PrecisionRules(c, problems);
  OwnershipRules(c, given, problems);
  OptimizerRules(c, given, problems);
  SchedulerRules(c, given, problems);
  ModelRules(c, given, problems);
  PipelineRules(c, problems);
  HybridShardingRules(c, given, problems);
  DeviceRules(c, problems);
}

}  // namespace zerort
