#!/usr/bin/env bash
# libsluice.so exports the C API and nothing else, and carries its SONAME (ctest: c_api_exports).
#
#   tests/c_api/check_exports.sh path/to/libsluice.so.X.Y.Z
set -euo pipefail
lib=${1:?usage: check_exports.sh LIBSLUICE}
[ -f "$lib" ] || { echo "FAIL: no library at $lib"; exit 1; }

# Defined dynamic symbols; the version script's node (SLUICE_0, type A) is not a symbol of code.
symbols=$(nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }' | sed 's/@.*//' | sort -u)
[ -n "$symbols" ] || { echo "FAIL: $lib exports nothing"; exit 1; }
others=$(grep -v '^sluice_' <<<"$symbols" || true)
if [ -n "$others" ]; then
  echo "FAIL: $lib exports symbols outside the C API:"
  head -20 <<<"$others"
  exit 1
fi
for want in sluice_client_create sluice_client_destroy sluice_check_one sluice_check_batch \
            sluice_check_async sluice_strerror sluice_options_init sluice_result_init \
            sluice_release; do
  grep -qx "$want" <<<"$symbols" || { echo "FAIL: $want is not exported"; exit 1; }
done
# Version nodes (lib/client/sluice.map): what a program linked against an older library asks for
# must still be there, and what leases added is in SLUICE_1.
versioned=$(nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }')
for want in sluice_check_one@@SLUICE_0 sluice_result_init@SLUICE_0 sluice_result_init@@SLUICE_1 \
            sluice_release@@SLUICE_1; do
  grep -qx "$want" <<<"$versioned" || { echo "FAIL: $want is not exported"; exit 1; }
done
soname=$(objdump -p "$lib" | awk '$1 == "SONAME" { print $2 }')
[ "$soname" = libsluice.so.0 ] || { echo "FAIL: SONAME is '$soname', expected libsluice.so.0"; exit 1; }
echo "ok: $(wc -l <<<"$symbols") symbols, all sluice_*; SONAME $soname"
