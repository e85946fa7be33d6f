#!/usr/bin/env bash
# Installs every Debian package that building, testing and demoing ShardMix needs.
# Idempotent: packages already installed (dpkg-query) are skipped; apt-get runs only for the
# missing ones. Run as root (or via sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  ccache                              # compiler cache for test.sh's and demo.sh's builds (decision 0060)
  # transport and launch
  libfabric-dev libfabric-bin libopenmpi-dev openmpi-bin
  rdma-core libibverbs-dev ibverbs-providers
  # libraries we build on (one well-kept library per job; see docs/decisions/)
  libboost-dev libboost-system-dev    # Boost.Asio: client service, sockets, signals
  libtomlplusplus-dev                 # TOML config
  libspdlog-dev libfmt-dev            # logging facade
  libcli11-dev                        # command lines
  libxxhash-dev                       # XXH64 of sample bytes (traces, verification)
  libisal-dev                         # CRC32C (hardware-accelerated) of TFRecord shards
  libgtest-dev libgmock-dev           # unit tests
  clang-14 libclang-rt-14-dev llvm-14 # asan/fuzz test stages: libFuzzer and sanitizer runtimes, llvm-symbolizer
  librapidcheck-dev                   # property tests (shrinking counterexamples)
  python3 python3-xxhash              # e2e trace checker (XXH64 of the sample files)
  # emulated cluster and the entropy-vs-locality sweep (deploy/netns-cluster.sh, bench/sweep.sh)
  iproute2                            # ip netns, veth, bridge; tc tbf
  python3-matplotlib                  # bench/sweep_report.py draws the PNG
  # Python binding (python/) and its tests, the PyTorch example and study
  # (examples/, bench/fashion_mnist_study.py); built for the system's /usr/bin/python3
  pybind11-dev python3-dev            # the extension module shardmix._shardmix
  python3-numpy python3-pytest        # numpy.frombuffer views; the tests (unittest, pytest-compatible)
  python3-torch                       # shardmix.torch, the study, bench/storage.sh's DataLoader baseline
  dataset-fashion-mnist               # /usr/share/datasets/fashion-mnist: the study's data
  # slow-storage benchmark (bench/storage.sh, docs/decisions/0027)
  fuse3 libfuse3-dev                  # bench/slowfs: FUSE passthrough with latency and a bandwidth cap
  # the S3 source (docs/s3.md, docs/decisions/0051): libcurl (HTTP, SigV4), libcrypto (MD5,
  # SHA-256); boto3 for bench/s3.sh's DataLoader baseline
  libcurl4-openssl-dev libssl-dev python3-boto3
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm run the local S3 server of the S3 tests (deploy/s3-local.sh installs s3rver
# with npm). Only when there is no npm at all: a node from another source (whose package
# bundles npm) conflicts with Debian's npm package.
command -v npm >/dev/null || missing+=(nodejs npm)
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
