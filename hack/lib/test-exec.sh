#!/usr/bin/env bash
# go test -exec of hack/test.sh: runs a test binary ("$@", in its package's
# directory) with the GOGC the caller of make test had. hack/test.sh gives the
# Go toolchain its own (BUILD_GOGC); the tests, and the products and tools
# they start, run as they would without it.
if [[ "${HYBRID_CCM_CALLER_GOGC_SET:-}" == set ]]; then
  export GOGC="${HYBRID_CCM_CALLER_GOGC:-}"
else
  unset GOGC
fi
unset HYBRID_CCM_CALLER_GOGC HYBRID_CCM_CALLER_GOGC_SET
exec "$@"
