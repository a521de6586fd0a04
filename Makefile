# zerort: the two set-up commands of the README.
#   make run   installs what is missing, builds, and runs the default job
#   make test  installs what is missing, builds, and runs the tests (CPU, MPI, sanitizers,
#              installed-package consumer; GPU tests run when a GPU is present, else skip)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# Open MPI refuses to run as root without these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
# In containers the single-copy shared-memory path (CMA) is often not permitted.
export OMPI_MCA_btl_vader_single_copy_mechanism := none
MPIRUN := mpirun --oversubscribe
ZERORT := $(BUILD)/tools/zerort

.PHONY: all deps configure build build-cli run run-llama test test-unit test-cpu-levels test-asan test-tsan test-install format format-check bench bench-peers bench-gemm clean

all: build

# Every build compiles each target's C++ sources 8 to a translation unit (CMake's unity build;
# the CUDA sources stay one to a unit): the headers (nlohmann/json above all) are parsed and
# instantiated once per batch, not per file. On two cores a fresh Release build takes 8 min
# instead of 18, the ASan one 9 instead of 15 (docs/benchmarks.md, "Process start-up and the CI
# run"); a name defined twice in one target's anonymous namespaces fails to compile. An edit
# recompiles its batch of 8: CMAKE_FLAGS=-DCMAKE_UNITY_BUILD=OFF builds one file at a time.
UNITY := -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8

deps:
	./scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(UNITY) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# The zerort command alone (its libraries, CUDA kernels included; no tests or examples): what
# `make run` and `make run-llama` need.
build-cli: configure
	cmake --build $(BUILD) -j$(JOBS) --target zerort

# The default job: the environment, then the tiny GPT trained on the built-in corpus (CPU, about a
# minute on 2 cores; metrics in runs/tiny-cpu/metrics.jsonl, a text sample at the end).
run: build-cli
	$(ZERORT) env
	$(ZERORT) train configs/tiny-cpu.json --overwrite  # a fresh demo run each time

# The LLaMA example, download-free: a SentencePiece tokenizer trained on the built-in corpus, the
# corpus tokenized with it, a small LLaMA trained at ZeRO-3 and sampled (configs/llama-tiny-cpu.json).
LLAMA_RUN := runs/llama-tiny-cpu
run-llama: build-cli
	mkdir -p $(LLAMA_RUN)
	$(ZERORT) data corpus $(LLAMA_RUN)/corpus.txt --overwrite
	$(ZERORT) data train-tokenizer $(LLAMA_RUN)/tokenizer.model --vocab-size 512 --threads 2 --overwrite
	$(ZERORT) data prepare $(LLAMA_RUN)/corpus.txt $(LLAMA_RUN)/corpus.bin --overwrite \
	  --tokenizer $(LLAMA_RUN)/tokenizer.model
	$(ZERORT) train configs/llama-tiny-cpu.json --overwrite

test: format-check test-unit test-install test-asan test-tsan

# Every C++ and CUDA source as .clang-format says (Debian 12's clang-format 14): `make format`
# rewrites them, `make format-check` (part of `make test`, so CI runs it) lists what differs.
SOURCE_DIRS := runtime kernels offload sharding layers data config checkpoint estimate engine tools tests \
  examples
FORMATTED = $(shell find $(SOURCE_DIRS) \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
format: deps
	@clang-format -i $(FORMATTED)
format-check: deps
	@clang-format --dry-run --Werror $(FORMATTED) && echo "format-check: $(words $(FORMATTED)) files formatted"

# Then the CPU kernels' tests again on emulated CPUs of the x86-64 levels below AVX-512
# (tools/cpu_levels.py, [Note: the CPU levels]: QEMU's user mode as an AVX2 Haswell and an SSE4.2
# Nehalem), so that the loops and OpenBLAS kernels such machines run are tested on this one.
CPU_LEVELS_QUICK := ^(OptimizerTest|ReduceTest|FastOpsTest|FlashMathTest|ModelMathTest|ModelOpsTest|LambTest|OneBitKernelTest|QuantizeTest|DTypeTest|RopeTest|DecoderGoldenTest)\.
test-unit: build
	ctest --test-dir $(BUILD) -L 'cpu|mpi|gpu' --output-on-failure -j2
	tools/cpu_levels.py $(BUILD) -R '$(CPU_LEVELS_QUICK)'

# Every CPU test program of the Release build on both emulated levels (on 2 cores about 32 min at
# x86-64-v2 and more at x86-64-v3, whose AVX2 QEMU emulates more slowly: docs/benchmarks.md).
test-cpu-levels: build
	tools/cpu_levels.py $(BUILD)

# The installed package, consumed by programs that know only find_package(zerort): a
# communicator hello; a trainer that embeds the shard manager (ZeRO-3) for its own MLP, by manual
# scopes and by the layer driver, bitwise equal at 1 and 2 ranks, with and without NVMe (nothing
# may be left in the directory), its checkpoints resumed and inspected, and each misuse failing
# naming the unit (examples/embed/check.sh); README.md's embedding program (a doc test:
# examples/readme/check.sh); and one that splits its own MLP over a
# tensor-parallel group (tp 1 = tp 2 on one process; data 1 x tensor 2 under mpirun -np 2); one
# whose own runtime/ and layers/ folders precede zerort's on its include path (examples/own_folders);
# and every installed header compiled from the install prefix alone (tests/install/public_headers.sh).
EXAMPLES := hello_comm embed embed_tp own_folders
test-install: build
	rm -rf $(BUILD)/install-test $(addprefix $(BUILD)/,$(EXAMPLES))
	cmake --install $(BUILD) --prefix $(CURDIR)/$(BUILD)/install-test > /dev/null
	tests/install/public_headers.sh $(CURDIR)/$(BUILD)/install-test
	for ex in $(EXAMPLES); do \
	  cmake -S examples/$$ex -B $(BUILD)/$$ex -G Ninja -DCMAKE_BUILD_TYPE=Release \
	    -DCMAKE_PREFIX_PATH=$(CURDIR)/$(BUILD)/install-test > /dev/null && \
	  cmake --build $(BUILD)/$$ex || exit 1; \
	done
	$(BUILD)/hello_comm/hello_comm
	$(MPIRUN) -np 2 $(BUILD)/hello_comm/hello_comm
	examples/embed/check.sh $(BUILD)/embed/embed_mlp $(BUILD)/install-test/bin/zerort \
	  $(CURDIR)/$(BUILD)/embed-check $(MPIRUN)
	examples/readme/check.sh README.md $(CURDIR)/$(BUILD)/install-test \
	  $(CURDIR)/$(BUILD)/readme-check $(MPIRUN)
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $(BUILD)/embed_tp/embed_tp_mlp
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $(MPIRUN) -np 2 $(BUILD)/embed_tp/embed_tp_mlp
	$(BUILD)/own_folders/own_folders
	@echo "test-install: public headers, hello_comm 2, embed (examples/embed/check.sh: its count above), README program 3, embed_tp 2, own_folders 1 passed"

# The CPU tests again under AddressSanitizer and UndefinedBehaviorSanitizer (CPU-only build, -O1
# with line tables: what ASan recommends, and quick to compile on two cores). Warnings are errors
# here and in the TSan build (ZR_WERROR): the tree compiles without any, so a new one fails CI.
# Two settings keep this stage's time to what it checks. Every test process and every zerort it
# starts would re-execute itself to set libgomp's spin count (kernels/openmp_waits.h), and a
# sanitized process takes about 0.3 s to start (the loader's 1.2M relocations, the shadow
# memory): the environment here is what that re-execution sets (kZerortSpinCount), so each
# starts once. The Release stage, the install test and tsan-train run the re-execution, and
# busy_machine checks what it sets. Measured on 2026-11-30: this stage's tests 639 -> 503 s,
# hostile_checkpoint alone 105 -> 63 s. And the memory grid's world-4 cells that only repeat
# world 2's code paths at more ranks (plain, checkpointed, bf16: 86 s of the stage) run in the
# Release stage alone. Only the cpu label's test programs are built (ZR_TEST_LABELS), and their
# own sources at -O0 (ZR_TEST_OPTIMIZE; the libraries stay -O1): under the sanitizers -O0 compiles
# the test units in about half the time (942 -> 508 s of CPU on 2026-11-30), and the tests ran
# as long (726 and 727 s of test time).
# The two fuzzers sample fewer inputs here (their seeds' first 100 configs and 20 checkpoints, of
# the Release stage's 300 and 40): each sanitized run starts and runs about 3x slower (136 and 62
# s of test time with the Release counts, 2026-12-02), and the Release stage has already run the
# rest of the sample without the sanitizers. So do the file fuzzers (fuzz_replay, ZR_FUZZ_MUTATIONS):
# the first 2,000 of the Release stage's 5,000 mutants (each mutant is made from its own index),
# about 25 s of the stage (checkpoint 31.2 -> 16.7 s, tokenizer_json 32.9 -> 9.9, 2026-12-07).
ASAN_SKIP := Grid/MemoryGridTest\.EstimateMatchesTheMeasuredStep/stage[0-3]_world4(_ckpt(_bf16)?)?( |$$)
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
	  -DZR_ENABLE_CUDA=OFF -DZR_SANITIZE=address,undefined -DZR_WERROR=ON -DZR_TEST_LABELS=cpu \
	  -DZR_TEST_OPTIMIZE=-O0 -DZR_FUZZ_MUTATIONS=2000 $(UNITY) $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  GOMP_SPINCOUNT=1000 ZERORT_OPENMP_WAITS=1 ZR_FUZZ_TRIALS=100 ZR_CHECKPOINT_FUZZ_TRIALS=20 \
	  ctest --test-dir $(ASAN_BUILD) -L cpu -E '$(ASAN_SKIP)' --output-on-failure -j2

# The stream-ordering tests under ThreadSanitizer (docs/async-device.md): the runtime's queued
# streams, the host gradients' worker thread (sharding/host_gradient_queue.h), the host step's
# worker ([Note: the host step behind the forward]), and the GPT model trained on queued, jittered streams (ZeRO-3 gathers, reductions,
# tensor parallelism, the host-tier LAMB step), where a missing event wait or host
# synchronisation is a reported data race. A CPU-only build of those targets alone (minutes, not
# the whole tree); the load-time dispatch of the CPU kernels is off (its ifunc resolvers run
# before ThreadSanitizer starts). Death tests fork, which ThreadSanitizer does not follow: they
# run in the other stages. Then zerort itself (tools/tsan-train.sh): short training runs on
# cpu-async, one process and two MPI ranks, with NVMe and host offload, TP/SP, 16-bit.
TSAN_TESTS := cpu_streams_test host_gradient_queue_test offload_parity_test decoder_model_test zerort
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
	  -DZR_ENABLE_CUDA=OFF -DZR_SANITIZE=thread -DZR_CPU_DISPATCH=OFF -DZR_WERROR=ON $(UNITY) \
	  $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target $(TSAN_TESTS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --test-dir $(TSAN_BUILD) -R 'CpuStreams|QueuedStreams|HostGradientQueue|BehindTheForward' -E 'DeathTest' --output-on-failure -j2
	./tools/tsan-train.sh $(TSAN_BUILD)/tools/zerort

# The measured benchmarks recorded in docs/benchmarks.md.
bench: build-cli
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 $(MPIRUN) -np 4 $(ZERORT) bench comm --backend mpi \
	  --min-bytes 64KiB --max-bytes 64MiB --rounds 9 --json
	$(ZERORT) bench adamw --json
	$(ZERORT) bench model --config configs/bench-tiny.json --json

# zerort's training step against PyTorch's (Debian's python3-torch, installed here if missing) on
# this machine, in one run: tools/peers/compare.py (docs/benchmarks.md, "CPU training speed").
bench-peers: build-cli
	./scripts/install-deps.sh --peers
	/usr/bin/python3 tools/peers/compare.py $(ZERORT)

# The model's GEMM shapes through OpenBLAS, BLIS, oneDNN and libxsmm (Debian's, installed here if
# missing), in one run: tools/peers/gemm_compare.cc (docs/benchmarks.md, "GEMM libraries").
ARCH_LIB := /usr/lib/$(shell gcc -print-multiarch)
ARCH_INC := /usr/include/$(shell gcc -print-multiarch)
bench-gemm:
	./scripts/install-deps.sh --peers
	mkdir -p $(BUILD)/peers
	g++ -O2 -std=c++20 -fopenmp -I$(ARCH_INC)/blis-openmp -c tools/peers/gemm_blis.cc \
	  -o $(BUILD)/peers/gemm_blis.o
	g++ -O2 -std=c++20 -fopenmp -I$(ARCH_INC)/openblas-openmp tools/peers/gemm_compare.cc \
	  $(BUILD)/peers/gemm_blis.o -o $(BUILD)/peers/gemm_compare \
	  -L$(ARCH_LIB)/openblas-openmp -lopenblas -L$(ARCH_LIB)/blis-openmp -lblis -ldnnl \
	  /usr/lib/libxsmm.a -lpthread -ldl -lrt \
	  -Wl,-rpath,$(ARCH_LIB)/openblas-openmp -Wl,-rpath,$(ARCH_LIB)/blis-openmp
	$(BUILD)/peers/gemm_compare --threads 2 --rounds 5

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
