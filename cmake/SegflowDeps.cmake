# Finds every external dependency once. LibTorch comes from the venv's torch wheel.
if(NOT EXISTS "${SEGFLOW_PYTHON}")
  message(FATAL_ERROR "SEGFLOW_PYTHON=${SEGFLOW_PYTHON} does not exist: run scripts/setup.sh first")
endif()
execute_process(
  COMMAND "${SEGFLOW_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE SEGFLOW_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "could not import torch from ${SEGFLOW_PYTHON}: run scripts/setup.sh")
endif()
list(APPEND CMAKE_PREFIX_PATH "${SEGFLOW_TORCH_PREFIX}")

# LibTorch's CUDA build configures against the CUDA toolkit; no GPU is needed for that.
if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
if(NOT DEFINED TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "9.0")  # H200; only used by LibTorch's CMake when compiling CUDA
endif()
find_package(Torch REQUIRED)
# LibTorch built with CUDA (the torch wheel's cu130 build): the CUDA-only code (the augmenter's
# side stream, actors/detail/device_stream.cpp) is compiled in, against the toolkit's headers;
# a missing header is a build error, never a silent fallback. A CPU-only LibTorch leaves it out.
if(TARGET torch_cuda)
  set(SEGFLOW_WITH_CUDA 1)
else()
  set(SEGFLOW_WITH_CUDA 0)
endif()
message(STATUS "segflow: LibTorch with CUDA: ${SEGFLOW_WITH_CUDA}")
# TorchConfig adds its flags to CMAKE_CXX_FLAGS; the ABI define must match the wheel.

find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(DCMTK REQUIRED CONFIG)
if(NOT TARGET DCMTK::dcmnet)  # segflowd's DICOM node and sender (daemon/dicom/)
  message(FATAL_ERROR "DCMTK without dcmnet: install libdcmtk-dev (Debian) or build DCMTK with dcmnet")
endif()
# DICOM TLS of the node and the sender (daemon/dicom/tls.cpp): DCMTK's dcmtls on OpenSSL.
if(NOT TARGET DCMTK::dcmtls OR NOT DCMTK_WITH_OPENSSL)
  message(FATAL_ERROR "DCMTK without dcmtls/OpenSSL: install libdcmtk-dev (Debian) or build DCMTK with OpenSSL")
endif()
find_package(OpenSSL REQUIRED)
# DICOMweb (STOW-RS, QIDO-RS, WADO-RS; daemon/dicom/web_client.cpp): Debian's libcurl4-openssl-dev.
find_package(CURL REQUIRED)
find_package(spdlog REQUIRED CONFIG)
find_package(yaml-cpp REQUIRED CONFIG)
find_package(nlohmann_json REQUIRED CONFIG)
find_package(SQLite3 REQUIRED)
# SHA-256 of model packages' files (messages/hashing.cpp): Debian's libssl-dev.
find_package(OpenSSL REQUIRED)
find_package(CAF REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(ZMQ REQUIRED IMPORTED_TARGET libzmq)
# JPEG 2000 pixel data in DICOM (pipeline/io/detail/dicom_j2k.cpp): Debian's libopenjp2-7-dev.
pkg_check_modules(OPENJP2 REQUIRED IMPORTED_TARGET libopenjp2)
# NRRD and MetaImage files (pipeline/io/nrrd.cpp, metaimage.cpp): ITK's NrrdIO (C) and MetaIO
# (C++) libraries from Debian's libinsighttoolkit5-dev, used as plain libraries (no ITK
# templates, no ITKConfig.cmake). Their header folder also holds ITK's copies of other
# libraries' headers (openjpeg.h, ...), so it is given to those two sources only.
find_path(SEGFLOW_ITK_IO_INCLUDE_DIR NAMES NrrdIO.h metaImage.h PATH_SUFFIXES ITK-5.4 ITK-5.3 ITK-5.2 REQUIRED)
find_library(SEGFLOW_ITK_NRRDIO_LIBRARY NAMES ITKNrrdIO-5.4 ITKNrrdIO-5.3 ITKNrrdIO-5.2 ITKNrrdIO REQUIRED)
find_library(SEGFLOW_ITK_METAIO_LIBRARY NAMES ITKMetaIO-5.4 ITKMetaIO-5.3 ITKMetaIO-5.2 ITKMetaIO REQUIRED)
