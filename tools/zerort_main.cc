// The zerort command line: discovers the launch environment, sets up rank-prefixed logging and
// dispatches to a subcommand. Exit codes: runtime/exit_codes.h.
#include <cstdio>
#include <set>
#include <string>

#include "CLI/CLI.hpp"
#include "commands.h"
#include "zerort/kernels/openmp_waits.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/launch_env.h"
#include "zerort/runtime/log.h"

int main(int argc, char** argv) {
  using namespace zerort;
  // Before anything else: the OpenMP runtime's wait setting, which it reads before main
  // ([Note: OpenMP waits on a busy machine]); returns only when the process need not start again.
  const std::optional<std::string> waits_failed = ReexecWithOpenMpWaits(argv);
  CLI::App app{"zerort: a ZeRO/FSDP sharded-optimizer training runtime"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "zerort 0.1.0");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();

  cli::EnvOptions env_options;
  CLI::App* env =
      app.add_subcommand("env", "Print version, build, devices, libraries and launch environment");
  env->add_flag("--json", env_options.json, "One JSON object instead of text");
  env->add_option("--tp", env_options.tp,
                  "Under a launcher: the tensor-parallel size of the mesh "
                  "whose groups to print")
      ->check(CLI::Range(1, 1 << 16));
  env->add_option("--pp", env_options.pp, "... its pipeline-parallel size")
      ->check(CLI::Range(1, 1 << 16));
  env->add_option("--data-shard-size", env_options.data_shard_size,
                  "... its hybrid-sharding group size (parallel.data_shard_size; 0: none)")
      ->check(CLI::Range(0, 1 << 16));

  CLI::App* bench = app.add_subcommand("bench", "Benchmarks measured against a same-run baseline");
  bench->require_subcommand(1);
  cli::BenchCommOptions comm_options;
  CLI::App* comm =
      bench->add_subcommand("comm", "Collective bandwidth against raw MPI / a copy floor");
  comm->add_option("--backend", comm_options.backend,
                   "loopback, mpi or nccl (default: mpi under a launcher, else loopback)")
      ->check(CLI::IsMember({"loopback", "mpi", "nccl"}));
  comm->add_option("--ranks", comm_options.ranks, "Loopback ranks (threads)")
      ->capture_default_str();
  comm->add_option("--min-bytes", comm_options.min_bytes, "Smallest message")
      ->capture_default_str();
  comm->add_option("--max-bytes", comm_options.max_bytes, "Largest message (x4 steps)")
      ->capture_default_str();
  comm->add_option("--dtype", comm_options.dtype, "f32, bf16 or f16")->capture_default_str();
  comm->add_option("--ops", comm_options.ops, "Operations to measure")->delimiter(',');
  comm->add_option("--rounds", comm_options.rounds, "Alternating rounds (medians reported)")
      ->capture_default_str();
  comm->add_option("--seconds-per-round", comm_options.seconds_per_round,
                   "Target duration of one round")
      ->capture_default_str();
  comm->add_flag("--json", comm_options.json, "One JSON object instead of a table");
  cli::BenchAdamwOptions adamw_options;
  CLI::App* adamw =
      bench->add_subcommand("adamw", "Fused AdamW against the memory-bandwidth floor");
  adamw->add_option("--params", adamw_options.params, "Parameters in the shard")
      ->capture_default_str();
  adamw->add_option("--rounds", adamw_options.rounds, "Alternating rounds (medians reported)")
      ->capture_default_str();
  adamw->add_flag("--json", adamw_options.json, "One JSON object instead of text");
  CLI::Option* overlap =
      adamw->add_flag("--overlap", adamw_options.overlap,
                      "Also time the step on its own thread beside GEMMs, against the two in turn");
  adamw
      ->add_flag("--lane", adamw_options.lane,
                 "Instead: the update split between the CPU and a device lane (pinned copies)")
      ->excludes(overlap);

  cli::BenchAttentionOptions attention_options;
  CLI::App* attention = bench->add_subcommand(
      "attention", "Flash-style causal attention against the materialised path (TFLOP/s)");
  attention->add_option("--batch", attention_options.batch, "Sequences")->capture_default_str();
  attention->add_option("--seq", attention_options.seq, "Tokens per sequence")
      ->capture_default_str();
  attention->add_option("--heads", attention_options.heads, "Query heads")->capture_default_str();
  attention
      ->add_option("--kv-heads", attention_options.kv_heads,
                   "Key/value heads (grouped-query); 0: --heads")
      ->capture_default_str();
  attention->add_option("--head-size", attention_options.head_size, "Channels per head")
      ->capture_default_str();
  attention
      ->add_option("--rounds", attention_options.rounds, "Alternating rounds (medians reported)")
      ->capture_default_str();
  attention->add_flag("!--no-backward", attention_options.backward, "Time the forward only");
  attention->add_option("--device", attention_options.device, "cpu, or cuda (bf16)")
      ->capture_default_str();
  attention->add_flag("--json", attention_options.json, "One JSON object instead of a table");

  cli::BenchOffloadOptions offload_options;
  CLI::App* offload = bench->add_subcommand(
      "offload",
      "NVMe store bandwidth against fio on the same path; step time with/without offload");
  offload->add_option("--path", offload_options.path, "Directory on the disk to measure")
      ->capture_default_str();
  offload->add_option("--size", offload_options.size_bytes, "Bytes written and read per round")
      ->capture_default_str();
  offload->add_option("--block-size", offload_options.block_size, "Bytes per I/O request")
      ->capture_default_str();
  offload->add_option("--queue-depth", offload_options.queue_depth, "Requests in flight")
      ->capture_default_str();
  offload->add_option("--engine", offload_options.engine, "auto, io_uring or threads")
      ->check(CLI::IsMember({"auto", "io_uring", "threads"}))
      ->capture_default_str();
  offload->add_option("--rounds", offload_options.rounds, "Alternating rounds (medians)")
      ->capture_default_str();
  offload->add_option("--config", offload_options.config,
                      "Run config: also its step time with and without its offload");
  offload->add_flag("--json", offload_options.json, "One JSON object instead of text");

  cli::TrainOptions train_options;
  CLI::App* train = app.add_subcommand("train", "Train the GPT model from a JSON run config");
  train->add_option("config", train_options.config, "Run config (JSON)")->required();
  train->add_option("--set", train_options.overrides, "Override a key: path.to.key=value")
      ->take_all()
      ->allow_extra_args(false);
  train->add_flag("--print-config", train_options.print_config,
                  "Print the resolved config and exit");
  train->add_flag("--resume", train_options.resume, "Continue from checkpoint.dir/latest");
  train->add_flag("--overwrite", train_options.overwrite,
                  "Start a new run in a checkpoint.dir or metrics file that holds an earlier "
                  "run's (its steps are kept; only this run's are rotated)");

  CLI::App* config = app.add_subcommand("config", "About run configs");
  config->require_subcommand(1);
  CLI::App* keys = config->add_subcommand(
      "keys", "Every DeepSpeed config key and what zerort does with it (a Markdown table)");
  CLI::App* reference = config->add_subcommand(
      "reference", "Every config key: type, default, allowed values, what it does (Markdown)");

  cli::PlotOptions plot_options;
  CLI::App* plot = app.add_subcommand(
      "plot",
      "Draw loss, validation loss, learning rate, tokens/s and gradient norm of a "
      "metrics.jsonl against steps (through gnuplot)");
  plot->add_option("metrics", plot_options.metrics, "metrics.jsonl of a run")->required();
  plot->add_option("-o,--out", plot_options.out, "Image to write: .png or .svg")->required();

  CLI::App* data = app.add_subcommand("data", "Token files");
  data->require_subcommand(1);
  cli::DataPrepareOptions prepare_options;
  CLI::App* prepare = data->add_subcommand(
      "prepare", "Turn a text file (.jsonl: a document per line) into a token file");
  prepare->add_option("text", prepare_options.text, "Input text file")->required();
  prepare->add_option("out", prepare_options.out, "Token file to write")->required();
  prepare->add_option("--tokenizer", prepare_options.tokenizer,
                      "A Hugging Face tokenizer.json (byte-level BPE); default: byte tokens");
  prepare->add_option("--threads", prepare_options.threads, "Threads (0: every core)")
      ->check(CLI::Range(0, 1024));
  // [Note: outputs the user named] (runtime/user_file.h)
  const char* const kOverwriteHelp =
      "Replace out if it exists (else exit 2: nothing saved is replaced unasked)";
  prepare->add_flag("--overwrite", prepare_options.overwrite, kOverwriteHelp);
  std::string corpus_out;
  bool corpus_overwrite = false;
  CLI::App* corpus = data->add_subcommand(
      "corpus", "Write the built-in corpus (the default run's text) to a file");
  corpus->add_option("out", corpus_out, "Text file to write")->required();
  corpus->add_flag("--overwrite", corpus_overwrite, kOverwriteHelp);
  cli::TrainTokenizerOptions tokenizer_options;
  CLI::App* train_tokenizer =
      data->add_subcommand("train-tokenizer",
                           "Train a SentencePiece tokenizer (OUT.model) on a text or the built-in "
                           "corpus");
  train_tokenizer->add_option("out", tokenizer_options.out, "The .model file to write")->required();
  train_tokenizer->add_option("--input", tokenizer_options.input,
                              "Text to train on (a sentence per line); default: the built-in "
                              "corpus");
  train_tokenizer->add_option("--vocab-size", tokenizer_options.vocab_size, "Pieces")
      ->capture_default_str();
  train_tokenizer->add_option("--type", tokenizer_options.type, "bpe or unigram")
      ->capture_default_str();
  train_tokenizer
      ->add_option("--threads", tokenizer_options.threads,
                   "Trainer threads (the model depends on them); 0: every core")
      ->check(CLI::Range(0, 1024));
  train_tokenizer->add_flag("--overwrite", tokenizer_options.overwrite, kOverwriteHelp);

  cli::EvalOptions eval_options;
  CLI::App* eval = app.add_subcommand(
      "eval", "Mean next-token loss of a checkpoint over the first windows of a token file");
  eval->add_option("config", eval_options.config, "Run config (JSON)")->required();
  eval->add_option("--checkpoint", eval_options.checkpoint, "Checkpoint (step) directory")
      ->required();
  eval->add_option("--data", eval_options.data, "Token file (default: the config's data)");
  eval->add_option("--max-windows", eval_options.max_windows,
                   "Windows of seq_len + 1 tokens from the start (0: all)");
  eval->add_flag("--json", eval_options.json, "{\"loss\": ..., \"tokens\": ...}");

  CLI::App* checkpoint =
      app.add_subcommand("checkpoint", "Checkpoint inspection, export and import");
  checkpoint->require_subcommand(1);
  cli::CheckpointOptions ckpt_options;
  CLI::App* inspect = checkpoint->add_subcommand(
      "inspect", "Step, config, layout, sizes and checksum status of a checkpoint");
  inspect->add_option("dir", ckpt_options.dir, "Checkpoint (step) directory")->required();
  CLI::App* export_cmd = checkpoint->add_subcommand(
      "export",
      "Master weights as a Hugging Face model: GPT-2 or LLaMA/Qwen2 (model.safetensors, "
      "config.json)");
  export_cmd->add_option("dir", ckpt_options.dir, "Checkpoint (step) directory")->required();
  export_cmd->add_option("out_dir", ckpt_options.out_dir, "Output directory")->required();
  export_cmd
      ->add_option("--max-shard-size", ckpt_options.max_shard_size,
                   "Above this, safetensors shards and their index (Hugging Face's 5GB)")
      ->capture_default_str();
  export_cmd->add_flag("--overwrite", ckpt_options.overwrite,
                       "Write into out_dir though it holds files (else exit 2); the model files "
                       "of an earlier export there are replaced");
  CLI::App* import_cmd = checkpoint->add_subcommand(
      "import", "A Hugging Face model directory (config.json, safetensors) as a zerort checkpoint");
  import_cmd->add_option("hf_dir", ckpt_options.dir, "Hugging Face model directory")->required();
  import_cmd->add_option("out_dir", ckpt_options.out_dir, "Checkpoint directory to create")
      ->required();

  cli::EstimateOptions est;
  CLI::App* estimate = app.add_subcommand(
      "estimate", "Memory per GPU/rank by tier and category, for a run config or a model shape");
  estimate->add_option("config", est.config, "Run config (JSON)");
  estimate
      ->add_option("--world-size", est.world_size,
                   "Ranks of the run (run config): data-parallel x tensor_parallel_size")
      ->capture_default_str();
  estimate->add_option("--device", est.device, "cpu or cuda (run config; default train.device)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  estimate->add_flag("--measure", est.measure,
                     "Run two real steps and print estimate against measured, per category");
  estimate->add_option("--model", est.model,
                       "tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-tiny, llama-3-8b, "
                       "llama-3-70b, qwen2-72b or qwen3-8b");
  estimate->add_option("--hf-config", est.hf_config,
                       "Shape: a Hugging Face config.json (LLaMA, Mistral, Qwen2, Qwen3, GPT-2)");
  estimate->add_option("--tp", est.tp, "Shape: tensor-parallel size")->capture_default_str();
  estimate->add_option("--pp", est.pp, "Shape: pipeline stages (1F1B, pp micro-batches)")
      ->capture_default_str();
  estimate->add_option("--layers", est.layers, "Shape: transformer blocks");
  estimate->add_option("--hidden", est.hidden, "Shape: d_model");
  estimate->add_option("--heads", est.heads, "Shape: attention heads");
  estimate->add_option("--vocab", est.vocab, "Shape: vocabulary")->capture_default_str();
  estimate->add_option("--gpus", est.gpus, "GPUs per node")->capture_default_str();
  estimate->add_option("--nodes", est.nodes, "Nodes")->capture_default_str();
  estimate->add_option("--seq-len", est.seq_len, "Sequence length (default: the model's)");
  estimate->add_option("--micro-batch", est.micro_batch, "Sequences per GPU per micro-batch")
      ->capture_default_str();
  estimate->add_option("--params", est.params, "Cold mode: total parameters");
  estimate->add_option("--largest-layer-params", est.largest_layer_params,
                       "Cold mode: parameters of the largest layer");
  estimate->add_option("--ranks-per-node", est.ranks_per_node,
                       "Run config: ranks per node, placed node by node (default: one node)");
  estimate->add_option("--data-shard-size", est.data_shard_size,
                       "Shape: hybrid sharding (HSDP) over groups of this many GPUs at stages 1-3");
  estimate->add_option("--hpz", est.hpz,
                       "Shape: ZeRO++ hpZ over groups of this many GPUs (stage 3)");
  estimate->add_flag("--qwz", est.qwz, "Shape: ZeRO++ int8 weight gathers (stage 3)");
  estimate->add_flag("--qgz", est.qgz, "Shape: ZeRO++ int8 gradient reduce-scatter (stage 3)");
  estimate->add_flag("--onebit", est.onebit,
                     "Shape: DeepSpeed's 1-bit Adam after freeze_step (stage 0 rows)");
  estimate->add_option("--intra-gbps", est.intra_gbps,
                       "Link speed within a node, Gb/s: a communication time per step");
  estimate->add_option("--inter-gbps", est.inter_gbps, "Link speed across nodes, Gb/s");
  estimate->add_option("--fit", est.fit, "Only layouts that fit in this much device memory");
  estimate->add_flag("--explain", est.explain, "Every term with its formula and size");
  estimate->add_flag("--json", est.json, "One JSON object");

  cli::BenchModelOptions model_options;
  CLI::App* model = bench->add_subcommand(
      "model", "GPT forward+backward: tokens/s, FLOP/s, MFU against the model's own GEMM rate");
  model->add_option("--config", model_options.config, "Run config (JSON)")->required();
  model->add_option("--set", model_options.overrides, "Override a key: path.to.key=value")
      ->take_all()
      ->allow_extra_args(false);
  model->add_option("--iters", model_options.iters, "Measured iterations")->capture_default_str();
  model->add_flag("--cpu", model_options.cpu, "Measure on the CPU even when a GPU is present");
  model->add_flag("--json", model_options.json, "One JSON object instead of text");
  model->add_flag("--phases", model_options.phases,
                  "Forward, backward, optimizer and GEMM time per step, and the same-run sgemm "
                  "2048^3 rate as a second baseline");
  model->add_flag("--census", model_options.census,
                  "Also count one micro-batch's kernel calls and host reads");
  model->add_flag("--timeline", model_options.timeline,
                  "Also time each kernel call of the last micro-batch on the stream (CUDA events "
                  "on a GPU), by kind and GEMM shape, with the gaps between calls");

  // CLI11 would only say "a subcommand is required": name the word that is not a command, or the
  // option before the command that zerort does not have.
  {
    std::string names;
    std::set<std::string> commands;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      commands.insert(sub->get_name());
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (commands.contains(arg)) break;
      if (arg == "--log-level") {
        ++i;  // its value
        continue;
      }
      const bool top_level =
          arg.starts_with("--log-level=") || arg == "--version" || arg == "--help" || arg == "-h";
      if (top_level) continue;
      if (arg.starts_with("-")) {
        std::fprintf(stderr,
                     "zerort: unknown option '%s'; before the command zerort takes --log-level, "
                     "--version and --help; commands: %s\n",
                     arg.c_str(), names.c_str());
      } else {
        std::fprintf(stderr, "zerort: unknown command '%s'; commands: %s\n", arg.c_str(),
                     names.c_str());
      }
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  }

  StatusOr<spdlog::level::level_enum> level = ParseLogLevel(log_level);
  if (!level.ok()) {
    std::fprintf(stderr, "zerort: %s\n", std::string(level.status().message()).c_str());
    return kExitUsage;
  }
  StatusOr<LaunchEnv> launch = DiscoverLaunchEnv(ProcessEnv());
  if (!launch.ok()) {
    std::fprintf(stderr, "zerort: %s\n", std::string(launch.status().message()).c_str());
    return kExitUsage;
  }
  ConfigureLogging(LogOptions{launch->rank, launch->world_size, *level, /*all_ranks=*/true});
  if (waits_failed) {
    Logger()->warn("OpenMP threads keep libgomp's long spin (a busy machine slows them most): {}",
                   *waits_failed);
  }
  if (launch->rank == 0) {
    Logger()->info("{}", launch->ToString());
  } else {
    Logger()->debug("{}", launch->ToString());
  }

  if (app.got_subcommand(env)) return cli::RunEnv(env_options, *launch, &argc, &argv);
  if (comm->parsed()) return cli::RunBenchComm(comm_options, *launch, &argc, &argv);
  if (adamw->parsed()) return cli::RunBenchAdamw(adamw_options);
  if (attention->parsed()) return cli::RunBenchAttention(attention_options);
  if (model->parsed()) return cli::RunBenchModel(model_options, *launch, &argc, &argv);
  if (offload->parsed()) return cli::RunBenchOffload(offload_options);
  if (estimate->parsed()) {
    for (const CLI::Option* option : estimate->get_options()) {
      if (option->count() > 0 && !option->get_lnames().empty()) {
        est.given.insert("--" + option->get_lnames().front());
      }
    }
    return cli::RunEstimate(est);
  }
  if (train->parsed()) return cli::RunTrain(train_options, *launch, &argc, &argv);
  if (keys->parsed()) return cli::RunConfigKeys();
  if (reference->parsed()) return cli::RunConfigReference();
  if (plot->parsed()) return cli::RunPlot(plot_options);
  if (prepare->parsed()) return cli::RunDataPrepare(prepare_options);
  if (train_tokenizer->parsed()) return cli::RunTrainTokenizer(tokenizer_options);
  if (corpus->parsed()) return cli::RunWriteCorpus(corpus_out, corpus_overwrite);
  if (eval->parsed()) return cli::RunEval(eval_options);
  if (inspect->parsed()) return cli::RunCheckpointInspect(ckpt_options);
  if (export_cmd->parsed()) return cli::RunCheckpointExport(ckpt_options);
  if (import_cmd->parsed()) return cli::RunCheckpointImport(ckpt_options);
  return kExitUsage;
}
