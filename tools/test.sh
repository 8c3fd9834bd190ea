#!/usr/bin/env bash
# The README's test command: installs what the tests need (once; a second
# run finds it all and installs nothing), starts a one-machine Slurm for the
# autoscaler's Slurm test, runs every test of the workspace with nextest,
# and stops the Slurm daemons it started.
#
#   tools/test.sh [NEXTEST ARGS...]      e.g. tools/test.sh -p raylet-data
#
# What it installs (Debian; as root for the packages):
#   iproute2                 network namespaces for the multi-host and chaos suites
#   slurm-wlm, munge         the one-machine Slurm (.ci/slurm.sh)
#   chromium                 the dashboard's browser test
#   prometheus               the scrape test of the head's target list
#   python3-venv             the tests' Python venvs, made under target/:
#     target/mlflow-venv     mlflow (MLflow tests of Train and Tune)
#     target/openai-venv     openai (the OpenAI-compatible server's client test)
#     target/ray-venv        ray, aiohttp, pydantic (Ray's job CLI and SDK test)
#   s3s-fs                   an S3-compatible server (cargo install)
#   cargo-nextest            the test runner (cargo install)
#
# A test never passes by skipping: one whose need is missing fails, saying
# how to provide it. On a machine where some need cannot be had (no root),
# leave the tests that need it out by name, and this script neither
# installs it nor hides that they were left out:
#   RAYLET_TEST_LEAVE_OUT=chromium,slurm,netns,shm-mount,prometheus tools/test.sh
# (raylet-test-support lists the names; CI leaves nothing out).
set -euo pipefail
cd "$(dirname "$0")/.."

leave_out=${RAYLET_TEST_LEAVE_OUT:-}
left_out() { [[ ",$leave_out," == *",$1,"* ]]; }
if [[ -n $leave_out && ${CI:-} == true ]]; then
    echo "CI leaves nothing out, but RAYLET_TEST_LEAVE_OUT=$leave_out" >&2
    exit 2
fi

apt_install() {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

installs_started=$SECONDS
if ! left_out netns && ! command -v ip >/dev/null 2>&1; then
    apt_install iproute2
fi
if ! left_out slurm; then
    .ci/slurm.sh install
fi
if ! left_out chromium && ! command -v chromium >/dev/null 2>&1; then
    apt_install chromium fonts-dejavu-core
fi
if ! left_out prometheus && [ ! -x /usr/bin/prometheus ]; then
    apt_install prometheus
fi
# tune/tests/results_in_pandas.rs makes a venv with pandas on its first run.
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    apt_install python3 python3-venv
fi

# pip_venv VENV MODULE PACKAGE VERSION [REQUIREMENT...]: a venv under
# target/ with PACKAGE==VERSION and the requirements, made or fixed only
# when MODULE's version is not VERSION already.
pip_venv() {
    local venv=$1 module=$2 package=$3 version=$4
    shift 4
    if ! "$venv/bin/python" -c "import $module, sys; sys.exit($module.__version__ != '$version')" >/dev/null 2>&1; then
        [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "$package==$version" "$@"
    fi
}
# raylet_train::testing::MLFLOW_VERSION
pip_venv target/mlflow-venv mlflow mlflow 3.17.2
# llm/tests/openai_client.rs's OPENAI_VERSION
pip_venv target/openai-venv openai openai 3.57.0
# tests/ray_job_api.rs's RAY_VERSION: Ray's job CLI and SDK without Ray's
# dashboard extras, with what its job client imports (aiohttp for the log
# tail, pydantic for job details).
pip_venv target/ray-venv ray ray 2.60.0 aiohttp==3.14.5 pydantic==2.14.4

# raylet_storage::testing::S3S_FS_VERSION
if ! command -v s3s-fs >/dev/null 2>&1 && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs" ]; then
    cargo install s3s-fs --version 0.14.1 --features binary --locked
fi
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install cargo-nextest --locked
fi
echo "tools/test.sh: installs took $((SECONDS - installs_started)) s"

if ! left_out slurm; then
    # Its node advertises 16 CPUs, so that several 2-CPU raylet nodes fit.
    trap '.ci/slurm.sh stop' EXIT
    SLURM_CI_CPUS=16 .ci/slurm.sh
fi

# Each test left out adds a line here (raylet_test_support::LEFT_OUT_LOG).
left_out_log=$PWD/target/left-out-tests.txt
mkdir -p target && : >"$left_out_log"
status=0
# Every crate's tests, unless the arguments choose packages (`-p
# raylet-data`): a filter alone (`-E 'test(equal)'`) runs over the whole
# workspace, not the default members (the CLI and the quickstart).
chooses_packages=false
for arg in "$@"; do
    case $arg in
        -p | -p* | --package | --package=* | --workspace | --all) chooses_packages=true ;;
    esac
done
$chooses_packages || set -- --workspace "$@"
RAYLET_TEST_LEFT_OUT_LOG=$left_out_log cargo nextest run "$@" || status=$?
if [[ -s $left_out_log ]]; then
    echo "tools/test.sh: tests left out at your request (RAYLET_TEST_LEAVE_OUT=$leave_out):"
    sed 's/^/  /' "$left_out_log"
fi
exit "$status"
