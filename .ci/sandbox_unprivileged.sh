#!/usr/bin/env bash
# Run the fork-server sandbox tests as an unprivileged user.
#
# CI runs as root, so `make test` covers only the fork server's root path (a PID namespace, a
# uid of its own per sandbox, the uid sweep). A trainer that is not root takes the other path
# (a user namespace, sandboxes sharing the trainer's uid, the process-tree sweep): this script
# tests that one. Run it as root after `make setup-test` (`.ci/run` does, after `make test`):
#
#   .ci/sandbox_unprivileged.sh            # user looprl-ci, created if missing
#   LOOPRL_CI_USER=someone .ci/sandbox_unprivileged.sh
#
# It creates the user, lets it enter the directories on the way to the repository, the
# virtualenv and the interpreter the virtualenv points to (o+x only: no listing, no writing;
# each change is printed), checks that the user can import what the tests need, and runs
# tests/test_sandbox.py and tests/test_sandbox_lifecycle.py as that user with a HOME of its own,
# no pytest cache and no .pyc writes (the checkout stays root's and unchanged).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
user=${LOOPRL_CI_USER:-looprl-ci}
py=$repo/.venv/bin/python

if [ "$(id -u)" != 0 ]; then
  echo "sandbox_unprivileged: run this as root (it creates the user $user and runs the tests as it)" >&2
  exit 2
fi
if [ ! -x "$py" ]; then
  echo "sandbox_unprivileged: $py is missing: run 'make setup-test' first" >&2
  exit 2
fi
if ! id -u "$user" >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user"
  echo "sandbox_unprivileged: created user $user"
fi

# Every directory on the way to each path must let others enter it (execute bit).
open_path() {
  local dir=$1
  [ -d "$dir" ] || dir=$(dirname "$dir")
  while :; do
    if [ "$(( 0$(stat -c %a "$dir") & 1 ))" = 0 ]; then
      chmod o+x "$dir"
      echo "sandbox_unprivileged: chmod o+x $dir (so that $user can reach what it needs)"
    fi
    [ "$dir" = / ] && break
    dir=$(dirname "$dir")
  done
}
base_prefix=$("$py" -c 'import sys; print(sys.base_prefix)')
for path in "$repo" "$(readlink -f "$py")" "$base_prefix"; do
  open_path "$path"
done

home=$(mktemp -d /tmp/looprl-ci-home.XXXXXX)
chown "$user:" "$home"
trap 'rm -rf "$home"' EXIT
as_user() {
  runuser -u "$user" -- env -i HOME="$home" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
    OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 "$@"
}

if ! as_user "$py" -c 'import looprl.sandbox, numpy, sympy, pytest, pytest_asyncio'; then
  echo "sandbox_unprivileged: $user cannot import looprl and the test dependencies with $py;" \
    "make the checkout and the virtualenv readable by others (umask 022 when cloning and" \
    "running 'make setup-test', or chmod -R o+rX on them)" >&2
  exit 1
fi
echo "sandbox_unprivileged: running the fork-server sandbox tests as $user (uid $(id -u "$user"))"
as_user "$py" -m pytest -p no:cacheprovider tests/test_sandbox.py tests/test_sandbox_lifecycle.py
