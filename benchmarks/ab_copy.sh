#!/usr/bin/env bash
# A copy of the package at another revision, for an A/B on the device (gpu_serve_http_ab.sh CODE_B=..., or
# PYTHONPATH=<copy> before a benchmark script). Two steps, because a device call carries at most 64 MiB:
#   bash benchmarks/ab_copy.sh make REV DEST   here: `git archive REV ddtree_bench suites` into DEST (the suites too:
#                                              ddtree_bench/suite_specs links to them), files other than .py over
#                                              100 KiB left out (the bundled weights and datasets);
#   bash benchmarks/ab_copy.sh fill DEST       there, from the repo root: those files copied back from the working
#                                              tree's package (unchanged since REV, or the A/B compares more than code),
#                                              then checked: DEST's package is the one that runs, and it knows gsm8k.
# Either step exits 1 with one line saying why.
set -u
here=$(dirname "$0")
source "$here/serve_lib.sh"
case "${1:-}" in
  make)
    rev=${2:?usage: ab_copy.sh make REV DEST}; dest=${3:?usage: ab_copy.sh make REV DEST}
    [ -e "$dest" ] && { echo "ab_copy: $dest exists; remove it first" >&2; exit 1; }
    mkdir -p "$dest"
    git archive "$rev" ddtree_bench suites | tar -x -C "$dest" || { echo "ab_copy: git archive $rev failed" >&2; exit 1; }
    find "$dest" -type f ! -name "*.py" -size +100k -delete
    echo "ab_copy: $rev in $dest ($(du -sh "$dest" | cut -f1); large data files left for 'fill')"
    ;;
  fill)
    dest=${2:?usage: ab_copy.sh fill DEST}
    [ -d "$dest/ddtree_bench" ] || { echo "ab_copy: no package in $dest" >&2; exit 1; }
    (cd ddtree_bench && find models data -type f -size +100k) | while read -r f; do
      [ -e "$dest/ddtree_bench/$f" ] || { mkdir -p "$dest/ddtree_bench/$(dirname "$f")"; cp "ddtree_bench/$f" "$dest/ddtree_bench/$f"; }
    done
    use_package "$dest" > /dev/null || exit 1
    PYTHONPATH="$dest" python3 -m ddtree_bench suites 2> /dev/null | grep -q "^gsm8k " \
      || { echo "ab_copy: the copy in $dest does not list the gsm8k suite" >&2; exit 1; }
    echo "ab_copy: $dest ready"
    ;;
  *)
    echo "usage: ab_copy.sh make REV DEST | fill DEST" >&2; exit 1 ;;
esac
