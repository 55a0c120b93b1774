"""Daemon soak: segflowd serving many control clients (and bursts of malformed requests) while
a job trains and new cases are dropped into the watched folder, against the same job with no
clients, in one run. Loopback only (tcp://127.0.0.1), bounded in time and request count.

Prints JSON lines:
  {"bench": "daemon_soak_job", "phase": "quiet"|"loaded"|"quiet_after", ...}   the job's
      samples/s (median over its epochs after the first); the quiet figure the ratio uses is
      the mean of the runs before and after the loaded one
  {"bench": "daemon_soak_rss", "t_s": ..., "rss_mb": ...}          daemon RSS samples (loaded phase)
  {"bench": "daemon_soak", "name": "daemon_soak", requests_per_s, p50_ms, p99_ms, malformed
   (sent, answered), job samples/s quiet vs loaded and their ratio, RSS first/last/max and its
   slope over the loaded phase (MB per minute), cases dropped and indexed, ...}

usage: daemon_soak.py [--clients 4] [--seconds 60] [--max-requests 200000] [--epochs 6]
                      [--cases 8] [--size 48] [--malformed-every 25] [--drop-every 5]
                      [--skip-quiet] [--no-job] [--malloc-arena-max N]
  --skip-quiet and --no-job split the RSS question: serving alone, or the job alone
  (--clients 0 --drop-every 1e9), without the job-alone phases around the loaded one.
Needs the built segflow and segflowd (SEGFLOW_BIN, default build/apps) and pyzmq.
"""
import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class Client:
    def __init__(self, ctx, endpoint, timeout_ms=10000):
        self.ctx, self.endpoint, self.timeout_ms = ctx, endpoint, timeout_ms
        self._open()

    def _open(self):
        self.s = self.ctx.socket(zmq.REQ)
        self.s.setsockopt(zmq.LINGER, 0)
        self.s.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
        self.s.connect(self.endpoint)

    def raw(self, payload: bytes):
        """Sends bytes, returns the reply bytes or None (no reply in time: the socket is remade)."""
        self.s.send(payload)
        try:
            return self.s.recv()
        except zmq.Again:
            self.s.close()
            self._open()
            return None

    def call(self, obj):
        r = self.raw(json.dumps(obj).encode())
        return json.loads(r) if r is not None else None


MALFORMED = [
    b"",
    b"{",
    b"not json at all",
    b"[1, 2, 3]",
    b'{"cmd": 42}',
    b'{"cmd": "no_such_command"}',
    b'{"cmd": "status", "job": "seven"}',
    b'{"cmd": "start", "config": "model: {name: unet, channelz: 4}\\nstages: [load]"}',
    bytes(random.Random(7).getrandbits(8) for _ in range(512)),
    b'{"cmd": "status", "pad": "' + b"x" * (2 << 20) + b'"}',  # over max_request_bytes
]


def wait_job(client, job_id, deadline):
    while time.time() < deadline:
        r = client.call({"cmd": "status", "job": job_id})
        if r and r.get("ok") and r["job"]["state"] in ("completed", "failed", "stopped"):
            return r["job"]
        time.sleep(0.5)
    raise SystemExit(f"daemon_soak: job {job_id} did not finish in time")


def job_rate(job):
    """Median samples/s of the job's epochs after the first (metrics.jsonl in its run folder)."""
    rates = []
    with open(os.path.join(job["run_dir"], "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "epoch":
                rates.append(j["samples_per_s"])
    if len(rates) < 2:
        raise SystemExit(f"daemon_soak: job {job['id']} logged {len(rates)} epochs; need 2 or more")
    return statistics.median(rates[1:]), len(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60.0, help="cap on the loaded phase")
    ap.add_argument("--max-requests", type=int, default=200000)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--size", type=int, default=48)
    ap.add_argument("--malformed-every", type=int, default=25, help="every Nth request of a client is malformed")
    ap.add_argument("--drop-every", type=float, default=5.0, help="seconds between cases dropped into the folder")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--skip-quiet", action="store_true",
                    help="no job-alone phases before and after (no samples/s ratio; for RSS runs)")
    ap.add_argument("--malloc-arena-max", type=int, default=None,
                    help="the daemon config's malloc_arena_max (default: the daemon's own, 2; 0 = glibc's)")
    ap.add_argument("--no-job", action="store_true",
                    help="the loaded phase runs for --seconds with no job training (RSS of serving alone)")
    a = ap.parse_args()
    bindir = os.environ.get("SEGFLOW_BIN", os.path.join(ROOT, "build", "apps"))
    segflow, segflowd = os.path.join(bindir, "segflow"), os.path.join(bindir, "segflowd")
    work = tempfile.mkdtemp(prefix="segflow_soak_")
    data_root, state = os.path.join(work, "data"), os.path.join(work, "state")
    os.makedirs(data_root)
    ds = os.path.join(data_root, "soak")
    subprocess.run([segflow, "synth", "--out", ds + ".partial", "--cases", str(a.cases), "--size", str(a.size),
                    "--format", "nifti", "--seed", "5"], check=True, stdout=subprocess.DEVNULL)
    os.rename(ds + ".partial", ds)
    spare = os.path.join(work, "spare")  # cases to drop in while the loaded job trains
    subprocess.run([segflow, "synth", "--out", spare, "--cases", "24", "--size", str(a.size), "--format", "nifti",
                    "--seed", "9"], check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    with open(os.path.join(work, "daemon.yaml"), "w") as f:
        f.write(f"data_root: {data_root}\nstate_dir: {state}\ncontrol: {endpoint}\n"
                f"events: tcp://127.0.0.1:{free_port()}\nrescan_interval_s: 5\nsettle_s: 1\nlog_level: warn\n")
        if a.malloc_arena_max is not None:
            f.write(f"malloc_arena_max: {a.malloc_arena_max}\n")
    log = open(os.path.join(work, "segflowd.log"), "w")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    daemon = subprocess.Popen([segflowd, "--config", os.path.join(work, "daemon.yaml")], stdout=log, stderr=log,
                              env=env)
    ctx = zmq.Context()
    try:
        ctl = Client(ctx, endpoint)
        t0 = time.time()
        while not (pong := ctl.call({"cmd": "ping"}) or {}).get("ok"):
            if time.time() - t0 > 60 or daemon.poll() is not None:
                raise SystemExit("daemon_soak: segflowd did not answer; see " + log.name)
            time.sleep(0.2)
        cfg = os.path.join(ROOT, "configs", "quickstart-unet3d.yaml")
        sets = [f"data.root={ds}", f"train.epochs={a.epochs}", "train.val_interval=0", "data.val_cases=1"]

        def run_job(name, during=None):
            r = ctl.call({"cmd": "start", "path": cfg, "set": sets + [f"name={name}"]})
            if not r or not r.get("ok"):
                raise SystemExit(f"daemon_soak: start failed: {r}")
            jid = r["job"] if isinstance(r.get("job"), int) else (r.get("id") or r["job"]["id"])
            if during:
                during(jid)
            return wait_job(ctl, jid, time.time() + 3600)

        # Phase 1: the job alone.
        quiet_rate = None
        if not a.skip_quiet:
            quiet = run_job("soak-quiet")
            quiet_rate, quiet_epochs = job_rate(quiet)
            print(json.dumps({"bench": "daemon_soak_job", "phase": "quiet", "samples_per_s": quiet_rate,
                              "epochs": quiet_epochs, "state": quiet["state"]}), flush=True)

        # Phase 2: the same job with clients hammering the control socket and cases arriving.
        stop = threading.Event()
        lat, lock = [], threading.Lock()
        counts = {"requests": 0, "errors": 0, "malformed_sent": 0, "malformed_answered": 0, "lost": 0}
        rss = []

        def client_loop(k):
            c = Client(ctx, endpoint)
            rng = random.Random(k)
            n, local = 0, []
            while not stop.is_set():
                n += 1
                if n % a.malformed_every == 0:
                    t = time.perf_counter()
                    rep = c.raw(MALFORMED[rng.randrange(len(MALFORMED))])
                    with lock:
                        counts["malformed_sent"] += 1
                        if rep is not None:
                            counts["malformed_answered"] += 1
                        else:
                            counts["lost"] += 1
                    continue
                req = rng.choice([{"cmd": "status"}, {"cmd": "list"}, {"cmd": "datasets"}, {"cmd": "ping"}])
                t = time.perf_counter()
                rep = c.call(req)
                dt = (time.perf_counter() - t) * 1e3
                local.append(dt)
                with lock:
                    counts["requests"] += 1
                    if rep is None:
                        counts["lost"] += 1
                    elif not rep.get("ok"):
                        counts["errors"] += 1
                    if counts["requests"] >= a.max_requests:
                        stop.set()
            with lock:
                lat.extend(local)
            c.s.close()

        dropped = []

        def dropper():
            i = 0
            names = sorted(n for n in os.listdir(os.path.join(spare, "imagesTr")))
            while not stop.wait(a.drop_every) and i < len(names):
                img = names[i]
                cid = img[: -len("_0000.nii.gz")]
                new = f"drop_{i:03d}"
                for sub, src, dst in (("imagesTr", img, new + "_0000.nii.gz"), ("labelsTr", cid + ".nii.gz", new + ".nii.gz")):
                    tmp = os.path.join(ds, sub, "." + dst + ".tmp")
                    shutil.copyfile(os.path.join(spare, sub, src), tmp)
                    os.rename(tmp, os.path.join(ds, sub, dst))
                dropped.append(new)
                i += 1

        def sampler(pid, t_start):
            while not stop.wait(0.5):
                rss.append((time.time() - t_start, rss_mb(pid)))

        loaded_job = {}

        def during(jid):
            t_start = time.time()
            threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(a.clients)]
            threads += [threading.Thread(target=dropper), threading.Thread(target=sampler, args=(daemon.pid, t_start))]
            for t in threads:
                t.start()
            deadline = t_start + a.seconds
            while time.time() < deadline and not stop.is_set():
                if jid is not None:
                    r = ctl.call({"cmd": "status", "job": jid})
                    if r and r.get("ok") and r["job"]["state"] in ("completed", "failed", "stopped"):
                        break
                time.sleep(0.5)
            stop.set()
            for t in threads:
                t.join()
            loaded_job["seconds"] = time.time() - t_start

        loaded_rate = None
        if a.no_job:
            during(None)
        else:
            loaded = run_job("soak-loaded", during)
            loaded_rate, loaded_epochs = job_rate(loaded)
            print(json.dumps({"bench": "daemon_soak_job", "phase": "loaded", "samples_per_s": loaded_rate,
                              "epochs": loaded_epochs, "state": loaded["state"]}), flush=True)
        if not a.skip_quiet:
            # Phase 3: alone again, so machine drift shows instead of landing in the ratio.
            quiet2 = run_job("soak-quiet2")
            quiet2_rate, _ = job_rate(quiet2)
            print(json.dumps({"bench": "daemon_soak_job", "phase": "quiet_after", "samples_per_s": quiet2_rate,
                              "state": quiet2["state"]}), flush=True)
            quiet_rate = (quiet_rate + quiet2_rate) / 2
        for t, m in rss:
            print(json.dumps({"bench": "daemon_soak_rss", "t_s": round(t, 2), "rss_mb": round(m, 1)}))
        time.sleep(2 * 5 + 2)  # one rescan interval and settle: the last dropped cases get indexed
        d = ctl.call({"cmd": "datasets", "dataset": "soak"}) or {}
        indexed = None
        if d.get("ok") and d.get("datasets"):
            entry = d["datasets"][0] if isinstance(d["datasets"], list) else d["datasets"]
            indexed = entry.get("cases") if isinstance(entry, dict) else None
        alive = (ctl.call({"cmd": "ping"}) or {}).get("ok", False)
        lat.sort()
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None
        half = [m for t, m in rss if t >= (rss[-1][0] / 2 if rss else 0)]
        slope = None
        if len(rss) >= 4:
            ts, ms = [t for t, _ in rss], [m for _, m in rss]
            tm, mm = statistics.mean(ts), statistics.mean(ms)
            den = sum((t - tm) ** 2 for t in ts)
            slope = sum((t - tm) * (m - mm) for t, m in zip(ts, ms)) / den * 60.0 if den else None
        print(json.dumps({
            "bench": "daemon_soak", "name": "daemon_soak", "device": "cpu",
            "config": {"clients": a.clients, "seconds": a.seconds, "epochs": a.epochs, "cases": a.cases,
                       "size": a.size, "malformed_every": a.malformed_every, "drop_every_s": a.drop_every},
            "loaded_seconds": loaded_job.get("seconds"),
            "requests": counts["requests"], "requests_per_s": counts["requests"] / loaded_job["seconds"],
            "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": lat[-1] if lat else None,
            "error_replies": counts["errors"], "malformed_sent": counts["malformed_sent"],
            "malformed_answered": counts["malformed_answered"], "no_reply": counts["lost"],
            "job_samples_per_s_quiet": quiet_rate, "job_samples_per_s_loaded": loaded_rate,
            "samples_per_s": loaded_rate, "step_ms": None,
            "loaded_over_quiet": loaded_rate / quiet_rate if quiet_rate and loaded_rate else None,
            "job": not a.no_job, "malloc_arena_max": pong.get("malloc_arena_max"),
            "rss_mb_first": rss[0][1] if rss else None, "rss_mb_last": rss[-1][1] if rss else None,
            "rss_mb_max": max(m for _, m in rss) if rss else None,
            "rss_mb_second_half_max": max(half) if half else None,
            "rss_slope_mb_per_min": slope,
            "cases_dropped": len(dropped), "cases_indexed": indexed, "daemon_alive": alive,
        }), flush=True)
    finally:
        try:
            Client(ctx, endpoint, 2000).call({"cmd": "shutdown"})
        except Exception:
            pass
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        ctx.destroy(linger=0)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"daemon_soak: kept {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
