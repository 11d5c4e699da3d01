# One image for every Headroom component: `headroom webhook|extender|agent|certs`.
#   docker build -t ghcr.io/headroom-dev/headroom:0.1.0 .
# Runs as a non-root user and needs no writable root filesystem (Python writes
# no bytecode at run time; the manifests mount an emptyDir at /tmp). The bytecode
# is hash-based, not stamped with the sources' mtimes: a COPY between stages may
# move an mtime, and a stale .pyc makes every start recompile from source (the
# official client's core_v1_api alone takes ~85 MiB to compile); -f rewrites the
# timestamped .pyc pip already wrote.
# BASE: any Python 3.11 image with `python` on PATH; `make image` passes one
# built here from Debian packages, as no registry is reachable (devcluster/images).
ARG BASE=python:3.11-slim
FROM ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/lock.txt requirements/lock.txt
# Only the runtime dependencies, at the locked versions: the lock also pins the
# test and demo extras, which the image does not install.
COPY pyproject.toml README.md ./
COPY headroom headroom
COPY kube kube
COPY serving serving
COPY webhook webhook
COPY extender extender
COPY agent agent
COPY certs certs
COPY cli cli
COPY devcluster devcluster
RUN python -m venv /opt/headroom \
 && /opt/headroom/bin/pip install --constraint requirements/lock.txt . \
 && /opt/headroom/bin/python -m compileall -q -f --invalidation-mode unchecked-hash /opt/headroom

FROM ${BASE}
COPY --from=build /opt/headroom /opt/headroom
ENV PATH=/opt/headroom/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric uid, so that runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001
ENTRYPOINT ["headroom"]
CMD ["--help"]
