# The image of `fleetrate serve`, which deploy/kubernetes names. Build it
# from the repository's root:
#
#     docker build -t fleetrate:dev .
#
# (podman build and buildah bud take the same arguments), push it to your
# own registry and put that name in the manifests; no image is published.
# Run it with a configuration mounted at /etc/fleetrate/fleetrate.yaml:
#
#     docker run --rm -p 8080:8080 -p 8081:8081 \
#       -v "$PWD/examples/fleetrate.yaml:/etc/fleetrate/fleetrate.yaml:ro" fleetrate:dev
#
# The binary is static (CGO_ENABLED=0) and the final image is distroless's
# static nonroot base: no shell, no package manager, user 65532.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/fleetrate ./cmd/fleetrate

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fleetrate /usr/local/bin/fleetrate
USER 65532:65532
WORKDIR /etc/fleetrate
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/fleetrate"]
CMD ["serve"]
