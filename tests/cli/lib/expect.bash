# Shared helpers for the tests/cli/*.sh scripts (sourced, not a test itself).
# Usage in a script:  source "$(dirname "$0")/lib/expect.bash"; ...; finish
# MEGATRON must be set (the binary), TMP is a scratch directory removed on exit.
fails=0; passes=0
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

# expect_error "needle" args...: exit status != 0, exactly one line on stderr, holding needle.
expect_error() {
  local needle=$1; shift
  timeout 120 "$MEGATRON" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null; local rc=$?
  local lines; lines=$(wc -l <"$TMP/err")
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$needle" "$TMP/err"; then
    echo "FAIL: megatron $* -> rc=$rc, stderr ($lines lines), wanted: $needle"; head -c 2000 "$TMP/err"
    fails=$((fails+1))
  else
    passes=$((passes+1))
  fi
}

# check "description" command...: the command must succeed.
check() {
  local what=$1; shift
  if "$@"; then passes=$((passes+1)); else echo "FAIL: $what"; fails=$((fails+1)); fi
}

# tree_sum DIR: one checksum over every file's path and content (to show data is intact).
tree_sum() {
  (cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}

finish() {
  echo "$passes passed, $fails failed"
  [ $fails -eq 0 ]
}
