#!/usr/bin/env python3
"""Checks every relative link in the repository's Markdown files: the target exists and,
for a #fragment into a Markdown file, that file has a heading with that GitHub anchor.
Usage: check_doc_links.py [REPO_ROOT]. Prints each broken link; exit 1 if there is one.
Run by ctest as docs_links (label docs)."""
import os, re, sys, subprocess

root = sys.argv[1] if len(sys.argv) > 1 else "."

def markdown_files():
    try:  # the files git knows (tracked, or new and not ignored): no build trees
        out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
                             capture_output=True, text=True, check=True).stdout.split()
        return [f for f in out if os.path.exists(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):  # no git: walk, skipping hidden and build dirs
        found = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
            found += [os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith(".md")]
        return found

files = markdown_files()
link = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")

def anchors(path):
    out, seen = set(), {}
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0); seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out

bad = 0
for f in files:
    path = os.path.join(root, f)
    in_code = False
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        for target in link.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                print(f"{f}:{no}: {target}: no such file"); bad += 1
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                print(f"{f}:{no}: {target}: no heading #{frag}"); bad += 1
print(f"{len(files)} Markdown files, {bad} broken link(s)")
sys.exit(1 if bad else 0)
