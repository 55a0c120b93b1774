#!/usr/bin/env python3
"""Orthanc's REST API and a pynetdicom C-STORE peer for the hospital loop tests.

Also a module for the benchmarks (bench/hospital_bench.py, bench/dicom-load.py): config(),
free_port(), wait_for(), http_json().

usage: orthanc_pacs.py config OUT.json DIR HTTP_PORT DICOM_PORT SEGFLOW_PORT [OPTIONS]
           Writes an Orthanc configuration: storage and index under DIR, loopback only, AE
           title ORTHANC, no plugins, modality "segflow" = SEGFLOW@127.0.0.1:SEGFLOW_PORT.
           OPTIONS: --dicomweb (Debian's orthanc-dicomweb plugin, root /dicom-web/),
           --lua FILE (a Lua script: filters), --tls CERT KEY CA (its DICOM port speaks DICOM
           TLS only; --require-client-cert: clients must present a certificate CA signed).
       orthanc_pacs.py upload URL FILE...
           POSTs the files to /instances; prints {"series": [Orthanc series ids]}.
       orthanc_pacs.py store URL MODALITY SERIES_ID
           Has Orthanc C-STORE the series to the modality (POST /modalities/M/store, synchronous).
       orthanc_pacs.py segs URL OUTDIR
           Downloads every Segmentation Storage instance Orthanc holds into OUTDIR; prints
           {"segs": N, "instances": total instances}.
       orthanc_pacs.py push PORT CALLING CALLED FILE...
           C-STOREs the files with pynetdicom (one association); exit 1 unless all succeed.
"""
import json
import os
import socket
import sys
import time
import urllib.request

SEG_CLASS = "1.2.840.10008.5.1.4.1.1.66.4"


def free_port():
    """A free TCP port on the loopback address (for Orthanc's and segflowd's ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, what, who="orthanc_pacs", interval=0.1):
    """Polls pred() every `interval` seconds until it holds; exits naming `what` after `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return
        time.sleep(interval)
    sys.exit(f"{who}: timed out waiting for {what}")


def http_json(url, data=None):
    """GET `url` (or POST `data` as JSON) and parse the JSON answer."""
    req = urllib.request.Request(url, data=None if data is None else json.dumps(data).encode(),
                                 method="GET" if data is None else "POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def http(url, data=None, method=None):
    req = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


DICOMWEB_PLUGINS = ["/usr/lib/orthanc/libOrthancDicomWeb.so", "/usr/share/orthanc/plugins/libOrthancDicomWeb.so"]


def config(out, folder, http_port, dicom_port, segflow_port, options=()):
    cfg = {
        "Name": "segflow-test-pacs",
        "StorageDirectory": os.path.join(folder, "storage"),
        "IndexDirectory": os.path.join(folder, "index"),
        "HttpPort": int(http_port),
        "DicomPort": int(dicom_port),
        "DicomAet": "ORTHANC",
        "RemoteAccessAllowed": False,
        "AuthenticationEnabled": False,
        "HttpServerEnabled": True,
        "DicomServerEnabled": True,
        "DicomAlwaysAllowStore": True,
        "DicomCheckCalledAet": False,
        "Plugins": [],
        "StorageCompression": False,
        "DicomModalities": {"segflow": ["SEGFLOW", "127.0.0.1", int(segflow_port)]},
    }
    opts = list(options)
    while opts:
        o = opts.pop(0)
        if o == "--dicomweb":
            plugin = next((p for p in DICOMWEB_PLUGINS if os.path.exists(p)), None)
            if plugin is None:
                sys.exit("the DICOMweb plugin is not installed (Debian's orthanc-dicomweb)")
            cfg["Plugins"] = [plugin]
            cfg["DicomWeb"] = {"Enable": True, "Root": "/dicom-web/", "EnableWado": False,
                               "Host": "127.0.0.1", "Ssl": False}
        elif o == "--lua":
            cfg["LuaScripts"] = [opts.pop(0)]
        elif o == "--tls":
            cert, key, ca = opts.pop(0), opts.pop(0), opts.pop(0)
            cfg.update({"DicomTlsEnabled": True, "DicomTlsCertificate": cert, "DicomTlsPrivateKey": key,
                        "DicomTlsTrustedCertificates": ca, "DicomTlsRemoteCertificateRequired": False})
        elif o == "--require-client-cert":
            cfg["DicomTlsRemoteCertificateRequired"] = True
        else:
            sys.exit("config: unknown option " + o)
    with open(out, "w") as f:
        json.dump(cfg, f, indent=1)


def upload(url, files):
    series = []
    for f in files:
        with open(f, "rb") as fh:
            r = json.loads(http(url + "/instances", fh.read(), "POST"))
        if r["ParentSeries"] not in series:
            series.append(r["ParentSeries"])
    print(json.dumps({"series": series}))


def store(url, modality, series_id):
    body = json.dumps({"Resources": [series_id], "Synchronous": True}).encode()
    print(http(url + "/modalities/" + modality + "/store", body, "POST").decode())


def segs(url, outdir):
    os.makedirs(outdir, exist_ok=True)
    ids = json.loads(http(url + "/instances"))
    n = 0
    for i in ids:
        tags = json.loads(http(url + "/instances/" + i + "/simplified-tags"))
        if tags.get("SOPClassUID") == SEG_CLASS:
            with open(os.path.join(outdir, i + ".dcm"), "wb") as f:
                f.write(http(url + "/instances/" + i + "/file"))
            n += 1
    print(json.dumps({"segs": n, "instances": len(ids)}))


def push(port, calling, called, files):
    import pydicom
    from pynetdicom import AE

    datasets = [pydicom.dcmread(f) for f in files]
    ae = AE(ae_title=calling)
    for cls in sorted({str(d.SOPClassUID) for d in datasets}):
        ae.add_requested_context(cls)
    assoc = ae.associate("127.0.0.1", int(port), ae_title=called)
    if not assoc.is_established:
        sys.exit("association refused or failed")
    bad = 0
    for d in datasets:
        st = assoc.send_c_store(d)
        if not st or st.Status != 0:
            bad += 1
    assoc.release()
    sys.exit(1 if bad else 0)


def main():
    a = sys.argv[1:]
    if not a:
        sys.exit(__doc__)
    cmd = a[0]
    if cmd == "config" and len(a) >= 6:
        config(*a[1:6], options=a[6:])
    elif cmd == "upload" and len(a) >= 3:
        upload(a[1], a[2:])
    elif cmd == "store" and len(a) == 4:
        store(*a[1:])
    elif cmd == "segs" and len(a) == 3:
        segs(*a[1:])
    elif cmd == "push" and len(a) >= 5:
        push(a[1], a[2], a[3], a[4:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
