#!/usr/bin/env bash
# Runs every Go fuzz target in the module for $1 (go test -fuzztime: a count of
# inputs such as 2000x, or a duration; default 2000x, see the Makefile), or
# only those of the packages under $2 (e.g. ./coordinator/gate/proxy). -vet=off:
# make lint's go vet ./... checks the same packages with every analyzer.
set -euo pipefail
t="${1:-2000x}"
under="${2:-.}"
grep -rl --include='*_test.go' '^func Fuzz' "${under}" | sort | while read -r f; do
  pkg="./$(dirname "${f#./}")"
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //' | while read -r fn; do
    echo "fuzz: ${pkg} ${fn} (${t})"
    go test -vet=off -run '^$' -fuzz "^${fn}\$" -fuzztime "${t}" "${pkg}"
  done
done
