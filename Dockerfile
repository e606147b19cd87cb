# syntax=docker/dockerfile:1
#
# One image for every dsflash tier; the entrypoint is `dsflash` and the first argument picks
# the tier (k8s/*.yaml pass exactly these):
#
#   docker run -p 8000:8000 IMAGE gateway --redis-url redis://HOST:6379/0
#   docker run --gpus all --shm-size 16g -v CKPT:/models/DeepSeek-V4.1-Flash:ro IMAGE \
#       prefill --checkpoint /models/DeepSeek-V4.1-Flash --gpus 0,1,2,3 --redis-url ...
#   docker run --gpus all --shm-size 16g ... IMAGE decode --checkpoint ... --redis-url ...
#
# Build: `docker build -t dsflash:0.1.0 .` (docs/deploy.md, "Building the image").
#
# Why Debian 12 and not an nvidia/cuda base: the RDMA transport needs pyverbs, and the only
# pyverbs that works comes prebuilt with rdma-core's distribution package, compiled for that
# distribution's own Python (pip's pyverbs sdist builds a private rdma-core that then clashes
# with the system libibverbs; see kvcache/transport/rdma_verbs.py). Debian 12's Python is 3.11,
# the version dsflash targets, and its python3-pyverbs is built for it; Ubuntu 22.04 (the CUDA
# images) has 3.10, Ubuntu 24.04 has 3.12. Nothing is lost: torch's wheels bring the CUDA
# user-space libraries (cuBLAS, cuDNN, NCCL, ...) and Triton brings ptxas, while the driver
# (libcuda) is mounted into the container by the NVIDIA container toolkit at run time.

ARG DEBIAN_RELEASE=bookworm
# Must be the Python of ${DEBIAN_RELEASE}: checked below, and in tests/deploy.
ARG PYTHON_VERSION=3.11

# ---------------------------------------------------------------- base: what runs
FROM debian:${DEBIAN_RELEASE}-slim AS base
ARG PYTHON_VERSION
# - python3, python3-venv: the interpreter the virtualenv below is made from.
# - gcc, libc6-dev, python3-dev: Triton compiles a small C launcher for its kernels the first
#   time each is used, against Python.h, on the machine that runs it.
# - python3-pyverbs, ibverbs-providers: the RDMA verbs binding and the NIC drivers' user-space
#   halves (mlx5, efa, ...); ibverbs-utils gives `ibv_devices` / `ibv_devinfo` for debugging.
# - tini: PID 1 that forwards SIGTERM. A worker installs its drain handler only once the
#   weights are loaded; before that a Python PID 1 would ignore SIGTERM (the kernel drops
#   default-action signals to PID 1) and every stop would wait for the kill.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev gcc libc6-dev \
      python3-pyverbs ibverbs-providers ibverbs-utils \
      tini ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN test "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "${PYTHON_VERSION}" \
 || { echo "python3 of this base is not ${PYTHON_VERSION}: change PYTHON_VERSION or DEBIAN_RELEASE together" >&2; exit 1; }

# ---------------------------------------------------------------- build: the virtualenv
FROM base AS build
ARG PYTHON_VERSION
# Same pin as pyproject.toml (tests/deploy checks it). TORCH_INDEX_URL picks a CUDA flavour
# from PyTorch's own index, e.g. https://download.pytorch.org/whl/cu128; empty = PyPI's
# default Linux wheel, which is a CUDA build.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/dsflash
# torch first and alone: the largest layer, and the one that changes least.
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/dsflash/bin/pip install -U pip \
 && /opt/dsflash/bin/pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"
WORKDIR /src
# The pinned dependencies next, from pyproject.toml alone, so editing the source reuses this layer.
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/requirements.txt \
 && /opt/dsflash/bin/pip install -r /tmp/requirements.txt
# Then dsflash itself (not editable): setup.py generates the gRPC stubs from protos/ and
# installs the top-level folders as dsflash.* subpackages.
COPY setup.py README.md ./
COPY protos protos
COPY dsflash dsflash
COPY model model
COPY kvcache kvcache
COPY prefill_worker prefill_worker
COPY decode_worker decode_worker
COPY gateway gateway
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/dsflash/bin/pip install --no-deps .
# The distribution's pyverbs, visible to the virtualenv (and only it, not all of dist-packages).
# Then fail the build, not the pod, if the installed package misses a module a tier imports.
RUN ln -s /usr/lib/python3/dist-packages/pyverbs "/opt/dsflash/lib/python${PYTHON_VERSION}/site-packages/pyverbs" \
 && /opt/dsflash/bin/python -c "import pyverbs.device, dsflash.v1.worker_pb2" \
 && /opt/dsflash/bin/python -c "import dsflash.gateway.server, dsflash.prefill_worker.server, dsflash.decode_worker.server" \
 && /opt/dsflash/bin/dsflash gateway --help > /dev/null

# ---------------------------------------------------------------- runtime
FROM base AS runtime
# The unprivileged user the gateway (and TCP-only workers) run as; k8s/*.yaml use this uid.
# /var/cache/dsflash holds Triton's kernel cache and other caches; Kubernetes mounts an
# emptyDir over it. Sticky and world-writable, because RDMA workers run as root without
# CAP_DAC_OVERRIDE (k8s/prefill.yaml) and must still write there.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/dsflash --shell /usr/sbin/nologin dsflash \
 && install -d -m 1777 /var/cache/dsflash
COPY --from=build /opt/dsflash /opt/dsflash
ENV PATH=/opt/dsflash/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    XDG_CACHE_HOME=/var/cache/dsflash \
    TRITON_CACHE_DIR=/var/cache/dsflash/triton \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# NVIDIA_VISIBLE_DEVICES is deliberately not set: the device plugin sets it for pods that
# request GPUs, and an image-wide `all` would hand every GPU of a node to a CPU-only gateway
# pod on runtimes that honour it.
USER 10001
WORKDIR /home/dsflash
# gateway HTTP, prefill gRPC, decode gRPC, worker metrics (the manifests' containerPorts).
EXPOSE 8000 50051 50052 9400
ENTRYPOINT ["/usr/bin/tini", "--", "dsflash"]
CMD ["--help"]
