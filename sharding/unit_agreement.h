// Every data-parallel rank must register the same units: they shard each unit alike and meet in
// its gathers and reductions by position. ShardManager::Initialize checks it once.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/communicator.h"

namespace zerort {

// [Note: every rank registers the same units]
// `entries` describes this rank's registration, one line per entry: the manager's settings that
// must agree (stage, dtypes), then one line per unit in order (its name, and each parameter's
// name, local and global shape and weight decay). OK when every rank of `dp` has the same
// entries: one all-gather of a 64-bit fingerprint (XXH3) of them. Otherwise every rank returns the
// same error, naming the first entry that differs and both ranks' versions of it (the entries of
// all ranks are gathered for that: two more collectives, on the failing path only). Without the
// check a unit registered with another shape failed in its first gather naming no unit
// (MPI_ERR_TRUNCATE), or trained silently wrong when the shapes padded to the same length.
Status AgreeOnUnits(Communicator& dp, Allocator& allocator, Stream& stream,
                    const std::vector<std::string>& entries);

// A 64-bit hash of a parameter's initial values (XXH3; never 0, which means "not computed").
uint64_t InitialValuesHash(std::span<const float> values);

// Every rank computes the initial values of the parameters its shard touches, in full, from the
// Initializer; a rank-dependent Initializer would start the ranks from different weights (at
// stage 0 every replica its own). `hashes[i]` is InitialValuesHash of parameter i (in unit order)
// or 0 where this rank did not compute it, `names[i]` names it. One all-gather of the hashes; a
// parameter two ranks computed differently fails Initialize on every rank, naming it and the
// ranks. Parameters only one rank computes are not compared (only one version of them exists).
Status AgreeOnInitialValues(Communicator& dp, Allocator& allocator, Stream& stream,
                            const std::vector<uint64_t>& hashes,
                            const std::vector<std::string>& names);

}  // namespace zerort
