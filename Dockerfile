# syntax=docker/dockerfile:1
# The tpu-operator controller image. Build from the repository root:
#   docker build -t tpu-operator .
# The install step is scripts/install-package.sh: every dependency from
# requirements/operator.txt (`make lock`), pinned and checked against its hashes.
#
# Base image: PYTHON_IMAGE, the official Python image by tag here. A release builds from
# that tag resolved to its digest, passed as
# `--build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...`, and records it in the
# image's org.opencontainers.image.base.* labels and the release notes
# (docs/contributing/images.md). The test suite builds this file with a local stand-in for
# the base, tagged in its place.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# Python 3.11 on Debian bookworm, as the worker image: the lock files are resolved for it.

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/ requirements/
COPY scripts/install-package.sh scripts/
COPY operator/ operator/
COPY worker-image/ worker-image/
RUN sh scripts/install-package.sh operator /opt/venv /src

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tpu-operator" \
      org.opencontainers.image.description="Kubernetes operator for JAX training on GKE TPU node pools" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# A fixed non-root UID (the chart's securityContext runs as 65532).
USER 65532:65532
EXPOSE 8000 8081
ENTRYPOINT ["tpu-operator"]
CMD ["run"]
