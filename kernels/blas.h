// The CPU BLAS (OpenBLAS; oneDNN's sgemm instead with -DZR_ENABLE_DNNL=ON) behind the CPU GEMMs:
// its identity and its thread count; and the vector width of zerort's own CPU loops. zerort does
// not set the count: OpenBLAS and OpenMP read OPENBLAS_NUM_THREADS and OMP_NUM_THREADS, which ranks
// sharing a node set so that together they do not oversubscribe its cores (docs/benchmarks.md's
// mpirun lines).
#pragma once

#include <string>

namespace zerort {

std::string BlasVersion();  // OpenBLAS's configuration string
int BlasThreads();          // threads OpenBLAS will use
// The library behind the CPU kernels' fp32 GEMMs: "oneDNN 2.6.3", or "OpenBLAS, Haswell kernels"
// (the kernel set OpenBLAS runs: it picks one by CPU model, or takes OPENBLAS_CORETYPE's).
std::string CpuGemmLibrary();
// Empty, or a warning when OPENBLAS_CORETYPE holds OpenBLAS to AVX2 or older kernels on a CPU
// with AVX-512 (this project's machines set it to Haswell; OpenBLAS's own choice there ran the
// training step 1.6-1.7x faster, docs/benchmarks.md).
std::string BlasCoreWarning();
// The version of the CPU kernels' hot loops (ZR_CPU_CLONES, kernels/cpu/vector_math.h) the loader
// picks on this CPU: "AVX-512 (x86-64-v4)", "AVX2 + FMA (x86-64-v3)" or "baseline x86-64"; or
// "baseline (the per-width versions are not built: ZR_CPU_DISPATCH=OFF)". The test of what it
// says on other CPUs: tools/cpu_levels.py, which runs the tests on emulated ones. Defined beside
// the loops, in kernels/cpu/fast_ops.cc.
std::string CpuLoopLevel();

}  // namespace zerort
