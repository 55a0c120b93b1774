"""The CPU thread matrix (bench/cpu-threads.sh): segflow's training throughput at its defaults
against every fixed OpenMP wait policy and intra-op team it could have chosen, on a quiet
machine and beside busy processes, and against the plain PyTorch, MONAI and MedSAM loops at
their own defaults on the same data, in one run. Prints JSON lines:

  {"bench": "cpu_threads", "workload": W, "load": L, "setting": S, "side": ..., "samples_per_s": ...}
      one run: segflow `bench --json` end to end (e2e) samples/s, or a peer's samples/s
  {"bench": "cpu_threads_line", "workload": W, "load": L, ...}
      per workload and load: segflow's default, the best fixed setting, the peers, and the
      ratios the goals are stated in (default / best, default / peer, 1 -> 2 threads)

Settings (segflow): "default" is what a user gets (no variable, no flag); the fixed ones are a
wait policy (libgomp = libgomp's own default with no variable set, passive, active, or
spin=N for GOMP_SPINCOUNT) with train.threads = T. A busy process is a shell loop spinning on
one core for the whole run.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(HERE, ".venv", "bin", "python")
SEGFLOW = os.path.join(os.environ.get("SEGFLOW_BIN", os.path.join(HERE, "build", "apps")), "segflow")

WORKLOADS = ["quickstart", "medsam-tiny", "medsam-small", "spleen", "fullres"]


def clean_env():
    """The environment without any OpenMP/MKL setting: what a user's shell has by default."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("OMP_", "GOMP_", "KMP_", "MKL_")):
            del env[k]
    return env


def policy_env(policy):
    env = clean_env()
    if policy in ("passive", "active"):
        env["OMP_WAIT_POLICY"] = policy
    elif policy.startswith("spin="):
        env["GOMP_SPINCOUNT"] = policy.split("=", 1)[1]
    elif policy not in ("libgomp", "default"):
        raise SystemExit(f"cpu_threads: unknown policy {policy}")
    return env


class Busy:
    """`n` processes spinning on the CPU while the block runs."""

    def __init__(self, n):
        self.n, self.procs = n, []

    def __enter__(self):
        self.procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(self.n)]
        time.sleep(0.5 if self.n else 0)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


def run(cmd, env, cwd):
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(f"cpu_threads: failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}\n")
        return None
    return r.stdout


def last_json(text, key=None, value=None):
    out = None
    for line in (text or "").splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            if key is None or j.get(key) == value:
                out = j
    return out


# ---------------------------------------------------------------------------------------------
# Workloads: each prepares its data once and knows how to run segflow and its peers.


class Workload:
    peers = ()
    epochs = 3

    def __init__(self, name, work):
        self.name, self.work = name, os.path.join(work, name)
        os.makedirs(self.work, exist_ok=True)

    def segflow_cmd(self, threads):
        cmd = [SEGFLOW, "bench", self.job, "--json", "--epochs", str(self.epochs)] + self.sets
        if threads:
            cmd += ["--set", f"train.threads={threads}"]
        return cmd

    def segflow(self, policy, threads):
        out = run(self.segflow_cmd(threads), policy_env(policy), self.work)
        j = last_json(out, "bench", "e2e")
        if not j:
            return None
        return {"samples_per_s": j["samples_per_s"], "step_ms": j["step_ms"], "threads": j.get("threads"),
                "threads_reason": j.get("threads_reason"), "peak_host_mb": j.get("peak_host_mb")}


class Quickstart(Workload):
    """configs/quickstart-unet3d.yaml as shipped (actors loader), on its own synthetic data."""

    peers = ("pytorch", "monai")
    epochs = 5

    def prepare(self):
        self.job = os.path.join(HERE, "configs", "quickstart-unet3d.yaml")
        self.data = os.path.join(self.work, "data")
        self.sets = ["--set", f"data.root={self.data}", "--set", f"output.runs_dir={self.work}/runs"]
        # One short training run makes the dataset (data.synth) the peers read too.
        run([SEGFLOW, "train", self.job] + self.sets + ["--set", "train.epochs=1", "--set", "train.val_interval=0",
                                                         "--quiet"], clean_env(), self.work)

    def peer(self, name, threads):
        cmd = [PY, os.path.join(HERE, "bench", "baselines", "train_baseline.py"), "--mode",
               "torch" if name == "pytorch" else "monai", "--data", self.data, "--epochs", "3", "--workers", "0",
               "--threads", str(threads)]
        j = last_json(run(cmd, clean_env(), self.work))
        return {"samples_per_s": j["samples_per_s"], "step_ms": j.get("step_ms")} if j else None


class MedSam(Workload):
    """bench/medsam-bench.sh's two sides: segflow's SAM step and MedSAM's loop (bench/medsam_step.py)."""

    peers = ("medsam",)
    epochs = 2

    def __init__(self, name, work, preset):
        super().__init__(name, work)
        self.preset, self.img = preset, {"tiny": 64, "small": 256}[preset]
        self.batch, self.steps, self.cases = 4, 12, 4

    def prepare(self):
        data, npy = os.path.join(self.work, "data"), os.path.join(self.work, "npy")
        run([SEGFLOW, "synth", "--out", data, "--cases", str(self.cases), "--size", "64", "--format", "nifti",
             "--seed", "7"], clean_env(), self.work)
        run([PY, os.path.join(HERE, "bench", "medsam_step.py"), "slices", data, npy, "--img", str(self.img)],
            clean_env(), self.work)
        self.npy = npy
        shift = max(1, (20 * self.img + 512) // 1024)
        per_case = (self.batch * self.steps + self.cases - 1) // self.cases
        self.job = os.path.join(self.work, "job.yaml")
        with open(self.job, "w") as f:
            f.write(f"""name: medsam-bench-{self.preset}
seed: 0
data: {{root: {data}, num_classes: 2, val_cases: 0}}
stages:
  - {{name: load}}
  - {{name: scale_intensity_range, options: {{a_min: -200, a_max: 300, b_min: 0.0, b_max: 1.0, clip: true}}}}
  - {{name: medsam_box, options: {{image_size: {self.img}, bbox_shift: {shift}, num_samples: {per_case}}}}}
model: {{name: sam, preset: {self.preset}, spatial_dims: 2, in_channels: 3, out_channels: 1}}
loss: {{name: dice_bce, sigmoid: true, squared_pred: true, to_onehot_y: false}}
optimizer: {{name: adamw, lr: 0.0001, weight_decay: 0.01}}
schedule: {{name: constant}}
train: {{epochs: 2, batch_size: {self.batch}, amp: none, val_interval: 0, loader: simple}}
output: {{runs_dir: {self.work}/runs}}
""")
        self.sets = []

    def peer(self, name, threads):
        cmd = [PY, os.path.join(HERE, "bench", "medsam_step.py"), "train", self.npy, "--preset", self.preset, "--batch",
               str(self.batch), "--steps", str(self.steps), "--threads", str(threads), "--device", "cpu"]
        j = last_json(run(cmd, clean_env(), self.work))
        return {"samples_per_s": j["samples_per_s"], "step_ms": j.get("step_ms")} if j else None


class Spleen(Workload):
    """configs/spleen-ct-unet3d.yaml at bench/spleen-bench.sh's reduced CPU size (48^3 crops)."""

    peers = ("monai-spleen",)
    epochs = 2

    def prepare(self):
        self.job = os.path.join(HERE, "configs", "spleen-ct-unet3d.yaml")
        self.data = os.path.join(self.work, "data")
        self.sets = ["--set", f"data.root={self.data}", "--set", "data.synth.size=64", "--set", "data.synth.cases=8",
                     "--set", "stages.6.options.spatial_size=[48, 48, 48]", "--set", "validation.roi_size=[64, 64, 64]",
                     "--set", "train.device=cpu", "--set", f"output.runs_dir={self.work}/runs"]
        run([SEGFLOW, "train", self.job] + self.sets + ["--set", "train.epochs=1", "--set", "train.val_interval=0",
                                                         "--quiet"], clean_env(), self.work)
        runs = os.path.join(self.work, "runs")
        self.split = os.path.join(self.work, "split.json")
        for d in sorted(os.listdir(runs)):
            if os.path.exists(os.path.join(runs, d, "split.json")):
                shutil.copy(os.path.join(runs, d, "split.json"), self.split)

    def peer(self, name, threads):
        env = clean_env()
        env["OMP_NUM_THREADS"] = str(threads)  # the MONAI script has no thread flag; torch reads this
        cmd = [PY, os.path.join(HERE, "bench", "baselines", "monai_spleen_fast.py"), "--data", self.data, "--split",
               self.split, "--crop", "48", "--roi", "64", "--epochs", str(self.epochs), "--device", "cpu"]
        j = last_json(run(cmd, env, self.work))
        return {"samples_per_s": j["samples_per_s"], "step_ms": j.get("step_ms")} if j else None


class Fullres(Workload):
    """The 3d_fullres job `segflow plan` writes for 8 phantoms of 64^3 (no peer: its own plan)."""

    epochs = 2

    def prepare(self):
        data, plans = os.path.join(self.work, "data"), os.path.join(self.work, "plans")
        run([SEGFLOW, "synth", "--out", data, "--cases", "8", "--size", "64", "--format", "nifti", "--seed", "3"],
            clean_env(), self.work)
        run([SEGFLOW, "plan", data, "--out", plans, "--configurations", "3d_fullres"], clean_env(), self.work)
        jobs = [f for f in os.listdir(plans) if f.endswith(".yaml") and "3d_fullres" in f]
        if not jobs:
            raise SystemExit(f"cpu_threads: segflow plan wrote no 3d_fullres job into {plans}")
        self.job = os.path.join(plans, jobs[0])
        self.sets = ["--set", f"output.runs_dir={self.work}/runs"]


def make(name, work):
    if name == "quickstart":
        return Quickstart(name, work)
    if name.startswith("medsam-"):
        return MedSam(name, work, name.split("-", 1)[1])
    if name == "spleen":
        return Spleen(name, work)
    if name == "fullres":
        return Fullres(name, work)
    raise SystemExit(f"cpu_threads: unknown workload {name}; known: {', '.join(WORKLOADS)}")


# ---------------------------------------------------------------------------------------------


def line_summary(workload, load, rows, threads_list):
    """The goals' ratios for one workload and load."""
    seg = {r["setting"]: r["samples_per_s"] for r in rows if r["side"] == "segflow" and r["samples_per_s"]}
    fixed = {k: v for k, v in seg.items() if k != "default"}
    best_setting = max(fixed, key=fixed.get) if fixed else None
    out = {"bench": "cpu_threads_line", "workload": workload, "load": load, "segflow_default": seg.get("default"),
           "best_fixed": best_setting, "best_fixed_samples_per_s": fixed.get(best_setting)}
    if seg.get("default") and best_setting:
        out["default_over_best"] = seg["default"] / fixed[best_setting]
    # The fixed setting the default amounts to (libgomp's policy and the team auto chose): the
    # two differ only by noise, so their ratio says how far apart two equal runs land here.
    chosen = next((r.get("threads") for r in rows if r["side"] == "segflow" and r["setting"] == "default"), None)
    same = f"libgomp/threads={chosen}"
    if seg.get("default") and same in fixed:
        out["default_over_same_fixed"] = seg["default"] / fixed[same]
        out["same_fixed"] = same
    peers = {}
    for r in rows:
        if r["side"] != "segflow" and r["samples_per_s"]:
            peers[f"{r['side']}@{r['setting']}"] = r["samples_per_s"]
    out["peers"] = peers
    if seg.get("default"):
        out["default_over_peer"] = {k: seg["default"] / v for k, v in peers.items()}
    # 1 -> 2 threads under each fixed policy (the scaling goal reads it for the best policy).
    scaling = {}
    for k, v in fixed.items():
        pol, _, t = k.rpartition("/threads=")
        if t == "1" and f"{pol}/threads=2" in fixed:
            scaling[pol] = fixed[f"{pol}/threads=2"] / v
    out["two_over_one_thread"] = scaling
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--loads", default="0,1,2", help="busy processes beside each run")
    ap.add_argument("--threads", default=None, help="fixed team sizes (default: 1..usable cores)")
    ap.add_argument("--policies", default="libgomp,passive,active", help="fixed wait policies (or spin=N)")
    ap.add_argument("--peers", default="yes", choices=["yes", "no"])
    ap.add_argument("--repeat", type=int, default=1, help="runs per setting; the median counts")
    ap.add_argument("--epochs", type=int, default=0, help="segflow bench epochs (default: per workload)")
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    if not os.access(SEGFLOW, os.X_OK):
        raise SystemExit(f"cpu_threads: no segflow at {SEGFLOW} (scripts/build.sh)")
    ncpu = len(os.sched_getaffinity(0))
    threads_list = [int(t) for t in a.threads.split(",")] if a.threads else list(range(1, ncpu + 1))
    policies = [p for p in a.policies.split(",") if p]
    loads = [int(x) for x in a.loads.split(",")]
    work = a.work or tempfile.mkdtemp(prefix="cpu-threads.")
    print(json.dumps({"bench": "cpu_threads_setup", "cpus": ncpu, "cpu_model": cpu_model(), "threads": threads_list,
                      "policies": policies, "loads": loads, "work": work}), flush=True)
    try:
        for name in a.workloads.split(","):
            w = make(name, work)
            if a.epochs:
                w.epochs = a.epochs
            w.prepare()
            for load in loads:
                # Every setting once per round, rounds repeated: a slow minute of the machine
                # then spreads over the settings instead of landing on one.
                runs = [("segflow", "default" if p == "default" else f"{p}/threads={t}",
                         lambda p=p, t=t: w.segflow(p, t))
                        for p, t in [("default", 0)] + [(p, t) for p in policies for t in threads_list]]
                if a.peers == "yes":
                    runs += [(peer, f"threads={ncpu}", lambda peer=peer: w.peer(peer, ncpu)) for peer in w.peers]
                got = {(side, label): [] for side, label, _ in runs}
                for _ in range(a.repeat):
                    for side, label, fn in runs:
                        got[(side, label)].append(measure_once(load, fn))
                rows = [summarise(name, load, label, side, got[(side, label)]) for side, label, _ in runs]
                print(json.dumps(line_summary(name, load, rows, threads_list)), flush=True)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


def cpu_busy_s():
    """Busy CPU seconds of the whole machine so far (/proc/stat, every CPU)."""
    with open("/proc/stat") as f:
        v = [float(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def children_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure_once(load, fn, max_foreign=0.15, tries=3):
    """Runs `fn` beside `load` busy processes. The run also reports its foreign load: cores
    kept busy during it by processes that are neither the run nor its busy processes (another
    job on the machine); a run above `max_foreign` is run again, up to `tries` times."""
    r = None
    for _ in range(tries):
        b0, c0, t0 = cpu_busy_s(), children_s(), time.monotonic()
        with Busy(load):
            r = fn()
        foreign = max(0.0, (cpu_busy_s() - b0) - (children_s() - c0)) / max(1e-9, time.monotonic() - t0)
        if r:
            r["foreign_load"] = round(foreign, 3)
        if not r or foreign <= max_foreign:
            break
        time.sleep(10)
    return r


def summarise(workload, load, setting, side, results):
    """One JSON line per setting: the median run's figures (the upper middle one of an even
    count: the better of two), and every run's samples/s."""
    results = sorted((r for r in results if r), key=lambda r: r["samples_per_s"])
    row = {"bench": "cpu_threads", "workload": workload, "load": load, "setting": setting, "side": side,
           "samples_per_s": None}
    if results:
        row.update(results[len(results) // 2])
        row["runs"] = [round(r["samples_per_s"], 2) for r in results]
        row["foreign_loads"] = [r["foreign_load"] for r in results]
    print(json.dumps(row), flush=True)
    return row


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
