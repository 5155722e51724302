# Sourced by the set-up scripts: a line per phase on the terminal, the phase's own output
# (apt-get's, CMake's, the compiler's) in a log, and the log's tail when a phase fails.
#   progress_start NAME LOG   name the script and its log (made absolute; its folder created)
#   phase WHAT CMD...         print "NAME: WHAT ...", run CMD with its output appended to the
#                             log, then the time it took; on failure print the log's last
#                             lines and its path, and exit with CMD's status

progress_start() {
  progress_name="$1"
  mkdir -p "$(dirname "$2")"
  progress_log="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
}

progress_elapsed() {
  local s=$(($(date +%s) - $1))
  if ((s >= 60)); then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi
}

phase() {
  local what="$1"
  shift
  local t0
  t0=$(date +%s)
  printf '%s: %s ... ' "$progress_name" "$what"
  printf '\n==== %s: %s (%s)\n' "$progress_name" "$what" "$*" >>"$progress_log"
  local status=0
  "$@" >>"$progress_log" 2>&1 </dev/null || status=$?
  if ((status != 0)); then
    printf 'failed after %s\n' "$(progress_elapsed "$t0")"
    printf '%s: the last lines of %s:\n' "$progress_name" "$progress_log" >&2
    tail -n 40 "$progress_log" | sed 's/^/    /' >&2
    printf '%s: %s failed (exit status %d); the whole log: %s\n' "$progress_name" "$what" \
      "$status" "$progress_log" >&2
    exit "$status"
  fi
  printf 'done (%s)\n' "$(progress_elapsed "$t0")"
}
