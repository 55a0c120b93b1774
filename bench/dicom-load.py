#!/usr/bin/env python3
"""Load on segflowd's DICOM node (issue 45 item 5): concurrent pynetdicom senders push many
series of real-size CT slices (512 x 512) to segflowd with auto_infer on; each series' SEG goes
to Orthanc (STOW-RS by default, or C-STORE). Measured: instances/s of the push, association
refusals under dicom.max_associations, time from a series' last instance (its association
released) to its SEG in Orthanc (p50/p95, Orthanc polled every 0.5 s), the daemon's peak RSS.
Checked: every series stored byte for byte (the data set bytes of each stored file against the
bytes the sender encoded), inferred exactly once (one inference job per series in the daemon's
state) and one SEG per series in Orthanc; in the kill9 scenario segflowd is killed with SIGKILL
once half the series are pushed and started again, and the senders retry what failed.

    flock /tmp/segflow-cpu.lock .venv/bin/python bench/dicom-load.py            # the default size
    .venv/bin/python bench/dicom-load.py --series 200 --min-instances 100 --max-instances 300  # the issue's

The series: `segflow synth --size 512 --format dicom` volumes with 0.8 mm pixels and three
slice counts spread over [--min-instances, --max-instances]; series i is base i % 3 with new
Study, Series, SOP instance and frame of reference UIDs and PatientID (rewritten by the
sender, so 200 series need no 200 copies on disk). The model: a tiny 3D UNet trained here for
a few epochs on 128 x 128 phantoms of the same field of view, resampled to 4 mm (or
--checkpoint). One JSON line per scenario (`bench: dicom_load`), and `bench: dicom_load_series`
lines per series with --per-series. Needs the built segflow/segflowd (--bin, default
build/apps), Debian's Orthanc (+ orthanc-dicomweb for STOW-RS), pydicom, pynetdicom, pyzmq.
"""
import argparse
import hashlib
import json
import multiprocessing as mp
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
import orthanc_pacs  # noqa: E402  (the tests' Orthanc helper: its configuration)

CT_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.2"
EXPLICIT_LE = "1.2.840.10008.1.2.1"


free_port, http_json = orthanc_pacs.free_port, orthanc_pacs.http_json


def wait_for(pred, timeout, what):
    orthanc_pacs.wait_for(pred, timeout, what, "dicom-load", 0.2)


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"dicom-load: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


# ---- The data and the model ----

def synth_bases(segflow, out, counts, size):
    """One synthetic CT series per slice count (0.8 mm pixels, the slice spacing that makes
    `count` slices); returns [sorted file list] per base."""
    bases = []
    for k, n in enumerate(counts):
        dz = size * 0.8 * 1.2 / n  # segflow synth: nz = round(size * sxy / sz * 1.2)
        folder = os.path.join(out, f"base{k}")
        run([segflow, "synth", "--cases", "1", "--size", str(size), "--format", "dicom", "--seed", str(40 + k),
             "--spacing", f"0.8,0.8,{dz:.6f}", "--out", folder])
        files = []
        for root, _, names in os.walk(folder):
            files += [os.path.join(root, f) for f in names if f.startswith("IM_")]
        bases.append(sorted(files))
    return bases


JOB = """name: dicom-load-model
seed: 1
data:
  root: {root}
  val_cases: 1
  num_classes: 5
stages:
  - {{name: load}}
  - {{name: resample, options: {{spacing: [4.0, 4.0, 4.0]}}}}
  - {{name: scale_intensity_range, options: {{a_min: -200, a_max: 300, b_min: 0.0, b_max: 1.0, clip: true}}}}
  - {{name: fg_bg_indices}}
  - {{name: rand_crop_pos_neg, options: {{spatial_size: [32, 32, 32], pos: 3, neg: 1, num_samples: 2}}}}
model: {{name: unet, spatial_dims: 3, in_channels: 1, out_channels: 5, channels: [8, 16, 32], strides: [2, 2],
        num_res_units: 1, norm: batch}}
loss: {{name: dice_ce, to_onehot_y: true, softmax: true}}
optimizer: {{name: adam, lr: 0.01}}
schedule: {{name: constant}}
train: {{epochs: {epochs}, batch_size: 2, device: cpu, val_interval: 0, checkpoint_interval: 1, loader: simple,
        threads: 2}}
validation: {{roi_size: [32, 32, 32], overlap: 0.25, sw_batch_size: 4}}
output: {{runs_dir: {runs}}}
"""


def train_model(segflow, tmp, epochs, env):
    """A tiny UNet on 128 x 128 phantoms of the bench series' field of view (3.2 mm pixels)."""
    data = os.path.join(tmp, "train")
    run([segflow, "synth", "--cases", "6", "--size", "128", "--format", "nifti", "--seed", "7",
         "--spacing", "3.2,3.2,4.0", "--out", data])
    job = os.path.join(tmp, "model.yaml")
    with open(job, "w") as f:
        f.write(JOB.format(root=data, epochs=epochs, runs=os.path.join(tmp, "runs")))
    run([segflow, "train", job, "--quiet"], env=env)
    for root, _, names in os.walk(os.path.join(tmp, "runs")):
        if "last.pt" in names:
            return os.path.join(root, "last.pt")
    sys.exit("dicom-load: training wrote no last.pt")


def series_uids(run_id, i):
    from pydicom.uid import generate_uid
    u = lambda what: generate_uid(entropy_srcs=[run_id, what, str(i)])  # noqa: E731
    return {"study": u("study"), "series": u("series"), "frame": u("frame"), "patient": f"LOAD{i:05d}"}


def series_datasets(run_id, i, files):
    """Series i: the base files with this series' UIDs; (datasets, {sop uid: sha1 of the data set
    bytes as sent in explicit VR little endian})."""
    import pydicom
    from pydicom.uid import generate_uid
    from pynetdicom.dsutils import encode
    ids = series_uids(run_id, i)
    out, hashes = [], {}
    for k, f in enumerate(files):
        ds = pydicom.dcmread(f)
        ds.StudyInstanceUID = ids["study"]
        ds.SeriesInstanceUID = ids["series"]
        ds.FrameOfReferenceUID = ids["frame"]
        ds.PatientID = ids["patient"]
        ds.SOPInstanceUID = generate_uid(entropy_srcs=[run_id, "sop", str(i), str(k)])
        ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
        hashes[str(ds.SOPInstanceUID)] = hashlib.sha1(encode(ds, False, True)).hexdigest()
        out.append(ds)
    return out, hashes


# ---- The senders (one process each) ----

def sender(worker, port, run_id, bases, todo, results, stop):
    """Takes series indices from `todo` and pushes each in one association until it is
    released; refused or broken associations are retried after a short random pause."""
    from pynetdicom import AE
    ae = AE(ae_title="LOADGEN")
    ae.add_requested_context(CT_IMAGE_STORAGE, EXPLICIT_LE)
    ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = 60
    rng = random.Random(worker)
    while not stop.is_set():
        try:
            i = todo.get(timeout=0.5)
        except queue.Empty:
            continue
        if i is None:
            return
        datasets, hashes = series_datasets(run_id, i, bases[i % len(bases)])
        refusals = failures = 0
        while not stop.is_set():
            assoc = ae.associate("127.0.0.1", port, ae_title="SEGFLOW")
            if assoc.is_rejected:
                refusals += 1
                time.sleep(rng.uniform(0.1, 0.5))
                continue
            if not assoc.is_established:  # daemon down or restarting
                failures += 1
                time.sleep(rng.uniform(0.3, 1.0))
                continue
            ok = True
            for ds in datasets:
                st = assoc.send_c_store(ds)
                if not st or getattr(st, "Status", 0xFFFF) != 0:
                    ok = False
                    break
            if ok:
                assoc.release()
                ok = assoc.is_released
            else:
                assoc.abort()
            if ok:
                break
            failures += 1
            time.sleep(rng.uniform(0.3, 1.0))
        results.put({"series": i, "t_done": time.time(), "instances": len(datasets), "refusals": refusals,
                     "failures": failures, "hashes": hashes, "worker": worker})


# ---- The daemon ----

class Daemon:
    def __init__(self, segflowd, config, log, env):
        self.segflowd, self.config, self.log, self.env = segflowd, config, log, env
        self.proc, self.peak_rss_mb, self.restarts = None, 0.0, 0

    def start(self):
        self.proc = subprocess.Popen([self.segflowd, "--config", self.config], env=self.env,
                                     stdout=open(self.log, "a"), stderr=subprocess.STDOUT)

    def sample_rss(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        self.peak_rss_mb = max(self.peak_rss_mb, int(line.split()[1]) / 1024.0)
        except OSError:
            pass

    def kill9(self):
        self.sample_rss()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.restarts += 1

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.sample_rss()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def control(endpoint, obj, timeout_ms=20000):
    import zmq
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, timeout_ms)
    s.connect(endpoint)
    try:
        s.send(json.dumps(obj).encode())
        return json.loads(s.recv())
    except Exception:  # noqa: BLE001  (no daemon: None)
        return None
    finally:
        s.close()


# ---- Orthanc: when each series' SEG arrived ----

class SegWatch(threading.Thread):
    """Polls Orthanc every 0.5 s; first_seen[StudyInstanceUID] = when a SEG of it appeared."""

    def __init__(self, url):
        super().__init__(daemon=True)
        self.url, self.first_seen, self.studies, self.halt = url, {}, {}, threading.Event()

    def poll(self):
        series = http_json(self.url + "/tools/find", {"Level": "Series", "Query": {"Modality": "SEG"}})
        now = time.time()
        for s in series:
            info = self.studies.get(s)
            if info is None:
                parent = http_json(f"{self.url}/series/{s}")["ParentStudy"]
                info = http_json(f"{self.url}/studies/{parent}")["MainDicomTags"]["StudyInstanceUID"]
                self.studies[s] = info
            self.first_seen.setdefault(info, now)

    def run(self):
        while not self.halt.is_set():
            try:
                self.poll()
            except Exception:  # noqa: BLE001  (Orthanc busy: next poll)
                pass
            self.halt.wait(0.5)

    def seg_instances_per_study(self):
        """StudyInstanceUID -> number of SEG instances Orthanc holds for it."""
        out = {}
        for s, study in self.studies.items():
            out[study] = out.get(study, 0) + len(http_json(f"{self.url}/series/{s}")["Instances"])
        return out


# ---- One scenario ----

def stored_dataset_sha1(path):
    """sha1 of a Part 10 file's data set bytes (after the file meta group)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[128:132] != b"DICM":
        return None
    # (0002,0000) UL, explicit VR: tag(4) VR(2) len(2) value(4)
    group_len = int.from_bytes(data[140:144], "little")
    return hashlib.sha1(data[144 + group_len:]).hexdigest()


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def scenario(name, a, tmp, bases, checkpoint, segflowd, env):
    work = os.path.join(tmp, name)
    os.makedirs(work)
    run_id = f"{name}-{a.seed}"
    node = free_port()
    orthanc_dir = os.path.join(work, "orthanc")
    http, pacs = free_port(), free_port()
    url = f"http://127.0.0.1:{http}"
    opts = ["--dicomweb"] if a.seg_to == "dicomweb" else []
    orthanc_pacs.config(os.path.join(work, "orthanc.json"), orthanc_dir, http, pacs, node, options=opts)
    orthanc = subprocess.Popen(["Orthanc", os.path.join(work, "orthanc.json")],
                               stdout=open(os.path.join(work, "orthanc.log"), "w"), stderr=subprocess.STDOUT)
    daemon = None
    procs = []
    try:
        wait_for(lambda: subprocess.run(["curl", "-sf", url + "/system"], capture_output=True).returncode == 0,
                 60, "Orthanc")
        dest = (f"{{kind: dicomweb, url: '{url}/dicom-web', retry_initial_s: 0.5, retry_max_s: 5, max_attempts: 1000}}"
                if a.seg_to == "dicomweb" else
                f"{{ae_title: ORTHANC, host: 127.0.0.1, port: {pacs}, retry_initial_s: 0.5, retry_max_s: 5, "
                f"max_attempts: 1000}}")
        config = os.path.join(work, "daemon.yaml")
        with open(config, "w") as f:
            f.write(f"""data_root: {work}/data
state_dir: {work}/state
plugin_dir: {work}/plugins
log_level: info
devices: [cpu]
dicom:
  port: {node}
  ae_title: SEGFLOW
  dataset: incoming
  allowed_calling_aes: [LOADGEN]
  max_associations: {a.max_associations}
  destinations:
    ORTHANC: {dest}
auto_infer:
  - {{dataset: incoming, checkpoint: {checkpoint}, send_to: ORTHANC, device: cpu, quiet_seconds: {a.quiet_seconds}}}
""")
        endpoint = f"ipc://{work}/state/control.sock"
        daemon = Daemon(segflowd, config, os.path.join(work, "segflowd.log"), env)
        daemon.start()
        wait_for(lambda: (control(endpoint, {"cmd": "ping"}, 1000) or {}).get("ok", False), 120, "segflowd")
        ctx = mp.get_context("fork")
        todo, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        for i in range(a.series):
            todo.put(i)
        for _ in range(a.senders):
            todo.put(None)
        t0 = time.time()
        procs = [ctx.Process(target=sender, args=(w, node, run_id, bases, todo, results, stop))
                 for w in range(a.senders)]
        for p in procs:
            p.start()
        watch = SegWatch(url)  # after the fork: the senders hold no copy of its thread
        watch.start()
        done, killed = {}, False
        deadline = time.monotonic() + a.timeout
        while len(done) < a.series and time.monotonic() < deadline:
            try:
                r = results.get(timeout=0.5)
                done[r["series"]] = r
            except queue.Empty:
                pass
            daemon.sample_rss()
            if name == "kill9" and not killed and len(done) >= a.series // 2:
                daemon.kill9()  # associations in flight, jobs queued and running, SEGs in the queue
                killed = True
                time.sleep(1.0)
                daemon.start()
        push_s = time.time() - t0
        stop.set()
        for p in procs:
            p.join(timeout=30)

        # Every series' SEG in Orthanc, and the daemon idle.
        studies = {series_uids(run_id, i)["study"]: i for i in done}

        def finished():
            daemon.sample_rss()
            if not all(s in watch.first_seen for s in studies):
                return False
            st = control(endpoint, {"cmd": "status"}) or {}
            return all(j["state"] not in ("queued", "running") for j in st.get("jobs", []))

        t_wait = time.monotonic()
        while not finished() and time.monotonic() - t_wait < a.timeout:
            time.sleep(1.0)
        time.sleep(2.0)
        watch.poll()
        watch.halt.set()

        # Checks: byte-equal storage, one job and one SEG per series.
        incoming = os.path.join(work, "data", "incoming")
        lost = mismatched = 0
        for i, r in done.items():
            ids = series_uids(run_id, i)
            case = os.path.join(incoming, f"{ids['study']}_{ids['series']}")
            if not os.path.isdir(case) or len(os.listdir(case)) != r["instances"]:
                lost += 1
            for uid, h in r["hashes"].items():
                p = os.path.join(case, uid + ".dcm")
                if not os.path.exists(p) or stored_dataset_sha1(p) != h:
                    mismatched += 1
        jobs = (control(endpoint, {"cmd": "status"}) or {}).get("jobs", [])
        per_case, failed_jobs = {}, 0
        for j in jobs:
            if j.get("kind") == "infer" and j.get("trigger") == "auto_infer":
                per_case[j.get("case")] = per_case.get(j.get("case"), 0) + 1
                failed_jobs += j.get("state") == "failed"
        job_counts = {}
        for i in done:
            ids = series_uids(run_id, i)
            n = per_case.get(f"{ids['study']}_{ids['series']}", 0)
            job_counts[str(n)] = job_counts.get(str(n), 0) + 1
        segs = watch.seg_instances_per_study()
        seg_missing = sum(1 for s in studies if segs.get(s, 0) == 0)
        seg_duplicated = sum(1 for s in studies if segs.get(s, 0) > 1)
        latencies = [watch.first_seen[s] - done[i]["t_done"] for s, i in studies.items() if s in watch.first_seen]
        node_stats = ((control(endpoint, {"cmd": "dicom"}) or {}).get("node") or {})
        instances = sum(r["instances"] for r in done.values())
        mb = instances * 512 * 512 * 2 / 1e6
        if a.per_series:
            for i, r in sorted(done.items()):
                s = series_uids(run_id, i)["study"]
                print(json.dumps({"bench": "dicom_load_series", "scenario": name, "series": i,
                                  "instances": r["instances"], "refusals": r["refusals"], "failures": r["failures"],
                                  "seg_after_s": round(watch.first_seen[s] - r["t_done"], 3)
                                  if s in watch.first_seen else None}), flush=True)
        row = {
            "bench": "dicom_load", "name": f"dicom_load_{name}", "scenario": name, "device": "cpu",
            "series": a.series, "series_pushed": len(done), "instances": instances,
            "pixel_mb": round(mb, 1), "senders": a.senders, "max_associations": a.max_associations,
            "push_s": round(push_s, 2), "instances_per_s": round(instances / push_s, 2),
            "samples_per_s": round(instances / push_s, 2), "step_ms": None,
            "pixel_mb_per_s": round(mb / push_s, 2),
            "association_refusals": sum(r["refusals"] for r in done.values()),
            "association_failures": sum(r["failures"] for r in done.values()),
            "daemon_associations_refused": node_stats.get("associations_refused"),
            "seg_latency_p50_s": round(percentile(latencies, 0.5), 2) if latencies else None,
            "seg_latency_p95_s": round(percentile(latencies, 0.95), 2) if latencies else None,
            "seg_latency_max_s": round(max(latencies), 2) if latencies else None,
            "daemon_peak_rss_mb": round(daemon.peak_rss_mb, 1), "restarts": daemon.restarts,
            "lost_series": lost + (a.series - len(done)), "byte_mismatches": mismatched,
            "seg_missing": seg_missing, "seg_duplicated": seg_duplicated,
            "inference_jobs_per_series": job_counts, "failed_jobs": failed_jobs,
            "config": {"min_instances": a.min_instances, "max_instances": a.max_instances, "size": a.size,
                       "seg_to": a.seg_to, "quiet_seconds": a.quiet_seconds, "kill9_at": "half the series"
                       if name == "kill9" else None},
        }
        row["ok"] = (row["lost_series"] == 0 and mismatched == 0 and seg_missing == 0 and seg_duplicated == 0
                     and set(job_counts) == {"1"} and failed_jobs == 0)
        print(json.dumps(row), flush=True)
        return row
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if daemon:
            daemon.stop()
        orthanc.terminate()
        try:
            orthanc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            orthanc.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=16, help="series pushed per scenario (the issue: 200)")
    ap.add_argument("--min-instances", type=int, default=100)
    ap.add_argument("--max-instances", type=int, default=150, help="(the issue: 300)")
    ap.add_argument("--size", type=int, default=512, help="rows = columns of the slices")
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--max-associations", type=int, default=4)
    ap.add_argument("--scenarios", default="clean,kill9")
    ap.add_argument("--seg-to", choices=["dicomweb", "dimse"], default="dicomweb")
    ap.add_argument("--quiet-seconds", type=float, default=1.0)
    ap.add_argument("--checkpoint", help="a checkpoint to use instead of training the tiny model")
    ap.add_argument("--epochs", type=int, default=6, help="of the tiny model")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per phase before giving up")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-series", action="store_true")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "apps"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    a = ap.parse_args()
    segflow, segflowd = os.path.join(a.bin, "segflow"), os.path.join(a.bin, "segflowd")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    tmp = tempfile.mkdtemp(prefix="dicom_load_")
    ok = True
    try:
        mid = (a.min_instances + a.max_instances) // 2
        bases = synth_bases(segflow, os.path.join(tmp, "bases"), [a.min_instances, mid, a.max_instances], a.size)
        checkpoint = os.path.abspath(a.checkpoint) if a.checkpoint else train_model(segflow, tmp, a.epochs, env)
        for name in a.scenarios.split(","):
            ok = scenario(name, a, tmp, bases, checkpoint, segflowd, env)["ok"] and ok
    finally:
        if a.keep:
            print(f"dicom-load: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
