"""benchmarks/datasets.json: every listed file is traceable, and the split is the seeded draw it states."""

import json
import re
from pathlib import Path

import numpy as np

LIST = Path(__file__).resolve().parents[1] / "benchmarks" / "datasets.json"


def load():
    return json.loads(LIST.read_text(encoding="utf-8"))


def test_every_file_names_its_public_source_and_checksum():
    for e in load()["datasets"]:
        assert re.fullmatch(r"[0-9a-f]{64}", e["sha256"]), e["name"]
        assert re.fullmatch(r"[0-9a-f]{40}", e["commit"]), e["name"]
        assert "/" in e["repo"] and e["path"].endswith(".mat"), e["name"]
        assert e["status"] in ("split", "shared", "skipped"), e["name"]
        if e["status"] != "split":
            assert e["reason"], e["name"]
        else:
            assert e["n"] > 0 and e["views"] == len(e["widths"]) >= 2 and e["classes"] >= 2, e["name"]


def test_the_split_is_the_seeded_draw_over_the_sorted_families():
    doc = load()
    split = [e for e in doc["datasets"] if e["status"] == "split"]
    families = sorted({e["family"] for e in split})
    assert families == doc["split"]["families"]
    perm = np.random.default_rng(doc["split"]["seed"]).permutation(len(families))
    development = {families[i] for i in perm[: (len(families) + 1) // 2]}
    for e in split:
        assert e["half"] == ("development" if e["family"] in development else "confirmation"), e["name"]


def test_sets_sharing_samples_fall_in_one_half():
    halves: dict = {}
    for e in load()["datasets"]:
        if e["status"] == "split":
            halves.setdefault(e["family"], set()).add(e["half"])
    assert all(len(h) == 1 for h in halves.values())
