#!/usr/bin/env python3
"""Stream-ordering mutations (docs/async-device.md, "How it is proven"): each event record and wait,
host synchronisation and stream-ordered free in sharding/ (and the NVMe step's staging fences) and
the pipeline executor's events and step-end synchronisation is removed in turn, the detector is rebuilt and run; a mutation is caught when it fails. Detectors:
  parity (default): zerort, then the asynchronous-device parity test
    (tests/cli/async_parity_test.py: cpu against cpu-async with jitter, bitwise);
  tsan: decoder_model_test in a ThreadSanitizer build (make test-tsan's), then
    DecoderModelTest.QueuedStreams*: a data race is a failure, whatever the timing.
The file is restored after every mutation, also on Ctrl-C. Prints a Markdown table
(docs/benchmarks.md keeps the last one).

Usage: tools/stream_mutations.py [--detector parity|tsan] [--build DIR] [--mpiexec mpirun]
                                 [--only ID ...] [--list]
About 45 s per mutation with the parity test, 35 s with tsan, on 2 cores."""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (id, file, the exact text removed or replaced (found exactly once), its replacement, what it orders)
MUTATIONS = [
    ("reducer-record-compute", "sharding/gradient_reducer.cc",
     "  ZR_RETURN_IF_ERROR(event_->Record(*resources_.compute));\n", "",
     "reductions start after the backward wrote the full gradients (record on compute)"),
    ("reducer-comm-waits", "sharding/gradient_reducer.cc",
     "  return resources_.comm->WaitEvent(*event_);\n", "  return absl::OkStatus();\n",
     "reductions start after the backward wrote the full gradients (comm waits)"),
    ("reducer-record-comm", "sharding/gradient_reducer.cc",
     "  ZR_RETURN_IF_ERROR(event_->Record(*resources_.comm));\n", "",
     "the step reads reduced gradients after the reductions (record on comm)"),
    ("reducer-compute-waits", "sharding/gradient_reducer.cc",
     "  ZR_RETURN_IF_ERROR(resources_.compute->WaitEvent(*event_));\n", "",
     "the step reads reduced gradients after the reductions (compute waits)"),
    ("gather-record-written", "sharding/sharded_unit.cc",
     "  ZR_RETURN_IF_ERROR(written_event_->Record(*compute));  // the compute shard's values are final\n",
     "", "a gather reads the compute shard after the step wrote it (record on compute)"),
    ("gather-comm-waits", "sharding/sharded_unit.cc",
     "  ZR_RETURN_IF_ERROR(comm->WaitEvent(*written_event_));\n", "",
     "a gather reads the compute shard after the step wrote it (comm waits)"),
    ("gather-record-gathered", "sharding/sharded_unit.cc",
     "  ZR_RETURN_IF_ERROR(gathered_event_->Record(*comm));\n", "",
     "the model reads gathered weights after the gather (record on comm)"),
    ("gather-compute-waits", "sharding/sharded_unit.cc",
     "  ZR_RETURN_IF_ERROR(resources_.compute->WaitEvent(*gathered_event_));\n", "",
     "the model reads gathered weights after the gather (compute waits)"),
    ("gathered-record-stream", "sharding/sharded_unit.cc",
     "  ZR_RETURN_IF_ERROR(resources_.tiers.device->RecordStream(gathered_, *resources_.compute));\n",
     "", "a released gathered buffer is reused only after compute read it (RecordStream)"),
    ("full-grad-record-stream", "sharding/sharded_unit.cc",
     "  ZR_RETURN_IF_ERROR(resources_.tiers.device->RecordStream(full_grad_, used_on));\n", "",
     "a dropped full gradient is reused only after its reduction read it (RecordStream)"),
    ("fetch-buffer-fence", "sharding/sharded_unit.cc",
     "    if (comm->asynchronous()) {\n", "    if (false) {\n",
     "a parameter fetch buffer returns to the pool after the gather read it"),
    ("cast-into-sync", "sharding/sharded_unit.cc",
     "      ZR_RETURN_IF_ERROR(Cast(src, out, stream));\n      return stream->Synchronize();\n",
     "      return Cast(src, out, stream);\n",
     "initial values the caller frees are cast before CastInto returns"),
    ("placed-zero-on-stream", "sharding/placed_buffer.cc",
     "plan.tier == MemoryTier::kDevice ? stream : nullptr", "nullptr",
     "a device-tier buffer is zeroed in its stream's order"),
    ("host-grad-sync", "sharding/sharded_optimizer.cc",
     "  ZR_RETURN_IF_ERROR(g.copied->Synchronize());\n  return AddHostGradient(",
     "  return AddHostGradient(",
     "the host tier adds a reduced gradient after its copy to the host ([Note: host gradients in "
     "flight])"),
    ("optimizer-by-device", "sharding/sharded_optimizer.h",
     "    return t == MemoryTier::kDevice ? resources_.compute : nullptr;\n",
     "    return resources_.compute->device().is_cpu() ? nullptr : resources_.compute;\n",
     "device-tier optimizer work on the compute stream (not by device)"),
    ("norm-host-read-sync", "sharding/sharded_optimizer.cc",
     "      CopyBytes(&current[1], Device::Cpu(), nonfinite.data(), nonfinite.device(), 4, compute));\n"
     "  ZR_RETURN_IF_ERROR(compute->Synchronize());\n",
     "      CopyBytes(&current[1], Device::Cpu(), nonfinite.data(), nonfinite.device(), 4, compute));\n",
     "the host-tier norm adds to the device sums after reading them"),
    ("lamb-host-sums-sync", "sharding/sharded_optimizer.cc",
     "  if (stream == nullptr) ZR_RETURN_IF_ERROR(comm_stream->Synchronize());\n", "",
     "host-tier LAMB reads its sums after their all-reduce"),
    ("lamb-device-sums-sync", "sharding/sharded_optimizer.cc",
     "  if (stream != nullptr) ZR_RETURN_IF_ERROR(stream->Synchronize());\n  for (const ShardPiece& p",
     "  for (const ShardPiece& p",
     "device-tier LAMB reads its sums after the copy"),
    ("read-state-sync", "sharding/sharded_optimizer.cc",
     "    return stream != nullptr ? stream->Synchronize() : absl::OkStatus();\n",
     "    return absl::OkStatus();\n", "a checkpoint reads optimizer state after the step wrote it"),
    ("manager-norm-sync", "sharding/shard_manager.cc",
     "  ZR_RETURN_IF_ERROR(CopyBytes(host, Device::Cpu(), acc.data(), device, sizeof(host), &compute));\n"
     "  ZR_RETURN_IF_ERROR(compute.Synchronize());\n",
     "  ZR_RETURN_IF_ERROR(CopyBytes(host, Device::Cpu(), acc.data(), device, sizeof(host), &compute));\n",
     "the host reads the global norm and overflow flag after they are summed"),
    ("manager-step-sync", "sharding/shard_manager.cc",
     "  ZR_RETURN_IF_ERROR(AfterStep());\n  ZR_RETURN_IF_ERROR(compute.Synchronize());\n",
     "  ZR_RETURN_IF_ERROR(AfterStep());\n",
     "the step returns once its updates are written"),
    ("nvme-step-fences", "sharding/nvme_step.cc",
     "  opt_.staging_->Return(j.lease, std::move(fences));\n",
     "  opt_.staging_->Return(j.lease, {});\n",
     "an NVMe staging set is reused after its writes completed"),
    # The pipeline executor ([Note: pipeline transfers on streams of their own]).
    ("pipeline-send-waits", "layers/pipeline_executor.cc",
     "  ZR_RETURN_IF_ERROR(on.WaitEvent(*compute_ready_));\n", "",
     "a send on its link's stream reads what the compute stream wrote"),
    ("pipeline-recv-waits", "layers/pipeline_executor.cc",
     "  ZR_RETURN_IF_ERROR(ls.stream->WaitEvent(*compute_ready_));\n", "",
     "a receive writes its buffer after the compute work issued before it"),
    ("pipeline-compute-waits", "layers/pipeline_executor.cc",
     "  return options_.stream->WaitEvent(*ls.received);\n", "  return absl::OkStatus();\n",
     "the compute stream reads a boundary after its receive"),
    ("pipeline-copy-kept", "layers/pipeline_executor.cc",
     "      if (!done) break;\n", "",
     "a send's copy is freed only after the send completed"),
    ("pipeline-step-sync", "layers/pipeline_executor.cc",
     "  for (auto& [link, ls] : link_streams_) ZR_RETURN_IF_ERROR(ls.stream->Synchronize());\n",
     "", "a step ends after its transfers (their errors are its own)"),
]


def run(cmd, timeout, env=None):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--detector", choices=["parity", "tsan"], default="parity")
    ap.add_argument("--build", help="default: build (parity), build-tsan (tsan)")
    ap.add_argument("--mpiexec", default="mpirun")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    chosen = [m for m in MUTATIONS if not a.only or m[0] in a.only]
    for mid, path, find, _, what in chosen:
        text = open(os.path.join(ROOT, path)).read()
        if text.count(find) != 1:
            sys.exit(f"{mid}: the text to mutate occurs {text.count(find)} times in {path}")
        if a.list:
            print(f"{mid}\t{path}\t{what}")
    if a.list:
        return
    build = a.build or ("build" if a.detector == "parity" else "build-tsan")
    if a.detector == "parity":
        target = "zerort"
        test = [sys.executable, os.path.join(ROOT, "tests", "cli", "async_parity_test.py"),
                os.path.join(ROOT, build, "tools", "zerort"), a.mpiexec]
        env = None
    else:
        target = "decoder_model_test"
        test = [os.path.join(ROOT, build, "tests", "decoder_model_test"),
                "--gtest_filter=DecoderModelTest.QueuedStreams*"]
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   TSAN_OPTIONS="halt_on_error=1")
    rows = []
    for mid, path, find, replace, what in chosen:
        full = os.path.join(ROOT, path)
        original = open(full).read()
        t0 = time.time()
        try:
            with open(full, "w") as f:
                f.write(original.replace(find, replace))
            b = run(["cmake", "--build", build, "--target", target], 1800)
            if b.returncode != 0:
                verdict, detail = "does not build", b.stdout[-300:]
            else:
                try:
                    r = run(test, 900, env)
                    out = r.stdout + r.stderr
                    failed = [l[7:] for l in out.splitlines() if l.startswith("FAILED")]
                    races = [l for l in out.splitlines() if "ThreadSanitizer:" in l]
                    verdict = "caught" if r.returncode != 0 else "MISSED"
                    detail = (races or failed or [""])[0][:100]
                except subprocess.TimeoutExpired:
                    verdict, detail = "caught", "the test hung (timeout)"
        finally:
            with open(full, "w") as f:
                f.write(original)
        rows.append((mid, path, what, verdict, detail))
        print(f"{mid}: {verdict} ({time.time() - t0:.0f} s) {detail}", file=sys.stderr, flush=True)
    run(["cmake", "--build", build, "--target", target], 1800)
    print("| mutation | file | what it orders | result | first failed check |")
    print("|---|---|---|---|---|")
    for mid, path, what, verdict, detail in rows:
        print(f"| `{mid}` | {path} | {what} | {verdict} | {detail.replace('|', '/')} |")
    print(f"\n{sum(r[3] == 'caught' for r in rows)} of {len(rows)} caught")


if __name__ == "__main__":
    main()
