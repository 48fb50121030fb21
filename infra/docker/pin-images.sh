#!/bin/sh
# Pins every base and build image relaybus uses by digest, again: for each
# reference written name:tag@sha256:<digest> in the Dockerfiles and the
# Cloud Build configurations, it resolves name:tag in its registry now and
# rewrites the digest. Run it to take newer images (a security fix in a
# base, a new Go patch release), then review the diff and let CI test it.
#
#   infra/docker/pin-images.sh            rewrite the digests
#   infra/docker/pin-images.sh --check    only list the references whose digest moved
#
# Needs docker with buildx (docker buildx imagetools inspect reads the
# registry without pulling), or crane (go install
# github.com/google/go-containerregistry/cmd/crane@latest). The digest is
# the one of the tag's manifest list (every platform), which is what
# `docker pull name:tag` resolves first.
set -eu
cd "$(dirname "$0")/../.."
files="infra/docker/Dockerfile infra/docker/test.Dockerfile cloudbuild.yaml cloudbuild.deploy.yaml"
check=false
[ "${1:-}" = "--check" ] && check=true

resolve() {
	if command -v crane >/dev/null 2>&1; then
		crane digest "$1"
	elif docker buildx version >/dev/null 2>&1; then
		docker buildx imagetools inspect "$1" --format '{{json .Manifest}}' | sed -n 's/.*"digest":"\(sha256:[0-9a-f]\{64\}\)".*/\1/p' | head -n 1
	else
		echo "pin-images: needs crane or docker buildx" >&2
		exit 2
	fi
}

moved=0
refs=$(grep -ohE '[a-z0-9./-]+(:[A-Za-z0-9._-]+)@sha256:[0-9a-f]{64}' $files | sort -u)
for ref in $refs; do
	image=${ref%@*}
	old=${ref#*@}
	new=$(resolve "$image")
	case "$new" in sha256:*) ;; *) echo "pin-images: cannot resolve $image" >&2; exit 1 ;; esac
	if [ "$new" != "$old" ]; then
		moved=$((moved + 1))
		echo "$image: $old -> $new"
		if ! $check; then
			for f in $files; do
				sed -i "s|$image@$old|$image@$new|g" "$f"
			done
		fi
	fi
done
echo "pin-images: $moved reference(s) moved"
if $check && [ "$moved" -gt 0 ]; then exit 1; fi
