#!/usr/bin/env python3
"""The hospital loop timed end to end: Orthanc C-STOREs a series to segflowd, auto_infer runs,
and the DICOM SEG goes back into Orthanc by itself (issue 31 item 4).

    .venv/bin/python bench/hospital_bench.py CHECKPOINT [--reps 2] [--quiet-seconds 1]

Starts Debian's Orthanc (its own config, storage and loopback ports in a temporary folder) and
segflowd (build/apps/segflowd) with a DICOM node, a named destination ORTHANC and one
auto_infer rule for CHECKPOINT on the CPU. For each series:
  - a synthetic CT phantom series (`segflow synth --size 48 --format dicom`: 48 x 48, about 20
    slices), and
  - TotalSegmentator's real CT series (512 x 512 x 20, Siemens; its blank Study/Series/SOP UIDs
    filled with new ones per repetition, since Orthanc indexes by them; pixel data unchanged),
each repetition a new series: upload it to Orthanc, have Orthanc push it to segflowd
(POST /modalities/segflow/store, which returns once the last instance is stored), then poll
Orthanc every 0.1 s until the SEG is there. Prints one JSON line per run: seconds of the
push, and from the last instance stored to the SEG in Orthanc (this includes the quiet
period); and, as the baseline in the same run, `segflow infer` writing the SEG for the same
series as one process (model load, read, inference, SEG write). A summary line per series
gives the medians and the ratio loop / infer.
"""
import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
import orthanc_pacs  # noqa: E402  (the tests' Orthanc helper: config, upload)

REAL_CT = os.path.expanduser("~/.cache/segflow-testdata/totalsegmentator/example_ct_dicom")


free_port, http_json = orthanc_pacs.free_port, orthanc_pacs.http_json


def wait_for(pred, timeout, what):
    orthanc_pacs.wait_for(pred, timeout, what, "hospital_bench", 0.1)


def seg_count(url):
    return len(http_json(url + "/tools/find", {"Level": "Series", "Query": {"Modality": "SEG"}}))


def real_series(out, rep):
    """TotalSegmentator's series with new Study/Series UIDs, SOP UIDs from the meta header."""
    import pydicom
    from pydicom.uid import generate_uid

    os.makedirs(out)
    study, series = generate_uid(), generate_uid()
    for f in sorted(glob.glob(os.path.join(REAL_CT, "*"))):
        d = pydicom.dcmread(f)
        d.StudyInstanceUID, d.SeriesInstanceUID = study, series
        d.SOPInstanceUID = d.file_meta.MediaStorageSOPInstanceUID
        d.SOPClassUID = d.file_meta.MediaStorageSOPClassUID
        d.SeriesDescription = f"hospital_bench real CT {rep}"
        d.save_as(os.path.join(out, os.path.basename(f)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quiet-seconds", type=float, default=1.0)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "apps"))
    a = ap.parse_args()
    segflow, segflowd = os.path.join(a.bin, "segflow"), os.path.join(a.bin, "segflowd")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    tmp = tempfile.mkdtemp(prefix="hospital_bench_")
    procs = []
    try:
        # The series: phantoms (one case per repetition) and real CT copies.
        subprocess.run([segflow, "synth", "--cases", str(a.reps), "--size", "48", "--format", "dicom",
                        "--seed", "5", "--out", os.path.join(tmp, "synth")], check=True, capture_output=True)
        phantoms = sorted(d for d in glob.glob(os.path.join(tmp, "synth", "**", "case_*"), recursive=True)
                          if os.path.isdir(d))[: a.reps]
        reals = [real_series(os.path.join(tmp, f"real{r}"), r) for r in range(a.reps)]

        http, pacs, node = free_port(), free_port(), free_port()
        url = f"http://127.0.0.1:{http}"
        orthanc_pacs.config(os.path.join(tmp, "orthanc.json"), os.path.join(tmp, "orthanc"), http, pacs, node)
        procs.append(subprocess.Popen(["Orthanc", os.path.join(tmp, "orthanc.json")],
                                      stdout=open(os.path.join(tmp, "orthanc.log"), "w"), stderr=subprocess.STDOUT))
        wait_for(lambda: subprocess.run(["curl", "-sf", url + "/system"], capture_output=True).returncode == 0,
                 60, "Orthanc")
        with open(os.path.join(tmp, "daemon.yaml"), "w") as f:
            f.write(f"""data_root: {tmp}/data
state_dir: {tmp}/state
plugin_dir: {tmp}/plugins
log_level: info
dicom:
  port: {node}
  ae_title: SEGFLOW
  dataset: incoming
  allowed_calling_aes: [ORTHANC]
  destinations:
    ORTHANC: {{ae_title: ORTHANC, host: 127.0.0.1, port: {pacs}, retry_initial_s: 0.5}}
auto_infer:
  - {{dataset: incoming, checkpoint: {os.path.abspath(a.checkpoint)}, send_to: ORTHANC, device: cpu,
      quiet_seconds: {a.quiet_seconds}}}
""")
        procs.append(subprocess.Popen([segflowd, "--config", os.path.join(tmp, "daemon.yaml")], env=env,
                                      stdout=open(os.path.join(tmp, "segflowd.log"), "w"), stderr=subprocess.STDOUT))

        def node_up():
            try:
                socket.create_connection(("127.0.0.1", node), timeout=0.5).close()
                return True
            except OSError:
                return False

        wait_for(node_up, 60, "segflowd's DICOM node")
        rows = {}
        for kind, series in (("phantom_48", phantoms), ("real_ct_512x512x20", reals)):
            for rep, folder in enumerate(series):
                files = sorted(glob.glob(os.path.join(folder, "*")))
                up = []
                for f in files:
                    with open(f, "rb") as fh:
                        r = json.loads(orthanc_pacs.http(url + "/instances", fh.read(), "POST"))
                    if r["ParentSeries"] not in up:
                        up.append(r["ParentSeries"])
                before = seg_count(url)
                t0 = time.perf_counter()
                http_json(url + "/modalities/segflow/store", {"Resources": up, "Synchronous": True})
                t1 = time.perf_counter()
                wait_for(lambda: seg_count(url) > before, 300, f"the SEG of {kind} {rep} in Orthanc")
                t2 = time.perf_counter()
                s0 = time.perf_counter()
                subprocess.run([segflow, "infer", "--checkpoint", a.checkpoint, "--input", folder, "--output",
                                os.path.join(tmp, f"{kind}_{rep}.dcm"), "--device", "cpu", "--quiet"],
                               env=env, check=True, capture_output=True)
                s1 = time.perf_counter()
                row = {"bench": "hospital_loop", "series": kind, "rep": rep, "instances": len(files),
                       "push_s": round(t1 - t0, 3), "last_instance_to_seg_in_orthanc_s": round(t2 - t1, 3),
                       "quiet_seconds": a.quiet_seconds, "segflow_infer_process_s": round(s1 - s0, 3)}
                rows.setdefault(kind, []).append(row)
                print(json.dumps(row), flush=True)
        for kind, rs in rows.items():
            loop = statistics.median(r["last_instance_to_seg_in_orthanc_s"] for r in rs)
            infer = statistics.median(r["segflow_infer_process_s"] for r in rs)
            print(json.dumps({"bench": "hospital_loop", "summary": True, "series": kind, "reps": len(rs),
                              "median_last_instance_to_seg_s": round(loop, 3),
                              "median_segflow_infer_process_s": round(infer, 3),
                              "ratio_loop_over_infer": round(loop / infer, 3)}), flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if os.environ.get("HOSPITAL_BENCH_KEEP"):
            print(f"hospital_bench: kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
