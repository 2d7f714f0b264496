#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a short time ($1, default 5s).
set -euo pipefail
t="${1:-5s}"
grep -rl --include='*_test.go' '^func Fuzz' . | while read -r f; do
  pkg="./$(dirname "${f#./}")"
  grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //' | while read -r fn; do
    echo "fuzz: ${pkg} ${fn} (${t})"
    go test -run '^$' -fuzz "^${fn}\$" -fuzztime "${t}" "${pkg}"
  done
done
