#!/opt/slurm-gpu/venv/bin/python
"""Benchmark: GPU oversubscription in a random stream of plain, MPS, MIG and shard jobs (issue 27 section 7).

A 1-node sandbox on h100-mig (GPUs 0 and 1 whole, in MIG mode for
``--gpu-mig``; GPUs 2 and 3 carved into Slurm MIG gres: 4g.40gb + 3x
1g.10gb each) with ``proctrack/cgroup`` and ``task/cgroup`` (Slurm's device
cgroup), the project's prolog/epilog, SPANK plugin and accounting prolog
step, over the NVML simulator.  Two streams in turn, each on a fresh
sandbox: one whose whole GPUs also offer 4 gres/shard each, one whose
whole GPUs offer 100 gres/mps each (Slurm keeps gres/gpu apart from one
sharing gres per node only: ``gres_init_node_config`` links a single
shared gres to gres/gpu, so a node offering both can hand one GPU out as
gres/gpu and as the other at once).  Each stream is a seeded random mix:
plain (``--gres=gpu:1``, which Slurm may serve with a whole GPU or a MIG
slice; a typed whole GPU; a 1g.10gb slice), ``--gpu-mps`` (the project's
per-job MPS daemon), ``--gpu-mig`` (instances the prolog carves for the
job), and that stream's sharing gres.

Each job does what a CUDA program would: it takes the devices its
environment and Slurm's device cgroup give it (the UUIDs in
``CUDA_VISIBLE_DEVICES``, else the MIG capability files it may open, else
the ``/dev/nvidiaN`` it may open; a ``--gpu-mps`` job's work runs on the
devices its MPS daemon was started with, read from the daemon's
``/proc/PID/environ``; a GPU's UUID on a GPU in MIG mode stands for the
instances of it the job's device cgroup opens), and the bench puts its process there in the
simulator's load, as the driver would list it.  Every 0.3 s the bench
reads the node as the accounting sampler does (``StatsReader``, each PID
given to a job by its Slurm cgroup, the devices each job holds from the
accounting registrations) and counts the (device, sample) pairs where a GPU
or MIG instance is used by two jobs that Slurm did not let share it
(bench/overlap.py: only gres/shard and gres/mps jobs that both hold it).
Of those, it says how many are on a GPU Slurm's own allocation gave every
job on it (``scontrol -d show job``): Slurm before 23.11.5 gives a GPU whole
while a gres/shard or gres/mps job still runs on it (SchedMD bug 19110,
docs/slurm-versions.md); 24.11 and 26.05 (``--slurm``) do not.

    /opt/slurm-gpu/venv/bin/python bench/bench_oversub.py [--jobs 30] [--seed 27] [--share shard,mps] [--smoke]

Goal: 0 overlapping (device, sample) pairs.  The floor is what the stream
exercised: the samples, the device-samples in use, the samples with a GPU
legitimately shared.  Exits 1 when an overlap is seen.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import string
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from benchrow import row  # noqa: E402
from overlap import device_users, overlaps, slurm_gave_all, slurm_indices  # noqa: E402
from sbjobs import (JOB_USERS, client, job, sandbox_options, sbatch, slurm_gpu_minors, use_load_file,  # noqa: E402
                    workdir)

MACHINE = "h100-mig"
TICK = 0.3
WHOLE = "--gres=gpu:nvidia_h100_80gb_hbm3:1"
# (kind, sbatch options, weight); the kinds Slurm lets share a GPU are "shard" and "mps".
KINDS = [("plain", ["--gres=gpu:1"], 3), ("plain", [WHOLE], 2),
         ("plain", ["--gres=gpu:nvidia_h100_80gb_hbm3_1g.10gb:1"], 2),
         # --gpu-mps on whole GPUs only: on a Slurm MIG slice the prolog cannot name the
         # slice Slurm gave (see docs/development.md, "The outcome rows").
         ("gpu-mps", [WHOLE, "--gpu-mps"], 3),
         ("gpu-mig", [WHOLE, "--gpu-mig=3g.40gb"], 1), ("gpu-mig", [WHOLE, "--gpu-mig=1g.10gb,1g.10gb"], 1),
         ("shard", ["--gres=shard:1"], 4), ("shard", ["--gres=shard:2"], 2),
         ("mps", ["--gres=mps:25"], 4), ("mps", ["--gres=mps:50"], 2)]
SHARING = {"shard", "mps"}

# What the job runs first: which devices it may use, as CUDA would find them.
PROBE = """import errno, glob, json, os, sys
dev, out = sys.argv[1], sys.argv[2]
can = []
for p in sorted(glob.glob(dev + '/nvidia[0-9]*')) + sorted(glob.glob(dev + '/nvidia-caps/nvidia-cap*')):
    try:
        open(p, 'rb').close()
    except OSError as e:
        if e.errno == errno.ENXIO:      # the device cgroup let it through; no driver behind it
            can.append(os.path.basename(p))
rec = {'job': os.environ['SLURM_JOB_ID'], 'pid': os.getppid(), 'open': can,
       'cvd': os.environ.get('CUDA_VISIBLE_DEVICES', ''), 'mps_pipe': os.environ.get('CUDA_MPS_PIPE_DIRECTORY', '')}
tmp = out + '.tmp'
with open(tmp, 'w') as f:
    json.dump(rec, f)
os.rename(tmp, out)
"""


class Node:
    """The node as the sampler sees it, and the simulator's load the jobs' processes make."""

    def __init__(self, sb, load: Path) -> None:
        from slurm_gpu.acct.store import Store
        from slurm_gpu.hw import backend
        from slurm_gpu.hw.gpustats import StatsReader
        from slurm_gpu_devkit.sandbox import nodesim
        self.sb, self.load = sb, load
        self.name = sb.node_names[0]
        self.state = sb.layout.var / self.name / nodesim.STATE_NAME
        self.write({})
        use_load_file(sb, self.name, load)
        self.api, _ = backend.open_api(backend.GpuSource("sim", str(self.state)))
        self.reader = StatsReader(self.api)
        self.store = Store(sb.layout.var / self.name / "acct")
        self.uses: dict[str, tuple[int, list[str]]] = {}      # job -> (pid, device keys)
        self.records: dict[str, dict] = {}                     # job -> what it saw and was given

    def write(self, devices: dict[str, list[int]]) -> None:
        from slurm_gpu_devkit.sim.load import LOAD_SCHEMA, write_load
        write_load(str(self.load), {"schema": LOAD_SCHEMA, "t0": time.time() - 3600, "devices": {
            k: [{"t": 0, "sm": 50, "pids": [{"pid": p, "sm": 50 // len(pids)} for p in pids]}]
            for k, pids in devices.items()}})

    def keys_of(self, rec: dict, stats) -> list[str]:
        """The device keys a job's probe record says it uses (see the module docstring)."""
        by_uuid = {s.uuid: s.key for s in stats}
        allowed = self.cgroup_keys(rec)
        cvd = daemon_devices(self.sb.layout.var / self.name, rec["job"]) if rec["mps_pipe"] else ""
        uuids = [u for u in (cvd or rec["cvd"]).split(",") if u.startswith(("MIG-", "GPU-"))]
        if not uuids:
            return allowed
        out = []
        for u in uuids:
            key = by_uuid.get(u, f"?{u}")
            # A GPU's UUID on a GPU in MIG mode: CUDA enumerates the instances the
            # process's device cgroup lets it open (the daemon runs in the job's cgroup).
            mine = [k for k in allowed if k.startswith(f"{key}/gi")]
            out += mine or [key]
        return sorted(set(out))

    def cgroup_keys(self, rec: dict) -> list[str]:
        """The devices Slurm's device cgroup let the job open: MIG instances by their
        capability files, else whole GPUs by ``/dev/nvidiaN``."""
        gpu_of_minor = {int(g.get("minor", i)): i for i, g in enumerate(self.facts()["gpus"])}
        caps = {int(n[len("nvidia-cap"):]) for n in rec["open"] if n.startswith("nvidia-cap")}
        if caps:
            out = []
            for name, m in self.api.mig_minors().items():
                parts = name.split("/")          # gpu<minor>/gi<id>/access
                if m in caps and len(parts) == 3:
                    out.append(f"{gpu_of_minor[int(parts[0][3:])]}/{parts[1]}")
            return sorted(out)
        return [str(gpu_of_minor[int(n[len("nvidia"):])]) for n in rec["open"] if n[len("nvidia"):].isdigit()]

    def facts(self) -> dict:
        return json.loads(self.state.read_text())["facts"]

    def take_up(self, out: Path, stats) -> bool:
        """New jobs' processes onto their devices, ended ones off; True when the load changed."""
        changed = False
        for f in out.glob("*.use"):
            rec = json.loads(f.read_text())
            if rec["job"] not in self.uses and rec["job"] not in self.records:
                self.uses[rec["job"]] = (int(rec["pid"]), self.keys_of(rec, stats))
                self.records[rec["job"]] = {**rec, "keys": self.uses[rec["job"]][1],
                                            "slurm": gres_detail(self.sb, rec["job"])}
                changed = True
        for j, (pid, _) in list(self.uses.items()):
            if not alive(pid):
                del self.uses[j]
                changed = True
        if changed:
            devices: dict[str, list[int]] = {}
            for pid, keys in self.uses.values():
                for k in keys:
                    devices.setdefault(k, []).append(pid)
            self.write(devices)
        return changed


def alive(pid: int) -> bool:
    """The process runs (a zombie's context is gone: the driver lists it no more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


def gres_detail(sb, jid: str) -> str:
    """What Slurm gave the job on its node (``scontrol -d show job``'s per-node GRES)."""
    out = client(sb, ["scontrol", "-d", "show", "job", jid], check=False)
    return " ".join(w for w in out.split() if w.startswith(("GRES=", "TresPerNode=", "JOB_GRES=")))


def daemon_devices(node_dir: Path, jid: str) -> str:
    """CUDA_VISIBLE_DEVICES of the job's running MPS daemon (its own environment, not our record of it)."""
    try:
        rec = json.loads((node_dir / "jobs" / f"{jid}.json").read_text())
    except (OSError, ValueError):
        return ""
    for pid in (rec.get("mps") or {}).get("pids") or ():
        try:
            env = Path(f"/proc/{int(pid)}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"CUDA_VISIBLE_DEVICES="):
                return e.split(b"=", 1)[1].decode()
    return ""


class Phase:
    """One sandbox and one stream: the jobs, what was seen, what went wrong."""

    def __init__(self, share: str) -> None:
        self.share = share
        self.kinds: dict[str, str] = {}
        self.opts: dict[str, list[str]] = {}
        self.ticks = self.used = self.shared = 0
        self.seen: list[tuple[float, str, tuple[str, ...]]] = []
        self.failed: list[str] = []
        self.missing: list[str] = []
        self.records: dict[str, dict] = {}
        self.slurm = ""
        self.gpu_of_index: dict[int, int] = {}     # Slurm's GPU index -> the GPU (a MIG slice's: its GPU)

    def slurms(self) -> int:
        """The overlapping device-samples where Slurm itself gave the GPU to every job on it."""
        given = {j: slurm_indices(r.get("slurm", "")) for j, r in self.records.items()}
        return sum(1 for _, key, jobs in self.seen if slurm_gave_all(key, jobs, given, self.gpu_of_index))


def run_phase(share: str, n: int, rng: random.Random, slurm: str | None, machine: str = MACHINE) -> Phase:
    """A sandbox whose GPUs are shared through *share* (gres/shard or gres/mps: Slurm keeps one
    sharing gres apart from gres/gpu per node, so a node offers one), and *n* random jobs."""
    from slurm_gpu.acct import attribution
    from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions
    ph = Phase(share)
    kinds_here = [k for k in KINDS if (k[0] not in SHARING or k[0] == share)
                  and (machine == MACHINE or not any("g.10gb:" in o for o in k[1]))]   # MIG gres: h100-mig's
    d = workdir("oversub")
    out = d / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    (d / "probe.py").write_text(PROBE)
    (d / "probe.py").chmod(0o644)
    sb = Sandbox(d, SandboxOptions(
        nodes=1, machine=machine, prolog=True, spank=True, simulate=True, cgroup=True, slurm=slurm,
        # cgroups are named by node: a name no other sandbox has used
        node_prefix="o" + "".join(random.choices(string.ascii_lowercase, k=5)),
        gres_options={"mps_count": 100} if share == "mps" else {"shards": 4},
        extra_config={"acct": {"enabled": True}, "repair": {"user_problem": False}}))
    try:
        sb.up()
        ph.slurm = sb.slurm_version
        node = Node(sb, d / "load.json")
        (d / "load.json").chmod(0o644)
        pending = [rng.choices(kinds_here, weights=[k[2] for k in kinds_here])[0] for _ in range(n)]
        next_submit = time.monotonic()
        t0 = time.monotonic()
        while True:
            if pending and time.monotonic() >= next_submit:
                kind, opts, _ = pending.pop(0)
                jid = sbatch(sb, [*opts, "-o", f"{out}/%j.out", "--wrap",
                                  f"/usr/bin/python3 -I {d}/probe.py {d}/dev {out}/$SLURM_JOB_ID.use; "
                                  f"sleep {rng.uniform(2, 5):.1f}"], rng.choice(JOB_USERS), cwd=str(out))
                ph.kinds[jid] = kind
                ph.opts[jid] = opts
                next_submit = time.monotonic() + rng.uniform(0.2, 1.5)
            # Processes that ended leave the load before the node is read, as the
            # driver drops a context when its process exits.
            stats = node.reader.read()
            if node.take_up(out, stats):
                stats = node.reader.read()
            regs = node.store.registrations()
            held = attribution.holders({j: r.get("devices", []) for j, r in regs.items()})
            sluids, bases = attribution.sluid_map(regs), attribution.v2_bases("/proc")

            def pid_job(pid: int) -> str | None:
                return attribution.job_of_pid("/proc", pid, sluids, bases) if alive(pid) else None
            users = device_users(stats, pid_job)
            found = overlaps(users, held, {j for j, k in ph.kinds.items() if k in SHARING})
            ph.ticks += 1
            ph.used += sum(1 for u in users.values() if u)
            ph.shared += sum(1 for u in users.values() if len(u) > 1)
            states = dict(line.split(None, 1) for line in client(sb, ["squeue", "-h", "-o", "%i %T"]).splitlines()
                          if " " in line) if found else {}
            for key, jobs in found:
                ph.seen.append((time.monotonic() - t0, key, jobs))
                print(f"  {share}: Slurm states then: " + ", ".join(f"{j} {states.get(j, 'gone')}" for j in jobs),
                      file=sys.stderr)
                print(f"  {share}: overlap at {ph.seen[-1][0]:.1f} s on {key}: jobs {', '.join(jobs)} "
                      f"({', '.join(ph.kinds.get(j, '?') for j in jobs)}); registered: "
                      + "; ".join(f"{j} {regs[j].get('devices')} shared={regs[j].get('shared')}"
                                  if j in regs else f"{j} none" for j in jobs), file=sys.stderr)
            if not pending and not client(sb, ["squeue", "-h", "-o", "%i"]).split():
                break
            if time.monotonic() - t0 > 60 + 6 * n:
                raise SystemExit(f"bench_oversub: jobs still queued: {client(sb, ['squeue'])}"
                                 f"{client(sb, ['sinfo', '-R', '-h', '-o', '%n %E'])}; jobs: "
                                 + "; ".join(f"{j} {' '.join(o)}" for j, o in ph.opts.items()))
            time.sleep(TICK)
        for jid in ph.kinds:
            st = job(sb, jid).get("JobState") or client(
                sb, ["sacct", "-n", "-X", "-P", "-j", jid, "-o", "State"], check=False).strip()
            if st and st != "COMPLETED":
                ph.failed.append(f"{jid} {ph.kinds[jid]} {st}")
        ph.missing = [j for j in ph.kinds if not (out / f"{j}.use").exists()]
        ph.records = node.records
        # Slurm numbers GPUs in gres.conf's order here (no AutoDetect): read it, not the product's map.
        position = {int(g.get("minor", i)): i for i, g in enumerate(node.facts()["gpus"])}
        ph.gpu_of_index = {i: position[m] for i, m in
                           enumerate(slurm_gpu_minors(sb.layout.gres_conf.read_text(), node.name))}
    finally:
        sb.down()
        shutil.rmtree(d, ignore_errors=True)
    return ph


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=30, help="jobs in all, half per sharing gres")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--share", default="shard,mps", help="the sharing gres to run a stream with, in turn")
    ap.add_argument("--machine", default=MACHINE, help="the node's recorded machine (MIG gres jobs only on h100-mig)")
    sandbox_options(ap)
    a = ap.parse_args()
    shares = [x for x in a.share.split(",") if x]
    n = 6 if a.smoke else max(1, a.jobs // len(shares))
    rng = random.Random(a.seed)
    t_start = time.perf_counter()
    phases = [run_phase(share, n, rng, a.slurm, a.machine) for share in shares]
    kinds = {f"{p.share}:{j}": k for p in phases for j, k in p.kinds.items()}
    seen = [x for p in phases for x in p.seen]
    ticks, used, shared = (sum(getattr(p, f) for p in phases) for f in ("ticks", "used", "shared"))
    counts = {k: sum(1 for v in kinds.values() if v == k) for k in ("plain", "gpu-mps", "gpu-mig", "shard", "mps")}
    print(f"bench_oversub: {len(kinds)} jobs ({', '.join(f'{v} {k}' for k, v in counts.items())}), "
          f"{ticks} samples every {TICK} s, {used} device-samples in use, {shared} shared by jobs; "
          f"Slurm {phases[0].slurm}, {time.perf_counter() - t_start:.0f} s in all")
    bad = False
    for p in phases:
        if p.failed or p.missing:
            bad = True
            print(f"bench_oversub: {p.share}: jobs that did not run through: {p.failed} {p.missing}")
        pairs = sorted({(k, j) for _, k, j in p.seen})
        if pairs:
            print(f"  {p.share}: overlapping devices: {pairs}")
            for j in sorted({j for _, js in pairs for j in js}, key=int):
                print(f"  {p.share}: job {j} ({p.kinds.get(j)}): {json.dumps(p.records.get(j))}")
    slurms = sum(p.slurms() for p in phases)
    if seen:
        print(f"bench_oversub: {slurms} of the {len(seen)} overlapping device-samples are on a GPU Slurm gave "
              "every job on it (scontrol -d show job); Slurm before 23.11.5 gives a GPU whole while a "
              "gres/shard or gres/mps job still runs on it (SchedMD bug 19110, docs/slurm-versions.md)")
    ok = row(f"GPU oversubscription: {len(kinds)} plain/MPS/MIG/shard jobs, process attribution",
             f"{len(seen)} overlapping device-samples ({slurms} Slurm's own allocation)",
             f"{used} device-samples in use, {shared} shared",
             "<= 0", not seen and not bad, a.smoke)
    return 0 if ok and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
