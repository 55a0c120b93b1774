#!/usr/bin/env python3
"""segflow's GPU check, shaped to the device tool's limits. scripts/gpu-check.sh runs it (see
there for how to call it); docs/how-to/gpu-check.md explains the figures.

The device lends one GPU for 15 minutes in all, starts and reruns included, and brings back at
most 8 files. So this check:
  - ends within SEGFLOW_GPU_CHECK_SECONDS (240) of its start whatever a phase does: every
    process runs under a cap and its process group is killed at the cap or at its phase's
    deadline, whichever comes first, and a run that finds too little time left is not started
    (PHASE_END, SUITES, BENCH_RUNS below hold every number);
  - writes exactly the files of OUT_FILES under $OUT, each cut to MAX_FILE_BYTES;
  - probes first (device torch = the bundle's, the bundle unpacked by Python's tarfile, the
    step benchmark on cuda:0) and stops there with a diagnosis when the probe fails;
  - runs every CUDA test case as its own process (models and apps first, two at a time), and
    reruns a failed one once with CUDA_LAUNCH_BLOCKING=1 NCCL_DEBUG=WARN
    TORCH_SHOW_CPP_STACKTRACES=1;
  - then the benchmarks in priority order; the data are made in the background from the start.
The test verdict and the benchmark's completeness are reported apart. Exit status: 0 tests
passed and every benchmark run complete, 1 a test case failed (or did not run), 2 no CUDA
device, no bundle or a failed probe, 3 tests passed but the benchmark is incomplete.

Test hooks (tests/scripts/test_gpu_check_budget.sh):
  SEGFLOW_GPU_CHECK_SLOW=KEY=S,...  every process of phase KEY (probe, tests, bench, background)
      or whose log name starts with KEY (case-, list-, bg-synth, ...) sleeps S seconds before its
      work, inside its cap: a phase that overruns
  SEGFLOW_GPU_CHECK_BUNDLE=DIR  an unpacked bundle instead of gpu-bundle.tar.xz
  SEGFLOW_GPU_CHECK_WHEELS=DIR  the wheel folder (default gpu-wheels/; missing: no MONAI)
  SEGFLOW_GPU_CHECK_REHEARSE=1  on a CPU: tiny sizes, device cpu, every CUDA case must fail
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FULL_BUDGET_S = 240.0
# Deadlines of the phases as fractions of the budget (240 s: probe 24, tests 120, bench 230);
# what is left after the bench is kept for the verdict.
PHASE_END = {"probe": 0.10, "tests": 0.50, "bench": 0.96}
GRACE_S = 2.0  # SIGTERM to SIGKILL (at 240 s); taken off every cap so that a kill ends inside it
# clang-format off
# Suites whose CUDA cases run, in this order, with each case's cap in seconds (at 240 s).
SUITES = [("models", 45), ("apps", 90), ("actors", 45), ("parallel", 60), ("pipeline", 30)]
TEST_WORKERS = 2      # cases at a time (processes on the one GPU)
RERUN_CAP_S = 45      # a failed case's second run, with the debugging environment
# Benchmark runs in priority order: name, cap in seconds, least time worth starting it.
BENCH_RUNS = [
    ("spleen_bf16",        45, 15),  # segflow bench: e2e, compute, efficiency, GPU utilisation
    ("spleen_bf16_cl",     30, 12),  # the same with train.channels_last
    ("monai",              60, 20),  # MONAI samples/s and time to Dice, same data and split
    ("quickstart",         40, 15),  # configs/quickstart-unet3d.yaml on the GPU to its Dice
    ("segflow_ttd",        45, 20),  # segflow train to the Dice target MONAI was given
    ("dp_devices",         20, 8),   # --devices cuda:0: run_data_parallel, NCCL world size 1
    ("torchrun_ws1",       20, 8),   # WORLD_SIZE=1 RANK=0 ... segflow train
    ("spleen_cache_gpu",   30, 12),  # train.cache_device: cuda
    ("spleen_fp16",        30, 12),  # train.amp: fp16 (loss scaling)
]
# Sizes: the spleen recipe on the GPU; tiny ones for a CPU rehearsal of the same plumbing.
PROFILES = {
    "gpu": {"device": "cuda:0", "cases": 24, "size": 160, "crop": 96, "roi": 160, "epochs": 2,
            "ttd_target": 0.3, "ttd_lr": 0.05, "ttd_val": 2, "ttd_epochs": 200,
            "qs_sets": [], "short_sets": ["train.epochs=2", "train.val_interval=1"]},
    "rehearse": {"device": "cpu", "cases": 4, "size": 48, "crop": 32, "roi": 48, "epochs": 1,
                 "ttd_target": 0.05, "ttd_lr": 0.05, "ttd_val": 1, "ttd_epochs": 2,
                 "qs_sets": ["data.synth.cases=5", "data.synth.size=32", "data.val_cases=1",
                             "train.epochs=2", "train.val_interval=1"],
                 "short_sets": ["data.synth.cases=5", "data.synth.size=32", "data.val_cases=1",
                                "train.epochs=1", "train.val_interval=1"]},
}
# The goals of issue 28 item 6, checked on the figures (CPU quickstart Dice: 0.93-0.95).
GOALS = {"s_per_32_case_epoch": 1.0, "pipeline_efficiency": 0.97, "gpu_util_pct": 90.0,
         "segflow_over_monai": 2.0, "quickstart_dice": (0.92, 0.96)}
# clang-format on
OUT_FILES = ("summary.json", "summary.txt", "tests.txt", "bench.jsonl", "env.txt", "monai.jsonl")
MAX_FILE_BYTES = 8 << 20
DEBUG_ENV = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "WARN", "TORCH_SHOW_CPP_STACKTRACES": "1"}


def tail(text, lines=40):
    return "\n".join(text.splitlines()[-lines:])


def read(path, default=""):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return default


class Check:
    """The state of one run of the check: clock, budget, output files, live processes."""

    def __init__(self):
        self.t0 = time.time()
        self.budget = float(os.environ.get("SEGFLOW_GPU_CHECK_SECONDS", FULL_BUDGET_S))
        self.scale = self.budget / FULL_BUDGET_S
        self.grace = GRACE_S * min(1.0, self.scale)
        self.rehearse = os.environ.get("SEGFLOW_GPU_CHECK_REHEARSE", "0") == "1"
        self.p = PROFILES["rehearse" if self.rehearse else "gpu"]
        self.slow = {}
        for item in filter(None, os.environ.get("SEGFLOW_GPU_CHECK_SLOW", "").split(",")):
            phase, _, secs = item.partition("=")
            self.slow[phase.strip()] = float(secs)
        self.out = Path(os.environ.get("OUT") or "/tmp/segflow-gpu-check")
        self.out.mkdir(parents=True, exist_ok=True)
        for f in OUT_FILES:
            (self.out / f).unlink(missing_ok=True)
        self.work = Path(os.environ.get("SEGFLOW_GPU_CHECK_WORK") or tempfile.mkdtemp(prefix="segflow-gpu-check-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.live = set()
        self.log_lines, self.env_sections, self.bench_lines, self.monai_lines = [], [], [], []
        self.tests, self.runs, self.figures, self.phases = [], {}, {}, {}
        self.result = {"probe": None, "tests": "NOT RUN", "bench": "NOT RUN"}
        self.env = self.benv = dict(os.environ)
        self.stop = self.stop_now = False  # the probe says: stop (stop_now: even in a rehearsal)
        self.bundle = self.bg = self.sampler = None

    # ---- clock and budget ----
    def now(self):
        return time.time() - self.t0

    def deadline(self, phase):
        if phase == "background":
            phase = "bench"
        return PHASE_END[phase] * self.budget

    def log(self, msg):
        line = f"[{self.now():6.1f}s] {msg}"
        print(line, flush=True)
        with self.lock:
            self.log_lines.append(line)

    def section(self, title, text):
        with self.lock:
            self.env_sections.append((title, text))

    # ---- processes ----
    def cap(self, nominal):
        """A cap of the tables above (seconds at 240 s) at this budget."""
        return nominal * self.scale

    def run(self, cmd, cap, phase, name, env=None, cwd=None, on_line=None):
        """Runs `cmd` (its own process group) for at most `cap` seconds and never past
        `phase`'s deadline. stdout and stderr go to work/logs/NAME.{out,err};
        on_line(stream, time, line) may return True to stop the process (a target reached).
        Returns {rc, seconds, timed_out, stopped, out, err}, or None when no time was left."""
        limit = min(cap, self.deadline(phase) - self.now()) - self.grace
        if limit <= self.grace / 4:
            return None
        slow = max([v for k, v in self.slow.items() if k == phase or name.startswith(k)], default=0)
        if slow:
            cmd = ["bash", "-c", 'sleep "$0"; exec "$@"', str(slow)] + list(map(str, cmd))
        logs = self.work / "logs"
        logs.mkdir(exist_ok=True)
        paths = {"out": logs / f"{name}.out", "err": logs / f"{name}.err"}
        start = time.time()
        proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env or self.env, cwd=cwd, start_new_session=True)
        with self.lock:
            self.live.add(proc)
        stop = threading.Event()
        pipes = {"out": proc.stdout, "err": proc.stderr}
        readers = [threading.Thread(target=self._pump, args=(pipes[s], paths[s], s, on_line, stop), daemon=True)
                   for s in pipes]
        for r in readers:
            r.start()
        timed_out = False
        while proc.poll() is None:
            if stop.is_set():
                break
            if time.time() - start > limit:
                timed_out = True
                break
            time.sleep(0.05)
        if proc.poll() is None:
            self.kill(proc)
        for r in readers:
            r.join(timeout=0.5)
        with self.lock:
            self.live.discard(proc)
        return {"rc": proc.returncode, "seconds": round(time.time() - start, 2), "timed_out": timed_out,
                "stopped": stop.is_set() and not timed_out, "out": paths["out"], "err": paths["err"]}

    @staticmethod
    def _pump(pipe, path, stream, on_line, stop):
        with open(path, "wb") as f:
            for raw in iter(pipe.readline, b""):
                f.write(raw)
                f.flush()
                if on_line and on_line(stream, time.time(), raw.decode(errors="replace").rstrip("\n")):
                    stop.set()

    def kill(self, proc):
        for sig, wait in ((signal.SIGTERM, self.grace), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def kill_all(self):
        with self.lock:
            procs = list(self.live)
        for p in procs:
            self.kill(p)

    # ---- output ----
    def write(self, name, text):
        assert name in OUT_FILES, name
        data = text.encode(errors="replace")
        if len(data) > MAX_FILE_BYTES:
            data = b"(cut: the first bytes are left out)\n" + data[-(MAX_FILE_BYTES - 64):]
        (self.out / name).write_bytes(data)

    def exit_status(self):
        if self.stop or self.bundle is None:
            return 2
        if self.result["tests"] != "PASS":
            return 1
        return 0 if self.result["bench"] == "complete" else 3

    def summary(self, final):
        rc = self.exit_status()
        s = {"verdict": {"tests": self.result["tests"], "bench": self.result["bench"],
                         "probe": self.result["probe"], "final": final, "exit_status": rc},
             "rehearsal": self.rehearse, "budget_s": self.budget, "seconds": round(self.now(), 1),
             "plan": plan(self), "phases": self.phases, "figures": self.figures, "goals": goals(self.figures),
             "tests": self.tests, "bench_runs": self.runs}
        self.write("summary.json", json.dumps(s, indent=1, default=str) + "\n")
        return rc


def plan(check):
    """The seconds each phase and run may take at this budget (summary.json "plan")."""
    return {"budget_s": check.budget,
            "phase_end_s": {k: round(v * check.budget, 1) for k, v in PHASE_END.items()},
            "case_cap_s": {s: round(c * check.scale, 1) for s, c in SUITES},
            "bench_cap_s": {n: round(c * check.scale, 1) for n, c, _ in BENCH_RUNS},
            "profile": "rehearse" if check.rehearse else "gpu"}


def goals(fig):
    """Issue 28 item 6's goals on the figures: {goal: {value, goal, met}} (met None: no figure)."""
    def row(value, goal, ok):
        return {"value": value, "goal": goal, "met": None if value is None else ok(value)}
    lo, hi = GOALS["quickstart_dice"]
    return {
        "s_per_32_case_epoch": row(fig.get("s_per_32_case_epoch"), f"<= {GOALS['s_per_32_case_epoch']}",
                                   lambda v: v <= GOALS["s_per_32_case_epoch"]),
        "pipeline_efficiency": row(fig.get("pipeline_efficiency"), f">= {GOALS['pipeline_efficiency']}",
                                   lambda v: v >= GOALS["pipeline_efficiency"]),
        "gpu_util_pct": row(fig.get("gpu_util_e2e_mean_pct"), f">= {GOALS['gpu_util_pct']}",
                            lambda v: v >= GOALS["gpu_util_pct"]),
        "segflow_over_monai": row(fig.get("segflow_over_monai"), f">= {GOALS['segflow_over_monai']}",
                                  lambda v: v >= GOALS["segflow_over_monai"]),
        "quickstart_dice": row(fig.get("quickstart_last_dice"), f"{lo}..{hi} (CPU 0.93-0.95 +- 0.01)",
                               lambda v: lo <= v <= hi),
    }


# ---------------------------------------------------------------------------------------------
# Probe: device torch, the bundle, its libraries, the step benchmark.

TORCH_INFO = r"""
import glob, json, os, sys
try:
    import torch
except Exception as e:
    print(json.dumps({"error": "python3 cannot import torch: %s" % e}))
    sys.exit(0)
d = os.path.dirname(torch.__file__)
site = os.path.dirname(d)
libs = [os.path.join(d, "lib")] + sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib"))) \
    + sorted(glob.glob(os.path.join(site, "nvidia", "*", "*", "lib")))
ok = bool(torch.cuda.is_available())
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "available": ok,
                  "count": torch.cuda.device_count() if ok else 0,
                  "name": torch.cuda.get_device_name(0) if ok else None,
                  "python": sys.version.split()[0], "executable": sys.executable, "libs": libs}))
"""


def last_json(path):
    for line in reversed(read(path).splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def json_lines(path):
    out = []
    for line in read(path).splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if isinstance(j, dict):
            out.append(j)
    return out


def probe_fail(c, what):
    c.result["probe"] = "failed: " + what
    c.log("PROBE FAILED: " + what)
    if c.rehearse and not c.stop_now:
        c.result["probe"] = "failed (rehearsal: going on): " + what
        return True
    c.stop = True
    return False


def torch_info(c):
    r = c.run([sys.executable, "-c", TORCH_INFO], c.cap(30), "probe", "torch-info")
    info = last_json(r["out"]) if r else None
    c.section("python3 and torch", json.dumps(info, indent=1) if info else tail(read(r["err"]) if r else "no time"))
    if info:
        return info
    return {"error": "python3 -c 'import torch' gave no answer (" + (tail(read(r["err"]), 5) if r else "no time") + ")"}


def unpack(c):
    """The bundle's folder: SEGFLOW_GPU_CHECK_BUNDLE, else gpu-bundle.tar.xz unpacked into the
    work folder by Python's tarfile (lzma: no xz binary needed)."""
    given = os.environ.get("SEGFLOW_GPU_CHECK_BUNDLE")
    if given:
        return Path(given).resolve()
    tar = REPO / "gpu-bundle.tar.xz"
    if not tar.is_file():
        return None
    code = ("import sys, tarfile\n"
            "t = tarfile.open(sys.argv[1], 'r:xz')\n"
            "try:\n    t.extractall(sys.argv[2], filter='data')\n"
            "except TypeError:\n    t.extractall(sys.argv[2])\n")
    r = c.run([sys.executable, "-c", code, tar, c.work], c.cap(30), "probe", "unpack")
    if not r or r["rc"] != 0:
        c.section("unpacking gpu-bundle.tar.xz", tail(read(r["err"])) if r else "no time left")
        return None
    return c.work / "gpu-bundle"


def bundle_env(c, b, info):
    env = dict(os.environ)
    libs = info.get("libs", []) + [str(b / "lib"), "/usr/local/cuda/lib64"]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env.update({"LD_LIBRARY_PATH": ":".join(libs), "SEGFLOW_BIN": str(b / "bin"), "SEGFLOW_SOURCE_DIR": str(b),
                "DCMDICTPATH": f"{b}/share/dcmtk/dicom.dic:{b}/share/dcmtk/private.dic",
                "PYTHONUNBUFFERED": "1", "SEGFLOW_PYTHON": sys.executable})
    return env


def check_manifest(c, b, info):
    manifest = read(b / "MANIFEST")
    c.section("bundle MANIFEST (head)", "\n".join(manifest.splitlines()[:8]))
    m = re.search(r"^torch (\S+)", manifest, re.M)
    if not m:
        return probe_fail(c, f"{b}/MANIFEST names no torch version")
    c.figures["bundle_torch"], c.figures["device_torch"] = m.group(1), info.get("torch")
    if m.group(1) != info.get("torch"):
        c.stop_now = True  # LibTorch's C++ ABI is per version: nothing else can work
        return probe_fail(c, f"the bundle was built against torch {m.group(1)}, python3 here has "
                             f"{info.get('torch')}: rebuild against this version")
    return True


def check_ldd(c, b):
    bins = sorted(str(p) for p in (b / "bin").iterdir())
    r = c.run(["ldd"] + bins, c.cap(15), "probe", "ldd", env=c.benv) if shutil.which("ldd") else None
    if not r:
        c.section("ldd", "ldd not run (no ldd, or no time left)")
        return True
    text = read(r["out"]) + read(r["err"])
    missing = sorted({line.strip() for line in text.splitlines() if "not found" in line})
    resolved = sorted({re.sub(r" \(0x[0-9a-f]+\)$", "", line.strip()) for line in text.splitlines() if "=>" in line})
    c.section("ldd of the bundle's binaries, LD_LIBRARY_PATH as the check sets it (each library once)",
              "\n".join(resolved))
    if missing:
        return probe_fail(c, "libraries not found: " + "; ".join(missing[:10]))
    return True


def step_bench(c, b):
    cmd = [b / "bin" / "segflow_step_bench", "--device", "cuda:0", "--reps", "1"]
    r = c.run(cmd, c.cap(30), "probe", "step-bench", env=c.benv)
    if r and r["rc"] == 0 and json_lines(r["out"]):
        c.bench_lines += [dict(j, check_run="probe") for j in json_lines(r["out"])]
        return True
    why = "no time left" if not r else ("timed out" if r["timed_out"] else f"exit status {r['rc']}")
    c.section("segflow_step_bench --device cuda:0 --reps 1: stderr", tail(read(r["err"]), 60) if r else why)
    dbg = c.run(cmd, c.cap(15), "probe", "step-bench-ld-debug", env=dict(c.benv, LD_DEBUG="libs"))
    if dbg:  # the library search, not the exit's "calling fini" lines
        search = [line for line in read(dbg["err"]).splitlines()
                  if re.search(r"find library=|trying file=|search path=|cannot open|error|not found", line)]
        c.section("the same under LD_DEBUG=libs: the library search (tail) and the last lines",
                  "\n".join(search[-80:]) + "\n...\n" + tail(read(dbg["err"]), 10))
    return probe_fail(c, f"segflow_step_bench on cuda:0: {why}")


def probe(c):
    """True when the check may go on. Starts the background work once the bundle is there."""
    start = c.now()
    info = torch_info(c)
    c.figures["device"] = info.get("name") or ("cpu (rehearsal)" if c.rehearse else None)
    if shutil.which("nvidia-smi"):
        r = c.run(["nvidia-smi"], c.cap(10), "probe", "nvidia-smi")
        c.section("nvidia-smi", read(r["out"]) + read(r["err"]) if r else "no time left")
    if "error" in info or not info.get("available"):
        why = info.get("error") or "torch sees no CUDA device"
        if not c.rehearse:
            c.stop_now = True
            probe_fail(c, f"no CUDA device: {why}; gpu-check needs the GPU machine (nothing was tested)")
            return False
        c.log(f"REHEARSAL without a GPU ({why}): every CUDA case must fail, benchmarks on the CPU")
        if "error" in info:
            c.stop_now = True
            return probe_fail(c, why)
    c.log(f"torch {info.get('torch')} (CUDA {info.get('cuda')}), device {info.get('name')}")
    b = unpack(c)
    if not b or not (b / "bin" / "segflow").exists():
        c.stop_now = True
        return probe_fail(c, "no bundle: make gpu-bundle.tar.xz here with scripts/make-gpu-bundle.sh and carry it")
    c.bundle, c.benv = b, bundle_env(c, b, info)
    start_background(c)
    ok = check_manifest(c, b, info) and check_ldd(c, b) and step_bench(c, b)
    if ok and c.result["probe"] is None:
        c.result["probe"] = "ok"
    c.phases["probe"] = [round(start, 1), round(c.now(), 1)]
    c.log(f"probe: {c.result['probe']}")
    return ok


# ---------------------------------------------------------------------------------------------
# Background work from the start: the benchmark data, the MONAI wheels, the split.

class Background:
    def __init__(self, c):
        self.c, self.events, self.results = c, {}, {}

    def start(self, name, fn, after=None):
        ev = self.events[name] = threading.Event()

        def body():
            try:
                first = self.wait(after, self.c.deadline("bench")) if after else {"ok": True}
                self.results[name] = fn() if (first or {}).get("ok") else {"ok": False, "error": after + " failed"}
            except Exception as e:  # a background failure is a finding, not a crash
                self.results[name] = {"ok": False, "error": repr(e)}
            ev.set()

        threading.Thread(target=body, daemon=True).start()

    def wait(self, name, until):
        ev = self.events.get(name)
        if ev is None:
            return None
        ev.wait(timeout=max(0.0, until - self.c.now()))
        return self.results.get(name)


def bg_task(c, name, cmd, cap, env=None, check=None):
    r = c.run(cmd, cap, "background", "bg-" + name, env=env or c.benv, cwd=c.work)
    ok = bool(r) and r["rc"] == 0 and (check() if check else True)
    c.log(f"background {name}: " + ("done" if ok else "FAILED") + (f" in {r['seconds']} s" if r else " (no time)"))
    if not ok:
        c.section(f"background {name}: stderr tail", tail(read(r["err"]) + read(r["out"]), 30) if r else "not run")
    return {"ok": ok, "seconds": r["seconds"] if r else None}


def prep_split(c):
    """A one-step CPU run of the spleen config: its split.json (MONAI trains on the same cases)
    and the disk cache of its decoded cases, which the spleen benchmarks read."""
    runs = c.work / "prep-runs"
    sets = spleen_sets(c, ["train.device=cpu", "train.amp=none", "train.epochs=1", "train.steps_per_epoch=1",
                           "train.val_interval=0", "output.runs_dir=" + str(runs),
                           "train.disk_cache=" + str(c.work / "dcache")])
    res = bg_task(c, "split", [c.segflow, "train", c.spleen_cfg] + sets_args(sets), c.cap(150),
                  check=lambda: any(runs.glob("*/split.json")))
    splits = sorted(runs.glob("*/split.json"))
    res["split"] = str(splits[0]) if splits else None
    return res


def start_background(c):
    p, b = c.p, c.bundle
    c.segflow, c.spleen_cfg = b / "bin" / "segflow", b / "configs" / "spleen-ct-unet3d.yaml"
    c.qs_cfg = b / "configs" / "quickstart-unet3d.yaml"
    c.bg = bg = Background(c)
    synth = [c.segflow, "synth", "--out", c.work / "spleen", "--cases", p["cases"], "--size", p["size"],
             "--format", "nifti", "--seed", "0"]  # the config's data.synth at the profile's size
    bg.start("synth", lambda: bg_task(c, "synth", synth, c.cap(150)))
    qs = {"cases": "16", "size": "48"}
    qs.update(dict(s[len("data.synth."):].split("=") for s in p["qs_sets"] if s.startswith("data.synth.")))
    bg.start("qs_data", lambda: bg_task(c, "quickstart-data", [c.segflow, "synth", "--out", c.work / "quickstart",
                                                               "--cases", qs["cases"], "--size", qs["size"],
                                                               "--format", "nifti", "--seed", "1"], c.cap(60)))
    bg.start("split", lambda: prep_split(c), after="synth")
    wheels = Path(os.environ.get("SEGFLOW_GPU_CHECK_WHEELS") or REPO / "gpu-wheels")
    whls = sorted(str(w) for w in wheels.glob("*.whl")) if wheels.is_dir() else []
    if whls:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--target", c.work / "site"] + whls
        bg.start("wheels", lambda: bg_task(c, "wheels", cmd, c.cap(60), env=dict(os.environ)))
    else:
        c.log(f"no wheels in {wheels} (scripts/fetch-gpu-wheels.sh): MONAI only if python3 has it")


# ---------------------------------------------------------------------------------------------
# Tests: every CUDA case of every suite as its own process.

def list_cases(c, suite):
    exe = c.bundle / "bin" / f"segflow_{suite}_tests"
    if not exe.exists():
        return None
    r = c.run([exe, "--list-test-cases", "--test-case=*CUDA*"], c.cap(20), "tests", f"list-{suite}", env=c.benv)
    if not r:
        return []
    return [line for line in read(r["out"]).splitlines()
            if line.strip() and not re.fullmatch(r"=+", line) and not line.startswith("[doctest]")]


def run_case(c, case, attempt, cap):
    """One attempt of one case: {attempt, status, rc, seconds, log}."""
    exe = c.bundle / "bin" / f"segflow_{case['suite']}_tests"
    env = dict(c.benv, SEGFLOW_REQUIRE_CUDA="1", OMP_WAIT_POLICY="passive")
    if attempt == 2:
        env.update(DEBUG_ENV)
    cwd = c.work / "cases"
    cwd.mkdir(exist_ok=True)
    # doctest splits filters at commas unless escaped (as tests/discover_tests.cmake does).
    cmd = [exe, "--test-case=" + case["name"].replace(",", "\\,"), "--duration=true"]
    r = c.run(cmd, cap, "tests", f"case-{case['suite']}-{case['index']}-{attempt}", env=env, cwd=cwd)
    if r is None:
        return {"attempt": attempt, "status": "not run (no time left)", "rc": None, "seconds": 0, "log": ""}
    text = read(r["out"]) + read(r["err"])
    m = re.search(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed", text)
    if r["timed_out"]:
        status = f"timed out after {r['seconds']} s"
    elif r["rc"] == 0 and m and m.group(1) == "1" and m.group(3) == "0":
        status = "passed"
    elif r["rc"] == 0:
        status = "failed (ran no case: the name did not select it)"
    else:
        status = f"failed (exit status {r['rc']})"
    return {"attempt": attempt, "status": status, "rc": r["rc"], "seconds": r["seconds"], "log": text}


def attempt_text(a):
    timed = a["rc"] is None or a["status"].startswith("timed out")
    return a["status"] if timed else f"{a['status']} ({a['seconds']} s)"


def tests(c):
    start = c.now()
    cases, missing = [], []
    for suite, cap in SUITES:
        names = list_cases(c, suite)
        if names is None or not names:
            missing.append(suite)
            c.log(f"tests: suite {suite}: " + ("no executable in the bundle" if names is None else "no CUDA case"))
            continue
        cases += [{"suite": suite, "name": n, "index": i, "cap": c.cap(cap), "attempts": []}
                  for i, n in enumerate(names)]
    c.log(f"tests: {len(cases)} CUDA cases in {len(SUITES) - len(missing)} suites, {TEST_WORKERS} at a time")
    queue, qlock = list(cases), threading.Lock()

    def worker():
        while True:
            with qlock:
                if not queue:
                    return
                case = queue.pop(0)
            a = run_case(c, case, 1, case["cap"])
            case["attempts"].append(a)
            c.log(f"  {case['suite']}: {case['name']}: {attempt_text(a)}")

    workers = [threading.Thread(target=worker) for _ in range(TEST_WORKERS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for case in cases:  # reruns, one at a time, with the debugging environment
        first = case["attempts"][0]
        if first["status"] != "passed" and not first["status"].startswith("not run"):
            a = run_case(c, case, 2, min(case["cap"], c.cap(RERUN_CAP_S)))
            case["attempts"].append(a)
            c.log(f"  rerun {case['suite']}: {case['name']}: {attempt_text(a)}")
    c.tests = [{"suite": k["suite"], "case": k["name"], "status": k["attempts"][0]["status"],
                "seconds": k["attempts"][0]["seconds"],
                "rerun": k["attempts"][1]["status"] if len(k["attempts"]) > 1 else None} for k in cases]
    failed = [t for t in c.tests if t["status"] != "passed"]
    c.result["tests"] = ("PASS" if cases and not failed and not missing else
                         f"FAIL ({len(failed)} of {len(cases)} cases did not pass"
                         + (f"; no CUDA case from {', '.join(missing)}" if missing else "") + ")")
    c.write("tests.txt", tests_text(cases))
    c.phases["tests"] = [round(start, 1), round(c.now(), 1)]
    c.log(f"tests: {c.result['tests']}")


def tests_text(cases):
    parts = []
    for k in cases:
        for a in k["attempts"]:
            lines = a["log"].splitlines()
            if len(lines) > 260:
                lines = lines[:40] + [f"... ({len(lines) - 240} lines left out) ..."] + lines[-200:]
            env = " (CUDA_LAUNCH_BLOCKING=1 NCCL_DEBUG=WARN TORCH_SHOW_CPP_STACKTRACES=1)" if a["attempt"] == 2 else ""
            parts.append(f"===== {k['suite']}: {k['name']}\n----- attempt {a['attempt']}{env}: {a['status']}, "
                         f"{a['seconds']} s\n" + "\n".join(lines))
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------
# Benchmarks.

class GpuSampler:
    """nvidia-smi's utilisation and memory every 250 ms, stamped with the wall clock, so that
    any run's measured window can be cut out afterwards."""

    QUERY = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms", "250"]

    def __init__(self, c):
        self.samples, self.proc, self.why = [], None, None
        if not shutil.which("nvidia-smi"):
            self.why = "nvidia-smi not found"
            return
        self.proc = subprocess.Popen(self.QUERY, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        with c.lock:
            c.live.add(self.proc)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in iter(self.proc.stdout.readline, b""):
            parts = raw.decode(errors="replace").split(",")
            try:
                self.samples.append((time.time(), float(parts[0]), float(parts[1])))
            except (ValueError, IndexError):
                continue

    def window(self, t0, t1):
        """{n, util_mean_pct, util_p10_pct, util_median_pct, mem_max_mb} over [t0, t1]."""
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        if not s:
            return {"n": 0, "why": self.why or "no sample in the window"}
        u = sorted(x[1] for x in s)
        return {"n": len(s), "util_mean_pct": round(sum(u) / len(u), 1), "util_p10_pct": u[len(u) // 10],
                "util_median_pct": u[len(u) // 2], "mem_max_mb": max(x[2] for x in s)}


def sets_args(sets):
    out = []
    for s in sets:
        out += ["--set", s]
    return out


def spleen_sets(c, extra=()):
    p = c.p
    crop, roi = p["crop"], p["roi"]
    # Stage 6 of configs/spleen-ct-unet3d.yaml is rand_crop_pos_neg (as bench/spleen-bench.sh).
    return ["data.root=" + str(c.work / "spleen"), f"data.synth.cases={p['cases']}", f"data.synth.size={p['size']}",
            f"stages.6.options.spatial_size=[{crop}, {crop}, {crop}]", f"validation.roi_size=[{roi}, {roi}, {roi}]",
            f"train.device={p['device']}", "output.runs_dir=" + str(c.work / "runs"), "train.log_every=1000", *extra]


def stderr_tail(c, name, r, lines=30):
    if r:
        c.section(f"{name}: exit status {r['rc']}, {r['seconds']} s" + (", timed out" if r["timed_out"] else "")
                  + " (stderr tail)", tail(read(r["err"]), lines))


def status_of(r, ok):
    if r is None:
        return "not run (no time left)"
    if r["timed_out"]:
        return f"timed out after {r['seconds']} s"
    return "ok" if ok else f"failed (exit status {r['rc']})"


def bench_spleen(c, name, cap, extra):
    """segflow bench of the spleen recipe: e2e, compute, summary, and the GPU's utilisation in
    the e2e and compute windows (each ends when its line arrives and lasts its `seconds`)."""
    t_end = c.now() + cap
    if not (c.bg.wait("synth", t_end) or {}).get("ok"):
        return {"status": "not run: the spleen data were not made"}
    c.bg.wait("split", min(t_end, c.now() + 0.3 * cap))  # its disk cache saves decoding
    got = []

    def on_line(stream, t, line):
        if stream == "out" and line.startswith("{"):
            got.append((t, line))
        return False

    sets = sets_args(spleen_sets(c, extra + ["train.disk_cache=" + str(c.work / "dcache")]))
    r = c.run([c.segflow, "bench", c.spleen_cfg, "--json", "--epochs", c.p["epochs"]] + sets,
              t_end - c.now(), "bench", name, env=c.benv, cwd=c.work, on_line=on_line)
    stderr_tail(c, f"segflow bench ({name})", r)
    lines = {}
    for t, text in got:
        try:
            j = json.loads(text)
        except ValueError:
            continue
        lines[j.get("bench")] = j
        c.bench_lines.append(dict(j, check_run=name))
        if j.get("bench") in ("e2e", "compute"):
            w = {"bench": "gpu_window", "check_run": name, "window": j["bench"], "seconds": j.get("seconds"),
                 **c.sampler.window(t - float(j.get("seconds", 0)), t)}
            c.bench_lines.append(w)
            lines["gpu_" + j["bench"]] = w
    ok = r is not None and r["rc"] == 0 and {"e2e", "compute", "summary"} <= set(lines)
    return {"status": status_of(r, ok), "seconds": r and r["seconds"], "figures": spleen_figures(lines)}


def spleen_figures(lines):
    e2e, comp, summ = lines.get("e2e", {}), lines.get("compute", {}), lines.get("summary", {})
    eff = summ.get("pipeline_efficiency")
    if isinstance(eff, dict):
        eff = next(iter(eff.values()), None)
    sps = e2e.get("samples_per_s")
    return {"samples_per_s_e2e": sps, "samples_per_s_compute": comp.get("samples_per_s"),
            "pipeline_efficiency": eff, "data_wait_ms": e2e.get("data_wait_ms"), "step_ms": e2e.get("step_ms"),
            "s_per_32_case_epoch": 32 * 4 / sps if sps else None,  # 4 crops per case, batch 4
            "first_epoch_s": e2e.get("first_epoch_s"), "peak_gpu_mb": summ.get("peak_gpu_mb"),
            "peak_host_mb": summ.get("peak_host_mb"),
            "gpu_util_e2e_mean_pct": lines.get("gpu_e2e", {}).get("util_mean_pct"),
            "gpu_util_compute_mean_pct": lines.get("gpu_compute", {}).get("util_mean_pct"),
            "gpu_mem_max_mb_smi": lines.get("gpu_e2e", {}).get("mem_max_mb")}


def metrics_history(run_dir):
    """Validation history of a segflow run folder's metrics.jsonl: [{epoch, seconds, mean_dice}]
    (seconds: the epochs' and validations' own seconds summed, as bench/spleen-bench.sh does)."""
    hist, elapsed, epochs = [], 0.0, []
    for j in json_lines(run_dir / "metrics.jsonl") if run_dir else []:
        if j.get("type") in ("epoch", "validation"):
            elapsed += float(j.get("seconds") or 0)
        if j.get("type") == "epoch":
            epochs.append(j)
        if j.get("type") == "validation" and j.get("mean_dice") is not None:
            hist.append({"epoch": j["epoch"] + 1, "seconds": round(elapsed, 2), "mean_dice": j["mean_dice"]})
    return hist, epochs


def train_run(c, name, cfg, sets, cap, args=(), env=None, target=None):
    """segflow train; with `target`, stopped at the first validation whose mean Dice reaches it.
    Returns (r, run folder, {epoch: wall seconds from the start at its validation line})."""
    runs = c.work / f"runs-{name}"
    seen, t0 = {}, time.time()

    def on_line(stream, t, line):
        m = re.match(r"validation epoch (\d+): mean Dice ([-0-9.naif]+)", line)
        if m:
            seen[int(m.group(1))] = round(t - t0, 2)
            try:
                return target is not None and float(m.group(2)) >= target
            except ValueError:
                return False
        return False

    r = c.run([c.segflow, "train", cfg, *args] + sets_args(list(sets) + ["output.runs_dir=" + str(runs)]),
              cap, "bench", name, env=env or c.benv, cwd=c.work, on_line=on_line)
    stderr_tail(c, f"segflow train ({name})", r)
    folders = sorted(p.parent for p in runs.glob("*/metrics.jsonl"))
    return r, (folders[0] if folders else None), seen


def bench_monai(c, cap):
    """bench/baselines/monai_spleen_fast.py on the same cases and split: its samples/s over the
    training epochs after the first, and its time to the Dice target (stopped at the cap)."""
    t_end = c.now() + cap
    synth = c.bg.wait("synth", t_end) or {}
    split = (c.bg.wait("split", t_end) or {}).get("split")
    c.bg.wait("wheels", t_end)
    if not synth.get("ok"):
        return {"status": "not run: the spleen data were not made"}
    p, env = c.p, dict(os.environ, PYTHONUNBUFFERED="1")
    if (c.work / "site").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(c.work / "site"), env.get("PYTHONPATH")]))
    cmd = [sys.executable, REPO / "bench" / "baselines" / "monai_spleen_fast.py", "--data", c.work / "spleen",
           "--crop", p["crop"], "--roi", p["roi"], "--device", p["device"], "--amp", "bf16", "--cache-workers", "8",
           "--seed", "0"]
    if split:
        budget = max(1, int(t_end - c.now() - 12 * c.scale))  # import, caching start, the last epoch
        cmd += ["--split", split, "--target-dice", p["ttd_target"], "--max-epochs", p["ttd_epochs"],
                "--val-interval", p["ttd_val"], "--lr", p["ttd_lr"], "--max-seconds", budget, "--throughput"]
    else:
        cmd += ["--epochs", p["epochs"]]
    got = []

    def on_line(stream, t, line):
        if stream == "out" and line.startswith("{"):
            got.append((t, line))
        return False

    r = c.run(cmd, t_end - c.now(), "bench", "monai", env=env, cwd=c.work, on_line=on_line)
    stderr_tail(c, "MONAI (monai_spleen_fast.py)", r, 40)
    fig = {}
    for t, text in got:
        try:
            j = json.loads(text)
        except ValueError:
            continue
        if j.get("bench") == "baseline":
            fig["monai_samples_per_s"] = j.get("samples_per_s")
            windows = j.get("windows") or [[t - j.get("steps", 0) * j.get("step_ms", 0) / 1e3, t]]
            w = [c.sampler.window(a, b) for a, b in windows]
            n = sum(x["n"] for x in w)
            j["gpu_util_mean_pct"] = round(sum(x.get("util_mean_pct", 0) * x["n"] for x in w) / n, 1) if n else None
            fig["monai_gpu_util_mean_pct"] = j["gpu_util_mean_pct"]
        if j.get("bench") == "time_to_dice":
            fig.update(monai_ttd_s=j.get("seconds"), monai_ttd_epoch=j.get("epoch"), monai_best_dice=j.get("best_dice"),
                       monai_ttd_stopped=j.get("stopped"))
        c.monai_lines.append(j)
    status = status_of(r, r is not None and r["rc"] == 0 and fig.get("monai_samples_per_s") is not None)
    if status == "ok" and not split:
        status = "incomplete: no split (the background split run failed), samples/s only"
    elif status == "ok" and fig.get("monai_ttd_s") is None:
        status = (f"incomplete: Dice {p['ttd_target']} not reached (stopped: {fig.get('monai_ttd_stopped')}, "
                  f"best {fig.get('monai_best_dice')})")
    return {"status": status, "seconds": r and r["seconds"], "figures": fig}


def bench_segflow_ttd(c, cap):
    """segflow train of the spleen recipe to the Dice target MONAI is given (same split, lr,
    validation interval), stopped at the first validation that reaches it."""
    t_end = c.now() + cap
    if not (c.bg.wait("synth", t_end) or {}).get("ok"):
        return {"status": "not run: the spleen data were not made"}
    p = c.p
    sets = spleen_sets(c, [f"train.epochs={p['ttd_epochs']}", f"train.val_interval={p['ttd_val']}",
                           f"optimizer.lr={p['ttd_lr']}", "seed=0"])
    r, run_dir, seen = train_run(c, "segflow_ttd", c.spleen_cfg, sets, t_end - c.now(), target=p["ttd_target"])
    hist, _ = metrics_history(run_dir)
    hit = next((h for h in hist if h["mean_dice"] >= p["ttd_target"]), None)
    line = {"bench": "time_to_dice", "name": "segflow_spleen", "check_run": "segflow_ttd",
            "target_dice": p["ttd_target"], "seconds": hit and hit["seconds"], "epoch": hit and hit["epoch"],
            "wall_s": hit and seen.get(hit["epoch"]), "best_dice": max((h["mean_dice"] for h in hist), default=None),
            "history": hist, "stopped_at_target": bool(r and r["stopped"])}
    c.bench_lines.append(line)
    if hit is None and r and (r["timed_out"] or r["rc"] == 0):
        status = f"incomplete: Dice {p['ttd_target']} not reached in {r['seconds']} s (best {line['best_dice']})"
    else:
        status = status_of(r, r is not None and (r["stopped"] or r["rc"] == 0))
    return {"status": status, "seconds": r and r["seconds"],
            "figures": {"segflow_ttd_s": line["seconds"], "segflow_ttd_wall_s": line["wall_s"],
                        "segflow_ttd_epoch": line["epoch"], "segflow_best_dice": line["best_dice"]}}


def bench_quickstart(c, cap):
    t_end = c.now() + cap
    c.bg.wait("qs_data", t_end)
    sets = ["data.root=" + str(c.work / "quickstart"), f"train.device={c.p['device']}"] + c.p["qs_sets"]
    r, run_dir, _ = train_run(c, "quickstart", c.qs_cfg, sets, t_end - c.now())
    hist, epochs = metrics_history(run_dir)
    sps = sorted(e.get("samples_per_s", 0) for e in epochs[1:]) or [None]
    line = {"bench": "quickstart_dice", "check_run": "quickstart", "device": c.p["device"],
            "epochs": len(epochs), "last_dice": hist[-1]["mean_dice"] if hist else None,
            "best_dice": max((h["mean_dice"] for h in hist), default=None), "history": hist,
            "median_epoch_samples_per_s": sps[len(sps) // 2], "cpu_reference_dice": "0.93-0.95"}
    ok = r is not None and r["rc"] == 0 and bool(hist)
    line["complete"] = ok  # a run cut at its cap: its Dice is not the job's, and no goal reads it
    c.bench_lines.append(line)
    key = "quickstart_" if ok else "quickstart_partial_"
    return {"status": status_of(r, ok), "seconds": r and r["seconds"],
            "figures": {key + "last_dice": line["last_dice"], key + "best_dice": line["best_dice"],
                        "quickstart_epochs": line["epochs"], "quickstart_wall_s": r and r["seconds"]}}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_parallel(c, name, cap):
    """The quickstart job for a few epochs through NCCL at world size 1: `--devices cuda:0`
    (run_data_parallel), or a torchrun-style environment (WORLD_SIZE=1 RANK=0 ...)."""
    t_end = c.now() + cap
    c.bg.wait("qs_data", t_end)
    sets = ["data.root=" + str(c.work / "quickstart"), f"train.device={c.p['device']}"] + c.p["short_sets"]
    env, args = dict(c.benv), []
    if name == "dp_devices":
        args = ["--devices", c.p["device"]]
    else:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")
    r, run_dir, _ = train_run(c, name, c.qs_cfg, sets, t_end - c.now(), args=args, env=env)
    log = read(r["err"]) + read(r["out"]) if r else ""
    hist, epochs = metrics_history(run_dir)
    path = ("run_data_parallel" if "data-parallel run" in log else "run_distributed_from_env"
            if "distributed run" in log else "run_training (single process: no process group was made)")
    single = path.startswith("run_training")
    line = {"bench": "parallel_ws1", "check_run": name, "label": "NCCL world size 1 only", "path": path,
            "backend": None if single else ("nccl" if c.p["device"].startswith("cuda") else "gloo"),
            "rc": r and r["rc"], "epochs": len(epochs), "last_dice": hist[-1]["mean_dice"] if hist else None,
            "epoch_samples_per_s": [e.get("samples_per_s") for e in epochs]}
    c.bench_lines.append(line)
    ok = r is not None and r["rc"] == 0 and bool(epochs)
    return {"status": status_of(r, ok), "seconds": r and r["seconds"], "figures": {name + "_path": path}}


# clang-format off
VARIANTS = {"spleen_bf16": ["train.amp=bf16"],
            "spleen_bf16_cl": ["train.amp=bf16", "train.channels_last=true"],
            "spleen_cache_gpu": ["train.amp=bf16", "train.cache_device=cuda"],
            "spleen_fp16": ["train.amp=fp16"]}
# clang-format on


def bench_run(c, name, cap):
    if name in VARIANTS:
        if c.rehearse and name in ("spleen_cache_gpu", "spleen_fp16"):
            return {"status": "not run: needs CUDA (rehearsal)"}
        return bench_spleen(c, name, cap, VARIANTS[name])
    if name == "monai":
        return bench_monai(c, cap)
    if name == "segflow_ttd":
        return bench_segflow_ttd(c, cap)
    if name == "quickstart":
        return bench_quickstart(c, cap)
    return bench_parallel(c, name, cap)


def bench(c):
    start = c.now()
    c.sampler = GpuSampler(c)
    for name, cap, least in BENCH_RUNS:
        left = c.deadline("bench") - c.now() - c.grace
        if left < c.cap(least):
            c.runs[name] = {"status": f"not run: {left:.0f} s left, it needs {c.cap(least):.0f}"}
        else:
            c.log(f"bench: {name} (at most {min(c.cap(cap), left):.0f} s)")
            try:
                c.runs[name] = bench_run(c, name, min(c.cap(cap), left))
            except Exception as e:  # a parsing slip must not cost the other runs
                c.runs[name] = {"status": f"error in the check: {e!r}"}
        c.log(f"bench: {name}: {c.runs[name]['status']}")
        c.summary("bench running")
    for name, run in c.runs.items():
        if name not in VARIANTS or name == "spleen_bf16":  # the other variants': derived_figures
            c.figures.update(run.get("figures", {}))
    derived_figures(c)
    bad = [n for n, r in c.runs.items() if not r["status"].startswith("ok")]
    c.result["bench"] = "complete" if not bad else "incomplete: " + ", ".join(bad)
    c.phases["bench"] = [round(start, 1), round(c.now(), 1)]
    c.log(f"benchmark {c.result['bench']}")


def derived_figures(c):
    f, runs = c.figures, c.runs
    base = runs.get("spleen_bf16", {}).get("figures", {}).get("samples_per_s_e2e")
    for v in ("spleen_bf16_cl", "spleen_cache_gpu", "spleen_fp16"):
        other = runs.get(v, {}).get("figures", {})
        f[v + "_samples_per_s_e2e"] = other.get("samples_per_s_e2e")
        f[v + "_over_bf16"] = other["samples_per_s_e2e"] / base if base and other.get("samples_per_s_e2e") else None
    monai = f.get("monai_samples_per_s")
    f["segflow_over_monai"] = base / monai if base and monai else None
    a, b = f.get("monai_ttd_s"), f.get("segflow_ttd_wall_s")
    f["monai_over_segflow_time_to_dice"] = a / b if a and b else None
    c.monai_lines.append({"bench": "segflow_vs_monai", "device": f.get("device"), "segflow_samples_per_s": base,
                          "monai_samples_per_s": monai, "segflow_over_monai": f["segflow_over_monai"],
                          "target_dice": c.p["ttd_target"], "segflow_time_to_dice_wall_s": b,
                          "segflow_time_to_dice_train_val_s": f.get("segflow_ttd_s"), "monai_time_to_dice_s": a,
                          "monai_over_segflow_time_to_dice": f["monai_over_segflow_time_to_dice"],
                          "note": "segflow wall: from its process start (decoding included); MONAI: from the start "
                                  "of its caching; both stopped at the first validation at or over the target"})


# ---------------------------------------------------------------------------------------------
# The verdict and the files.

def summary_text(c):
    lines = list(c.log_lines) + ["", "==== verdict"]
    lines.append(f"probe:  {c.result['probe']}")
    lines.append(f"tests:  {c.result['tests']}")
    lines.append(f"bench:  {c.result['bench']}")
    lines.append("figures: " + json.dumps(c.figures, default=str))
    for k, g in goals(c.figures).items():
        met = {True: "met", False: "NOT met", None: "no figure"}[g["met"]]
        lines.append(f"goal {k}: {g['value']} (goal {g['goal']}): {met}")
    lines.append(f"exit status {c.exit_status()} after {c.now():.1f} s of a {c.budget:.0f} s budget"
                 + (" (REHEARSAL on a CPU)" if c.rehearse else ""))
    return "\n".join(lines) + "\n"


def env_text(c):
    parts = []
    for title, text in c.env_sections:
        parts.append(f"==== {title}\n{text.rstrip()}\n")
    s = getattr(c, "sampler", None)
    if s and s.samples:
        parts.append("==== nvidia-smi samples (unix time, utilisation %, memory MiB)\n"
                     + "\n".join(f"{t:.2f} {u:.0f} {m:.0f}" for t, u, m in s.samples[-4000:]) + "\n")
    return "\n".join(parts)


def finish(c):
    c.kill_all()
    c.write("bench.jsonl", "".join(json.dumps(j, default=str) + "\n" for j in c.bench_lines))
    c.write("monai.jsonl", "".join(json.dumps(j, default=str) + "\n" for j in c.monai_lines))
    if not (c.out / "tests.txt").exists():
        c.write("tests.txt", "(no test case ran: see summary.txt)\n")
    c.write("env.txt", env_text(c))
    rc = c.summary("final")
    c.write("summary.txt", summary_text(c))
    if os.environ.get("SEGFLOW_GPU_CHECK_KEEP") != "1":
        shutil.rmtree(c.work, ignore_errors=True)
    return rc


def main(c):
    c.log(f"segflow GPU check: budget {c.budget:.0f} s, files under {c.out}, work in {c.work}"
          + (" (REHEARSAL on a CPU)" if c.rehearse else ""))
    c.summary("started")
    try:
        if probe(c):
            c.summary("probe done")
            tests(c)
            c.summary("tests done")
            bench(c)
    except Exception as e:  # the verdict is written whatever happened
        import traceback

        c.log(f"the check itself failed: {e!r}")
        c.section("traceback of the check", traceback.format_exc())
    return finish(c)


if __name__ == "__main__":
    sys.exit(main(Check()))
