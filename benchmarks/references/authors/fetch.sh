#!/usr/bin/env bash
# Clones every baseline's authors' repository at the commit its lock-step ran against
# (benchmarks/references/authors/common.py: REPOS) into DIR/<owner>+<name>, only the code (no data files).
#   bash benchmarks/references/authors/fetch.sh DIR && export FEDJAX_KD_AUTHORS=DIR
# A folder already there at the right commit is left as it is; at another commit, it is refused.
set -euo pipefail
dir="${1:?usage: bash benchmarks/references/authors/fetch.sh DIR}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$dir"
PYTHONPATH="$here" python3 -c '
from benchmarks.references.authors.repos import REPOS
for r in {r.slug: r for r in REPOS.values()}.values():
  print(r.slug, r.commit)' | while read -r slug commit; do
  dest="$dir/${slug/\//+}"
  if [ -d "$dest/.git" ]; then
    head="$(git -C "$dest" rev-parse HEAD)"
    [ "$head" = "$commit" ] || { echo "$dest is at ${head:0:7}, not ${commit:0:7}: git -C $dest checkout $commit" >&2; exit 2; }
    continue
  fi
  git clone -q --filter=blob:none --no-checkout "https://github.com/$slug" "$dest"
  git -C "$dest" checkout -q "$commit" -- $(git -C "$dest" ls-tree -r --name-only "$commit" \
      | grep -E '\.(py|sh|md|txt|json|yaml|yml)$' | grep -vE '(^|/)(data|dataset|rawdata)/')
  git -C "$dest" update-ref --no-deref HEAD "$commit"
  echo "$dest at ${commit:0:7}"
done
