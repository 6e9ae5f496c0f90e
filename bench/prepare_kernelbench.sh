#!/usr/bin/env bash
# Prepare .kb/ for `bench/device_run.sh throughput` (run here, not on the GPU machine): KernelBench's source
# from a checkout or a bare git directory (only src/, scripts/, the level-1/2 problems; ~1.5 MB), and the
# wheels its eval imports that the GPU image lacks (pydantic and its needs, python-dotenv; ~3 MB, Python 3.12
# x86-64). .kb/ is ignored through the repository's info/exclude and never committed; carry it with `.kb`.
# Usage: bench/prepare_kernelbench.sh PATH_TO_KERNELBENCH_CHECKOUT_OR_GIT_DIR [REV]
set -euo pipefail
src=$(cd "$1" && pwd); rev=${2:-HEAD}
gitdir=$src; [ -d "$src/.git" ] && gitdir=$src/.git
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --path-format=absolute --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '.kb/' "$exclude" 2>/dev/null || echo '.kb/' >> "$exclude"
rm -rf .kb/KernelBench .kb/wheels && mkdir -p .kb/KernelBench .kb/wheels
git --git-dir="$gitdir" archive "$rev" src scripts KernelBench/level1 KernelBench/level2 pyproject.toml LICENSE \
  README.md | tar -x -C .kb/KernelBench
git --git-dir="$gitdir" rev-parse "$rev" > .kb/KernelBench/KERNELBENCH_COMMIT
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms="$platforms --platform $p"
done
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
  -d .kb/wheels pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing-extensions==4.16.0 python-dotenv==1.2.4
git check-ignore -q .kb/KernelBench || { echo ".kb/ is not ignored: refusing to leave KernelBench in the tree" >&2; exit 1; }
du -sh .kb/KernelBench .kb/wheels
