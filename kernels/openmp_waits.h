// How the CPU thread team waits at the end of a parallel region, chosen before the OpenMP runtime
// starts.
//
// [Note: OpenMP waits on a busy machine]
// zerort's CPU kernels and OpenBLAS (its OpenMP build, CMakeLists.txt) share one libgomp thread
// team. A thread that reaches the end of a parallel region first waits there for the others;
// libgomp's default wait spins about 300,000 times (a few milliseconds) before it sleeps. On a
// quiet machine that keeps the team hot between back-to-back regions. On a busy one (a data
// loader, an evaluation, a second job or more MPI ranks than cores on the same cores) the
// spinning thread holds a core that the thread it waits for needs, so every region costs a
// scheduler time slice: the 2-layer d 64 model of configs/bench-tiny.json on 2 cores beside one
// competing 2-thread process ran more than 100x slower than alone (docs/cpu-performance.md).
// Sleeping at once (OMP_WAIT_POLICY=PASSIVE) fixes the busy case but costs the quiet one about 35%
// on that model (a futex wake per region). A short spin keeps both: GOMP_SPINCOUNT=1000 (libgomp's
// own count when it knows its threads outnumber the cores; about 10 microseconds) measured within
// a few percent of the default on a quiet machine and about half its speed beside the competing
// process, what its share of the cores allows.
// Not in every run: some placements of the four busy threads on two cores make a whole run of the
// tiny model 15-40x slower, with this count and with PASSIVE alike (a GEMM's team waits at its
// barrier for a thread that shares its core with both competitors; one thread, or GEMMs held to
// one thread, never did). A placement lasts as long as its processes; 0 to 7 runs of 15 were slow
// on 2026-11-30 (docs/benchmarks.md, "Placements"). Choosing each GEMM shape's thread count from
// measured times removes it, but OpenBLAS's Haswell kernels round a product differently on one
// thread and two, so the run's numbers would follow the machine's load: not kept.
//
// libgomp reads the variables once, in its initialiser before main, so they cannot be set from
// inside the process. `zerort` therefore re-executes itself (the same program, arguments and
// process id) with GOMP_SPINCOUNT set when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set;
// either one set by the user is kept as it is. A program that embeds zerort sets the variable in
// its own launcher (docs/embedding.md); `zerort env` prints what the process runs with.
#pragma once

#include <optional>
#include <string>

#include "zerort/runtime/launch_env.h"

namespace zerort {

// zerort's GOMP_SPINCOUNT when the user set no wait policy.
inline constexpr const char* kZerortSpinCount = "1000";
// Set beside it by the re-execution, so that the new image knows the spin count is zerort's.
inline constexpr const char* kZerortWaitsVariable = "ZERORT_OPENMP_WAITS";

// The wait setting the OpenMP runtime of a process with environment `env` started with, for
// `zerort env`: e.g. "GOMP_SPINCOUNT=1000 (zerort's default)", "OMP_WAIT_POLICY=PASSIVE (set by
// the environment)", or "libgomp's default (spins about 300,000 times)".
std::string DescribeOpenMpWaits(const EnvLookup& env);

// When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set: sets GOMP_SPINCOUNT=kZerortSpinCount
// (and kZerortWaitsVariable) and replaces the process image with /proc/self/exe and `argv`; it
// returns only if that is not needed (nullopt) or the exec failed (the reason, for a warning; the
// run goes on with libgomp's default).
std::optional<std::string> ReexecWithOpenMpWaits(char** argv);

}  // namespace zerort
