#!/usr/bin/env bash
# The image make test-deploy runs: localhost/kvtier/kvtierd:0.1.0, built by podman from the
# Containerfile with the .deb that cpack makes from build/ (PREBUILT_DEB: the build under
# test, not a second compile). No registry is reachable here, so the bookworm base is made
# with debootstrap from Debian's archive (docs/operations.md, Kubernetes). Both are reused
# while their inputs are unchanged: the base while it exists, the image while the .deb's
# files and the Containerfile hash the same (a label on the image).
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=$PWD/tests/deploy/containers.conf
BUILD=${BUILD:-build}
IMAGE=${KVTIER_DEPLOY_IMAGE:-localhost/kvtier/kvtierd:0.1.0}
BASE=localhost/debian:bookworm
CACHE=build-deploy
mkdir -p "$CACHE"

if ! podman image exists "$BASE"; then
  echo "deploy-image: making $BASE with debootstrap"
  rm -rf "$CACHE/rootfs"
  debootstrap --variant=minbase bookworm "$CACHE/rootfs" http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1 ||
    { tail -n 20 "$CACHE/debootstrap.log"; exit 1; }
  tar -C "$CACHE/rootfs" -c . | podman import - "$BASE" >/dev/null
  rm -rf "$CACHE/rootfs"
fi

rm -f "$BUILD"/kvtier_*_amd64.deb
(cd "$BUILD" && cpack -G DEB >/dev/null)
deb=$(ls "$BUILD"/kvtier_*_amd64.deb)
inputs=$( (dpkg-deb --fsys-tarfile "$deb" | tar -xO; cat Containerfile) | sha256sum | cut -c1-32)
have=$(podman image inspect "$IMAGE" --format '{{index .Labels "kvtier.inputs"}}' 2>/dev/null || true)
if [[ $have == "$inputs" ]]; then
  echo "deploy-image: $IMAGE is up to date ($inputs)"
  exit 0
fi
mkdir -p deploy/.prebuilt
cp "$deb" deploy/.prebuilt/kvtier.deb
echo "deploy-image: building $IMAGE from $deb"
podman build --format docker --network=host --label "kvtier.inputs=$inputs" \
  --build-arg BASE="$BASE" --build-arg RUNTIME_BASE="$BASE" --build-arg PREBUILT_DEB=deploy/.prebuilt/kvtier.deb \
  -t "$IMAGE" . >"$CACHE/build.log" 2>&1 || { tail -n 30 "$CACHE/build.log"; exit 1; }
rm -rf deploy/.prebuilt
echo "deploy-image: $IMAGE built"
