# A stand-in for docker.io/temporalio/temporal where no registry is reachable: the same
# Temporal CLI binary on a local Debian base, with the public image's entrypoint, user and
# home (deploy/compose.yaml keeps the dev server's database there).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN useradd --uid 1000 --create-home --home-dir /home/temporal --shell /usr/sbin/nologin temporal
COPY temporal /usr/local/bin/temporal
USER temporal
WORKDIR /home/temporal
ENTRYPOINT ["temporal"]
