// The zerort subcommands. Each returns a process exit code (runtime/exit_codes.h) and prints its
// result on stdout; diagnostics go to the log (stderr).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "zerort/runtime/launch_env.h"
#include "zerort/runtime/status.h"

namespace zerort::cli {

struct EnvOptions {
  bool json = false;
  // Under a launcher: the mesh whose groups to print (data = world / (tp x pp)).
  int tp = 1, pp = 1, data_shard_size = 0;
};
int RunEnv(const EnvOptions& options, const LaunchEnv& launch, int* argc, char*** argv);

struct BenchCommOptions {
  std::string backend;  // loopback, mpi, nccl; empty: mpi under a launcher, loopback otherwise
  int ranks = 4;        // loopback only
  std::string min_bytes = "4KiB";
  std::string max_bytes = "64MiB";
  std::string dtype = "f32";
  std::vector<std::string> ops = {"all_gather", "reduce_scatter", "all_reduce"};
  int rounds = 5;                   // alternating zerort/baseline rounds; medians are reported
  double seconds_per_round = 0.05;  // time each round aims for
  bool json = false;
};
int RunBenchComm(const BenchCommOptions& options, const LaunchEnv& launch, int* argc, char*** argv);

struct BenchAdamwOptions {
  int64_t params = int64_t{32} << 20;  // 32 Mi parameters: 960 MiB of state, far beyond caches
  int rounds = 7;
  bool json = false;
  // Also: can the step hide behind the backward? The update of --params on a thread of its own
  // while the main thread runs GEMMs of the GPT-2 124M MLP shape, against the two in turn.
  bool overlap = false;
  // Instead: could a device lane take part of the host step's update? (bench_lane.cc)
  bool lane = false;
};
int RunBenchAdamw(const BenchAdamwOptions& options);
int RunBenchAdamwLane(const BenchAdamwOptions& options);
// Whether `bytes_per_param` x --params of host memory is available (MemAvailable, or a cgroup's
// limit; true when neither can be read); if not, logs that `command` cannot have it, naming
// --params. The benches fill their buffers before timing anything, and the kernel grants more
// memory than it has: refused here, what does not fit would run the machine out of it part-way.
bool ParamsFitHostMemory(const char* command, int64_t params, double bytes_per_param);

struct BenchAttentionOptions {
  int batch = 4, seq = 1024, heads = 12, head_size = 64;  // GPT-2 124M's attention
  int kv_heads = 0;                                       // 0: heads (no grouping)
  int rounds = 5;
  bool backward = true;
  std::string device = "cpu";
  bool json = false;
};
int RunBenchAttention(const BenchAttentionOptions& options);

struct BenchOffloadOptions {
  std::string path = ".";                 // directory on the disk to measure (nvme_path)
  int64_t size_bytes = int64_t{1} << 30;  // one request of this size, each way
  int64_t block_size = 1 << 20;           // aio.block_size
  int queue_depth = 8;                    // aio.queue_depth
  std::string engine = "auto";            // auto | io_uring | threads
  int rounds = 3;                         // alternating rounds; medians reported
  std::string config;                     // optional: step time with and without offload
  bool json = false;
};
int RunBenchOffload(const BenchOffloadOptions& options);

struct BenchModelOptions {
  std::string config;  // run config (JSON): the model section and the batch/precision keys
  std::vector<std::string> overrides;  // --set path.to.key=value, as train's
  int iters = 3;     // measured iterations after one warm-up; the median is reported
  bool cpu = false;  // measure on the CPU even when a GPU is present
  bool json = false;
  bool phases = false;    // forward / backward / optimizer / GEMM split, and the sgemm 2048^3 peak
  bool census = false;    // kernel calls and host reads of one micro-batch (kernels/op_census.h)
  bool timeline = false;  // each kernel call's stream time, by kind (kernels/op_timeline.h)
};
int RunBenchModel(const BenchModelOptions& options, const LaunchEnv& launch, int* argc,
                  char*** argv);

struct TrainOptions {
  std::string config;                  // run config (JSON)
  std::vector<std::string> overrides;  // --set path.to.key=value
  bool print_config = false;           // print the resolved config and exit
  bool resume = false;                 // continue from checkpoint.dir/latest
  bool overwrite = false;              // a new run where an earlier run's files are
};
int RunTrain(const TrainOptions& options, const LaunchEnv& launch, int* argc, char*** argv);

// `zerort config keys`: the DeepSpeed key table (docs/deepspeed.md's).
int RunConfigKeys();
int RunConfigReference();  // zerort config reference: the field table as Markdown

struct PlotOptions {
  std::string metrics;  // a metrics.jsonl of zerort train
  std::string out;      // .png or .svg
};
int RunPlot(const PlotOptions& options);

struct DataPrepareOptions {
  std::string text;        // input text file (.jsonl: one document per line)
  std::string out;         // token file to write
  std::string tokenizer;   // a Hugging Face tokenizer.json; empty: byte tokens
  int threads = 0;         // 0: every core
  bool overwrite = false;  // replace `out` ([Note: outputs the user named], runtime/user_file.h)
};
int RunDataPrepare(const DataPrepareOptions& options);
struct TrainTokenizerOptions {
  std::string out;    // the .model file
  std::string input;  // text; empty: the built-in corpus
  int vocab_size = 512;
  std::string type = "bpe";
  int threads = 0;         // the trainer's (its model depends on them); 0: every core
  bool overwrite = false;  // replace `out`
};
int RunTrainTokenizer(const TrainTokenizerOptions& options);
// zerort data corpus OUT.txt: the built-in corpus (the default run's text) as a file.
int RunWriteCorpus(const std::string& out, bool overwrite);

struct EvalOptions {
  std::string config;       // run config: the model shape (and data.path by default)
  std::string checkpoint;   // step directory, or a checkpoint directory with `latest`
  std::string data;         // token file; default: the config's data.path or the built-in corpus
  int64_t max_windows = 0;  // 0: every window of the file
  bool json = false;
};
int RunEval(const EvalOptions& options);

struct CheckpointOptions {
  std::string dir;                     // step directory, or a checkpoint directory with `latest`
  std::string out_dir;                 // export and import
  std::string max_shard_size = "5GB";  // export: Hugging Face's shard size (ParseBytes)
  bool overwrite = false;              // export: into a directory that holds files
};
int RunCheckpointInspect(const CheckpointOptions& options);
int RunCheckpointExport(const CheckpointOptions& options);
int RunCheckpointImport(const CheckpointOptions& options);  // dir: a Hugging Face model

struct EstimateOptions {
  std::string config;     // run config; else a model shape or a parameter count
  int world_size = 1;     // data-parallel ranks for a run config
  std::string device;     // cpu | cuda for a run config; default: its train.device
  bool measure = false;   // run two real steps and compare (run config only)
  std::string model;      // a DecoderPreset name (gpt2 ..., llama-3-8b, llama-3-70b, qwen2-72b)
  std::string hf_config;  // a Hugging Face config.json (or its directory) instead of --model
  int tp = 1, pp = 1;     // tensor- and pipeline-parallel sizes (shape mode)
  int layers = 0, hidden = 0, heads = 0, vocab = 50257;  // SHAPE instead of --model
  int gpus = 1, nodes = 1;                               // GPUs per node, nodes
  int ranks_per_node = 0;   // config mode: ranks per node (0: every rank on one node)
  int data_shard_size = 0;  // shape mode: hybrid sharding's group size (0: none)
  int hpz = 1;              // shape mode, stage 3 rows: ZeRO++ hpZ's group size (1: none)
  bool qwz = false;         // shape mode, stage 3 rows: ZeRO++'s int8 weight gathers
  bool qgz = false;         // and int8 gradient reduce-scatter
  bool onebit = false;      // shape mode, stage 0 rows: 1-bit Adam after freeze_step
  double intra_gbps = 0;    // link speeds for a communication time per step (0: none)
  double inter_gbps = 0;
  int seq_len = 0;  // 0: the model's
  int micro_batch = 1;
  double params = 0;                // cold mode
  double largest_layer_params = 0;  // cold mode
  std::string fit;                  // "80GiB": only layouts that fit, fastest first
  bool explain = false;
  bool json = false;
  std::set<std::string> given;  // the flags on the command line ("--layers"), for their checks
};
int RunEstimate(const EstimateOptions& options);

// The exit code of a failed command: 2 for what the user can fix (bad config or input, a
// missing or damaged checkpoint or data file, a feature not available yet), else 1.
int ExitCodeOf(const Status& status);
// Logs `s`'s message as the command's error and returns ExitCodeOf(s).
int Fail(const Status& s);

// Parses "4096", "4KiB", "64MiB", "1GiB", "1.5GB".
StatusOr<size_t> ParseBytes(const std::string& text);
std::string FormatBytes(double bytes);  // "4 KiB", "64 MiB"

}  // namespace zerort::cli
