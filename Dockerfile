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
#
# GO_IMAGE and BASE_IMAGE name the two base images, for a machine that
# cannot pull them: deploy/image_test.go (-image.buildah) builds this file
# offline with a Go image made from the local toolchain and BASE_IMAGE=scratch.

ARG GO_IMAGE=golang:1.26-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/fleetrate ./cmd/fleetrate

FROM ${BASE_IMAGE}
COPY --from=build /out/fleetrate /usr/local/bin/fleetrate
USER 65532:65532
WORKDIR /etc/fleetrate
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/fleetrate"]
CMD ["serve"]
