#!/usr/bin/env bash
# Checks that the vendored crate in third_party/ is the registry's crate of the same version,
# plus third_party/patches/*.patch (applied in name order), and nothing else
# (third_party/README.md). Needs cargo and the network (cargo's own registry: whatever this
# machine's cargo is configured to use). Exits 1 with the differences when they disagree.
set -euo pipefail
cd "$(dirname "$0")/.."

crate=temporalio-sdk-core
vendored=third_party/$crate
# Whole directories of the published crate that the vendored copy leaves out (README: "What
# was left out"): tens of thousands of lines no build here reads, which a patch would only
# repeat. Everything else the copy leaves out or changes is in a patch.
left_out=(tests benches)
# Files cargo writes into every published crate: its lock file (packaged because the crate
# has a binary; a dependency's lock file is never read), the manifest as written before cargo
# normalized it, and the upstream commit it was packaged from. None is read by a build.
packaging=(Cargo.lock Cargo.toml.orig .cargo_vcs_info.json)

command -v patch >/dev/null || { echo "verify-third-party: needs patch(1)" >&2; exit 2; }
# A second vendored crate would go unchecked: this script knows one.
for entry in third_party/*; do
  case "$entry" in
    "$vendored" | third_party/patches | third_party/README.md) ;;
    *) echo "verify-third-party: $entry is not checked by this script; add it here" >&2; exit 2 ;;
  esac
done
version=$(sed -n '/^\[package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$vendored/Cargo.toml")
[ -n "$version" ] || { echo "verify-third-party: no [package] version in $vendored/Cargo.toml" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A throwaway project whose only dependency is the crate, so cargo downloads the published
# .crate. The workspace's lock file seeds it: the versions resolved are those our build uses,
# so the downloads are ones the build needs anyway (mostly already in cargo's cache).
mkdir -p "$work/probe/src"
cat >"$work/probe/Cargo.toml" <<EOF
[package]
name = "verify-third-party-probe"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
$crate = "=$version"
EOF
: >"$work/probe/src/lib.rs"
cp Cargo.lock "$work/probe/Cargo.lock"
host=$(rustc -vV | sed -n 's/^host: //p')
(cd "$work/probe" && cargo fetch --quiet --target "$host")

# The checksum the registry's index gives for the crate (cargo wrote it into the lock file).
checksum=$(awk -v name="$crate" -v ver="$version" '
  $0 == "name = \"" name "\"" { hit = 1; next }
  hit && $0 == "version = \"" ver "\"" { found = 1; next }
  found && /^checksum = / { gsub(/"/, "", $3); print $3; exit }
  /^\[\[package\]\]/ { hit = 0; found = 0 }' "$work/probe/Cargo.lock")
[ -n "$checksum" ] || { echo "verify-third-party: no registry checksum for $crate $version" >&2; exit 2; }

# Unpacked from the downloaded .crate itself, after checking it against that checksum: cargo's
# unpacked sources (registry/src) may have been edited in place, its archives are verified.
archive=""
for candidate in "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$crate-$version.crate"; do
  [ -f "$candidate" ] || continue
  if [ "$(sha256sum "$candidate" | cut -d' ' -f1)" = "$checksum" ]; then archive=$candidate; break; fi
done
[ -n "$archive" ] || { echo "verify-third-party: no downloaded $crate-$version.crate matches the registry's checksum $checksum" >&2; exit 2; }
mkdir -p "$work/pristine"
tar -xzf "$archive" -C "$work/pristine"

# The expected tree, at the vendored copy's path so the patches apply as they are written.
expected="$work/expected/$vendored"
mkdir -p "$(dirname "$expected")"
mv "$work/pristine/$crate-$version" "$expected"
for path in "${left_out[@]}" "${packaging[@]}"; do rm -rf "${expected:?}/$path"; done
shopt -s nullglob
patches=(third_party/patches/*.patch)
for p in "${patches[@]}"; do
  # No fuzz: a patch that no longer applies exactly is out of date, not close enough.
  if ! out=$(patch --directory="$work/expected" -p1 --forward --batch --fuzz=0 \
      --no-backup-if-mismatch --reject-file=- <"$p" 2>&1); then
    echo "verify-third-party: $p does not apply to $crate $version:" >&2
    echo "$out" >&2
    exit 1
  fi
done

if ! diff -r -u "$expected" "$vendored" >"$work/diff"; then
  echo "verify-third-party: $vendored is not $crate $version from the registry plus third_party/patches/*.patch:" >&2
  sed "s|$work/||g" "$work/diff" >&2
  echo "verify-third-party: put every change in a patch (third_party/README.md), or undo it" >&2
  exit 1
fi
echo "verify-third-party: $vendored is $crate $version from the registry plus ${#patches[@]} patches"
