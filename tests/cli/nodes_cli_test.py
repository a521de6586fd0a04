#!/usr/bin/env python3
"""Beyond one node, on one machine: 4 ranks as 2 simulated nodes x 2 (ZERORT_RANKS_PER_NODE=2).
Hybrid sharding (parallel.data_shard_size 2, and DeepSpeed's mics_shard_size) at ZeRO 1-3 trains
the flat ZeRO run's loss curve (1e-5 relative: the same mean gradient, summed in another order),
sends fewer bytes across nodes (metrics.jsonl), and writes checkpoints that resume at the flat
layout and back on the same curve; `zerort env` prints each rank's groups; the trace marks the
collectives that crossed nodes; bad node and shard settings exit 2 naming them.
Usage: nodes_cli_test.py PATH_TO_ZERORT MPIEXEC"""
import functools
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, merged, read_jsonl, tiny_run, write_json  # noqa: E402

zerort, mpiexec = sys.argv[1], sys.argv[2]
checks = Checks("nodes_cli_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ZERORT_RANKS_PER_NODE="2")
STEPS = 12
BASE = merged(tiny_run(STEPS), {"train_batch_size": 8, "train": {"device": "cpu"}})


write = functools.partial(write_json, tmp)
records = functools.partial(read_jsonl, tmp)


def train(name, overrides, extra_args=(), np_=4, run_env=env):
    run = merged(BASE, merged({"logging": {"metrics_file": os.path.join(tmp, name + ".jsonl")}},
                              overrides))
    cmd = [mpiexec, "-np", str(np_), "--oversubscribe", "-x", "ZERORT_RANKS_PER_NODE", zerort,
           "train", write(name + ".json", run), *extra_args]
    return subprocess.run(cmd, capture_output=True, text=True, env=run_env, timeout=300)


def close(a, b, tol=1e-5):
    return len(a) == len(b) and all(abs(x - y) <= tol * abs(y) for x, y in zip(a, b))


def matches_estimate(name, measured, links=("intra", "inter")):
    """[Note: bytes per step]: the estimator's replay of `name`'s config gives each link's bytes;
    the run adds only its scalar all-reduces (loss, norm, flags: under 100 bytes)."""
    e = subprocess.run([zerort, "estimate", os.path.join(tmp, name + ".json"), "--world-size", "4",
                        "--ranks-per-node", "2", "--json"], capture_output=True, text=True,
                       timeout=120)
    if not check(f"estimate {name} exits 0", e.returncode == 0, e.stderr[-800:]):
        return
    comm = json.loads(e.stdout)["comm"]
    for link in links:
        want, got = comm[f"{link}_node_bytes"], measured[f"comm_bytes_{link}_node"]
        check(f"{name}: {link}-node bytes {got} == the estimator's {want} + scalars",
              want <= got <= want + 100, f"{got} vs {want}")


def within_three_percent(label, name, exact="bf16_exact"):
    """The final validation loss of `name` within 3% of the exact run's; the two differ."""
    ex, got = records(exact), records(name)
    ev, v = ex[-1]["val_loss"], got[-1]["val_loss"]
    print(f"{label}: val loss {v:.4f} vs exact {ev:.4f} ({100 * (v - ev) / ev:+.2f}%)")
    check(f"{label} changes the numbers", [x["loss"] for x in ex] != [x["loss"] for x in got])
    check(f"{label}: final validation loss within 3% of the exact run", abs(v - ev) <= 0.03 * ev,
          f"{v} vs {ev}")
    return got


for stage in (1, 2, 3):
    flat, hybrid = f"flat_z{stage}", f"hsdp_z{stage}"
    zero = {"zero_optimization": {"stage": stage}}
    r = train(flat, zero)
    check(f"{flat} exits 0", r.returncode == 0, r.stderr[-2000:])
    r = train(hybrid, merged(zero, {"parallel": {"data_shard_size": 2}}))
    check(f"{hybrid} exits 0", r.returncode == 0, r.stderr[-2000:])
    if r.returncode != 0:
        continue
    a, b = records(hybrid), records(flat)
    check(f"stage {stage}: HSDP 2 x 2 == flat ZeRO to 1e-5",
          close([x["loss"] for x in a], [x["loss"] for x in b]),
          f"{[x['loss'] for x in a]} {[x['loss'] for x in b]}")
    # [Note: bytes on the wire]: the flat run's data group spans both nodes (every byte counts
    # across); HSDP keeps gathers and reduce-scatters in the node, and only the gradient shard's
    # all-reduce crosses.
    check(f"stage {stage}: the flat run sends nothing within a node",
          all(x["comm_bytes_intra_node"] == 0 for x in b), str(b[-1]))
    check(f"stage {stage}: HSDP sends fewer bytes across nodes than the flat run",
          a[-1]["comm_bytes_inter_node"] < b[-1]["comm_bytes_inter_node"] / 2 and
          a[-1]["comm_bytes_intra_node"] > 0, f"{a[-1]} {b[-1]}")
    check(f"stage {stage}: the metrics line names both links",
          "MB in node" in r.stdout and "MB across" in r.stdout, r.stdout[-600:])
    matches_estimate(flat, b[-1])
    matches_estimate(hybrid, a[-1])

# Stage 1 sends only each rank's shard across the replicas, as stage 2 does (its reduce-scatter's
# result): the same bytes across nodes, to the step's scalars.
if all(os.path.exists(os.path.join(tmp, f"hsdp_z{s}.jsonl")) for s in (1, 2)):
    z1, z2 = (records(f"hsdp_z{s}")[-1]["comm_bytes_inter_node"] for s in (1, 2))
    print(f"HSDP bytes across nodes per step: stage 1 {z1}, stage 2 {z2}")
    check(f"HSDP stage 1 sends stage 2's bytes across nodes ({z1} and {z2})",
          abs(z1 - z2) <= 100, f"{z1} {z2}")

# ZeRO++ hpZ ([Note: hpZ]): a secondary copy within the node serves every gather but the step's
# first, bit for bit the same weights; only the forward's gathers (and the gradients) cross.
r = train("hpz", {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2},
                  "logging": {"trace_file": os.path.join(tmp, "hpz_trace.json")}})
check("hpZ 2 exits 0", r.returncode == 0, r.stderr[-2000:])
if r.returncode == 0 and os.path.exists(os.path.join(tmp, "flat_z3.jsonl")):
    h, f = records("hpz"), records("flat_z3")
    check("hpZ == flat ZeRO-3 bitwise", [x["loss"] for x in h] == [x["loss"] for x in f])
    check("hpZ sends fewer bytes across nodes",
          h[-1]["comm_bytes_inter_node"] < f[-1]["comm_bytes_inter_node"] and
          h[-1]["comm_bytes_intra_node"] > 0, f"{h[-1]} {f[-1]}")
    matches_estimate("hpz", h[-1])
    with open(os.path.join(tmp, "hpz_trace.json")) as fh:
        spans = [ev["name"] for ev in json.load(fh) if ev.get("ph") == "X"]
    secondary = [x for x in spans if "(hpZ)" in x]
    primary = [x for x in spans if "gather blocks" in x and "(hpZ)" not in x]
    check("the backward's gathers read the secondary copy inside the node",
          secondary and all("world.dp_hpz" in x and "inter-node" not in x for x in secondary),
          str(secondary[:4]))
    check("the forward's gathers cross nodes",
          primary and all("inter-node" in x for x in primary), str(primary[:4]) + str(spans[:8]))
    check("at least as many secondary gathers (the backward's) as primary ones (the forward's)",
          len(secondary) >= len(primary) > 0, f"{len(secondary)} {len(primary)}")

# ZeRO++ qwZ: weights gathered as int8 change the numbers by design. 300 steps of the tiny GPT in
# bf16 at lr 1e-3: the final validation loss (64 windows) within 3% of the exact run's. Why 3% is
# enough: at this learning rate the curve is smooth (the exact run with only its reductions' order
# changed, HSDP, ends 0.02% away), and qwZ measured +0.8%, qgZ +0.6%, both together +1.7%
# (docs/multi-node.md): a bound that a real loss of accuracy (a wrong scale, a lost group) breaks.
# OpenBLAS's kernel set moves them a little (six sets: qwZ +0.77% to +1.42%, qgZ +0.57% to
# +0.70%), so ctest runs this test with the CPU's kernels and with OPENBLAS_CORETYPE=Haswell.
# (At lr 3e-3 the same runs end up to 5% apart either way: there the trajectory is chaotic.) Also
# the bytes the estimator's formula gives, and about 3/4 of the exact run's bytes across nodes
# (the gathers, half of ZeRO-3's bytes in bf16, halve; the fp32 reduce-scatter stays).
LONG = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
        "train": {"steps": 300, "eval_interval": 300, "eval_windows": 64}, "steps_per_print": 100}
r_exact = train("bf16_exact", LONG)
r_qwz = train("bf16_qwz", merged(LONG, {"zero_optimization": {"zero_quantized_weights": True}}))
check("bf16 exact run exits 0", r_exact.returncode == 0, r_exact.stderr[-2000:])
check("qwZ run exits 0", r_qwz.returncode == 0, r_qwz.stderr[-2000:])
if r_exact.returncode == 0 and r_qwz.returncode == 0:
    qw = within_three_percent("qwZ", "bf16_qwz")
    ratio = qw[-1]["comm_bytes_inter_node"] / records("bf16_exact")[-1]["comm_bytes_inter_node"]
    check("qwZ: about 3/4 of the exact run's bytes across nodes", 0.72 < ratio < 0.78, str(ratio))
    matches_estimate("bf16_qwz", qw[-1])

# ZeRO++ qgZ ([Note: qgZ]): the gradient reduce-scatter as int8 all-to-alls, in the node then
# across: the same 2% bound on the 300-step validation loss, the estimator's bytes on each link,
# and the gradients' inter-node bytes a small part of the exact run's (each rank sends one quantized
# block across instead of its ring share of every block in fp32).
r = train("bf16_qgz", merged(LONG, {"zero_optimization": {"zero_quantized_gradients": True}}))
check("qgZ run exits 0", r.returncode == 0, r.stderr[-2000:])
if r.returncode == 0 and r_exact.returncode == 0:
    qg = within_three_percent("qgZ", "bf16_qgz")
    ex = records("bf16_exact")
    check("qgZ: fewer bytes across nodes, some within",
          qg[-1]["comm_bytes_inter_node"] < ex[-1]["comm_bytes_inter_node"] and
          qg[-1]["comm_bytes_intra_node"] > 0, f"{qg[-1]} {ex[-1]}")
    matches_estimate("bf16_qgz", qg[-1])

# The asynchronous CPU device (queued streams, docs/async-device.md) trains every ZeRO++ path and
# HSDP bitwise like the synchronous one: their collectives and copies are ordered on the streams.
for label, layout in (("hpZ + qwZ + qgZ", {"zero_hpz_partition_size": 2,
                                           "zero_quantized_weights": True,
                                           "zero_quantized_gradients": True}),
                      ("HSDP + hpZ + qwZ", {"zero_hpz_partition_size": 2,
                                            "zero_quantized_weights": True})):
    curves = []
    for device in ("cpu", "cpu-async"):
        name = f"async_{len(curves)}_{layout.get('zero_quantized_gradients', False)}"
        extra = {"zero_optimization": dict(layout, stage=3), "train": {"steps": 6, "device": device}}
        if "qgZ" not in label:
            extra["parallel"] = {"data_shard_size": 2}
        r = train(name, extra)
        check(f"{label} on {device} exits 0", r.returncode == 0, r.stderr[-1500:])
        curves.append([x["loss"] for x in records(name)] if r.returncode == 0 else None)
    check(f"{label}: cpu-async == cpu bitwise", curves[0] is not None and curves[0] == curves[1],
          str(curves))

# DeepSpeed's MiCS key is the same layout at stage 3: the same numbers, bit for bit.
r = train("mics", {"zero_optimization": {"stage": 3, "mics_shard_size": 2}})
check("mics_shard_size 2 exits 0", r.returncode == 0, r.stderr[-2000:])
if r.returncode == 0 and os.path.exists(os.path.join(tmp, "hsdp_z3.jsonl")):
    check("mics_shard_size 2 == data_shard_size 2 bitwise",
          [x["loss"] for x in records("mics")] == [x["loss"] for x in records("hsdp_z3")])

# Checkpoints move between the layouts: HSDP to step 6, resumed flat; flat to 6, resumed HSDP.
# The second resume adds hpZ (bitwise the run without it, so the same curve).
for first, second in (({"parallel": {"data_shard_size": 2}}, {}),
                      ({}, {"parallel": {"data_shard_size": 2},
                            "zero_optimization": {"zero_hpz_partition_size": 2}})):
    label = "HSDP -> flat" if first else "flat -> HSDP"
    ckpt = os.path.join(tmp, "ckpt_" + ("h" if first else "f"))  # and metrics files of its own
    common = {"zero_optimization": {"stage": 3}, "checkpoint": {"dir": ckpt}}
    tag = "h" if first else "f"
    r = train("leg1_" + tag, merged(merged(common, first), {"train": {"steps": 6}}))
    check(f"{label}: first leg exits 0", r.returncode == 0, r.stderr[-2000:])
    files = sorted(os.listdir(os.path.join(ckpt, "step_6"))) if r.returncode == 0 else []
    check(f"{label}: the shard group's files only",
          sum(f.endswith(".master.bin") for f in files) == (2 if first else 4), str(files))
    r = train("leg2_" + tag, merged(common, second), ["--resume"])
    check(f"{label}: resumed run exits 0", r.returncode == 0, r.stderr[-2000:])
    if r.returncode == 0:
        got = [x["loss"] for x in records("leg2_" + tag)][-6:]
        want = [x["loss"] for x in records("hsdp_z3")][6:]
        check(f"{label}: resumed on the straight run's curve to 1e-5", close(got, want),
              f"{got} {want}")

# A trace marks the collectives that crossed nodes: only HSDP's replica all-reduces (and the
# run's own world-wide agreement) do.
trace = os.path.join(tmp, "trace.json")
r = train("traced", {"zero_optimization": {"stage": 3}, "parallel": {"data_shard_size": 2},
                     "train": {"steps": 2}, "logging": {"trace_file": trace}})
check("traced HSDP run exits 0", r.returncode == 0, r.stderr[-2000:])
if r.returncode == 0:
    with open(trace) as f:
        spans = [e["name"] for e in json.load(f) if e.get("ph") == "X"]
    crossed = [s for s in spans if " inter-node" in s]
    check("gathers stay in the node",
          not any("gather blocks" in s for s in crossed) and any("gather blocks" in s for s in spans),
          str(crossed[:5]))
    check("the replica all-reduces cross nodes",
          any("across replicas" in s for s in crossed), str(crossed[:5]))

# zerort env prints the nodes and every rank's groups.
r = subprocess.run([mpiexec, "-np", "4", "--oversubscribe", "-x", "ZERORT_RANKS_PER_NODE", zerort,
                    "env", "--data-shard-size", "2", "--json"], capture_output=True, text=True,
                   env=env, timeout=120)
check("env under mpirun exits 0", r.returncode == 0, r.stderr[-1000:])
if r.returncode == 0:
    t = json.loads(r.stdout)["topology"]
    check("env: two simulated nodes", [n["ranks"] for n in t["nodes"]] == [[0, 1], [2, 3]], str(t))
    check("env: rank 3's shard group and replicate group",
          "world.dp_shard: ranks 2,3" in t["groups"][3] and
          "world.dp_replicate: ranks 1,3 (crosses nodes)" in t["groups"][3], str(t["groups"]))

# Bad settings exit 2 naming what was wrong, before training.
bad = [
    ("a shard size that does not divide the data ranks", {"parallel": {"data_shard_size": 3},
                                                            "zero_optimization": {"stage": 3}},
     env, "parallel.data_shard_size = 3 does not divide the data-parallel size 4"),
    ("MiCS below stage 3", {"zero_optimization": {"stage": 2, "mics_shard_size": 2}}, env,
     "zero_optimization.mics_shard_size = 2 is MiCS"),
    ("hybrid sharding at stage 0", {"zero_optimization": {"stage": 0},
                                    "parallel": {"data_shard_size": 2}}, env,
     "parallel.data_shard_size = 2 shards the model state in groups"),
    ("hpZ below stage 3", {"zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}},
     env, "zero_optimization.zero_hpz_partition_size = 2 is ZeRO++ hpZ"),
    ("an hpZ size that does not divide the shard group",
     {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4},
      "parallel": {"data_shard_size": 2}}, env,
     "zero_optimization.zero_hpz_partition_size = 4 does not divide the parallel.data_shard_size 2"),
    ("qwZ below stage 3", {"zero_optimization": {"stage": 2, "zero_quantized_weights": True}},
     env, "zero_optimization.zero_quantized_weights is ZeRO++ qwZ"),
    ("qgZ below stage 3", {"zero_optimization": {"stage": 2, "zero_quantized_gradients": True}},
     env, "zero_optimization.zero_quantized_gradients is ZeRO++ qgZ"),
    ("qgZ with hybrid sharding", {"zero_optimization": {"stage": 3,
                                                        "zero_quantized_gradients": True},
                                  "parallel": {"data_shard_size": 2}}, env,
     "zero_optimization.zero_quantized_gradients with parallel.data_shard_size"),
    ("two shard sizes that disagree", {"zero_optimization": {"stage": 3, "mics_shard_size": 2},
                                       "parallel": {"data_shard_size": 4}}, env,
     "are the same setting and disagree"),
    ("ranks per node that do not divide the world", {}, dict(env, ZERORT_RANKS_PER_NODE="3"),
     "ZERORT_RANKS_PER_NODE=3 does not divide the world size 4"),
    ("ranks per node that are not a number", {}, dict(env, ZERORT_RANKS_PER_NODE="two"),
     "ZERORT_RANKS_PER_NODE='two' is not a positive integer"),
]
for what, overrides, run_env, message in bad:
    r = train("bad", overrides, run_env=run_env)
    check(f"{what}: exit 2", r.returncode == 2, f"{r.returncode} {r.stderr[-800:]}")
    check(f"{what}: names it", message in r.stderr, r.stderr[-800:])

checks.finish()
