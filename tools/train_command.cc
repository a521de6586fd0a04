// zerort train CONFIG and zerort data prepare TEXT OUT.
//
// train: the config is read and validated on every rank before anything else happens (nothing is
// created on disk before it is valid), then the paths it names are checked on each rank; then the
// data-parallel group is MPI's world under a launcher (NCCL over it on GPUs when built with NCCL),
// or a group of one.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "zerort/config/config.h"
#include "zerort/config/config_schema.h"
#include "zerort/config/deepspeed_config.h"
#include "zerort/data/data_prepare.h"
#include "zerort/data/token_file.h"
#include "zerort/data/tokenizer.h"
#include "zerort/engine/preflight.h"
#include "zerort/engine/trainer.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/session.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort::cli {

int ExitCodeOf(const Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kNotFound:       // --resume without a checkpoint
    case absl::StatusCode::kDataLoss:       // a damaged checkpoint or data file
    case absl::StatusCode::kAlreadyExists:  // another run's directory, lock or metrics file
      return kExitUsage;
    default:
      return kExitRuntimeFailure;
  }
}

int RunConfigKeys() {
  std::fputs(DeepSpeedKeysMarkdown().c_str(), stdout);
  return kExitOk;
}

int RunConfigReference() {
  std::fputs(ConfigReferenceMarkdown().c_str(), stdout);
  return kExitOk;
}

int RunTrain(const TrainOptions& o, const LaunchEnv& launch, int* argc, char*** argv) {
  StatusOr<RunConfig> config = LoadRunConfig(o.config, o.overrides);
  if (!config.ok()) {
    Logger()->error("{}", config.status().message());
    return kExitUsage;
  }
  // The paths it names, on this rank's machine (reading the config touched none of them).
  if (Status paths = CheckRunPaths(*config, o.config); !paths.ok()) {
    Logger()->error("{}", paths.message());
    return kExitUsage;
  }
  if (o.resume && config->checkpoint.dir.empty()) {
    Logger()->error("{}: --resume needs checkpoint.dir", o.config);
    return kExitUsage;
  }
  if (launch.rank == 0) {
    for (const std::string& note : config->notes) Logger()->info("{}: {}", o.config, note);
    for (const std::string& w : config->warnings) Logger()->warn("{}: {}", o.config, w);
  }
  if (o.print_config) {
    // The batch triple is resolved for the data-parallel size of the world this process was
    // launched in, as train resolves it.
    RunConfig resolved = *config;
    const int model_parallel =
        resolved.parallel.tensor_parallel_size * resolved.parallel.pipeline_parallel_size;
    Status batch = absl::OkStatus();
    if (launch.world_size % model_parallel != 0) {
      batch = absl::InvalidArgumentError(
          StrCat("world size ", launch.world_size, " (", launch.source,
                 ") is not a multiple of tensor_parallel_size x pipeline_parallel_size = ",
                 model_parallel));
    } else {
      batch = ResolveBatch(resolved, launch.world_size / model_parallel,
                           model_parallel == 1
                               ? StrCat("world size from the launcher: ", launch.source)
                               : StrCat("world size from the launcher (", launch.source,
                                        ") / (tensor_parallel_size x pipeline_parallel_size)"));
    }
    if (!batch.ok()) {
      Logger()->error("{}: {}", o.config, batch.message());
      return kExitUsage;
    }
    if (launch.rank == 0) std::printf("%s\n", resolved.ToJson().dump(2).c_str());
    return kExitOk;
  }
  if (!config->logging.level.empty()) {
    if (auto level = ParseLogLevel(config->logging.level); level.ok()) Logger()->set_level(*level);
  }

  if (Status nodes = CheckRanksPerNodeOverride(ProcessEnv(), launch.world_size); !nodes.ok()) {
    Logger()->error("{}", nodes.message());
    return kExitUsage;
  }
  // MPI under a launcher (NCCL over it on GPUs), or a group of one (runtime/session.h).
  StatusOr<std::unique_ptr<Session>> session =
      Session::Start(argc, argv,
                     {.device = config->train.device == "cuda" ? "cuda"
                                : config->train.device.empty() ? ""
                                                               : "cpu",
                      .thread_multiple = config->train.device == "cpu-async",
                      .collective_timeout_s = config->parallel.collective_timeout_s,
                      .configure_logging = false});
  if (!session.ok()) {
    if (config->train.device == "cpu-async" && absl::IsInvalidArgument(session.status())) {
      Logger()->error(
          "train.device \"cpu-async\" runs collectives on each stream's thread: {} "
          "(use train.device \"cpu\")",
          session.status().message());
      return kExitUsage;
    }
    if (config->train.device == "cuda" && absl::IsFailedPrecondition(session.status())) {
      Logger()->error("train.device = \"cuda\", but there is {}", session.status().message());
      return kExitUsage;
    }
    Logger()->error("{}", session.status().message());
    return kExitRuntimeFailure;
  }
  // Open MPI gives ranks a pseudo-terminal even when mpirun's own output is a pipe, so a
  // launched run never draws the bar.
  const bool progress_bar = ::isatty(STDOUT_FILENO) && launch.source == "none";
  StatusOr<TrainResult> result = Train(*config, {.world = &(*session)->world(),
                                                 .world_source = (*session)->world_source(),
                                                 .local_rank = launch.local_rank,
                                                 .device = (*session)->device(),
                                                 .progress_bar = progress_bar,
                                                 .resume = o.resume,
                                                 .overwrite = o.overwrite,
                                                 .local_world_size = launch.local_world_size,
                                                 .topology = &(*session)->topology(),
                                                 .faults = FaultHooks::FromEnvironment()});
  if (!result.ok()) {
    Logger()->error("{}", result.status().message());
    const int code = ExitCodeOf(result.status());
    (*session)->EndAfterError(code);  // a rank that failed alone ends the job now
    return code;
  }
  if (result->non_finite) return kExitNonFinite;
  if (result->stopped_by_signal) return kExitOk;  // saved; continue with --resume
  return kExitOk;
}

int RunDataPrepare(const DataPrepareOptions& o) {
  // [Note: outputs the user named]; and never the text being read, --overwrite or not.
  std::error_code ec;
  Status out_ok = std::filesystem::equivalent(o.text, o.out, ec)
                      ? absl::InvalidArgumentError(
                            StrCat("data prepare: ", o.out, " is the text it would be made from"))
                      : CheckReplaceable(o.out, o.overwrite, "data prepare");
  if (!out_ok.ok()) return Fail(out_ok);
  const bool bar = ::isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  auto progress = [&](int64_t done, int64_t total) {
    if (!bar) return;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "\rdata prepare: %5.1f%% of %.1f MiB, %.1f MB/s", 100.0 * done / total,
                 total / 1048576.0, s > 0 ? done / s / 1e6 : 0.0);
    if (done == total) std::fputc('\n', stderr);
  };
  StatusOr<PrepareSummary> s = PrepareTokenFile(
      {.input = o.text, .output = o.out, .tokenizer = o.tokenizer, .threads = o.threads}, progress);
  if (!s.ok()) {
    Logger()->error("data prepare: {}", s.status().message());
    return ExitCodeOf(s.status());
  }
  if (o.tokenizer.empty()) {
    std::printf("wrote %s: %lld byte-level tokens (vocabulary 256) from %s\n", o.out.c_str(),
                static_cast<long long>(s->tokens), o.text.c_str());
  } else {
    std::printf("wrote %s: %lld tokens (vocabulary %d, %s) from %lld documents of %s, %.1f MB/s\n",
                o.out.c_str(), static_cast<long long>(s->tokens), s->vocab_size,
                o.tokenizer.c_str(), static_cast<long long>(s->documents), o.text.c_str(),
                s->seconds > 0 ? s->bytes / s->seconds / 1e6 : 0.0);
  }
  return kExitOk;
}

int RunTrainTokenizer(const TrainTokenizerOptions& o) {
  if (Status out_ok = CheckReplaceable(o.out, o.overwrite, "data train-tokenizer"); !out_ok.ok()) {
    return Fail(out_ok);
  }
  const Status s = TrainSentencePiece({.input = o.input,
                                       .output = o.out,
                                       .vocab_size = o.vocab_size,
                                       .type = o.type,
                                       .threads = o.threads});
  if (!s.ok()) {
    Logger()->error("data train-tokenizer: {}", s.message());
    return ExitCodeOf(s);
  }
  std::printf("wrote %s: a SentencePiece %s model of %d pieces from %s\n", o.out.c_str(),
              o.type.c_str(), o.vocab_size,
              o.input.empty() ? "the built-in corpus" : o.input.c_str());
  return kExitOk;
}

int RunWriteCorpus(const std::string& out, bool overwrite) {
  const std::string text = DefaultCorpus();
  if (Status out_ok = CheckReplaceable(out, overwrite, "data corpus"); !out_ok.ok()) {
    return Fail(out_ok);
  }
  if (Status s = WriteFileAtomically(out, text, "data corpus"); !s.ok()) {
    Logger()->error("data corpus: {}", s.message());
    return ExitCodeOf(s);
  }
  std::printf("wrote %s: the built-in corpus (%zu bytes)\n", out.c_str(), text.size());
  return kExitOk;
}

}  // namespace zerort::cli
