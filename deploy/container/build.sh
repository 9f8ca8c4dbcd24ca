#!/usr/bin/env bash
# Builds the Sluice container image from a build tree, with no registry and no base image: a root
# holding only sluiced and sluicectl (in /usr/local/bin, as deploy/k8s/statefulset.yaml expects),
# the shared libraries they load (found by ldd), a static busybox for /bin/sh and sed (the
# StatefulSet's start command writes each pod's config with them), a user `sluice` (uid and gid
# 65532, the manifests' runAsUser), the default config (deploy/container/sluiced.yaml) and the
# example rules. buildah writes it in Docker format (which keeps HEALTHCHECK) into the local
# container storage that podman reads.
#
#   deploy/container/build.sh BUILD_DIR [TAG]     TAG defaults to sluice:<project version>
#
# Then: podman run -d -p 7350:7350/udp -p 7351:7351 sluice:0.3.0
#       podman save sluice:0.3.0 | ssh node 'podman load'   (or push it to your registry)
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:?usage: build.sh BUILD_DIR [TAG]}" && pwd)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
tag=${2:-sluice:${version:-0.0.0}}
for tool in buildah ldd; do
  command -v "$tool" >/dev/null || { echo "build.sh: $tool not found (deploy/setup.sh installs it)" >&2; exit 2; }
done
busybox=$(command -v busybox || true)
[ -n "$busybox" ] && ! ldd "$busybox" >/dev/null 2>&1 ||
  { echo "build.sh: a static busybox is needed (Debian package busybox-static)" >&2; exit 2; }
bins=("$build/daemon/sluiced" "$build/daemon/sluicectl")
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "build.sh: $b is not built" >&2; exit 2; }; done

root=$(mktemp -d)
chmod 0755 "$root"  # the image's / (mktemp makes it 0700)
ctr=""
cleanup() {
  [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$root"
}
trap cleanup EXIT

install -d "$root/usr/local/bin" "$root/bin" "$root/etc/sluice" "$root/tmp" "$root/run/sluice" \
  "$root/var/lib/sluice"
install -m 0755 "${bins[@]}" "$root/usr/local/bin/"
install -m 0755 "$busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
ln -s busybox "$root/bin/sed"
# Every shared library either program loads, at the path the loader looks for it, and the loader.
for lib in $(ldd "${bins[@]}" | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | sort -u); do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
printf 'root:x:0:0:root:/root:/bin/sh\nsluice:x:65532:65532:Sluice rate-limit node:/nonexistent:/bin/false\n' \
  >"$root/etc/passwd"
printf 'root:x:0:\nsluice:x:65532:\n' >"$root/etc/group"
install -m 0644 "$src/deploy/container/sluiced.yaml" "$root/etc/sluice/sluiced.yaml"
install -m 0644 "$src/deploy/rules.example.yaml" "$root/etc/sluice/rules.yaml"
chmod 1777 "$root/tmp"
chown 65532:65532 "$root/var/lib/sluice" "$root/run/sluice"
chmod 0700 "$root/var/lib/sluice"

ctr=$(buildah from --format docker scratch)
# Copied through a mount so that owners and modes stay as set above (buildah copy makes root own all).
mnt=$(buildah mount "$ctr")
cp -a "$root"/. "$mnt"/
buildah umount "$ctr" >/dev/null
buildah config \
  --user 65532:65532 \
  --workingdir /var/lib/sluice \
  --entrypoint '["/usr/local/bin/sluiced"]' \
  --cmd '--config /etc/sluice/sluiced.yaml' \
  --port 7350/udp --port 7350/tcp --port 7351/tcp --port 7352/udp --port 8081/tcp --port 6379/tcp \
  --volume /var/lib/sluice \
  --healthcheck 'CMD /usr/local/bin/sluicectl status --admin 127.0.0.1:7351' \
  --healthcheck-interval 10s --healthcheck-timeout 3s --healthcheck-retries 3 \
  --stop-signal SIGTERM \
  --label org.opencontainers.image.title=sluice \
  --label org.opencontainers.image.version="${version:-0.0.0}" \
  --label org.opencontainers.image.description="Sluice, a peer-to-peer rate-limit daemon" \
  "$ctr"
buildah commit --format docker --rm "$ctr" "$tag" >/dev/null
ctr=""
echo "built $tag ($(du -sb "$root" | cut -f1) bytes of files)"
