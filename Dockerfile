# sandboxrun itself, as a command-line image. FOR TRUSTED OPERATORS ONLY: to create sandboxes
# it needs the Docker engine socket (-v /var/run/docker.sock:/var/run/docker.sock), and whoever
# holds that socket is root on the host. Mount workspaces at the same path as on the host (the
# engine resolves bind sources on the host):
#   docker run --rm -v /var/run/docker.sock:/var/run/docker.sock -v "$PWD:$PWD" -w "$PWD" \
#     sandboxrun/cli:latest run -b docker -- make test
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
COPY pyproject.toml README.md /src/
COPY sandboxrun /src/sandboxrun
COPY images /src/images
RUN pip install --no-cache-dir /src && rm -rf /src
ENTRYPOINT ["sandboxrun"]
CMD ["--help"]
