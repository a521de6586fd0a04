// A checkpoint read under a run config: the saved run config's keys that give the tensors their
// shapes and meaning must be the run's (`zerort train --resume`, `zerort eval`), each difference
// named with both values. The keys are JSON paths of the run config as ToJson writes it (a key a
// checkpoint predates is not compared).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"

namespace zerort {

// A resumed run's config against the one that saved the checkpoint: what shapes the saved state
// must match (the model's shape, the optimizer and the compute dtype); what is meant to change
// (ZeRO stage, world size and layout, batch size, learning-rate schedule) may.
Status CheckResumable(const nlohmann::json& saved, const nlohmann::json& now,
                      const std::string& step_dir);
// A checkpoint read under another run config (`command`: "eval"): the model's architecture keys
// (arch, the shape, n_kv_head, intermediate_size, rope_theta, rope_scaling, rms_norm_eps,
// tie_word_embeddings, the bias flags, sliding_window) must equal the ones the checkpoint was
// saved with; seq_len may differ. Ok for an embedder's checkpoint (no config), whose load fails by
// itself.
Status CheckSameArchitecture(const nlohmann::json& saved, const nlohmann::json& now,
                             const std::string& step_dir, const std::string& command);

// The saved parameters (metadata.json's `params`: names and unpadded shapes) against the model the
// saved run config declares (DecoderUnits of its `model` section): the same names, each with the
// same shape, none missing or extra; the first difference is named (DataLoss: the metadata
// contradicts itself). Ok for an embedder's checkpoint (no config: nothing to compare against).
// `checkpoint inspect` reports it and `checkpoint export` refuses on it, where a resume or an eval
// would refuse only when its own model met the shapes.
Status CheckSavedParams(const nlohmann::json& metadata,
                        const std::vector<std::pair<std::string, Shape>>& params,
                        const std::string& step_dir);

}  // namespace zerort
