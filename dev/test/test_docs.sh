#!/usr/bin/env bash
# The specs and the links of the documentation (issue 14, item 7): every spec a file cites is in spec/, cited in
# the one form `spec/<name>.md <section>` (not ../shared/spec/..., "gka spec 3.2" or "spec/gka.md section 3.2"),
# and every relative link of README.md and FORMATS.md reaches a file of the repository, or a heading of the file
# for a #anchor. A made-up text with one fault of each kind is the negative control. Prints PASS/FAIL lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# check_docs FILE...: prints one line per problem found in the files, nothing when there is none
check_docs() {
    python3 - "$@" <<'PY'
import os, re, sys
odd_forms = [
    (re.compile(r"shared/spec/"), "a path outside the repository (shared/spec/)"),
    (re.compile(r"\b(gdn|kaczmarz|gdn_kaczmarz|gka|kalman|pdn) spec (sections? )?[0-9]"), "'<mixer> spec <section>' instead of spec/<name>.md"),
    (re.compile(r"spec/[a-z_]+\.md sections? [0-9]"), "'spec/<name>.md section N' instead of 'spec/<name>.md N'"),
]
def anchor(heading):  # GitHub's: lower case, punctuation dropped, spaces to hyphens
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")
for path in sys.argv[1:]:
    text = open(path, encoding="utf-8").read()
    for n, line in enumerate(text.splitlines(), 1):
        for name in re.findall(r"(?<![A-Za-z0-9_./])spec/([A-Za-z0-9_]+)\.md", line):
            if not os.path.isfile(f"spec/{name}.md"):
                print(f"{path}:{n}: cites spec/{name}.md, which is not in spec/")
        for rx, what in odd_forms:
            if rx.search(line):
                print(f"{path}:{n}: {what}: {rx.search(line).group(0)}")
    if not path.endswith(".md"):
        continue
    anchors = {anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, frag = target.partition("#")
        if file and not os.path.exists(os.path.join(os.path.dirname(path), file)):
            print(f"{path}: link to {file}, which does not exist")
        if not file and frag not in anchors:
            print(f"{path}: link to #{frag}, which is no heading of the file")
PY
}

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

specs=$(ls spec/*.md 2> /dev/null | tr '\n' ' ')
for s in gdn_kaczmarz gka kalman pdn llmc_conventions; do
    [ -f "spec/$s.md" ] || fail "spec/$s.md in the repository" "missing"
done
[ -n "$specs" ] && pass "the specs are in the repository: $specs"

files=$(git ls-files | grep -E '\.(c|h|cu|cuh|py|sh|js|md)$|(^|/)Makefile$' | grep -vE '^spec/|^dev/test/test_docs\.sh$')
problems=$(check_docs $files)
if [ -z "$problems" ]; then
    pass "every spec cited in the $(echo "$files" | wc -l) source and documentation files exists, in the one form spec/<name>.md <section>; README and FORMATS links resolve"
else
    fail "spec citations and links" "$(echo "$problems" | head -n 5 | tr '\n' ';')"
fi

# negative control: one fault of each kind, each must be reported
cat > "$tmp/bad.md" <<'EOF'
# Heading
See spec/gdn.md 3.2, ../shared/spec/gka.md 3.1, the gka spec 3.2, spec/pdn.md section 9.
A [missing file](no_such_file.md) and a [missing heading](#no-such-heading); a [good one](#heading).
EOF
got=$(cd "$tmp" && mkdir -p spec && cp "$OLDPWD"/spec/*.md spec/ && check_docs bad.md | wc -l)
if [ "$got" = 6 ]; then
    pass "negative control: a text with 6 faults (unknown spec, shared path, '<mixer> spec N', 'section N', missing file, missing heading) gives 6 reports"
else
    fail "negative control" "$got reports for 6 faults"
fi
