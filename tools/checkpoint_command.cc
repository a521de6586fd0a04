// zerort eval, zerort checkpoint inspect, zerort checkpoint export.
#include <cstdio>

#include "commands.h"
#include "zerort/checkpoint/checkpoint.h"
#include "zerort/checkpoint/export.h"
#include "zerort/config/config.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort::cli {

int Fail(const Status& s) {
  Logger()->error("{}", s.message());
  return ExitCodeOf(s);
}

int RunEval(const EvalOptions& o) {
  if (o.max_windows < 0) {
    return Fail(absl::InvalidArgumentError(
        StrCat("--max-windows ", o.max_windows, ": must be >= 0 (0: every window)")));
  }
  StatusOr<RunConfig> config = LoadRunConfig(o.config);
  if (!config.ok()) return Fail(config.status());
  StatusOr<std::string> step_dir = ResolveStepDir(o.checkpoint);
  if (!step_dir.ok()) return Fail(step_dir.status());
  const std::string data = o.data.empty() ? config->data.path : o.data;
  StatusOr<EvalResult> r = EvaluateCheckpoint(*config, *step_dir, data, o.max_windows);
  if (!r.ok()) return Fail(r.status());
  if (o.json) {
    std::printf("%s\n", nlohmann::json{{"loss", r->loss}, {"tokens", r->tokens}}.dump().c_str());
  } else {
    std::printf("%s: loss %.6f over %lld tokens (%lld windows of %s)\n", step_dir->c_str(), r->loss,
                static_cast<long long>(r->tokens), static_cast<long long>(r->windows),
                data.empty() ? "the built-in corpus" : data.c_str());
  }
  return kExitOk;
}

int RunCheckpointInspect(const CheckpointOptions& o) {
  StatusOr<std::string> step_dir = ResolveStepDir(o.dir);
  if (!step_dir.ok()) return Fail(step_dir.status());
  StatusOr<CheckpointSummary> s = InspectCheckpoint(*step_dir);
  if (!s.ok()) return Fail(s.status());
  const nlohmann::json& meta = s->metadata;
  std::printf("checkpoint %s\n", step_dir->c_str());
  std::printf("  step %lld, %lld sequences consumed, saved by %d ranks (%d writing), format %d\n",
              static_cast<long long>(meta["step"].get<int64_t>()),
              static_cast<long long>(meta["run_state"]["consumed_sequences"].get<int64_t>()),
              meta["saved_with"]["world_size"].get<int>(), meta["saved_with"]["writers"].get<int>(),
              meta["format_version"].get<int>());
  if (meta.contains("mesh") && meta["mesh"].is_object() &&
      meta["mesh"].value("data", nlohmann::json()).is_number_integer() &&
      meta["mesh"].value("tensor", nlohmann::json()).is_number_integer()) {
    const nlohmann::json pipeline = meta["mesh"].value("pipeline", nlohmann::json(1));
    std::printf("  mesh: data %lld x tensor %lld x pipeline %lld (loads at any other layout)\n",
                static_cast<long long>(meta["mesh"]["data"].get<int64_t>()),
                static_cast<long long>(meta["mesh"]["tensor"].get<int64_t>()),
                pipeline.is_number_integer() ? static_cast<long long>(pipeline.get<int64_t>()) : 1);
  }
  if (SavedByEmbedder(meta)) {
    // An embedder's checkpoint (checkpoint/manager_checkpoint.h): its own JSON instead of a config.
    std::string user = meta.value("user", nlohmann::json())
                           .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (user.size() > 300) {
      // Cut at a character boundary: half a UTF-8 sequence would make the output invalid text.
      size_t cut = 300;
      while (cut > 0 && (static_cast<unsigned char>(user[cut]) & 0xC0) == 0x80) --cut;
      user = user.substr(0, cut) + "...";
    }
    std::printf("  saved by a trainer that embeds zerort (no model config); user: %s\n",
                user.c_str());
  } else {
    const nlohmann::json& model = meta["config"]["model"];
    std::printf("  model: %d layers, d %d, %d heads, seq %d, vocab %d; ZeRO-%d, %s\n",
                model["n_layer"].get<int>(), model["d_model"].get<int>(),
                model["n_head"].get<int>(), model["seq_len"].get<int>(),
                model["vocab_size"].get<int>(),
                meta["config"]["zero_optimization"]["stage"].get<int>(),
                meta["config"]["optimizer"]["type"].get<std::string>().c_str());
  }
  int64_t numel = 0;
  for (const auto& p : meta["params"]) numel += NumElements(p["shape"].get<Shape>());
  std::printf("  %zu parameters, %lld elements; %zu shard files, %.2f MiB\n", meta["params"].size(),
              static_cast<long long>(numel), s->files.size(), s->bytes / 1048576.0);
  for (const std::string& f : s->files) std::printf("    %s\n", f.c_str());
  const std::string params = !s->params.empty()      ? StrCat("MISMATCH: ", s->params)
                             : SavedByEmbedder(meta) ? "not compared (no model config)"
                                                     : "as the saved config's model declares them";
  std::printf("  parameters: %s\n", params.c_str());
  std::printf("  checksums: %s\n", s->ok ? "all ok" : "MISMATCH (see above)");
  return s->ok && s->params.empty() ? kExitOk : kExitUsage;
}

int RunCheckpointExport(const CheckpointOptions& o) {
  // The flag first: a wrong size is named before any file is read.
  StatusOr<size_t> shard = ParseBytes(o.max_shard_size);
  if (!shard.ok() || *shard < 1) {
    return Fail(absl::InvalidArgumentError(
        StrCat("--max-shard-size ", o.max_shard_size, ": expected a size (5GB, 512MiB)")));
  }
  StatusOr<std::string> step_dir = ResolveStepDir(o.dir);
  if (!step_dir.ok()) return Fail(step_dir.status());
  // [Note: outputs the user named] (runtime/user_file.h): a model directory is not written into
  // unasked (the one a run was initialised from, say).
  if (Status out = CheckOutputDirectory(o.out_dir, o.overwrite, "checkpoint export"); !out.ok()) {
    return Fail(out);
  }
  StatusOr<ExportSummary> s =
      ExportHuggingFace(*step_dir, o.out_dir, DType::kF32, static_cast<int64_t>(*shard));
  if (!s.ok()) return Fail(s.status());
  std::printf("exported %s to %s: %d tensors, %.2f MiB in %d file(s)%s, config.json\n",
              step_dir->c_str(), o.out_dir.c_str(), s->tensors, s->bytes / 1048576.0, s->files,
              s->files > 1 ? " and model.safetensors.index.json" : "");
  return kExitOk;
}

int RunCheckpointImport(const CheckpointOptions& o) {
  StatusOr<ImportSummary> s = ImportHuggingFace(o.dir, o.out_dir);
  if (!s.ok()) return Fail(s.status());
  std::printf("imported %s to %s: %.2fM parameters\n", o.dir.c_str(), s->step_dir.c_str(),
              s->parameters / 1e6);
  return kExitOk;
}

}  // namespace zerort::cli
