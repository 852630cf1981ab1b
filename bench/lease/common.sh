# Sourced by the lease's scripts (run.sh, profile.sh, tune.sh): `lease LOG BUDGET` starts the
# call (the repository root, $OUT, the log, the clock), `installed` installs the carried wheels and
# ptxgen unless an earlier call on this warm machine did, `step` runs one command within the budget.

# lease LOG BUDGET: cd to the root, log everything to $OUT/LOG, count BUDGET seconds from now.
lease() {
    cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
    OUT=${OUT:-bench/lease/out}
    BUDGET=${BUDGET:-$2}
    START=$SECONDS
    mkdir -p "$OUT"
    exec > >(tee -a "$OUT/$1") 2>&1
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
}

# installed: the .whl/ wheels into /tmp/site and ptxgen in place, once a machine (a shell
# function: call it directly, `step` runs programs).
installed() {
    local t0=$SECONDS rc
    if [[ -d /tmp/site ]] && python3 -c 'import gguf, ptxgen.cli' 2>/dev/null; then
        echo "== install: done by an earlier call"
        return 0
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && python3 -m pip install -q --no-deps --no-build-isolation -e .
    rc=$?
    echo "== install: exit ${rc} after $(( SECONDS - t0 )) s"
    return $rc
}

# step NAME SECONDS COMMAND...: COMMAND under min(SECONDS, what is left of BUDGET); skipped below 20 s.
step() {
    local name=$1 cap=$2 left t0 rc
    shift 2
    left=$(( BUDGET - (SECONDS - START) ))
    (( cap > left )) && cap=$left
    if (( cap < 20 )); then
        echo "== $name: skipped, ${left} s of the budget left"
        return 1
    fi
    echo "== $name (at most ${cap} s)"
    t0=$SECONDS
    timeout --kill-after=10 "$cap" "$@"
    rc=$?
    echo "== $name: exit ${rc} after $(( SECONDS - t0 )) s"
    return $rc
}
