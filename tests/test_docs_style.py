"""The docs describe the product as it is, not how the project got there.

* no doc, README, CHANGELOG or source line narrates development with relative, dated labels
  ("stop 51", "six rounds ago", "this session", "the previous round's table"): such labels are
  false as soon as the next change lands, and the history lives in git;
* docs/clustering.md, the design rationale of the clustering pipeline, stays at most 400 lines;
* the CHANGELOG's Unreleased block has each Keep a Changelog category at most once;
* every relative link of a doc, and every ``docs/NAME.md`` it names, resolves to a file.

The patterns leave the product's own vocabulary alone: a federated *round* ("this round's
self-mask keys", "the previous round's centres"), an *early stop*, a *stopping rule*, "stop the
run".
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: development-narrating labels (case-insensitive); each must not hit the product's vocabulary
NARRATION = [
    r"\bstops? \d+\b(?! (?:rounds?|steps?|iterations?|seconds?|s\b|fits?|times?|samples?))",  # "stop 51"
    r"\brounds? ago\b",  # "six rounds ago"
    r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten) rounds (?:ago|before|earlier)\b",
    r"\bthis session\b",
    r"\b(?:earlier|previous|last|that) sessions?(?:'s)?\b",
    r"\(this round\)",
    r"\b(?:before|until|since|in) this round\b",
    r"\b(?:this|that|the previous|the last|an earlier|the earlier) round's "
    r"(?:code|defaults?|table|run|fits?|record|change|rule|score|study|replay)\b",
    r"\bthe round before\b",
    r"\bpreviously\b",
]
PATTERN = re.compile("|".join(f"(?:{p})" for p in NARRATION), re.IGNORECASE)

CATEGORIES = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")


def _text_files() -> list[Path]:
    files = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    return files + sorted((ROOT / "src").rglob("*.py"))


def _hits(paths) -> list[str]:
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in PATTERN.finditer(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()[:120]}")
    return found


def test_patterns_spare_the_products_vocabulary():
    legitimate = [
        "the early stop fires after 5 rounds", "stop the run", "a stopping rule", "stop 20 steps early",
        "this round's self-mask keys", "the previous round's centres", "the previous round's global mean gradient",
        "a client that missed the previous round", "the server's last round", "at their next round",
        "stop 5 rounds later",
    ]
    assert [s for s in legitimate if PATTERN.search(s)] == []
    narrating = [
        "The bases' start (stop 51)", "(six rounds ago)", "(this round)", "from stop 50 on",
        "measured in this session", "the previous round's table", "before this round the refinement",
        "Stop 48's run", "previously the default", "two rounds ago",
    ]
    assert [s for s in narrating if not PATTERN.search(s)] == []


def test_docs_readme_changelog_do_not_narrate_development():
    files = [p for p in _text_files() if p.suffix == ".md"]
    assert _hits(files) == []


def test_source_does_not_narrate_development():
    files = [p for p in _text_files() if p.suffix == ".py"]
    assert _hits(files) == []


def test_clustering_rationale_is_short():
    lines = (ROOT / "docs" / "clustering.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 400, f"docs/clustering.md has {len(lines)} lines (at most 400)"


def test_changelog_unreleased_has_one_section_per_category():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    start = text.index("## [Unreleased]")
    following = text.find("\n## ", start + 1)
    block = text[start:following if following != -1 else len(text)]
    headings = re.findall(r"^### (.+?)\s*$", block, re.MULTILINE)
    assert [h for h in headings if h not in CATEGORIES] == [], "only Keep a Changelog categories"
    assert len(headings) == len(set(headings)), f"repeated headings: {headings}"
    assert headings == sorted(headings, key=CATEGORIES.index), f"Keep a Changelog order: {headings}"


def test_doc_links_resolve():
    broken = []
    for path in sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md", ROOT / "CHANGELOG.md"]:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: ({target})")
        for name in re.findall(r"\bdocs/[\w./-]+\.md\b", text):
            if not (ROOT / name).exists():
                broken.append(f"{path.relative_to(ROOT)}: {name}")
    assert broken == []
