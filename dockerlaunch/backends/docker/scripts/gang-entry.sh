#!/bin/sh
# The entrypoint of a supervised job container (`up --detach`): runs gang.py (beside this file) under the image's
# own python3 when it is 3.8 or later, as docker-init's direct child (exec), else the command as Docker would have,
# after saying so in the run's folder (the launcher then WARNs that nothing watches the job once it is gone).
# usage: gang-entry.sh run SETTINGS_JSON -- COMMAND...    gang-entry.sh take-secret (the start's `docker exec -i`)
here=${0%/*}
py=
for p in python3 /usr/bin/python3 /usr/local/bin/python3 python; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 8))' 2>/dev/null; then
    py=$p
    break
  fi
done
case ${1:-} in
  take-secret)
    if [ -z "$py" ]; then cat >/dev/null; echo unsupervised; exit 0; fi
    exec "$py" "$here/gang.py" take-secret ;;
  run)
    if [ -n "$py" ]; then exec "$py" "$here/gang.py" "$@"; fi
    settings=$2
    shift 2
    [ "${1:-}" = -- ] && shift
    # the run's folder, from the settings' "dir" (a path made by the launcher: no quote or backslash in it)
    dir=$(printf '%s' "$settings" | sed -n 's/.*"dir":"\([^"]*\)".*/\1/p')
    if [ -n "$dir" ]; then
      mkdir -p "$dir" 2>/dev/null && : >"$dir/unsupervised-rank${NODE_RANK:-x}" 2>/dev/null
    fi
    echo "[dockerlaunch] no Python >= 3.8 in the image: this rank runs without the gang supervisor" >&2
    exec "$@" ;;
  *)
    echo "usage: gang-entry.sh run SETTINGS_JSON -- COMMAND... | take-secret" >&2
    exit 2 ;;
esac
