#!/usr/bin/env bash
# Builds a real kube-apiserver and kube-controller-manager (Kubernetes 1.20.2) from Debian's own
# `kubernetes` source package, for the tier-A tests (tests/backends/k8s). Run once per machine;
# the binaries are cached outside the repository:
#
#   tools/k8s/build.sh [CACHE_DIR]      # default: ~/.cache/reamer/k8s-1.20.2
#
# Needs root and apt (golang-go 1.19, rsync, etcd-server). About 7-10 min on 2 cores.
# One fix is applied before building: the vendored modern-go/reflect2 v1.0.1 segfaults under
# Go 1.19 on the first custom-resource request, so it is replaced by Debian's 1.0.2.
set -euo pipefail
CACHE="${1:-$HOME/.cache/reamer/k8s-1.20.2}"
BIN="$CACHE/bin"
if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/etcd" ]; then
  echo "cached: $BIN"; exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"; flock 9
if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/etcd" ]; then
  echo "cached: $BIN (built meanwhile)"; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
need=""
for p in golang-go rsync etcd-server golang-github-modern-go-reflect2-dev dpkg-dev make; do
  dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
if [ -n "$need" ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends $need; fi

SRC="$CACHE/src"
if [ ! -d "$SRC/tree" ]; then
  rm -rf "$SRC"; mkdir -p "$SRC/apt/lists/partial" "$SRC/apt/cache/archives/partial"
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$SRC/apt/sources.sources"
  mkdir -p "$SRC/apt/sources.list.d"; cp "$SRC/apt/sources.sources" "$SRC/apt/sources.list.d/debian.sources"
  APTOPT=(-o "Dir::Etc::sourcelist=/dev/null" -o "Dir::Etc::sourceparts=$SRC/apt/sources.list.d"
          -o "Dir::State::Lists=$SRC/apt/lists" -o "Dir::Cache=$SRC/apt/cache")
  apt-get "${APTOPT[@]}" update -qq
  (cd "$SRC" && apt-get "${APTOPT[@]}" source --download-only kubernetes)
  (cd "$SRC" && dpkg-source --no-check -x kubernetes_*.dsc tree >/dev/null)
  REFLECT2=/usr/share/gocode/src/github.com/modern-go/reflect2
  rm -rf "$SRC/tree/vendor/github.com/modern-go/reflect2"
  cp -r "$REFLECT2" "$SRC/tree/vendor/github.com/modern-go/reflect2"
fi
cd "$SRC/tree"
GOPROXY=off GOFLAGS=-mod=vendor make WHAT="cmd/kube-apiserver cmd/kube-controller-manager"
mkdir -p "$BIN"
for b in kube-apiserver kube-controller-manager; do  # copy, then rename: a running binary is replaced, not written
  cp "$(find _output -type f -name "$b" -perm -u+x | head -1)" "$BIN/.$b.new" && mv -f "$BIN/.$b.new" "$BIN/$b"
done
ln -sf "$(command -v etcd)" "$BIN/etcd"
"$BIN/kube-apiserver" --version
echo "built: $BIN"
